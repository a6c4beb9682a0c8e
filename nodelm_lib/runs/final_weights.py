"""A run's final weights, and evaluations of them kept beside the record of their training.

Records are committed, checkpoints are not. An analysis of final weights (04's spectra and
Lyapunov exponents) is computed once and kept in a run store's evaluations
(``store.write_evaluations``), so that a clone rebuilds its tables from stored numbers instead of
training the runs again for their weights. ``FinalWeights.evaluation`` reads an evaluation back or
computes it from the weights and keeps it.

A stored evaluation must describe the weights it was computed from. Where the weights on disk are
the stored training (``store.same_training``), evaluations go to the run's own store, beside its
record. A run trained again for its weights on another kind of CPU ends a little elsewhere (up to
~0.01 nats after 2000 steps); its record goes to a side store under the checkpoints
(``store.weights_store``) and so do evaluations of its weights, never the run's own store, whose record
they do not describe (``store.read_evaluations`` would ignore them there anyway: it checks the
final validation loss they were made with).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from nodelm_lib.training.record import RunRecord

from .store import (checkpoint_path, read_evaluations, read_record, record_path, same_training, weights_record,
                    weights_store, write_evaluations)


def _side_record(config_hash: str, checkpoints: str | Path) -> RunRecord | None:
    path = record_path(weights_store(checkpoints), config_hash)
    return read_record(path) if path.exists() else None


@dataclass
class FinalWeights:
    """One run's final model and the store where evaluations of it are kept: ``record`` is the
    training the weights come from (and the evaluations describe), ``store`` the store holding it
    (the run's own, or ``WEIGHTS_STORE`` for a retraining that ended elsewhere)."""

    record: RunRecord
    store: Path
    checkpoints: Path
    device: str = "cpu"
    _model: Any = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def of(cls, stored: RunRecord, store: str | Path, checkpoints: str | Path, device: str = "cpu",
           needs: Iterable[str] = ()) -> "FinalWeights | None":
        """Where the evaluations ``needs`` (keys) of the run of ``stored`` (``store``'s record) are
        kept or can be made: the run's own store where it keeps them all or the weights on disk are
        its training; the side store where it keeps them all for an earlier retraining or the weights
        on disk are another training. None where the weights must be trained first. With no
        ``needs`` every answer is a model on disk."""
        store, checkpoints, needs = Path(store), Path(checkpoints), set(needs)
        if needs and needs <= set(read_evaluations(stored, store)):
            return cls(stored, store, checkpoints, device)
        retrained = _side_record(stored.config_hash, checkpoints)
        if needs and retrained is not None and needs <= set(read_evaluations(retrained, weights_store(checkpoints))):
            return cls(retrained, weights_store(checkpoints), checkpoints, device)
        on_disk = weights_record(stored.config_hash, checkpoints)  # the training the weights on disk come from
        if on_disk is None:
            return None
        if same_training(on_disk, stored):
            return cls(stored, store, checkpoints, device)
        return cls(on_disk, weights_store(checkpoints), checkpoints, device)

    def model(self):
        """The final model, loaded once (eval mode, on ``device``)."""
        if self._model is None:
            from nodelm_lib.training.model_files import load_model

            path = checkpoint_path(self.record.config_hash, self.checkpoints)
            if not path.exists():
                raise FileNotFoundError(f"{path}: the final weights of run {self.record.config_hash} are not on disk, "
                                        f"and an evaluation {self.store} does not keep was asked for; list it in the "
                                        "`needs` of sweeps.final_weights, which trains the run again for its weights")
            self._model = load_model(path, device=self.device)
        return self._model

    def evaluation(self, key: str, compute: Callable[[Any], Any]) -> Any:
        """The evaluation ``key`` of these weights: read back from ``store``, else ``compute(model)``
        (JSON values) kept there first. Either way the value is what the JSON file holds, so a table
        built from it is the same whether it was computed now or read back."""
        stored = read_evaluations(self.record, self.store)
        if key not in stored:
            stored = {**stored, key: compute(self.model())}
            write_evaluations(self.record, stored, self.store)
            stored = read_evaluations(self.record, self.store)
        return stored[key]
