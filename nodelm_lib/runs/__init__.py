"""Where runs live: the run store (``store``: a run is read back if stored, resumed if
interrupted), the records as table rows (``records``), claims that keep concurrent workers from
training one run twice (``claims``), isolated runs in a child process (``isolated``) and
cluster launchers (``launch``)."""
