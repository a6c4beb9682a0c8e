"""One training run in a fresh Python process: what ``run(isolate=True)`` and a sweep's workers use.

The process's peak memory (resident set size on CPU) and speed are then its own, not inflated by
earlier runs in the same process, and a crash takes down only that run. The child runs this
module's ``main`` on CONFIG.json (``CHILD_COMMAND``); it stops when the process that started it dies.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from nodelm_lib.config import TrainConfig, from_dict, to_dict
from nodelm_lib.files import atomic_write_text
from nodelm_lib.training.loop import train
from nodelm_lib.training.record import RECORD_NAME, RunRecord

# the environment variable through which a sweep tells an isolated run how many threads to use
THREADS_ENV = "NODELM_NUM_THREADS"
# the pid of the sweep that started an isolated run: the run stops when that process is gone
PARENT_ENV = "NODELM_PARENT_PID"
# the child's command line before the config file. Not ``python -m nodelm_lib.runs.isolated``:
# importing the package imports this module first, and runpy then warns in every run's log that the
# module it executes was already imported
CHILD_COMMAND = ("-c", "import sys; from nodelm_lib.runs.isolated import main; sys.exit(main(sys.argv[1:]))")


def train_in_subprocess(tc: TrainConfig, out_dir: Path, threads: int | None = None) -> RunRecord:
    """``train(tc)`` in a fresh interpreter (with ``threads`` torch threads, if given); its
    output is appended to ``out_dir/train.log`` (a header line per attempt)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    config_file = out_dir / "config.json"
    atomic_write_text(config_file, json.dumps(to_dict(dataclasses.replace(tc, progress=False))))
    log = out_dir / "train.log"
    (out_dir / RECORD_NAME).unlink(missing_ok=True)  # what we read back must be this child's
    env = os.environ.copy()
    env[PARENT_ENV] = str(os.getpid())
    if threads is not None:
        env.update({THREADS_ENV: str(threads), "OMP_NUM_THREADS": str(threads)})
    with open(log, "a") as log_file:  # appended: a resumed run's log keeps its earlier attempts
        log_file.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')}: run {tc.config_hash()} ({tc.model.arch}, seed "
                       f"{tc.seed}), {tc.max_steps} steps\n")
        log_file.flush()
        child = subprocess.Popen([sys.executable, *CHILD_COMMAND, str(config_file)],
                                 stdout=log_file, stderr=subprocess.STDOUT, env=env)
        try:
            code = child.wait()
        except BaseException:  # the sweep was interrupted: stop the child too; its checkpoint stays
            child.terminate()
            child.wait()
            raise
    record_file = out_dir / RECORD_NAME
    record = RunRecord.from_json(record_file) if record_file.exists() else None
    if code != 0 and (record is None or record.status != "failed"):
        tail = "".join(log.read_text().splitlines(keepends=True)[-20:])
        raise RuntimeError(f"run {tc.config_hash()} ({tc.model.arch}, seed {tc.seed}) exited with code {code}; "
                           f"the last lines of {log}:\n{tail}")
    return record


def stop_when_parent_dies(parent_pid: int, poll_s: float = 1.0) -> threading.Thread:
    """Send this process SIGTERM once ``parent_pid`` is no longer its parent.

    An isolated run whose sweep was killed (SIGKILL, a restarted notebook kernel) would otherwise
    train on, orphaned: the sweep's claim names the dead sweep, so a restarted sweep takes it over
    as stale and trains the same hash a second time beside it. The run stops at once instead and
    its last checkpoint resumes it. A daemon thread polls ``os.getppid()`` (an orphan is adopted
    by init or a subreaper), which works on every POSIX system, unlike Linux's PR_SET_PDEATHSIG
    (which also fires when the parent *thread* that started the child exits)."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        print(f"the sweep that started this run (pid {parent_pid}) is gone: stopping", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="stop-when-parent-dies", daemon=True)
    thread.start()
    return thread


def main(argv: list[str] | None = None) -> int:
    """One training run from CONFIG.json, ``argv``'s one item (``run(isolate=True)``'s child,
    started with ``CHILD_COMMAND``; ``python -m nodelm_lib.runs.isolated CONFIG.json`` works too)."""
    (config_file,) = argv if argv is not None else sys.argv[1:]
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")  # into train.log: "resumed from step N"
    if os.environ.get(PARENT_ENV):
        stop_when_parent_dies(int(os.environ[PARENT_ENV]))
    if os.environ.get(THREADS_ENV):
        torch.set_num_threads(int(os.environ[THREADS_ENV]))
    tc = from_dict(TrainConfig, json.loads(Path(config_file).read_text()))
    try:
        train(tc)
    except Exception as err:  # a failed run wrote its record (status "failed"); the parent reads it
        if getattr(err, "record", None) is None:
            raise
        print(f"run failed: {err}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
