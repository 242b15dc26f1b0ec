"""What a ``pgroup`` close reads (issue 35, item 5): an environment set up
empty is a "no" at once (a look no longer spends its 50 ms budget waiting on
another job's native keeper, exec'd with no environment), and the job's close
takes the members its caller has just captured instead of capturing the whole
process table again (a PTY close reads the table once in its owner).

Real processes throughout; the table reads are counted by wrapping
``identity.capture`` (the real function still runs)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

import tether
from tether import identity
from tether.pty import PtySession

pytestmark = pytest.mark.skipif(not identity._LINUX, reason="reads /proc")


def _execd(p: subprocess.Popen, comm: str = "sleep") -> identity.Identity:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        i = identity.read(p.pid)
        if i is not None and i.comm == comm:
            return i
        time.sleep(0.01)
    raise AssertionError(f"pid {p.pid} never became {comm}")


def test_an_environment_set_up_empty_is_told_from_one_being_torn_down(procs) -> None:
    empty = procs.popen(["sleep", "30"], env={})
    full = procs.popen(["sleep", "30"])
    dying = procs.popen(["sleep", "30"], env={})
    for p in (empty, full, dying):
        _execd(p)
    dying.kill()  # not waited for: a zombie, whose memory (and environment) is gone
    deadline = time.monotonic() + 5
    while (identity.read(dying.pid) or identity.Identity((0, 0, ""))).state != "Z":
        assert time.monotonic() < deadline, "the killed process never became a zombie"
        time.sleep(0.01)
    # Both read as nothing at all...
    assert identity.environ_has(empty.pid, b"X=1") is None
    assert identity.environ_has(dying.pid, b"X=1") is None
    # ...but only one was set up empty; the others are not called so.
    assert identity.environ_empty(empty.pid)
    assert not identity.environ_empty(dying.pid)
    assert not identity.environ_empty(full.pid)


def test_a_pgroup_look_does_not_wait_on_an_empty_environment(procs) -> None:
    job = tether.Job(mechanism="pgroup")
    try:
        member = job.popen(["sleep", "30"])
        # A child of this process (an adopter: its environment is asked),
        # born after the job opened, exec'd with no environment at all.
        stranger = procs.popen(["sleep", "30"], env={})
        s = _execd(stranger)
        _execd(member)
        pids = job.member_pids()
        assert member.pid in pids and stranger.pid not in pids
        # A settled "no", remembered: the old look took the empty read for a
        # process inside exec, waited its whole budget (0.05 s) on it, and
        # asked again at every look.
        assert job._backend.mech.env_seen.get((s.pid, s.start)) is False
    finally:
        job.close()
    assert identity.is_alive(identity.read(stranger.pid))  # never the job's


def forked_keeper(job: tether.Job) -> int:
    """The job's keeper's pid; skips unless it was forked from here (then
    it runs this test's wrapper of ``identity.capture``). A multi-threaded
    owner (an xdist worker) has its keepers forked by a warden process."""
    keeper = job.trace()["keeper_pid"]
    k = identity.read(keeper)
    if job.trace().get("keeper") != "python" or k is None or k.ppid != os.getpid():
        pytest.skip("the keeper was not forked from this process: its captures are not seen")
    return keeper


class Calls(list):
    """Times of ``identity.capture`` calls in this process; ``log``: every
    call's pid, in a file - a keeper forked from here inherits the wrapper,
    so its captures are there too."""

    log: Path

    def by(self, pid: int) -> int:
        return self.log.read_text().split().count(str(pid))


@pytest.fixture
def captures(monkeypatch, tmp_path):
    calls = Calls()
    calls.log = tmp_path / "captures.log"
    calls.log.touch()
    real = identity.capture
    me = os.getpid()

    def counting(**kw):
        if os.getpid() == me:
            calls.append(time.monotonic())
        with open(calls.log, "a") as f:
            f.write(f"{os.getpid()}\n")
        return real(**kw)

    monkeypatch.setattr(identity, "capture", counting)
    return calls


def test_job_close_with_known_members_reads_no_table(procs, captures) -> None:
    job = tether.Job(mechanism="pgroup")
    p = job.popen(["sleep", "30"])
    ident = _execd(p)
    n = len(captures)
    closed = job.close(known=[ident])
    assert len(captures) == n  # the owner read no table
    assert not identity.is_alive(ident)
    assert ident in closed and not closed.left
    # Control: without ``known`` the same close reads the table.
    job2 = tether.Job(mechanism="pgroup")
    ident2 = _execd(job2.popen(["sleep", "30"]))
    n = len(captures)
    closed2 = job2.close()
    assert len(captures) > n
    assert not identity.is_alive(ident2) and ident2.pid in [i.pid for i in closed2]


def test_a_pgroup_pty_close_captures_the_table_once_in_its_owner(procs, captures) -> None:
    s = PtySession(["/bin/sh", "-c", "for i in 1 2 3; do sleep 30 & done; echo READY; wait"],
                   env=procs.env(), mechanism="pgroup")
    try:
        s.read_until(b"READY", 20)
        deadline = time.monotonic() + 10
        while len([i for i in procs.alive() if i.comm == "sleep"]) < 3:
            assert time.monotonic() < deadline, "the session's sleeps never started"
            time.sleep(0.01)
        n = len(captures)
        keeper = forked_keeper(s.job)
        r = s.close("immediate")
        assert r.ok and len(r.captured) == 3
        assert len(captures) - n == 1  # the PTY's own capture; the job's close reuses it
        # ...and so does the keeper's kill loop: it reads only what was
        # created since the owner's look (the old loop captured the table).
        assert captures.by(keeper) == 0
        assert not [i for i in procs.alive() if i.comm == "sleep"]
    finally:
        s.close("immediate")
        if s.job is not None:
            s.job.close()


def test_control_a_keepers_close_without_the_owners_look_captures_the_table(captures) -> None:
    """The check above can fail: the same keeper, closed with no look of
    the owner's, captures the table (and its captures are logged here)."""
    job = tether.Job(mechanism="pgroup")
    try:
        keeper = forked_keeper(job)
    except BaseException:
        job.close()
        raise
    _execd(job.popen(["sleep", "30"]))
    job._backend.close()  # the backend's close alone: no look handed over
    job.close()
    assert captures.by(keeper) >= 1
