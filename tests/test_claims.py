"""Claims on runs in a shared store: one holder at a time, what a claim records, stale ones taken over."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time

from nodelm_lib.runs import claims


def dead_pid() -> int:
    """The pid of a process that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def plant(tmp_path, config_hash: str, **info) -> None:
    """A claim left by some other worker."""
    claims.claim_path(tmp_path, config_hash).write_text(json.dumps({"time": time.time(), "token": "theirs", **info}))


def test_one_holder_at_a_time_and_the_claim_says_who(tmp_path):
    claim = claims.try_claim(tmp_path, "abc")
    assert claim is not None and claim.held()
    info = claims.read_claim(tmp_path, "abc")
    assert (info["host"], info["pid"]) == (socket.gethostname(), os.getpid())
    assert abs(info["time"] - time.time()) < 60 and info["age_s"] < 60
    assert claims.try_claim(tmp_path, "abc") is None  # held by a live worker: this very process
    assert claims.try_claim(tmp_path, "other") is not None  # claims are per hash
    claim.release()
    assert claims.read_claim(tmp_path, "abc") is None
    with claims.try_claim(tmp_path, "abc") as again:  # free again
        assert again.held()
    assert not claims.claim_path(tmp_path, "abc").exists()  # released on leaving the block
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.claim"]  # no temporary files left


def race(store, claimants: int) -> list:
    """The claims won by ``claimants`` threads that all try to claim "abc" at the same moment."""
    start = threading.Barrier(claimants)
    won = []

    def claimant():
        start.wait()
        claim = claims.try_claim(store, "abc", stale_after_s=600)
        if claim is not None:
            won.append(claim)

    threads = [threading.Thread(target=claimant) for _ in range(claimants)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won


def test_of_many_simultaneous_claimants_exactly_one_wins(tmp_path):
    won = race(tmp_path, 8)
    assert len(won) == 1
    won[0].release()


def test_a_stale_claim_found_by_many_workers_at_once_is_taken_over_by_exactly_one(tmp_path):
    # the interleaving that once let two win (a late remover deleting the winner's fresh claim
    # while a third worker claimed the gap) is rare: many rounds give it many chances
    for round_ in range(25):
        store = tmp_path / str(round_)
        store.mkdir()
        plant(store, "abc", host="node-elsewhere", pid=1)
        old = time.time() - 3600
        os.utime(claims.claim_path(store, "abc"), (old, old))
        won = race(store, 6)
        assert len(won) == 1 and won[0].held(), f"round {round_}: {len(won)} workers hold the claim"
        won[0].release()
        assert sorted(p.name for p in store.iterdir()) == []  # no lock or set-aside file left


def test_a_worker_that_judged_a_claim_stale_a_moment_ago_never_removes_its_successor(tmp_path):
    plant(tmp_path, "abc", host=socket.gethostname(), pid=dead_pid())
    path = claims.claim_path(tmp_path, "abc")
    successor = claims.try_claim(tmp_path, "abc")
    assert successor is not None
    # a second worker, which judged the dead worker's claim stale before the takeover, acts now
    assert not claims._remove_stale(path, None) and successor.held()
    successor.release()
    path.write_text("")  # an exclusive create's claim, empty for the moment before it is filled
    assert not claims._remove_stale(path, None) and path.exists()


def test_a_takeover_lock_left_by_a_dead_worker_is_removed(tmp_path, caplog):
    plant(tmp_path, "abc", host=socket.gethostname(), pid=dead_pid())
    lock = tmp_path / ".abc.claim.takeover"
    lock.touch()
    old = time.time() - claims.TAKEOVER_STALE_S - 60
    os.utime(lock, (old, old))
    with caplog.at_level(logging.WARNING, logger="nodelm_lib.runs.claims"):
        claim = claims.try_claim(tmp_path, "abc")
    assert claim is not None and "died holding it" in caplog.text and not lock.exists()
    claim.release()


def test_a_takeover_waits_while_another_worker_holds_the_takeover_lock(tmp_path):
    plant(tmp_path, "abc", host=socket.gethostname(), pid=dead_pid())
    lock = tmp_path / ".abc.claim.takeover"
    lock.touch()
    releaser = threading.Timer(0.3, lock.unlink)
    started = time.monotonic()
    releaser.start()
    claim = claims.try_claim(tmp_path, "abc")
    assert claim is not None and time.monotonic() - started >= 0.25
    claim.release()


def test_a_dead_workers_claim_is_taken_over_with_a_warning(tmp_path, caplog):
    plant(tmp_path, "abc", host=socket.gethostname(), pid=dead_pid())
    assert claims.is_stale(claims.read_claim(tmp_path, "abc"))
    with caplog.at_level(logging.WARNING, logger="nodelm_lib.runs.claims"):
        claim = claims.try_claim(tmp_path, "abc")
    assert claim is not None and claims.read_claim(tmp_path, "abc")["pid"] == os.getpid()
    assert "taking over the stale claim on run abc" in caplog.text
    claim.release()


def test_a_live_worker_on_this_host_keeps_its_claim(tmp_path):
    plant(tmp_path, "abc", host=socket.gethostname(), pid=os.getppid(), pid_start=claims.process_start_time(os.getppid()))
    assert claims.try_claim(tmp_path, "abc") is None
    # the same pid number, but another process started under it: the claimant is gone
    plant(tmp_path, "abc", host=socket.gethostname(), pid=os.getppid(), pid_start="1")
    assert claims.is_stale(claims.read_claim(tmp_path, "abc"))


def test_another_hosts_claim_is_stale_once_its_heartbeat_stops(tmp_path):
    plant(tmp_path, "abc", host="node-elsewhere", pid=1)
    assert claims.try_claim(tmp_path, "abc", stale_after_s=600) is None  # fresh: alive
    old = time.time() - 3600
    os.utime(claims.claim_path(tmp_path, "abc"), (old, old))
    claim = claims.try_claim(tmp_path, "abc", stale_after_s=600)
    assert claim is not None
    claim.release()


def test_a_held_claim_beats_and_notices_a_takeover(tmp_path):
    claim = claims.try_claim(tmp_path, "abc", heartbeat_s=0.05)
    path = claims.claim_path(tmp_path, "abc")
    old = time.time() - 3600
    os.utime(path, (old, old))
    deadline = time.time() + 10
    while path.stat().st_mtime < time.time() - 60:  # the heartbeat touches the file
        assert time.time() < deadline, "the claim was never touched"
        time.sleep(0.02)
    plant(tmp_path, "abc", host="node-elsewhere", pid=1)  # taken over as stale by another worker
    assert not claim.held()
    claim.release()
    assert path.exists()  # releasing never removes someone else's claim


def test_a_requeued_slurm_job_takes_over_its_own_earlier_claim(tmp_path, monkeypatch):
    plant(tmp_path, "abc", host="node-elsewhere", pid=1, job_id="4242", attempt=0)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert claims.is_stale(claims.read_claim(tmp_path, "abc"))
    monkeypatch.setenv("SLURM_JOB_ID", "4243")  # another job: wait for the heartbeat
    assert not claims.is_stale(claims.read_claim(tmp_path, "abc"))
