"""Claims on a file system without hard links (Colab's Drive mount answers os.link with ENOSYS,
other FUSE mounts with EOPNOTSUPP): made by exclusive create, with the guarantees of test_claims.py."""

from __future__ import annotations

import errno
import os

import pytest

import test_claims as with_links  # the same checks, run here with os.link failing
from nodelm_lib.runs import claims

# every test of test_claims.py that creates, takes over or puts back a claim file
GUARANTEES = ["test_one_holder_at_a_time_and_the_claim_says_who", "test_of_many_simultaneous_claimants_exactly_one_wins",
              "test_a_dead_workers_claim_is_taken_over_with_a_warning", "test_a_live_worker_on_this_host_keeps_its_claim",
              "test_another_hosts_claim_is_stale_once_its_heartbeat_stops", "test_a_held_claim_beats_and_notices_a_takeover",
              "test_a_stale_claim_found_by_many_workers_at_once_is_taken_over_by_exactly_one",
              "test_a_worker_that_judged_a_claim_stale_a_moment_ago_never_removes_its_successor"]


@pytest.fixture(params=[errno.ENOSYS, errno.EOPNOTSUPP], ids=["ENOSYS", "EOPNOTSUPP"])
def no_hard_links(request, monkeypatch) -> list:
    """``os.link`` failing as on a file system without hard links; returns the calls it got."""
    calls = []

    def refuse(src, dst, *args, **kwargs):
        calls.append((src, dst))
        raise OSError(request.param, os.strerror(request.param), str(src), None, str(dst))

    monkeypatch.setattr(os, "link", refuse)
    return calls


@pytest.mark.parametrize("name", GUARANTEES)
def test_the_claim_guarantees_hold_without_hard_links(no_hard_links, name, tmp_path, request):
    test = getattr(with_links, name)
    kwargs = {"tmp_path": tmp_path}
    if "caplog" in test.__code__.co_varnames[:test.__code__.co_argcount]:
        kwargs["caplog"] = request.getfixturevalue("caplog")
    test(**kwargs)
    assert no_hard_links  # the hard link was tried, refused, and the exclusive create took over


def test_an_exclusive_create_never_replaces_a_claim(no_hard_links, tmp_path):
    first = claims.try_claim(tmp_path, "abc")
    assert first is not None and claims.read_claim(tmp_path, "abc")["token"] == first.info["token"]
    assert claims.try_claim(tmp_path, "abc") is None and first.held()
    first.release()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no temporary files left


def test_other_link_errors_are_not_taken_for_a_missing_feature(tmp_path, monkeypatch):
    def no_space(src, dst, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "link", no_space)
    with pytest.raises(OSError, match="No space left"):
        claims.try_claim(tmp_path, "abc")
