"""Tests of the orphan reaper (tether.reaper) with real processes.

Real leftovers: an owner process opens a Job with an audit log, starts a tree,
and then the owner and its keeper are SIGKILLed together (keeper first), so
nothing ends the tree -- the control asserts the tree survived -- and the
reaper must end it. Synthetic audit records name real processes this test
started (PID reuse, background, detached, live owners); nothing here ever
names a process the test did not start.

Every process carries the ``procs`` fixture's mark and is ended by its
finalizer (conftest.py); stale cgroups a test made are removed by its own
finalizer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import procutil
import pytest
from procutil import poll_until as wait_until

from tether import audit, gate, identity, reaper
from tether.identity import Identity

pytestmark = [pytest.mark.mechanism, pytest.mark.timeout(60)]

IS_LINUX = sys.platform.startswith("linux")
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
GRACE = 0.5

# The owner: opens a job with an audit log, starts a tree, prints the
# identities of everything, then waits to be killed.
OWNER = r"""
import json, os, subprocess, sys, time
from tether import Job, gate, identity

mech, state = sys.argv[1], sys.argv[2]
job = Job(name="reap-test", mechanism=mech, state_dir=state, session="sess-1", grace=0.1)
plain = job.popen(["sleep", "300"], stdin=subprocess.DEVNULL)
# A shell with a background child and a setsid child (new session): descendants.
tree = job.popen(["/bin/sh", "-c", "sleep 300 & setsid sleep 300 & wait"], stdin=subprocess.DEVNULL)
# Ignores SIGTERM, and so does its child: only SIGKILL (or cgroup.kill) ends them.
stubborn = job.popen(["/bin/sh", "-c", "trap '' TERM; sleep 300 & wait"], stdin=subprocess.DEVNULL)
escapee = None
if mech == "cgroup":
    # A setsid escapee whose parent exits: linked to the run only by its cgroup.
    p = job.popen(["/bin/sh", "-c", "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!"],
                  stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    escapee = int(p.stdout.readline())
    p.wait()
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    if len(identity.children(tree.pid)) >= 2 and len(identity.children(stubborn.pid)) >= 1:
        break
    time.sleep(0.005)
time.sleep(0.05)  # let the shells' children exec and set their traps
def ident(pid):
    i = identity.read(pid)
    return None if i is None else i.to_dict()
me = identity.read(os.getpid())
print(json.dumps({
    "owner": ident(os.getpid()),
    "run": f"{os.getpid()}-{me.start}",
    "keeper": ident(job.trace()["keeper_pid"]),
    "cgroup": job.trace().get("cgroup_path"),
    "plain": ident(plain.pid),
    "tree": ident(tree.pid),
    "tree_kids": [ident(c) for c in identity.children(tree.pid)],
    "stubborn": ident(stubborn.pid),
    "stubborn_kids": [ident(c) for c in identity.children(stubborn.pid)],
    "escapee": ident(escapee) if escapee else None,
}), flush=True)
time.sleep(600)
"""


def available(name: str) -> bool:
    from tether.platform import probe

    return probe(name).available


def do_reap(state: Path, **kw) -> reaper.ReapReport:
    # cgroup_dirs=(): only the stale cgroups this test's audit log names; other
    # test suites on this machine keep their own tether-* run dirs.
    kw.setdefault("grace", GRACE)
    kw.setdefault("cgroup_dirs", ())
    return reaper.reap(state, **kw)


def read_line(p: subprocess.Popen, timeout: float = 30) -> str:
    return procutil.read_line(p, timeout, "owner")


def ids(info: dict) -> list[Identity]:
    out = [info["plain"], info["tree"], *info["tree_kids"], info["stubborn"], *info["stubborn_kids"]]
    if info.get("escapee"):
        out.append(info["escapee"])
    return [Identity.from_dict(d) for d in out]



@pytest.fixture
def cgroups_made():
    """Stale cgroup dirs a test made; removed (members killed) at the end."""
    made: list[str] = []
    yield made
    from tether import cgroupfs as lc

    for path in reversed(made):  # parents were listed first
        if os.path.isdir(path):
            lc.kill(path, timeout=3)  # only this test's processes are in it
            lc.remove_tree(path)


def leave_leftovers(procs, state: Path, mech: str) -> tuple[dict, list[Identity]]:
    """Start an owner, then SIGKILL its keeper and itself: the tree is left over."""
    owner = procs.popen([sys.executable, "-c", OWNER, mech, str(state)],
                        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    info = json.loads(read_line(owner))
    keeper = Identity.from_dict(info["keeper"])
    # Keeper first: killed after the owner it would end the job within ~2 ms.
    assert gate.send_signal(keeper, signal.SIGKILL, member=True)
    assert wait_until(lambda: not identity.is_alive(keeper))
    owner.kill()
    owner.wait(timeout=10)
    return info, ids(info)


@pytest.mark.parametrize("mech", ["subreaper", "pgroup"])
def test_real_leftovers_are_reaped(procs, tmp_path: Path, mech: str) -> None:
    if not available(mech):
        pytest.skip(f"{mech} not available here")
    state = tmp_path / "state"
    info, left = leave_leftovers(procs, state, mech)
    # Control: with owner and keeper dead, nothing ends the tree by itself.
    time.sleep(0.3)
    assert all(identity.is_alive(i) for i in left), "control: the leftovers must survive"
    assert len(left) == 6

    report = do_reap(state, grace=1.0)

    assert wait_until(lambda: not any(identity.is_alive(i) for i in left))
    assert info["run"] in report.runs_over
    by_pid = {e.pid: e for e in report.ended}
    assert set(by_pid) == {i.pid for i in left}, report
    tree, stubborn = info["tree"]["pid"], info["stubborn"]["pid"]
    for e in report.ended:
        assert e.run == info["run"]
        assert e.session == "sess-1"
        assert e.job and e.job.startswith("j")
        assert e.runtime_s > 0
        assert e.comm in ("sleep", "sh", "setsid")
    # Descendants are attributed to the recorded process they descend from.
    for kid in info["tree_kids"]:
        assert by_pid[kid["pid"]].via == tree
        assert by_pid[kid["pid"]].how == "SIGTERM"
    # The TERM-ignoring pair needed SIGKILL, after the grace period.
    assert by_pid[stubborn].how == "SIGKILL"
    assert by_pid[info["stubborn_kids"][0]["pid"]].how == "SIGKILL"
    assert by_pid[info["plain"]["pid"]].how == "SIGTERM"
    # Bottom-up: a child is listed (ended) before its parent.
    order = [e.pid for e in report.ended]
    for kid in info["tree_kids"]:
        assert order.index(kid["pid"]) < order.index(tree)
    assert not report.skipped and report.ok
    # Each ended process is recorded in the audit log.
    reaps = [r for r in audit.iter_records(state) if r["event"] == "reap"]
    assert {r["pid"] for r in reaps} == {i.pid for i in left}
    assert all(r["run"] == info["run"] and r["owner"]["pid"] == info["owner"]["pid"] for r in reaps)
    # A second reap finds nothing left to do.
    again = do_reap(state)
    assert again.ended == [] and again.skipped == []


@pytest.mark.skipif(not IS_ROOT, reason="cgroup v2 is writable only by root here")
def test_stale_cgroup_is_killed_and_removed(procs, tmp_path: Path, cgroups_made) -> None:
    if not available("cgroup"):
        pytest.skip("cgroup v2 not writable here")
    state = tmp_path / "state"
    info, left = leave_leftovers(procs, state, "cgroup")
    cg = info["cgroup"]
    run_dir = os.path.dirname(cg)
    cgroups_made.extend([run_dir, cg])
    esc = Identity.from_dict(info["escapee"])
    # Control: the escapee has left every parent link; only its cgroup holds it.
    time.sleep(0.3)
    assert all(identity.is_alive(i) for i in left), "control: the leftovers must survive"
    recorded = {info["plain"]["pid"], info["tree"]["pid"], info["stubborn"]["pid"]}
    assert identity.read(esc.pid).ppid not in recorded
    from tether import cgroupfs as lc

    assert lc.populated(cg)
    members = {int(x) for x in Path(cg, "cgroup.procs").read_text().split()}
    assert {i.pid for i in left} <= members

    report = do_reap(state)

    assert wait_until(lambda: not any(identity.is_alive(i) for i in left))
    assert not os.path.exists(cg) and not os.path.exists(run_dir)
    assert cg in report.cgroups_removed and run_dir in report.cgroups_removed
    by_pid = {e.pid: e for e in report.ended}
    assert set(by_pid) == {i.pid for i in left}, report
    assert by_pid[esc.pid].cgroup == cg and by_pid[esc.pid].via is None
    # cgroup members that ignore SIGTERM are ended by cgroup.kill.
    assert by_pid[info["stubborn"]["pid"]].how == "cgroup.kill"
    assert by_pid[info["plain"]["pid"]].how == "SIGTERM"
    assert report.ok


@pytest.mark.skipif(not IS_ROOT, reason="cgroup v2 is writable only by root here")
def test_stale_cgroup_without_audit_is_found_by_scanning(procs, tmp_path: Path,
                                                       cgroups_made) -> None:
    """No audit log at all: a tether run dir whose owner is gone is proof enough."""
    from tether import cgroupfs as lc

    if not available("cgroup"):
        pytest.skip("cgroup v2 not writable here")
    base, _ = lc.base_dir()
    # A private parent, so the scan sees only this test's run dirs.
    parent = os.path.join(base, f"reaper-test-{os.getpid()}-{time.monotonic_ns()}")
    dead = _dead_owner(procs)
    me = identity.read(os.getpid())
    stale = os.path.join(parent, f"tether-{dead.pid}-{dead.start}")
    live = os.path.join(parent, f"tether-{me.pid}-{me.start}")
    j1, j1sub = os.path.join(stale, "j1"), os.path.join(stale, "j1", "j1-sub")
    j3, j3bg = os.path.join(stale, "j3"), os.path.join(stale, "j3", "j4.bg")
    dirs = [parent, stale, j1, j1sub, os.path.join(stale, "j2.bg"), j3, j3bg,
            live, os.path.join(live, "j1")]
    for d in dirs:
        os.mkdir(d)
        cgroups_made.append(d)

    def put(d: str) -> Identity:
        _, ident = _spawn_sleep(procs)
        Path(d, "cgroup.procs").write_text(str(ident.pid))
        return ident

    doomed = put(j1)
    doomed_sub = put(j1sub)  # a nested job: killed with its outer one
    background = put(os.path.join(stale, "j2.bg"))
    outer = put(j3)  # its nested job is background: ended alone, the dir stays
    nested_bg = put(j3bg)
    mine = put(os.path.join(live, "j1"))
    empty_stale = os.path.join(parent, f"tether-{dead.pid}-{dead.start + 1}")
    os.mkdir(empty_stale)
    cgroups_made.append(empty_stale)

    gone = {doomed.pid, doomed_sub.pid, outer.pid}
    dry = do_reap(tmp_path / "no-log", cgroup_dirs=[parent], dry_run=True)
    assert {e.pid for e in dry.ended} == gone and identity.is_alive(doomed)

    report = do_reap(tmp_path / "no-log", grace=0, cgroup_dirs=[parent])

    assert not any(identity.is_alive(i) for i in (doomed, doomed_sub, outer))
    for i in (background, nested_bg, mine):
        assert identity.is_alive(i)
    by_pid = {e.pid: e for e in report.ended}
    assert set(by_pid) == gone
    e = by_pid[doomed.pid]
    assert (e.run, e.job, e.cgroup, e.how) == (f"{dead.pid}-{dead.start}", "j1", j1, "cgroup.kill")
    assert (by_pid[doomed_sub.pid].job, by_pid[doomed_sub.pid].how) == ("j1-sub", "cgroup.kill")
    assert (by_pid[outer.pid].cgroup, by_pid[outer.pid].how) == (j3, "SIGKILL")
    sk = skipped(report)
    assert sk[background.pid] == reaper.BACKGROUND and sk[nested_bg.pid] == reaper.BACKGROUND
    assert set(report.cgroups_removed) == {j1, empty_stale}
    assert not os.path.exists(j1)
    assert os.path.isdir(j3bg) and os.path.isdir(live)  # kept: background job, live owner


def _spawn_sleep(procs, **kw) -> tuple[subprocess.Popen, Identity]:
    p = procs.popen(["sleep", "300"], stdin=subprocess.DEVNULL, **kw)
    ident = identity.read(p.pid)
    assert ident is not None
    return p, ident


def _dead_owner(procs) -> Identity:
    """The identity of a process that existed and is now gone."""
    p, ident = _spawn_sleep(procs)
    p.kill()
    p.wait(timeout=5)
    assert not identity.is_alive(ident)
    return ident


class Log:
    """Writes audit records of one synthetic run."""

    def __init__(self, state: Path, owner: Identity, run: str | None = None) -> None:
        self.w = audit.AuditWriter(state)
        self.owner = {"pid": owner.pid, "start": owner.token()}
        self.run = run or f"{owner.pid}-{owner.start}"

    def spawn(self, ident: Identity, start: int | None = None, job: str = "j1", **kw) -> None:
        tok = f"{ident.start if start is None else start}@{ident.boot}"
        assert self.w.write("spawn", run=self.run, owner=self.owner, job=job, pid=ident.pid,
                            start=tok, boot=ident.boot, uid=ident.uid, mechanism="subreaper",
                            in_job=True, **kw)

    def event(self, event: str, **kw) -> None:
        assert self.w.write(event, run=self.run, owner=self.owner, **kw)


def skipped(report: reaper.ReapReport) -> dict[int, str]:
    return {s.pid: s.reason for s in report.skipped}


def test_pid_reuse_is_never_touched(procs, tmp_path: Path) -> None:
    state = tmp_path / "state"
    log = Log(state, _dead_owner(procs))
    _, victim = _spawn_sleep(procs)  # alive, but not the process the record names
    _, control = _spawn_sleep(procs)
    log.spawn(victim, start=victim.start - 1)
    log.spawn(control)

    report = do_reap(state)

    assert identity.is_alive(victim)
    assert skipped(report)[victim.pid] == reaper.PID_REUSED
    # Control: the same run's matching record was acted on.
    assert not identity.is_alive(control)
    assert [e.pid for e in report.ended] == [control.pid]


def test_pid_reused_after_run_end_says_so(procs, tmp_path: Path) -> None:
    state = tmp_path / "state"
    owner = _dead_owner(procs)
    log = Log(state, owner)
    log.event("run-end")
    time.sleep(0.05)
    _, later = _spawn_sleep(procs)
    # A record naming later's pid with a start before the run ended.
    log.spawn(later, start=owner.start)
    report = do_reap(state)
    assert identity.is_alive(later)
    (s,) = report.skipped
    assert s.reason == reaper.PID_REUSED and "after its run ended" in s.detail
    assert report.ended == []


def test_background_and_detached_are_never_touched(procs, tmp_path: Path) -> None:
    state = tmp_path / "state"
    log = Log(state, _dead_owner(procs))
    _, bg = _spawn_sleep(procs)
    _, det = _spawn_sleep(procs)
    _, bg_job = _spawn_sleep(procs)
    _, control = _spawn_sleep(procs)
    log.spawn(bg, background=True)
    log.spawn(det, job="j2", detached=True)
    log.event("job-open", job="jbg", background=True)
    log.spawn(bg_job, job="jbg")  # background by its job's record
    log.spawn(control, job="j3")
    # A leftover shell whose child was launched detached: the shell is ended,
    # the detached child is not (the descendant walk stops at it).
    sh = procs.popen(["/bin/sh", "-c", "sleep 300 & wait"], stdin=subprocess.DEVNULL)
    assert wait_until(lambda: len(identity.children(sh.pid)) == 1)
    sh_ident = identity.read(sh.pid)
    kid = identity.read(identity.children(sh.pid)[0])
    log.spawn(sh_ident, job="j4")
    log.spawn(kid, job="j5", detached=True)

    report = do_reap(state)

    for i in (bg, det, bg_job, kid):
        assert identity.is_alive(i)
    sk = skipped(report)
    assert sk[bg.pid] == reaper.BACKGROUND
    assert sk[bg_job.pid] == reaper.BACKGROUND
    assert sk[det.pid] == reaper.DETACHED
    assert sk[kid.pid] == reaper.DETACHED
    assert not identity.is_alive(control) and not identity.is_alive(sh_ident)
    assert {e.pid for e in report.ended} == {control.pid, sh_ident.pid}


def test_live_owner_and_excluded_runs_are_never_touched(procs, tmp_path: Path) -> None:
    state = tmp_path / "state"
    _, live_owner = _spawn_sleep(procs)
    live = Log(state, live_owner)
    _, mine = _spawn_sleep(procs)
    live.spawn(mine)
    excl = Log(state, _dead_owner(procs), run="excluded-run")
    _, kept = _spawn_sleep(procs)
    excl.spawn(kept)
    over = Log(state, _dead_owner(procs))
    _, control = _spawn_sleep(procs)
    over.spawn(control)
    over.spawn(mine, job="j9")  # also claimed by an over run: the live run's claim wins

    report = do_reap(state, exclude_runs={"excluded-run"})

    assert identity.is_alive(mine) and identity.is_alive(kept) and identity.is_alive(live_owner)
    sk = skipped(report)
    assert sk[mine.pid] == reaper.OWNER_ALIVE
    assert sk[kept.pid] == reaper.EXCLUDED
    assert live.run in report.runs_live
    assert not identity.is_alive(control)
    assert [e.pid for e in report.ended] == [control.pid]


def test_live_run_inside_a_leftover_is_never_touched(procs, tmp_path: Path) -> None:
    """A leftover shell started a new owner: the shell goes, the live run stays."""
    state = tmp_path / "state"
    over = Log(state, _dead_owner(procs))
    sh = procs.popen(["/bin/sh", "-c", "sleep 300 & wait"], stdin=subprocess.DEVNULL)
    assert wait_until(lambda: len(identity.children(sh.pid)) == 1)
    sh_ident = identity.read(sh.pid)
    live_owner = identity.read(identity.children(sh.pid)[0])
    over.spawn(sh_ident)
    Log(state, live_owner).event("job-open", job="jx")

    report = do_reap(state)

    assert identity.is_alive(live_owner)
    assert not identity.is_alive(sh_ident)
    assert skipped(report)[live_owner.pid] == reaper.OWNER_ALIVE
    assert [e.pid for e in report.ended] == [sh_ident.pid]


@pytest.mark.skipif(not IS_ROOT, reason="needs root to start a process as another user")
def test_other_users_process_is_never_touched(procs, tmp_path: Path) -> None:
    state = tmp_path / "state"
    log = Log(state, _dead_owner(procs))
    _, other = _spawn_sleep(procs, user=65534)
    _, control = _spawn_sleep(procs)
    assert other.uid == 65534
    log.spawn(other)
    log.spawn(control)
    report = do_reap(state)
    assert identity.is_alive(other)
    assert skipped(report)[other.pid] == reaper.OTHER_USER
    assert not identity.is_alive(control)


def test_dry_run_ends_nothing(procs, tmp_path: Path) -> None:
    state = tmp_path / "state"
    log = Log(state, _dead_owner(procs))
    sh = procs.popen(["/bin/sh", "-c", "sleep 300 & wait"], stdin=subprocess.DEVNULL)
    assert wait_until(lambda: len(identity.children(sh.pid)) == 1)
    sh_ident = identity.read(sh.pid)
    kid = identity.read(identity.children(sh.pid)[0])
    log.spawn(sh_ident)

    dry = do_reap(state, dry_run=True)

    assert dry.dry_run
    assert {e.pid: e.how for e in dry.ended} == {sh_ident.pid: "dry-run", kid.pid: "dry-run"}
    assert identity.is_alive(sh_ident) and identity.is_alive(kid)
    assert not [r for r in audit.iter_records(state) if r["event"] == "reap"]
    # Control: the same reap, for real, ends both.
    real = do_reap(state)
    assert {e.pid for e in real.ended} == {sh_ident.pid, kid.pid}
    assert not identity.is_alive(sh_ident) and not identity.is_alive(kid)


def test_corrupt_and_truncated_lines_do_not_break_reaping(procs, tmp_path: Path) -> None:
    state = tmp_path / "state"
    owner = _dead_owner(procs)
    log = Log(state, owner)
    _, a = _spawn_sleep(procs)
    _, b = _spawn_sleep(procs)
    log.spawn(a)
    log.w.close()
    live = state / "audit.jsonl"
    with open(live, "ab") as f:
        f.write(b"not json at all\n")
        f.write(b"\x00\xff\xfe garbage\n")
        f.write(b'["a", "list"]\n')
        # Well-formed JSON with fields of the wrong types.
        f.write(json.dumps({"v": 1, "ts": 1, "event": "spawn", "run": 5, "pid": "x",
                            "owner": [1, 2], "start": 7}).encode() + b"\n")
        f.write(json.dumps({"v": 1, "ts": 1, "event": "spawn", "run": "r", "pid": a.pid,
                            "owner": {"pid": "1", "start": None}, "start": {"x": 1}}).encode()
                + b"\n")
        # A newer schema's record with unknown fields: still read.
        rec = {"v": 99, "ts": 1, "event": "spawn", "run": log.run, "owner": log.owner,
               "pid": b.pid, "start": b.token(), "boot": b.boot, "future": {"x": [1]}}
        f.write(json.dumps(rec).encode() + b"\n")
        f.write(b'{"v":1,"ts":1,"event":"spawn","run":"' + log.run.encode() + b'","pid":')  # torn
    # A rotated older copy holding garbage too.
    (state / "audit.jsonl.1").write_bytes(b"{{{{\n" + b"x" * 100 + b"\n")

    report = do_reap(state)

    assert not identity.is_alive(a) and not identity.is_alive(b)
    assert {e.pid for e in report.ended} == {a.pid, b.pid}
    st = report.log_stats
    assert st.files == 2 and st.truncated == 1 and st.corrupt >= 5 and st.newer == 1


def test_missing_and_empty_logs(tmp_path: Path) -> None:
    report = do_reap(tmp_path / "nope", cgroups=False)
    assert report.ended == [] and report.skipped == [] and report.ok
    (tmp_path / "empty").mkdir(mode=0o700)
    (tmp_path / "empty" / "audit.jsonl").write_bytes(b"")
    report = do_reap(tmp_path / "empty", cgroups=False)
    assert report.ended == [] and report.log_stats.files == 1


def test_unsafe_state_dir_is_refused(tmp_path: Path, capsys) -> None:
    d = tmp_path / "open"
    d.mkdir()
    os.chmod(d, 0o777)
    with pytest.raises(audit.AuditDirError):
        do_reap(d)
    assert reaper.cli(["--state-dir", str(d), "--no-cgroups"]) == 2
    assert "writable by group or others" in capsys.readouterr().err


def test_cli_json_and_table(procs, tmp_path: Path, capsys) -> None:
    state = tmp_path / "state"
    log = Log(state, _dead_owner(procs))
    _, a = _spawn_sleep(procs)
    _, reused = _spawn_sleep(procs)
    log.spawn(a, session="s-9")
    log.spawn(reused, start=reused.start + 1)

    assert reaper.cli(["--state-dir", str(state), "--dry-run", "--json", "--no-cgroups"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dry_run"] is True and out["ok"] is True
    assert [(e["pid"], e["session"], e["how"]) for e in out["ended"]] == [(a.pid, "s-9", "dry-run")]
    assert [(s["pid"], s["reason"]) for s in out["skipped"]] == [(reused.pid, "pid reused")]
    assert out["runs"]["over"] == [log.run] and out["log"]["records"] == 2
    assert identity.is_alive(a)

    assert reaper.cli(["--state-dir", str(state), "--grace", "0.5", "--no-cgroups"]) == 0
    text = capsys.readouterr().out
    assert "ended 1 process(es)" in text and str(a.pid) in text and "s-9" in text
    assert "pid reused" in text and "SIGTERM" in text
    assert not identity.is_alive(a) and identity.is_alive(reused)


def test_records_without_identity_prove_nothing(procs, tmp_path: Path) -> None:
    state = tmp_path / "state"
    _, a = _spawn_sleep(procs)
    _, b = _spawn_sleep(procs)
    w = audit.AuditWriter(state)
    dead = _dead_owner(procs)
    owner = {"pid": dead.pid, "start": dead.token()}
    # No start for the process; no owner for the run.
    w.write("spawn", run="r1", owner=owner, pid=a.pid)
    w.write("spawn", run="r2", pid=b.pid, start=b.token())
    report = do_reap(state)
    assert identity.is_alive(a) and identity.is_alive(b)
    sk = skipped(report)
    assert sk[a.pid] == reaper.NO_START and sk[b.pid] == reaper.OWNER_UNKNOWN
    assert report.ended == []


def test_report_str_and_dict_shapes(procs, tmp_path: Path) -> None:
    state = tmp_path / "state"
    log = Log(state, _dead_owner(procs))
    _, a = _spawn_sleep(procs)
    log.spawn(a)
    report = do_reap(state, dry_run=True)
    d = report.to_dict()
    assert set(d) >= {"version", "dry_run", "ok", "state_dir", "ended", "skipped",
                      "cgroups_removed", "runs", "log", "notes"}
    assert set(d["ended"][0]) >= {"pid", "run", "session", "job", "runtime_s", "comm", "how"}
    json.dumps(d)
    text = str(report)
    assert "would end 1 process(es)" in text and "dry-run" in text
