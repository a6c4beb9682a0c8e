"""Claims: which worker trains a config hash right now, as lock files in the shared run store.

Before training a run into a store, a worker claims its hash: it creates ``<store>/<hash>.claim``
atomically, holding JSON with its host, pid (and the pid's start time), job id, and the time. Only
one create can succeed, so two workers (two sweeps, two SLURM jobs, a notebook and a job) never
train the same hash at once; the loser sees who holds it. The claim is released (removed) when the
worker stops, in a ``finally``.

A worker killed hard (SIGKILL, a node that died, a SLURM time limit) leaves its claim behind. Such
a claim is *stale*, and the next worker takes it over with a warning:

- on the same host: its pid is no longer alive (or is another process reusing the number);
- on another host, where no pid can be checked: its heartbeat stopped. A held claim is touched
  every ``HEARTBEAT_S`` seconds by a thread, so a claim untouched for ``STALE_AFTER_S`` is dead;
- a requeued SLURM job (the same job id, a higher ``SLURM_RESTART_COUNT``) takes over its own
  earlier attempt's claim at once.

The lock file is written whole under a temporary name and hard-linked into place: ``link`` fails
when the name exists (as ``O_CREAT | O_EXCL`` does) and is atomic on NFS too, and no reader ever
sees a half-written claim. Where the file system has no hard links (Colab's Google Drive mount
answers ``link`` with ENOSYS, other FUSE mounts with EOPNOTSUPP), the claim is made by an exclusive
create (``O_CREAT | O_EXCL``) and filled at once; a claim still empty or unparsable
``UNREADABLE_GRACE_S`` after it appeared names no worker and is stale.

Workers that find the same claim stale remove it one at a time, each under a takeover lock
(``.<hash>.claim.takeover``, an exclusive create) and each only after judging the claim again
under that lock. Without the lock, a worker that judged the stale claim a moment ago could remove
the fresh claim another worker put in its place, and both would train the run. The lock is held
for a few file operations; one older than ``TAKEOVER_STALE_S`` belongs to a worker that died
holding it and is removed.

The claim guards against wasted work, not against corrupt results: records are written atomically
and training is deterministic, so even two workers that both trained a hash would store the same
record.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import secrets
import socket
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

SUFFIX = ".claim"
HEARTBEAT_S = 60.0  # how often a held claim is touched
STALE_AFTER_S = 600.0  # a claim of another host untouched this long belongs to a dead worker
# an empty or unparsable claim names no worker to wait for: stale as soon as it is older than
# the moment an exclusive create (where hard links fail) takes between creating and filling it
UNREADABLE_GRACE_S = 2.0
# a takeover lock is held for a rename, a read and an unlink: one this old outlived its worker
TAKEOVER_STALE_S = 30.0
TAKEOVER_POLL_S = 0.01


def claim_path(store: str | Path, config_hash: str) -> Path:
    return Path(store) / f"{config_hash}{SUFFIX}"


def process_start_time(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, /proc/<pid>/stat field 22): with the
    pid it names one process even after the number is reused. None where there is no /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # fields after the command name, which may hold spaces


def owner() -> dict:
    """What a claim says about the worker holding it: host, pid, the pid's start time, the SLURM
    job id and attempt (its requeues), the time and a token that tells two claims apart."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "pid_start": process_start_time(pid),
            "job_id": os.environ.get("SLURM_JOB_ID"), "attempt": int(os.environ.get("SLURM_RESTART_COUNT") or 0),
            "time": time.time(), "token": secrets.token_hex(8)}


def describe(info: dict) -> str:
    if info.get("unreadable"):
        return f"an unreadable claim file ({'empty' if not info.get('token') else 'not a claim this module wrote'})"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("time", 0)))
    job = f", job {info['job_id']}" if info.get("job_id") else ""
    return f"{info.get('host', '?')} pid {info.get('pid', '?')}{job} since {since}"


def read_claim(store: str | Path, config_hash: str) -> dict | None:
    """The claim on ``config_hash`` (with ``age_s``: seconds since its last heartbeat), or None."""
    return _read(claim_path(store, config_hash))


def _read(path: Path) -> dict | None:
    try:
        text = path.read_text()
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return None
    try:
        info = json.loads(text)
    except json.JSONDecodeError:
        info = None
    if not isinstance(info, dict) or not {"host", "token"} <= set(info):
        # empty, cut short or foreign: its raw text stands for its token, so that a takeover
        # removes this very file and not a claim written in its place meanwhile
        info = {"unreadable": True, "host": None, "pid": None, "token": text}
    return {**info, "age_s": age}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def is_stale(info: dict, stale_after_s: float | None = None) -> bool:
    """Whether the worker of claim ``info`` is gone (module docstring)."""
    stale_after_s = STALE_AFTER_S if stale_after_s is None else stale_after_s
    if info.get("unreadable"):
        return info["age_s"] > UNREADABLE_GRACE_S
    mine = owner()
    if info.get("job_id") and info["job_id"] == mine["job_id"] and info.get("attempt", 0) < mine["attempt"]:
        return True  # this job's earlier attempt (requeued after a time limit or preemption)
    if info.get("host") == mine["host"] and isinstance(info.get("pid"), int):
        if not _pid_alive(info["pid"]):
            return True
        started = process_start_time(info["pid"])
        return bool(info.get("pid_start") and started and started != info["pid_start"])
    return info["age_s"] > stale_after_s


