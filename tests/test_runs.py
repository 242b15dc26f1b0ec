"""Contract tests of the one reader from the audit log to runs (tether.runs):
every rotated copy, truncated and corrupt lines, records of the wrong shape
or of another boot, and what it keeps of processes that are gone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tether import audit, identity
from tether.runs import LIVE, OVER, UNKNOWN, read_runs

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
]


@pytest.fixture
def state(tmp_path: Path) -> Path:
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    return d


def _dead_identity() -> identity.Identity:
    p = subprocess.Popen(["true"])
    ident = identity.read(p.pid)
    p.wait()
    assert ident is not None
    return ident


def _owner(ident: identity.Identity) -> dict:
    return {"pid": ident.pid, "start": ident.token()}


@pytest.fixture
def live_child():
    p = subprocess.Popen(["sleep", "60"], stdin=subprocess.DEVNULL)
    try:
        yield identity.read(p.pid)
    finally:
        p.kill()
        p.wait()


def test_runs_from_every_rotated_copy_with_their_jobs_and_live_processes(state, live_child):
    me = identity.read(os.getpid())
    gone = _dead_identity()
    dead_proc = _dead_identity()
    # Small files: the records spread over several rotated copies.
    w = audit.AuditWriter(state, max_bytes=400, keep_files=50)
    w.write("run-start", run="r-live", owner=_owner(me), app="appA")
    w.write("job-open", run="r-live", owner=_owner(me), app="appA", job="j1", name="agent",
            mechanism="cgroup", session="chat-1", cgroup="/sys/fs/cgroup/x/tether-1-2/j1",
            keeper={"pid": live_child.pid, "start": live_child.token()})
    w.write("spawn", run="r-live", owner=_owner(me), app="appA", job="j1", session="chat-1",
            pid=live_child.pid, start=live_child.token(), label="claude")
    w.write("spawn", run="r-live", owner=_owner(me), job="j1", pid=dead_proc.pid,
            start=dead_proc.token())  # gone before the read: never comes back
    w.write("job-open", run="r-over", owner=_owner(gone), app="appB", job="j9",
            background=True)
    w.write("spawn", run="r-over", owner=_owner(gone), job="j9", pid=live_child.pid,
            start=live_child.token())
    w.write("exit", run="r-over", owner=_owner(gone), job="j9", pid=live_child.pid,
            start=live_child.token(), status=0)  # exited on record
    w.write("job-close", run="r-over", owner=_owner(gone), job="j9")
    w.write("run-end", run="r-over", owner=_owner(gone))
    w.close()
    assert len(audit.log_files(state)) >= 3  # rotated: the reader must read them all
    stats = audit.ReadStats()
    notes: list[str] = []
    runs = read_runs(state, stats=stats, notes=notes)
    assert set(runs) == {"r-live", "r-over"} and notes == []
    assert stats.files == len(audit.log_files(state)) and stats.corrupt == 0
    live, over = runs["r-live"], runs["r-over"]
    assert live.owner.same_process(me) and live.app == "appA" and live.state() == LIVE
    assert over.owner.same_process(gone) and over.state() == OVER and over.end_ts is not None
    j1 = live.jobs["j1"]
    assert (j1.name, j1.mechanism, j1.session, j1.closed) == ("agent", "cgroup", "chat-1", False)
    assert j1.keeper.same_process(live_child) and j1.opened is not None
    assert j1.cgroup.endswith("/j1") and j1.cgroup in live.cgroups
    # Only what may still be alive is kept: the live child, not the dead one.
    assert list(live.procs) == [(live_child.pid, live_child.start)]
    p = live.procs[(live_child.pid, live_child.start)]
    assert (p.job, p.session, p.label) == ("j1", "chat-1", "claude")
    assert live.session_of(p) == "chat-1"
    assert over.procs == {} and over.jobs["j9"].background and over.jobs["j9"].closed


def test_truncated_corrupt_and_foreign_lines_are_skipped_and_counted(state, live_child):
    me = identity.read(os.getpid())
    good = {"v": 1, "ts": 1.0, "event": "spawn", "run": "r1", "owner": _owner(me), "job": "j",
            "pid": live_child.pid, "start": live_child.token()}
    lines = [
        json.dumps(good),
        "this is not json",
        json.dumps([1, 2, 3]),  # JSON, not an object
        json.dumps({"v": 1, "ts": 2.0, "event": "spawn", "run": "r1", "pid": "12",
                    "start": {"x": 1}}),  # the wrong types: ignored, the read goes on
        json.dumps({"v": 1, "ts": 3.0, "event": "spawn", "run": "r2",
                    "owner": {"pid": me.pid, "start": f"{me.start}@another-boot"},
                    "pid": live_child.pid, "start": f"{live_child.start}@another-boot"}),
        json.dumps({"v": 99, "ts": 4.0, "event": "job-open", "run": "r1", "job": "j",
                    "name": "from the future", "new_field": [1]}),  # newer schema: read
        json.dumps({"v": 1, "ts": 5.0, "event": "reap", "run": "r1", "pid": 1}),  # proves nothing
    ]
    (state / "audit.jsonl.1").write_text("\n".join(lines) + "\n")
    (state / "audit.jsonl").write_text(json.dumps({**good, "ts": 6.0}) + '\n{"v": 1, "ev')
    stats = audit.ReadStats()
    notes: list[str] = []
    runs = read_runs(state, stats=stats, notes=notes)
    assert stats.corrupt == 2 and stats.truncated == 1 and stats.newer == 1
    assert stats.files == 2
    assert set(runs) == {"r1"}  # r2 is of another boot: nothing of it is alive
    r1 = runs["r1"]
    assert r1.jobs["j"].name == "from the future"
    assert list(r1.procs) == [(live_child.pid, live_child.start)]
    assert any("wrong type" in n for n in notes)


def test_no_owner_or_two_owners_is_unknown(state):
    me = identity.read(os.getpid())
    gone = _dead_identity()
    w = audit.AuditWriter(state)
    w.write("run-start", run="noowner")
    w.write("run-start", run="two", owner=_owner(me))
    w.write("run-start", run="two", owner=_owner(gone))
    w.close()
    runs = read_runs(state)
    assert runs["noowner"].state() == UNKNOWN
    assert runs["two"].owner_conflict and runs["two"].state() == UNKNOWN


def test_a_missing_log_is_empty_and_an_unsafe_dir_is_refused(tmp_path):
    assert read_runs(tmp_path / "nothing-here") == {}
    bad = tmp_path / "bad"
    bad.mkdir(mode=0o777)
    os.chmod(bad, 0o777)
    with pytest.raises(audit.AuditDirError):
        read_runs(bad)


# -- an older tether-shell's day files (shell-YYYY-MM-DD.jsonl) ----------------------

FIXTURE = Path(__file__).parent / "data" / "shell-legacy.jsonl"


def _legacy_day_file(state: Path, owner: identity.Identity, child: identity.Identity,
                     days_old: float) -> Path:
    """tests/data/shell-legacy.jsonl as an older tether-shell left it: its
    placeholders filled with a live owner and command, dated days_old ago."""
    import time

    text = FIXTURE.read_text()
    for key, value in (("@OWNER_PID@", owner.pid), ("@OWNER_START@", owner.start),
                       ("@PID@", child.pid), ("@START@", child.start), ("@BOOT@", child.boot)):
        text = text.replace(key, str(value))
    t = time.time() - days_old * 86400
    path = state / time.strftime("shell-%Y-%m-%d.jsonl", time.gmtime(t))
    path.write_text(text)
    path.chmod(0o600)
    os.utime(path, (t, t))
    return path


@pytest.fixture
def two_live():
    ps = [subprocess.Popen(["sleep", "60"], stdin=subprocess.DEVNULL) for _ in range(2)]
    try:
        yield [identity.read(p.pid) for p in ps]
    finally:
        for p in ps:
            p.kill()
            p.wait()


def test_an_older_tether_shells_day_file_is_still_read(state, two_live):
    owner, child = two_live
    _legacy_day_file(state, owner, child, 1)
    notes: list[str] = []
    runs = read_runs(state, notes=notes)
    run = runs[f"{owner.pid}-{owner.start}"]
    assert run.owner is not None and run.owner.same_process(owner) and run.state() == LIVE
    (job,) = run.jobs.values()
    assert job.name == "tether-shell" and job.mechanism == "subreaper" and not job.closed
    assert job.cookie and job.cookie.startswith(f"{owner.pid}-{owner.start}:")
    assert [(p.pid, p.start) for p in run.procs.values()] == [(child.pid, child.start)]
    assert "4300-77" not in runs or not runs["4300-77"].jobs  # started, exited, closed
    assert notes == []


@pytest.mark.parametrize("days_old", [15, 13])
def test_an_older_tether_shells_day_file_ages_out_by_the_audit_rule(state, two_live, days_old,
                                                                    monkeypatch):
    # The first write of an audit writer prunes: a day file older than
    # keep_days goes - after what still proves a live process (its job and
    # its command) was carried into audit.jsonl. Control: a younger one stays.
    # The carry reads the day file without the reader: a writer never loads
    # tether.audit_read (unloaded here, restored after the test).
    import tether

    owner, child = two_live
    path = _legacy_day_file(state, owner, child, days_old)
    monkeypatch.delitem(sys.modules, "tether.audit_read", raising=False)
    monkeypatch.delattr(tether, "audit_read", raising=False)
    with audit.AuditWriter(state, keep_days=14) as w:
        assert w.write("reap", how="test")
    assert "tether.audit_read" not in sys.modules
    assert path.exists() == (days_old < 14)
    carried = [r for r in audit.read_records(state) if r.get("carried")]
    if days_old < 14:
        assert carried == []
        return
    assert sorted(r["event"] for r in carried) == ["job-open", "spawn"]
    run = read_runs(state)[f"{owner.pid}-{owner.start}"]
    assert [(p.pid, p.start) for p in run.procs.values()] == [(child.pid, child.start)]
    assert run.state() == LIVE
