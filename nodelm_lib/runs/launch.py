"""Sweeps on a cluster: every (arm, seed) run as its own job, submitted through ``submitit``.

    from nodelm_lib.runs import launch
    launcher = launch.Launcher("slurm", folder="logs/submitit", timeout_min=240, gpus_per_node=1,
                               slurm_partition="gpu", slurm_array_parallelism=16)
    runs = nl.sweep(base, arms, seeds, store="results/runs/gpu", launcher=launcher)

``Launcher("local")`` runs the jobs as processes of this machine (submitit's local executor);
``Launcher()`` picks SLURM where ``sbatch`` exists, else local. submitit is an optional extra:
``pip install 'nodelm[cluster]'``.

The run store stays the single source of truth, shared by every worker (a shared file system on
a cluster): a job trains one config and writes its record into the store atomically
(``store.train_into_store``). So

- a run whose record is in the store is not submitted again; nor is one a live worker is training
  (its claim, ``claims.py``): the sweep waits for its record instead;
- a job first claims its hash with an atomic lock file, so two sweeps over one store (two drivers,
  a notebook beside a cluster sweep) train each run exactly once: the job that loses the claim
  returns at once, and its sweep waits for the other worker's record;
- a job killed by a time limit or preemption is requeued by submitit (the job is checkpointable)
  and resumes from its last checkpoint; a job killed otherwise leaves a stale claim, which the
  sweep notices and resubmits (``max_resubmits``), the new job resuming the same checkpoint;
- ``sweeps.collect`` reads the store at any time: finished runs as rows, the others listed as running
  (with their worker) or missing. ``sweep(..., launcher=..., wait=False)`` submits and returns that.

One job may itself train data-parallel: ``tasks_per_node=N, gpus_per_node=N`` starts N tasks, which
join one DDP run (``distributed.py``; submitit's ``TorchDistributedEnvironment`` sets the variables
torchrun would); rank 0 claims the run and writes its record.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from nodelm_lib.config import TrainConfig, from_dict, to_dict

from . import claims

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

CLUSTERS = ("auto", "slurm", "local", "debug")  # submitit's AutoExecutor: debug runs jobs in this process
DEFAULT_FOLDER = "checkpoints/submitit"


def import_submitit():
    """submitit, or an ImportError naming the extra that installs it."""
    try:
        import submitit
    except ImportError as err:
        raise ImportError("sweeps through a launcher need submitit, an optional dependency of nodelm: "
                          "pip install 'nodelm[cluster]' (or pip install submitit)") from err
    return submitit


class RunJob:
    """What one job runs: train one config into the store, unless the store has its record or a
    live worker has claimed it. Returns what it did: ``{"outcome": "trained" | "recorded" |
    "claimed", ...}``. Checkpointable: on a time limit or preemption submitit requeues the same
    call, which resumes the run's checkpoint."""

    def __call__(self, config: dict, store: str, checkpoints: str, need_checkpoint: bool = False) -> dict:
        from .store import finished_record, run_config, train_into_store

        tc = run_config(from_dict(TrainConfig, config))
        config_hash = tc.config_hash()
        ctx = _join_tasks(tc)
        outcome = None
        claim = None
        if ctx.is_main:
            if finished_record(tc, store, checkpoints, need_checkpoint) is not None:
                outcome = {"outcome": "recorded"}
            else:
                claim = claims.try_claim(store, config_hash)
                if claim is None:
                    outcome = {"outcome": "claimed", "by": claims.describe(claims.read_claim(store, config_hash) or {})}
                elif finished_record(tc, store, checkpoints, need_checkpoint) is not None:  # stored just before
                    claim.release()
                    claim, outcome = None, {"outcome": "recorded"}
        outcome = _from_rank_0(ctx, outcome)
        if outcome is not None:
            return {"config_hash": config_hash, **outcome}
        try:
            record = train_into_store(tc, store, checkpoints)
        finally:
            if claim is not None:
                claim.release()
        return {"config_hash": config_hash, "outcome": "trained", "status": record.status}

    def checkpoint(self, *args: Any, **kwargs: Any):
        """submitit calls this on a time limit or preemption: requeue the same call."""
        return import_submitit().helpers.DelayedSubmission(self, *args, **kwargs)


