"""Analyses of trained models and their runs (gradient flow; spectra and Lyapunov exponents to come)."""
