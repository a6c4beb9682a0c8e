"""Analyses: gradient flow of trained models, solver and gradient-method studies (spectra and Lyapunov exponents to come)."""
