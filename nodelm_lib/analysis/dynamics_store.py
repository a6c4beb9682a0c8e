"""Notebook 04's analyses of one run's final weights, read back from its run store or computed there.

Each analysis (``spectral.weight_spectra``, ``jacobian.jacobian_spectra``,
``lyapunov.token_sensitivity``, ``lyapunov.token_lyapunov_spectrum``) is computed once from a run's
final model and kept with the run's evaluations under a key naming what was computed
(``Analyses.keys``); read back, it rebuilds the same result object (``from_dict``), so the tables
and figures are the same digit for digit. A clone, which has the records but not the weights
(checkpoints are not committed), rebuilds notebook 04 from stored numbers and trains nothing.

``weights`` is a ``runs.final_weights.FinalWeights`` (``experiments.sweeps.final_weights`` gives
one per run, and trains a run again for its weights only where its store lacks a key it needs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nodelm_lib.runs.final_weights import FinalWeights

from . import jacobian as jc
from . import lyapunov as ly
from . import spectral as sp


@dataclass(frozen=True)
class Analyses:
    """What notebook 04 computes from a run's final weights: the weight spectra on the solver's
    grid (``ff_units`` as in ``spectral.weight_spectra``), and for the runs of its flow seeds the
    Jacobian spectra (``jacobian_mode``, ``n_krylov``) and Lyapunov analyses of the token ids
    ``tokens``. ``chunk_size`` (Jacobian rows per backward pass) says how, not what: it is not in
    the keys."""

    tokens: tuple[int, ...]
    ff_units: int | None = None
    jacobian_mode: str = "blocks"
    n_krylov: int = 64
    chunk_size: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "tokens", tuple(int(t) for t in self.tokens))
        if not self.tokens:
            raise ValueError("Analyses needs at least one token id (the encoded sentence)")

    @property
    def idx(self) -> torch.Tensor:
        return torch.tensor(self.tokens)

    def _of_tokens(self) -> str:
        return f"of tokens {','.join(map(str, self.tokens))}"

    def weight_spectra_key(self, seed: int) -> str:
        units = "all FF units" if self.ff_units is None else f"{self.ff_units} FF units drawn with seed {seed}"
        return f"weight spectra on the solver grid, {units}"

    def jacobian_key(self) -> str:
        return f"Jacobian spectra ({self.jacobian_mode}, {self.n_krylov} Krylov vectors) {self._of_tokens()}"

    def sensitivity_key(self) -> str:
        return f"token sensitivity {self._of_tokens()}"

    def token_spectrum_key(self) -> str:
        return f"Lyapunov spectrum of the last token {self._of_tokens()}"

    def keys(self, seed: int, flow: bool) -> list[str]:
        """The keys of a run's analyses: the weight spectra, and with ``flow`` the Jacobian and
        Lyapunov analyses (``sweeps.final_weights``' ``needs``)."""
        flow_keys = [self.jacobian_key(), self.sensitivity_key(), self.token_spectrum_key()] if flow else []
        return [self.weight_spectra_key(seed)] + flow_keys

    def weight_spectra(self, weights: FinalWeights, seed: int) -> sp.WeightSpectra:
        return _stored(weights, self.weight_spectra_key(seed), sp.WeightSpectra,
                       lambda m: sp.weight_spectra(m, ff_units=self.ff_units, seed=seed))

    def jacobian_spectra(self, weights: FinalWeights) -> jc.JacobianSpectra:
        return _stored(weights, self.jacobian_key(), jc.JacobianSpectra,
                       lambda m: jc.jacobian_spectra(m, self.idx, mode=self.jacobian_mode, n_krylov=self.n_krylov,
                                                     chunk_size=self.chunk_size))

    def token_sensitivity(self, weights: FinalWeights) -> ly.TokenSensitivity:
        return _stored(weights, self.sensitivity_key(), ly.TokenSensitivity,
                       lambda m: ly.token_sensitivity(m, self.idx, chunk_size=self.chunk_size))

    def token_spectrum(self, weights: FinalWeights) -> ly.TokenSpectrum:
        return _stored(weights, self.token_spectrum_key(), ly.TokenSpectrum,
                       lambda m: ly.token_lyapunov_spectrum(m, self.idx, position=-1, chunk_size=self.chunk_size))


def _stored(weights: FinalWeights, key: str, result_type, compute):
    """``result_type`` rebuilt from the evaluation ``key`` of ``weights``, which ``compute(model)``
    makes where the store does not keep it."""
    return result_type.from_dict(weights.evaluation(key, lambda model: compute(model).to_dict()))
