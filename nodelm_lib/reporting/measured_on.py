"""Which machine a table of timings was measured on, and where a rerun on another machine writes.

Losses come back bit for bit on a CPU of the records' type, and within a measured tolerance on
another (``runs.reproducibility``). Timings do not: seconds, tokens per second and peak memory
belong to the machine that measured them. A notebook whose outputs are timings (05's solver costs,
06's decoding speed) therefore keeps, beside its main table, a one-line file naming that machine
(``<name>_machine.txt``, e.g. ``results/generation_cpu_machine.txt``, holding the CPU model and
torch's capability in ``runs.timing.machine_of``'s wording). A rerun on the same kind of machine
rewrites the committed outputs; a rerun elsewhere writes its own beside them, every name with
``_on_<machine>`` added (``generation_cpu_on_<machine_slug>.csv``), and leaves the committed ones
as they are: a table's timings then always come from one machine.

    where = measured_on(results_dir, f"generation_{profile}", device)
    speed.to_csv(results_dir / f"{where.name('generation_' + profile)}.csv")
    where.write_machine()
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

MACHINE_FILE = "{name}_machine.txt"


def machine_slug(machine: str) -> str:
    """``machine`` as a file-name part: lower case, every run of other characters one hyphen
    ("Some CPU (AVX2)" -> "some-cpu-avx2"), so that a file name holds no spaces or brackets."""
    slug = re.sub(r"[^a-z0-9]+", "-", machine.lower()).strip("-")
    if not slug:
        raise ValueError(f"machine {machine!r} has no letters or digits to name its files by")
    return slug


@dataclass(frozen=True)
class MeasuredOn:
    """Where a notebook's machine-dependent outputs go. ``machine``: this machine;
    ``committed``: the machine that ``results_dir``'s table ``table`` was measured on (None where
    there is no such table yet, or it names no machine: this run's outputs are then the table)."""

    results_dir: Path
    table: str
    machine: str
    committed: str | None

    @property
    def apart(self) -> bool:
        """True where the committed outputs come from another machine: this run writes beside them."""
        return self.committed is not None and self.committed != self.machine

    @property
    def suffix(self) -> str:
        """What every output name of this run gets: "" on the committed outputs' machine, else
        ``_on_<machine_slug>``."""
        return f"_on_{machine_slug(self.machine)}" if self.apart else ""

    def name(self, stem: str) -> str:
        """``stem`` (a table's or a figure's name, without extension) for this run's output."""
        return stem + self.suffix

    def machine_file(self) -> Path:
        """The file that names the machine of this run's ``table``."""
        return self.results_dir / MACHINE_FILE.format(name=self.name(self.table))

    def write_machine(self) -> Path:
        """Write ``machine_file``: this run's outputs were measured on ``machine``."""
        path = self.machine_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.machine + "\n")
        return path

    def describe(self) -> str:
        """One line for the notebook's output: where the timings were measured and where they went."""
        if self.apart:
            return (f"timings measured on {self.machine}; the committed {self.table} was measured on {self.committed}, "
                    f"so this run's outputs are written apart, each name ending in {self.suffix}")
        return f"timings measured on {self.machine}"


def committed_machine(results_dir: str | Path, table: str) -> str | None:
    """The machine ``results_dir``'s ``table`` names in its machine file, or None where it has none."""
    path = Path(results_dir) / MACHINE_FILE.format(name=table)
    if not path.is_file():
        return None
    machine = path.read_text().strip()
    if not machine:
        raise ValueError(f"{path} is empty: it should name the machine that measured {table} "
                         "(runs.timing.machine_of's wording); delete it to make this run's outputs the table")
    return machine


def measured_on(results_dir: str | Path, table: str, device: str = "cpu", machine: str | None = None) -> MeasuredOn:
    """Where the outputs of a rerun of ``table`` (e.g. ``"generation_cpu"``) on this machine go
    (``machine``: this one's kind, ``runs.timing.this_machine(device)``, unless given)."""
    if machine is None:
        from nodelm_lib.runs.timing import this_machine

        machine = this_machine(device)
    return MeasuredOn(Path(results_dir), table, machine, committed_machine(results_dir, table))
