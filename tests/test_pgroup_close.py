"""What a ``pgroup`` close reads (issue 35, item 5): an environment set up
empty is a "no" at once (a look no longer spends its 50 ms budget waiting on
another job's native keeper, exec'd with no environment), and the job's close
takes the members its caller has just captured instead of capturing the whole
process table again, nor does the keeper's kill loop, which starts from the
owner's look: a PTY close scans the table once.

Real processes throughout; the table reads are counted by wrapping
``sparse_capture.capture`` (the real function still runs)."""

from __future__ import annotations

import subprocess
import time

import pytest

import tether
from tether import identity, sparse_capture

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


@pytest.fixture
def captures(monkeypatch):
    """Times of this process's captures of the table for a close
    (``sparse_capture.capture``; the real one runs)."""
    calls: list[float] = []
    real = sparse_capture.capture

    def counting(**kw):
        calls.append(time.monotonic())
        return real(**kw)

    monkeypatch.setattr(sparse_capture, "capture", counting)
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


# In a fresh, single-threaded owner, so that its keeper is forked from it and
# inherits the wrapper (an xdist worker has its keepers forked by a warden):
# each capture for a close (sparse_capture.capture) is logged with its caller's pid.
_OWNER = r"""
import json, os, sys, time
from tether import identity, sparse_capture
import tether
from tether.pty import PtySession

log, mode = sys.argv[1], sys.argv[2]
real = sparse_capture.capture
def counting(**kw):
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\n")
    return real(**kw)
sparse_capture.capture = counting

def sleeps(born, root):
    return [i for i in real(born_after=born).descendants([root])
            if i.comm == "sleep" and i.state not in "ZXx"]

if mode == "pty":
    s = PtySession(["/bin/sh", "-c", "for i in 1 2 3; do sleep 30 & done; echo READY; wait"],
                   mechanism="pgroup")
    s.read_until(b"READY", 20)
    deadline = time.monotonic() + 10
    while len(tree := sleeps(s.born_after, s.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    keeper = s.job.trace()["keeper_pid"]
    open(log, "w").close()
    r = s.close("immediate")
    out = {"ok": r.ok, "captured": len(r.captured)}
    left = [i for i in tree if identity.is_alive(i)]
else:  # the job's close alone: no look of the owner's handed over
    job = tether.Job(mechanism="pgroup")
    keeper = job.trace()["keeper_pid"]
    p = job.popen(["sleep", "30"])
    time.sleep(0.2)
    open(log, "w").close()
    job.close()
    out = {"ok": True, "captured": 1}
    left = [i for i in [identity.read(p.pid)] if i is not None and i.state not in "ZXx"]
pids = open(log).read().split()
out.update(owner=pids.count(str(os.getpid())),
           keeper=pids.count(str(keeper)), left=len(left))
print(json.dumps(out), flush=True)
"""


def _owner(procs, tmp_path, mode: str) -> dict:
    import json
    import sys

    p = procs.popen([sys.executable, "-c", _OWNER, str(tmp_path / "captures.log"), mode],
                    stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0, out
    return json.loads(out)


def test_a_pgroup_pty_close_scans_the_table_once(procs, tmp_path) -> None:
    r = _owner(procs, tmp_path, "pty")
    assert r["ok"] and r["captured"] == 3 and r["left"] == 0
    # The PTY's own capture; the job's close and the keeper's kill loop
    # reuse it: the keeper reads only what was created since the owner's look.
    assert r["owner"] == 1, r
    assert r["keeper"] == 0, r


def test_control_a_keepers_close_without_the_owners_look_scans_the_table(procs, tmp_path) -> None:
    """The check above can fail: the same keeper, closed with no look of the
    owner's, captures the table - and its captures are seen."""
    r = _owner(procs, tmp_path, "job")
    assert r["left"] == 0
    assert r["keeper"] >= 1, r
