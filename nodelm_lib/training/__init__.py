"""Training one run: the loop (``loop.train``, also ``nl.train``), its record (``record``), the
device and precision policy (``device``), optimiser and schedule (``optim``), evaluation
(``evaluation``), what a killed run resumes from (``state``), model files (``model_files``), the
checks of a stored file as it is read (``integrity``), FLOPs and memory (``profiling``) and data parallelism
(``distributed``)."""