class Claim:
    """A held claim on one hash: ``release()`` it (or use it as a context manager). A thread
    touches the lock file every ``HEARTBEAT_S`` seconds so that other hosts see it alive."""

    def __init__(self, path: Path, info: dict, heartbeat_s: float | None = None):
        self.path, self.info = path, info
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, args=(HEARTBEAT_S if heartbeat_s is None else heartbeat_s,),
                                        daemon=True, name=f"claim {path.name}")
        self._thread.start()

    def _beat(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            if not self.held():
                log.warning("the claim %s was taken over by %s; this worker's record, if it finishes, is the "
                            "same numbers", self.path, describe(_read(self.path) or {}))
                return
            try:
                os.utime(self.path)
            except FileNotFoundError:
                return

    def held(self) -> bool:
        """Whether the lock file is still this claim's (not taken over as stale)."""
        current = _read(self.path)
        return current is not None and current.get("token") == self.info["token"]

    def release(self) -> None:
        self._stop.set()
        if self.held():
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> "Claim":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def try_claim(store: str | Path, config_hash: str, stale_after_s: float | None = None,
              heartbeat_s: float | None = None) -> Claim | None:
    """Claim ``config_hash`` in ``store``: a held ``Claim``, or None while a live worker holds it
    (``read_claim`` says who). A stale claim is taken over, with a warning."""
    path = claim_path(store, config_hash)
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(10):  # each pass either claims, finds a live holder, or removes one stale claim
        info = owner()
        if _create(path, info):
            return Claim(path, info, heartbeat_s)
        current = _read(path)
        if current is None:
            continue  # released meanwhile: try again
        if not is_stale(current, stale_after_s):
            return None
        if _remove_stale(path, stale_after_s):
            log.warning("taking over the stale claim on run %s of %s (its worker is gone)", config_hash,
                        describe(current))
    raise RuntimeError(f"could not claim run {config_hash} in {store}: its claim {path} kept changing")


# what os.link raises on a file system without hard links: Colab's Google Drive mount answers
# ENOSYS, other FUSE and network mounts EOPNOTSUPP / ENOTSUP or EPERM
NO_HARD_LINKS = frozenset({errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EPERM})


def _create(path: Path, info: dict) -> bool:
    """Put a complete claim file at ``path`` unless one is there (``_place``)."""
    tmp = path.with_name(f".{path.name}.{info['token']}.tmp")
    try:
        tmp.write_text(json.dumps(info))
        return _place(tmp, path)
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise OSError(err.errno, f"No space left on the disk of the run store {path.parent}: the claim "
                                     f"{path.name} could not be written; free some space and run again (the "
                                     f"store's records are intact)", str(path)) from err
        raise
    finally:
        tmp.unlink(missing_ok=True)


def _place(src: Path, path: Path) -> bool:
    """Give ``path`` the contents of ``src`` unless ``path`` exists; False if it does. Atomic
    either way: a hard link where the file system has them (readers never see a half-written
    claim), else an exclusive create (``O_CREAT | O_EXCL``) filled at once, which a reader may
    see empty for that moment (``UNREADABLE_GRACE_S``)."""
    try:
        os.link(src, path)
        return True
    except FileExistsError:
        return False
    except OSError as err:
        if err.errno not in NO_HARD_LINKS:
            raise
    data = src.read_bytes()
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)  # an empty or partial claim would block the run until it went stale
        raise
    os.close(fd)
    return True


def _remove_stale(path: Path, stale_after_s: float | None) -> bool:
    """Remove the claim at ``path`` if it is still stale when judged again under the takeover
    lock; False if it changed meanwhile (released, or replaced by a live worker's claim)."""
    with _takeover_lock(path):
        current = _read(path)
        if current is None or not is_stale(current, stale_after_s):
            return False
        # aside first, so that a claim put there between the read and now (only its own dying
        # worker's release makes room for one) is seen and put back rather than removed
        aside = path.with_name(f".{path.name}.{secrets.token_hex(8)}.stale")
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return False
        taken = _read(aside)
        if taken is None or taken.get("token") == current.get("token"):
            aside.unlink(missing_ok=True)
            return True
        if not _place(aside, path):
            log.warning("a claim on %s was replaced while it was being taken over; two workers may train it "
                        "(records stay correct: both compute the same numbers)", path)
        aside.unlink(missing_ok=True)
        return False


@contextlib.contextmanager
def _takeover_lock(path: Path):
    """Hold ``.<name>.takeover`` beside the claim ``path`` (an exclusive create), waiting while
    another worker holds it; a lock older than ``TAKEOVER_STALE_S`` is its dead holder's."""
    lock = path.with_name(f".{path.name}.takeover")
    while True:
        try:
            os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            break
        except FileExistsError:
            pass
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            continue  # released meanwhile
        if age > TAKEOVER_STALE_S:
            log.warning("removing the takeover lock %s: its worker died holding it %.0f s ago", lock, age)
            lock.unlink(missing_ok=True)
        else:
            time.sleep(TAKEOVER_POLL_S)
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)


def wait_for_claim(store: str | Path, config_hash: str, poll_s: float = 2.0, stale_after_s: float | None = None) -> Claim:
    """Claim ``config_hash``, waiting while a live worker holds it (saying who, once)."""
    said = False
    while True:
        claim = try_claim(store, config_hash, stale_after_s)
        if claim is not None:
            return claim
        if not said:
            info = read_claim(store, config_hash)
            if info is not None:
                log.info("run %s is being trained by %s; waiting for it", config_hash, describe(info))
                said = True
        time.sleep(poll_s)
