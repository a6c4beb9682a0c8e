"""The library's version, in its own module so that any layer can record it (a run record
carries it) without importing the package's namespace."""

__version__ = "0.2.0"
