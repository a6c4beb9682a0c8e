"""Turning runs into results: statistics (``stats``), tables (``tables``), fitted trends
(``trends``), the figure style and saving (``style``), plots over runs and curves (``plotting``),
the notebooks' composite figures (``figures``), the docs' generated pages (``pages``) and the
timed reproduce record (``reproduce``)."""
