"""Decoding: ``sampling.generate`` (also ``nl.generate``: sampling with or without a KV cache) and
``fast_decode`` (incremental decoding that freezes a continuous-depth model's fields at their
time grid points)."""
