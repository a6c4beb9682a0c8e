"""Experiments over many runs: arms and the comparison protocol (``protocol``), sweeps
(``sweeps``), learning-rate selection (``lr_selection``), solver-depth ablations (``ablations``),
the size sweep (``scaling``), long-context evaluation (``long_context``), n-gram reference losses
(``ngram``), time and cost estimates (``estimate`` on a GPU, ``sweep_time`` from a store's step
times), the notebooks' parameter profiles (``profiles``) and running a notebook's code in this
process without Jupyter (``notebook_here``)."""
