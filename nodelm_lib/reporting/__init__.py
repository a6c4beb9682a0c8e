"""Turning runs into results: statistics (``stats``), tables (``tables``), fitted trends
(``trends``), figures (``plotting``), the docs' generated pages (``pages``) and the timed
reproduce record (``reproduce``)."""