def _join_tasks(tc: TrainConfig):
    """In a job of several tasks, export torchrun's variables (submitit's
    ``TorchDistributedEnvironment``) and join the process group; a one-task job is a plain run."""
    from nodelm_lib.training import distributed
    from nodelm_lib.training.device import resolve_device

    submitit = import_submitit()
    try:
        env = submitit.JobEnvironment()
    except RuntimeError:  # not inside a submitit job (the debug executor, a direct call)
        env = None
    if env is not None and env.num_tasks > 1:
        submitit.helpers.TorchDistributedEnvironment().export()
        _share_threads(env.num_tasks // env.num_nodes)
    ctx = distributed.launch_context()
    distributed.setup(ctx, distributed.process_device(ctx, resolve_device(tc.device)))
    return ctx


def _share_threads(tasks_here: int) -> None:
    """Split this node's CPUs between its tasks, as torchrun does (unless OMP_NUM_THREADS says):
    several processes each running a thread per core spin against each other, and gloo's
    collectives then wait on descheduled peers (8 tiny steps took a minute on 2 cores)."""
    import torch

    if os.environ.get("OMP_NUM_THREADS"):
        return
    cpus = int(os.environ.get("SLURM_CPUS_PER_TASK") or 0) or max(1, len(os.sched_getaffinity(0)) // tasks_here)
    torch.set_num_threads(cpus)


def _from_rank_0(ctx, value):
    """Rank 0's ``value`` on every rank of a several-task job."""
    if not ctx.active:
        return value
    import torch.distributed as torch_dist

    box = [value]
    torch_dist.broadcast_object_list(box, src=0)
    return box[0]


@dataclass
class Submitted:
    """Runs of one submission: the jobs submitted, and the runs left to other workers."""

    jobs: dict = field(default_factory=dict)  # config hash -> submitit job
    elsewhere: set = field(default_factory=set)  # config hashes claimed by a live worker
    configs: dict = field(default_factory=dict)  # config hash -> (TrainConfig, label)


class Launcher:
    """Submits runs as submitit jobs and waits for their records in the store.

    ``cluster``: one of ``CLUSTERS`` ("auto": SLURM where available, else local). ``folder``: where
    submitit keeps each job's pickles and logs (shared between the driver and the jobs).
    ``parameters`` go to the executor's ``update_parameters`` (``timeout_min``, ``gpus_per_node``,
    ``tasks_per_node``, ``cpus_per_task``, ``mem_gb``, ``slurm_partition``, ``slurm_account``,
    ``slurm_array_parallelism``, ...: submitit's names). ``executor`` is a ready submitit executor
    instead. ``poll_s``: how often the driver looks at jobs and the store. ``max_resubmits``: how many
    times a run whose worker died (stale claim, no record) is submitted again.

    ``history`` lists every finished job: config hash, label, job id and outcome ("trained",
    "recorded": found in the store, "claimed": left to another worker, "error"); ``jobs`` every
    job submitted, and ``cancel()`` stops those still running (their checkpoints stay).
    """

    def __init__(self, cluster: str = "auto", folder: str | Path = DEFAULT_FOLDER, *, executor=None,
                 poll_s: float = 10.0, max_resubmits: int = 2, **parameters: Any):
        if cluster not in CLUSTERS:
            raise ValueError(f"cluster={cluster!r} is not valid; choose one of {', '.join(map(repr, CLUSTERS))}")
        submitit = import_submitit()
        if executor is None:
            executor = submitit.AutoExecutor(folder=str(folder), cluster=None if cluster == "auto" else cluster)
            executor.update_parameters(**{"name": "nodelm", **_with_time_limit(executor.cluster, parameters)})
        elif parameters:
            executor.update_parameters(**parameters)
        self.executor = executor
        self.poll_s, self.max_resubmits = poll_s, max_resubmits
        self.history: list[dict] = []
        self.jobs: list = []

    def __repr__(self) -> str:
        return f"Launcher({type(self.executor).__name__}, folder={str(getattr(self.executor, 'folder', '?'))!r})"

    # ------------------------------------------------------------------ submitting

    def submit(self, configs: Iterable[TrainConfig], store: str | Path, checkpoints: str | Path,
               need_checkpoint: bool = False, labels: Iterable[str] | None = None) -> Submitted:
        """One job per config that the store lacks and no live worker has claimed (a config listed
        twice is one job). Returns at once; ``wait`` follows the jobs to their records."""
        from .store import finished_record, run_hash

        configs = list(configs)
        labels = list(labels) if labels is not None else [f"{tc.model.arch} seed {tc.seed}" for tc in configs]
        submitted = Submitted(configs={run_hash(tc): (tc, label) for tc, label in zip(configs, labels)})
        todo = []
        for config_hash, (tc, label) in submitted.configs.items():
            if finished_record(tc, store, checkpoints, need_checkpoint) is not None:
                continue
            holder = claims.read_claim(store, config_hash)
            if holder is not None and not claims.is_stale(holder):
                log.info("%s (%s) is being trained by %s: not submitted", label, config_hash, claims.describe(holder))
                submitted.elsewhere.add(config_hash)
                continue
            todo.append(config_hash)
        jobs = self._submit_jobs([submitted.configs[h][0] for h in todo], store, checkpoints, need_checkpoint)
        submitted.jobs.update(zip(todo, jobs))
        if todo:
            log.info("submitted %d job(s) to %s; %d run(s) stored, %d trained elsewhere", len(todo),
                     type(self.executor).__name__, len(submitted.configs) - len(todo) - len(submitted.elsewhere),
                     len(submitted.elsewhere))
        return submitted

    def _submit_jobs(self, configs: list[TrainConfig], store, checkpoints, need_checkpoint: bool) -> list:
        if not configs:
            return []
        job = RunJob()
        calls = [(to_dict(tc), str(store), str(checkpoints), need_checkpoint) for tc in configs]
        with self.executor.batch():  # one SLURM job array
            jobs = [self.executor.submit(job, *call) for call in calls]
        self.jobs += jobs
        return jobs

    def cancel(self) -> None:
        """Cancel every job of this launcher that has not finished (a rerun resumes them)."""
        for job in self.jobs:
            if not job.done():
                job.cancel(check=False)

    # ------------------------------------------------------------------ waiting

    def wait(self, submitted: Submitted, store: str | Path, checkpoints: str | Path, need_checkpoint: bool = False,
             progress: bool = True) -> None:
        """Follow the jobs until every run of ``submitted`` has its record in the store. A run left
        to another worker is watched; if that worker dies (stale or released claim, no record), the
        run is submitted again. Raises at the end, naming every run that failed and its log."""
        from tqdm import tqdm

        from .store import finished_record

        resubmits = {h: 0 for h in submitted.configs}
        errors: dict[str, str] = {}
        open_runs = set(submitted.jobs) | set(submitted.elsewhere)
        bar = tqdm(total=len(submitted.configs), initial=len(submitted.configs) - len(open_runs), disable=not progress,
                   desc="sweep", unit="run")
        try:
            while open_runs:
                for config_hash in sorted(open_runs):
                    tc, label = submitted.configs[config_hash]
                    job = submitted.jobs.get(config_hash)
                    if job is not None:
                        if not job.done():
                            continue
                        del submitted.jobs[config_hash]
                        outcome = self._outcome(job, config_hash, label)
                        if outcome["outcome"] == "error":
                            errors[config_hash] = outcome["error"]
                            open_runs.discard(config_hash)
                            continue
                        if outcome["outcome"] == "claimed":
                            submitted.elsewhere.add(config_hash)
                    if finished_record(tc, store, checkpoints, need_checkpoint) is not None:
                        submitted.elsewhere.discard(config_hash)
                        open_runs.discard(config_hash)
                        bar.update(1)
                        continue
                    if (config_hash in submitted.elsewhere and self._worker_gone(store, config_hash)
                            and finished_record(tc, store, checkpoints, need_checkpoint) is None):  # not just stored
                        if resubmits[config_hash] >= self.max_resubmits:
                            errors[config_hash] = (f"its worker stopped without a record {resubmits[config_hash] + 1} "
                                                   "time(s); see the claim's job log")
                            open_runs.discard(config_hash)
                            continue
                        resubmits[config_hash] += 1
                        submitted.elsewhere.discard(config_hash)
                        log.warning("%s (%s): its worker stopped without a record; submitting it again", label,
                                    config_hash)
                        (submitted.jobs[config_hash],) = self._submit_jobs([tc], store, checkpoints, need_checkpoint)
                if open_runs:
                    time.sleep(self.poll_s)
        finally:
            bar.close()
        if errors:
            lines = [f"  {submitted.configs[h][1]} ({h}): {msg}" for h, msg in errors.items()]
            raise RuntimeError(f"{len(errors)} of {len(submitted.configs)} run(s) failed; the others are in {store}, "
                               f"and rerunning the sweep resumes the failed ones from their checkpoints:\n"
                               + "\n".join(lines))

    def _outcome(self, job, config_hash: str, label: str) -> dict:
        """What a finished job did (``RunJob``'s result, or its error with the log to read)."""
        try:
            outcome = job.results()[0]  # task 0's (rank 0's, in a job of several tasks)
        except Exception as err:  # the job raised or was killed: its stderr says why
            stderr = getattr(getattr(job, "paths", None), "stderr", "?")
            outcome = {"outcome": "error", "error": f"job {job.job_id} failed ({type(err).__name__}: "
                                                    f"{str(err).strip().splitlines()[-1] if str(err).strip() else ''}); "
                                                    f"its log: {stderr}"}
        self.history.append({"config_hash": config_hash, "label": label, "job_id": str(job.job_id), **outcome})
        return outcome

    @staticmethod
    def _worker_gone(store, config_hash: str) -> bool:
        holder = claims.read_claim(store, config_hash)
        return holder is None or claims.is_stale(holder)

    def outcomes(self) -> dict[str, int]:
        """How many finished jobs trained, found a record, found a claim, or failed."""
        counts: dict[str, int] = {}
        for row in self.history:
            counts[row["outcome"]] = counts.get(row["outcome"], 0) + 1
        return counts


# submitit's own defaults (2 minutes locally, 5 on SLURM) would stop nearly every run
LOCAL_TIMEOUT_MIN = 7 * 24 * 60


def _with_time_limit(cluster: str, parameters: dict) -> dict:
    """``parameters`` with a job time limit: a week for local jobs unless given; SLURM jobs must
    say theirs (a partition's limit is the cluster's business, not a guess of ours)."""
    if "timeout_min" in parameters:
        return parameters
    if cluster == "slurm":
        raise ValueError("give the jobs' time limit: Launcher('slurm', timeout_min=...) in minutes, within your "
                         "partition's limit (submitit's default is 5); a run that outlives it is requeued and "
                         "resumes from its checkpoint")
    return {**parameters, "timeout_min": LOCAL_TIMEOUT_MIN}


def as_launcher(launcher, checkpoints: str | Path) -> Launcher:
    """A ``Launcher``, or one made from a cluster name (its folder next to the checkpoints)."""
    if isinstance(launcher, Launcher):
        return launcher
    if isinstance(launcher, str):
        return Launcher(launcher, folder=Path(checkpoints).parent / "submitit")
    raise ValueError(f"launcher={launcher!r} is not valid; pass a launch.Launcher or one of "
                     f"{', '.join(map(repr, CLUSTERS))}")


def run_all(configs: list[TrainConfig], store, checkpoints, launcher, need_checkpoint: bool, progress: bool,
            labels: list[str], wait: bool = True) -> list:
    """``sweeps.train_all`` through a launcher: the records (None for a run not finished when
    ``wait=False``), in the order of ``configs``."""
    from .store import finished_record

    launcher = as_launcher(launcher, checkpoints)
    submitted = launcher.submit(configs, store, checkpoints, need_checkpoint, labels)
    if wait:
        launcher.wait(submitted, store, checkpoints, need_checkpoint, progress)
    return [finished_record(tc, store, checkpoints, need_checkpoint) for tc in configs]


