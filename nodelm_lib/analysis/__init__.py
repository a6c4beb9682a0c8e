"""Analyses: gradient flow of trained models, solver and gradient-method studies, and notebook 04's
weight and Jacobian spectra, their trends over depth and Lyapunov exponents."""
