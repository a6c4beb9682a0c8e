"""Experiments over many runs: arms and the comparison protocol, sweeps and learning-rate
selection (``sweeps``), solver-depth ablations (``ablations``), the size sweep (``scaling``),
long-context evaluation (``long_context``), n-gram reference losses (``ngram``), time and cost
estimates (``estimate``) and the notebooks' parameter profiles (``profiles``)."""
