"""Where runs live: the run store (``store``: a run is read back if stored, resumed if
interrupted), the records as table rows (``records``), claims that keep concurrent workers from
training one run twice (``claims``), isolated runs in a child process (``isolated``), cluster
launchers (``launch``), a run's time from stored records (``timing``), a deadline that a run must
fit to start (``budget``), sweeps trained in chunks of a time budget (``chunks``), the
checks of a whole store (``store_checks``), and a sample of records retrained at HEAD against what
they recorded (``reproducibility``)."""
