"""Experiments over many runs: arms and the comparison protocol (``protocol``), sweeps
(``sweeps``), learning-rate selection (``lr_selection``), solver-depth ablations (``ablations``),
the size sweep (``scaling``), long-context evaluation (``long_context``), n-gram reference losses
(``ngram``), time and cost estimates (``estimate``) and the notebooks' parameter profiles
(``profiles``)."""
