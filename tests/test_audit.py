"""Tests of the spawn-audit log (tether.audit): real files, real processes,
a real full file system (tmpfs) and a real unprivileged user where root."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from procutil import unprivileged_blocker

from tether import audit
from tether import records as record_fields
from tether.audit import AuditDirError, AuditWriter, ReadStats, iter_records, read_records

SRC = str(Path(audit.__file__).resolve().parents[1])
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
NOBODY = 65534
CHILD_TIMEOUT = 60


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("TETHER_STATE_DIR", None)
    return env


def records(d: Path, **kw) -> list[dict]:
    return list(iter_records(d, **kw))


def write_log(d: Path, data: bytes, name: str = "audit.jsonl") -> Path:
    d.mkdir(mode=0o700, exist_ok=True)
    p = d / name
    p.write_bytes(data)
    return p


def rec_line(**fields) -> bytes:
    r = {"v": 1, "ts": 1.0, "event": "spawn"}
    r.update(fields)
    return (json.dumps(r, separators=(",", ":")) + "\n").encode()


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


# ---------------------------------------------------------------- round trip


def test_round_trip(state: Path) -> None:
    with AuditWriter(state) as w:
        owner = audit.owner_fields(os.getpid(), "123@boot")
        run = audit.new_run_id()
        assert w.write("run-start", run=run, owner=owner, app="demo")
        assert w.write(
            "spawn",
            run=run,
            owner=owner,
            **audit.spawn_fields(
                pid=4242,
                start="99@boot",
                boot="boot",
                pgid=4242,
                sid=17,
                uid=1000,
                job="j1",
                session="s-1",
                mechanism="subreaper",
                in_job=True,
                background=False,
                detached=False,
            ),
        )
        assert w.write("exit", run=run, job="j1", pid=4242, start="99@boot", status=-9)
        assert w.write("run-end", run=run, owner=owner)
    got = records(state)
    assert [r["event"] for r in got] == ["run-start", "spawn", "exit", "run-end"]
    for r in got:
        assert r["v"] == audit.SCHEMA_VERSION
        assert isinstance(r["ts"], float) and abs(r["ts"] - time.time()) < 60
        assert r["run"] == run
        assert list(r)[:3] == ["v", "ts", "event"]  # the reader's torn-line recovery relies on it
    spawn = got[1]
    assert spawn["owner"] == {"pid": os.getpid(), "start": "123@boot"}
    assert spawn["pid"] == 4242 and spawn["start"] == "99@boot" and spawn["pgid"] == 4242
    assert spawn["mechanism"] == "subreaper" and spawn["in_job"] is True
    assert spawn["background"] is False and spawn["detached"] is False
    assert "argv" not in spawn and "cgroup" not in spawn  # absent, not null
    assert got[2]["status"] == -9
    # file and directory are private
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(state / "audit.jsonl").st_mode) == 0o600


def test_a_relative_directory_is_resolved_once(tmp_path: Path, monkeypatch) -> None:
    # a chdir between the writer's creation and its (lazy) first open, or a
    # reopen, must not move the log
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    monkeypatch.chdir(a)
    with AuditWriter("st") as w:
        monkeypatch.chdir(b)
        assert w.write("run-start", run=audit.new_run_id(), app="demo")
    assert os.listdir(b) == [] and w.state_dir == a / "st"
    assert [r["event"] for r in audit.iter_records(a / "st")] == ["run-start"]


def test_unknown_event_is_a_programming_error(state: Path) -> None:
    with AuditWriter(state) as w, pytest.raises(ValueError):
        w.write("spawned")


def test_argv_only_when_opted_in(state: Path) -> None:
    plain = audit.spawn_fields(pid=10, job="j")
    assert "argv" not in plain
    opted = audit.spawn_fields(pid=10, job="j", record_argv=["ls", b"-l", b"\xff\xfe"])
    assert opted["argv"][:2] == ["ls", "-l"]
    with AuditWriter(state) as w:
        assert w.write("spawn", **plain)
        assert w.write("spawn", **opted)
    a, b = records(state)
    assert "argv" not in a
    assert b["argv"][0] == "ls" and os.fsencode(b["argv"][2]) == b"\xff\xfe"


def test_spawn_fields_from_a_real_identity() -> None:
    identity = pytest.importorskip("tether.identity", reason="tether.identity not written yet")
    me = identity.read(os.getpid())
    f = audit.spawn_fields(identity=me, job="j")
    assert f["pid"] == os.getpid()
    assert f["start"] == me.token() and f["boot"] == me.boot
    assert f["pgid"] == os.getpgid(0) and f["sid"] == os.getsid(0)


def test_huge_argv_is_cut_to_fit_a_readable_line(state: Path) -> None:
    argv = ["x" * 1000] * 300  # ~300 KB, far over MAX_LINE
    with AuditWriter(state) as w:
        assert w.write("spawn", pid=1234, **audit.spawn_fields(record_argv=argv))
        assert w.write("spawn", pid=1235, blob="y" * 200_000)  # no argv to cut
    s = ReadStats()
    a, b = list(read_records(state, stats=s))
    assert s.too_long == 0
    assert a["argv_truncated"] == 300 and 0 < len(a["argv"]) < 300 and a["pid"] == 1234
    assert b["event"] == "error" and b["error"] == "record-too-long" and b["of"] == "spawn"
    assert b["pid"] == 1235
    assert max(len(line) for line in (state / "audit.jsonl").read_bytes().splitlines()) <= (
        audit.MAX_LINE
    )


def test_log_fd_is_not_inherited(state: Path) -> None:
    w = AuditWriter(state)
    try:
        assert w.write("run-start", run="r")
        assert not os.get_inheritable(w.fileno())
        # a real child started without closing fds must not hold the log
        out = subprocess.run(
            ["ls", "-l", "/proc/self/fd/"],
            close_fds=False,
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT,
        ).stdout
        assert str(state) not in out
    finally:
        w.close()


# ---------------------------------------------------------------- rotation


def test_rotation_keeps_bounded_files(state: Path) -> None:
    with AuditWriter(state, max_bytes=2048, keep_files=3) as w:
        for i in range(300):
            assert w.write("spawn", seq=i, pid=1000 + i, job="j")
    files = audit.log_files(state)
    assert [p.name for p in files] == [
        "audit.jsonl.3",
        "audit.jsonl.2",
        "audit.jsonl.1",
        "audit.jsonl",
    ]
    for p in files:
        assert p.stat().st_size <= 2048
    seqs = [r["seq"] for r in records(state)]
    # the newest records, oldest first, without a gap
    assert seqs[-1] == 299 and seqs == list(range(seqs[0], 300)) and len(seqs) > 30


def test_reader_returns_everything_across_rotations_oldest_first(state: Path) -> None:
    with AuditWriter(state, max_bytes=1500, keep_files=1000) as w:
        for i in range(400):
            assert w.write("spawn", seq=i)
    s = ReadStats()
    assert [r["seq"] for r in read_records(state, stats=s)] == list(range(400))
    assert s.files > 10 and s.records == 400 and s.corrupt == s.truncated == 0


def test_keep_days_prunes_old_rotated_copies(state: Path) -> None:
    with AuditWriter(state, max_bytes=400, keep_files=10, keep_days=14) as w:
        i = 0
        while not (state / "audit.jsonl.4").exists():
            assert w.write("spawn", seq=i)
            i += 1
        old = time.time() - 20 * 86400
        os.utime(state / "audit.jsonl.3", (old, old))  # .3 and .4 are past 14 days
        os.utime(state / "audit.jsonl.4", (old, old))
        young = (state / "audit.jsonl.2").read_bytes()
        live = os.stat(state / "audit.jsonl").st_ino
        while os.stat(state / "audit.jsonl").st_ino == live:  # exactly one more rotation
            assert w.write("spawn", seq=i)
            i += 1
    names = [p.name for p in audit.log_files(state)]
    assert names == ["audit.jsonl.3", "audit.jsonl.2", "audit.jsonl.1", "audit.jsonl"]
    assert (state / "audit.jsonl.3").read_bytes() == young  # renamed, not pruned


def test_keep_files_lowered_prunes_extra_copies(state: Path) -> None:
    with AuditWriter(state, max_bytes=300, keep_files=20) as w:
        for i in range(200):
            w.write("spawn", seq=i)
    assert len(audit.log_files(state)) > 8
    with AuditWriter(state, max_bytes=300, keep_files=3) as w:
        w.write("spawn", seq=999)
    assert [p.name for p in audit.log_files(state)][:-1] == [
        "audit.jsonl.3",
        "audit.jsonl.2",
        "audit.jsonl.1",
    ]


def test_writer_follows_a_rotation_made_by_another_writer(state: Path) -> None:
    a = AuditWriter(state, max_bytes=1000, keep_files=50)
    b = AuditWriter(state, max_bytes=1000, keep_files=50)
    try:
        for i in range(100):
            assert (a if i % 3 else b).write("spawn", seq=i)
        # neither keeps appending to a rotated copy: every copy is bounded
        for p in audit.log_files(state):
            assert p.stat().st_size <= 1000
        assert [r["seq"] for r in records(state)] == list(range(100))
    finally:
        a.close()
        b.close()


def test_threads_share_a_writer(state: Path) -> None:
    w = AuditWriter(state, max_bytes=4096, keep_files=1000)
    errors: list[BaseException] = []

    def run(t: int) -> None:
        try:
            for i in range(300):
                assert w.write("spawn", writer=t, seq=i)
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    try:
        for t in threads:
            t.start()
    finally:
        for t in threads:
            t.join(timeout=30)
        w.close()
    assert not errors
    check_log(state, writers=4, per_writer=300, max_bytes=4096)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")
def test_forked_child_keeps_using_the_writer(state: Path) -> None:
    w = AuditWriter(state)
    try:
        assert w.write("spawn", seq=0)
        pid = os.fork()
        if pid == 0:  # child: never return into pytest
            try:
                os._exit(0 if w.write("spawn", seq=1) else 3)
            finally:
                os._exit(4)
        deadline = time.monotonic() + CHILD_TIMEOUT
        while True:  # a bounded wait for our own child
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)  # the child we forked above, never reaped yet
                os.waitpid(pid, 0)
                pytest.fail("forked writer hung")
            time.sleep(0.01)
        assert os.waitstatus_to_exitcode(status) == 0
        assert w.write("spawn", seq=2)
    finally:
        w.close()
    assert [r["seq"] for r in records(state)] == [0, 1, 2]


# ---------------------------------------------------------------- carried forward

LINUX = sys.platform.startswith("linux")


def _owner(pid: int | None = None) -> dict:
    from tether import identity

    me = identity.read(pid or os.getpid())
    return {"pid": me.pid, "start": me.token()}


def _spawn_of(ident, **fields) -> dict:
    rec = {"run": fields.pop("run", "r-1"), "owner": fields.pop("owner", None) or _owner(),
           "job": "j1", "pid": ident.pid, "start": ident.token(), "boot": ident.boot}
    rec.update(fields)
    return rec


def _dead_identity():
    from tether import identity

    p = subprocess.Popen(["true"])
    ident = identity.read(p.pid)
    p.wait(10)
    return ident


def sleeper(procs: list) -> subprocess.Popen:
    p = subprocess.Popen(["sleep", "300"], stdin=subprocess.DEVNULL)
    procs.append(p)  # the fixture below ends it, by its Popen
    return p


def fill(w: AuditWriter, until, pad: int = 200) -> int:
    """Write filler records (of no process) until ``until()``; bounded."""
    for i in range(200_000):
        if until():
            return i
        assert w.write("spawn", run="filler", seq=i, pad="x" * pad)
    raise AssertionError("filler never reached its goal")


@pytest.mark.skipif(not LINUX, reason="real process identities (Linux /proc)")
def test_rotation_carries_forward_what_still_proves_a_live_process(state: Path, procs) -> None:
    from tether import identity

    live = sleeper(procs)
    ident = identity.read(live.pid)
    dead = _dead_identity()
    with AuditWriter(state, max_bytes=4096, keep_files=2) as w:
        assert w.write("run-start", run="r-1", owner=_owner(), app="a")
        assert w.write("spawn", **_spawn_of(ident, label="claude"))
        assert w.write("spawn", **_spawn_of(dead, label="gone"))
        assert w.write("job-close", run="r-1", owner=_owner(), job="j1")
        assert w.write("reap", run="r-1", pid=dead.pid)
        first = (state / "audit.jsonl").stat().st_ino
        # Rotate until the copy that held them is pruned (three rotations with keep_files=2).
        fill(w, lambda: not any(os.stat(p).st_ino == first for p in audit.log_files(state)))
        fill(w, lambda: len(audit.log_files(state)) == 3 and (state / "audit.jsonl.2").exists())
    recs = records(state)
    ours = [r for r in recs if r.get("run") == "r-1"]
    # The live process's spawn and its live owner's run-start survive, marked; the rest is gone.
    assert sorted(r["event"] for r in ours) == ["run-start", "spawn"], ours
    assert all(r.get("carried") is True for r in ours)
    spawn = next(r for r in ours if r["event"] == "spawn")
    assert spawn["pid"] == ident.pid and spawn["label"] == "claude" and spawn["start"] == ident.token()
    # Control: with the process gone, the next carry drops it.
    live.kill()
    live.wait(10)
    with AuditWriter(state, max_bytes=4096, keep_files=2) as w:
        fill(w, lambda: not any(r.get("event") == "spawn" and r.get("run") == "r-1"
                                for r in records(state)))
    from tether.runs import read_runs

    assert "r-1" not in read_runs(state) or not read_runs(state)["r-1"].procs


@pytest.mark.skipif(not LINUX, reason="real process identities (Linux /proc)")
def test_a_writer_keeping_fewer_copies_carries_before_it_prunes(state: Path, procs) -> None:
    """The issue-15 case: another writer left more copies than this one keeps; its
    first write prunes .6 and up - after carrying what they prove."""
    from tether import identity
    from tether.runs import read_runs

    live = sleeper(procs)
    ident = identity.read(live.pid)
    with AuditWriter(state, max_bytes=2048, keep_files=8) as w:
        assert w.write("spawn", **_spawn_of(ident, run="old", session="chat-1"))
        fill(w, lambda: (state / "audit.jsonl.8").exists())
    assert len(audit.log_files(state)) == 9
    assert read_runs(state)["old"].procs  # proven, from .8
    with AuditWriter(state, max_bytes=2048, keep_files=5) as w:
        assert w.write("spawn", run="new", seq=0)
    assert [p.name for p in audit.log_files(state)][0] == "audit.jsonl.5"
    runs = read_runs(state)
    assert list(runs["old"].procs) == [(ident.pid, ident.start)]
    assert runs["old"].procs[(ident.pid, ident.start)].session == "chat-1"


@pytest.mark.skipif(not LINUX, reason="real process identities (Linux /proc)")
def test_carry_is_capped_and_the_loss_is_said(state: Path, procs) -> None:
    from tether import identity
    from tether.runs import read_runs

    live = sleeper(procs)
    ident = identity.read(live.pid)
    with AuditWriter(state, max_bytes=8192, keep_files=1) as w:
        for i in range(60):  # ~60 x 250 bytes of records that all still prove something
            assert w.write("spawn", **_spawn_of(ident, run=f"r-{i}", seq=i))
        n = len(audit.log_files(state))
        fill(w, lambda: not any(r.get("run") == "r-0" and not r.get("carried")
                                for r in records(state)))
    recs = records(state)
    loss = [r for r in recs if r.get("event") == "error" and r.get("error") == "audit-carry-loss"]
    assert loss and loss[0]["lost"] > 0 and loss[0]["cap"] == 4096 and loss[0]["runs"]
    carried = [r for r in recs if r.get("carried")]
    assert carried and sum(len(json.dumps(r)) for r in carried) <= 4096 * 2
    notes: list[str] = []
    read_runs(state, notes=notes)
    assert any("size cap dropped" in n for n in notes), notes
    # The hard cap on total bytes holds: (keep_files + 1.5) x max_bytes (+ racing lines).
    assert sum(p.stat().st_size for p in audit.log_files(state)) <= 2.5 * 8192 + 1024
    assert n >= 1


def test_a_carried_record_fills_in_and_never_overrides(state: Path) -> None:
    """Carried copies are older than every record read before them."""
    from tether import identity
    from tether.runs import read_runs

    me = identity.read(os.getpid())
    owner = {"pid": me.pid, "start": me.token()}
    base = {"run": "r", "owner": owner, "job": "j"}
    lines = [
        rec_line(event="job-open", session="s1", **base),
        # a process of the job that runs (this one: read here, never signalled),
        # so that its job-close does not forget the job
        rec_line(event="spawn", pid=me.pid, start=me.token(), boot=me.boot, **base),
        rec_line(event="tasks", tasks=[{"id": "new", "label": "newer"}], **base),
        rec_line(event="job-close", **base),
        # carried from a deleted copy: older than all of the above
        rec_line(event="job-open", session="old", carried=True, name="n", **base),
        rec_line(event="tasks", tasks=[{"id": "old", "label": "older"}], carried=True, **base),
    ]
    write_log(state, b"".join(lines))
    run = read_runs(state)["r"]
    info = run.jobs["j"]
    assert info.closed and info.session == "s1" and info.name == "n"
    assert [t["id"] for t in info.tasks] == ["new"]
    # A job known only from a carried job-open: closed unless its keeper runs.
    write_log(state, rec_line(event="job-open", carried=True, run="q", owner=owner, job="k",
                              keeper={"pid": me.pid, "start": me.token()})
              + rec_line(event="job-open", carried=True, run="q", owner=owner, job="gone"))
    jobs = read_runs(state)["q"].jobs
    assert not jobs["k"].closed and jobs["gone"].closed


# ---------------------------------------------------------------- concurrency

WRITER_CHILD = r"""
import sys
from tether.audit import AuditWriter
state, wid, n, max_bytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
w = AuditWriter(state, max_bytes=max_bytes, keep_files=100000)
sys.stdout.write("ready\n"); sys.stdout.flush()
sys.stdin.read(1)  # start together
bad = 0
for i in range(n):
    # every 7th line is far over PIPE_BUF (4096): one write must still keep it whole
    pad = "x" * (6000 if i % 7 == 0 else (i % 50))
    if not w.write("spawn", writer=wid, seq=i, pid=100000 + i, pad=pad):
        bad += 1
w.close()
sys.exit(1 if bad else 0)
"""


def check_log(state: Path, *, writers: int, per_writer: int, max_bytes: int) -> int:
    """Assert no torn, lost or repeated record; return how often the writer changed."""
    s = ReadStats()
    seen: dict[tuple[int, int], int] = {}
    order = []
    for r in read_records(state, stats=s):
        key = (r["writer"], r["seq"])
        seen[key] = seen.get(key, 0) + 1
        order.append(r["writer"])
    assert s.corrupt == 0 and s.truncated == 0 and s.too_long == 0, s
    dup = [k for k, c in seen.items() if c > 1]
    assert not dup, f"records written once, read more than once: {dup[:5]}"
    missing = {(w, i) for w in range(writers) for i in range(per_writer)} - set(seen)
    assert not missing, f"{len(missing)} records lost, e.g. {sorted(missing)[:5]}"
    # rotation was active; a copy may pass max_bytes only by lines racing a rotation
    files = audit.log_files(state)
    assert len(files) > 3
    assert all(p.stat().st_size <= max_bytes + 4 * 7000 for p in files)
    return sum(1 for a, b in itertools.pairwise(order) if a != b)


def test_check_log_sees_a_torn_or_lost_line(tmp_path: Path) -> None:
    """Control: the checker used below flags the faults it is meant to catch."""
    good = b"".join(rec_line(writer=w, seq=i) for w in range(2) for i in range(3))
    lines = good.splitlines(keepends=True)
    torn = lines[0][:20] + lines[3] + lines[0][20:] + b"".join(lines[1:3] + lines[4:])
    for name, data in {"torn": torn, "lost": b"".join(lines[:-1])}.items():
        d = tmp_path / name
        write_log(d, b"", "audit.jsonl.3")
        write_log(d, b"", "audit.jsonl.2")
        write_log(d, b"", "audit.jsonl.1")
        write_log(d, data)
        with pytest.raises(AssertionError):
            check_log(d, writers=2, per_writer=3, max_bytes=10**6)


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:  # only the children this test started, by their Popen
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)


def test_four_writer_processes_no_line_torn_or_lost(state: Path, procs) -> None:
    writers, n, max_bytes = 4, 1000, 64 * 1024
    AuditWriter(state).close()  # create the directory once, 0700
    for wid in range(writers):
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", WRITER_CHILD, str(state), str(wid), str(n), str(max_bytes)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=child_env(),
            )
        )
    for p in procs:
        assert p.stdout.readline() == b"ready\n"
    for p in procs:
        p.stdin.write(b"g")
        p.stdin.close()
    for p in procs:
        assert p.wait(timeout=CHILD_TIMEOUT) == 0
    switches = check_log(state, writers=writers, per_writer=n, max_bytes=max_bytes)
    # they really wrote at the same time (else this test shows nothing)
    assert switches >= 3


# ---------------------------------------------------------------- reading


def test_reader_skips_and_counts_bad_lines(state: Path) -> None:
    data = (
        rec_line(seq=0)
        + b"this is not json\n"
        + b"\n   \n"  # blank lines: not records, not corrupt
        + b"[1, 2, 3]\n"
        + b'"a string"\n'
        + b"\xff\xfe\x00garbage\n"
        + b'{"v": 1, "ts": 2.0, "event": "spawn", "seq": \n'  # cut mid-record
        + b'{"v":1,"ts":2.5,"ev'  # a fragment a full disk cut short, then the
        + rec_line(seq=1)  # next record glued to it: the record is kept
        + rec_line(seq=2, pad="z" * 5000)  # over the small max_line below
        + b"[" * 100000
        + b"\n"  # too deep for json, and too long
        + rec_line(seq=3)
        + b'{"v": 1, "event": "exit", "seq": 4'  # truncated last line: no newline
    )
    write_log(state, data)
    s = ReadStats()
    got = list(read_records(state, stats=s, max_line=4096))
    assert [r.get("seq") for r in got] == [0, 1, 3]
    assert s.records == 3 and s.files == 1
    assert s.corrupt == 6  # text, list, string, binary, cut record, torn fragment
    assert s.too_long == 2 and s.truncated == 1
    assert s.lines == 11


def test_reader_deep_nesting_within_max_line(state: Path) -> None:
    write_log(state, b"[" * 60000 + b"\n" + b"{" * 60000 + b"\n" + rec_line(seq=7))
    s = ReadStats()
    assert [r["seq"] for r in read_records(state, stats=s)] == [7]
    assert s.corrupt == 2


def test_reader_yields_newer_schema_records(state: Path) -> None:
    write_log(
        state,
        rec_line(seq=1)
        + b'{"v": 7, "ts": 5.5, "event": "teleport", "quantum": {"x": [1, 2]}, "seq": 2}\n',
    )
    s = ReadStats()
    got = list(read_records(state, stats=s))
    assert got[1] == {"v": 7, "ts": 5.5, "event": "teleport", "quantum": {"x": [1, 2]}, "seq": 2}
    assert s.newer == 1 and s.records == 2


def test_reader_empty_and_missing(tmp_path: Path) -> None:
    s = ReadStats()
    assert list(read_records(tmp_path / "nope", stats=s)) == []
    assert list(read_records(tmp_path / "nope" / "deeper")) == []
    d = tmp_path / "empty"
    d.mkdir(mode=0o700)
    assert list(read_records(d, stats=s)) == []
    write_log(d, b"")
    assert list(read_records(d, stats=s)) == []
    assert s == ReadStats(files=1)


def test_over_long_line_is_never_held_in_memory(state: Path) -> None:
    big = 32 * 2**20
    with open(write_log(state, rec_line(seq=0)), "ab") as f:
        chunk = b"A" * 2**20
        for _ in range(big // len(chunk)):
            f.write(chunk)
        f.write(b"\n" + rec_line(seq=1) + b"B" * big)  # and an over-long unterminated tail
    tracemalloc.start()
    try:
        s = ReadStats()
        got = [r["seq"] for r in read_records(state, stats=s)]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == [0, 1]
    assert s.too_long == 2 and s.truncated == 0
    assert peak < 4 * 2**20, f"peak {peak} bytes for a {big}-byte line"


def test_reader_refuses_planted_files(state: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "secret.jsonl"
    elsewhere.write_bytes(rec_line(seq=666))
    write_log(state, rec_line(seq=1))
    os.symlink(elsewhere, state / "audit.jsonl.1")
    s = ReadStats()
    assert [r["seq"] for r in read_records(state, stats=s)] == [1]
    assert s.refused_files == 1
    if IS_ROOT:
        other = write_log(state, rec_line(seq=777), "audit.jsonl.2")
        os.chown(other, NOBODY, NOBODY)
        s = ReadStats()
        assert [r["seq"] for r in read_records(state, stats=s)] == [1]
        assert s.refused_files == 2


def test_reading_while_four_processes_write_and_rotate(state: Path, procs) -> None:
    """Readers during rotation see no duplicate and keep order per writer."""
    writers, n = 4, 1000
    AuditWriter(state).close()
    for wid in range(writers):
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", WRITER_CHILD, str(state), str(wid), str(n), "16384"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=child_env(),
            )
        )
    for p in procs:
        assert p.stdout.readline() == b"ready\n"
    for p in procs:
        p.stdin.write(b"g")
        p.stdin.close()
    reads = 0
    deadline = time.monotonic() + CHILD_TIMEOUT
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        last = dict.fromkeys(range(writers), -1)
        for r in iter_records(state):
            assert r["seq"] > last[r["writer"]], "a record repeated or out of order"
            last[r["writer"]] = r["seq"]
        reads += 1
    for p in procs:
        assert p.wait(timeout=CHILD_TIMEOUT) == 0
    assert reads >= 1
    check_log(state, writers=writers, per_writer=n, max_bytes=16384)


# ---------------------------------------------------------------- property


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=4096), max_line=st.sampled_from([16, 200, audit.MAX_LINE]))
def test_reader_never_raises_on_arbitrary_bytes(data: bytes, max_line: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "s"
        for name, blob in (("audit.jsonl.1", data[::-1]), ("audit.jsonl", data)):
            write_log(d, blob, name)
        s = ReadStats()
        got = list(read_records(d, max_line=max_line, stats=s))
        assert all(isinstance(r, dict) for r in got)
        assert s.records == len(got) and s.files == 2
        assert s.lines >= s.corrupt + s.truncated + s.too_long


good_records = st.fixed_dictionaries(
    {"v": st.just(1), "ts": st.floats(0, 2e9), "event": st.sampled_from(audit.EVENTS)},
    optional={"pid": st.integers(0, 2**22), "session": st.text(max_size=20)},
)
garbage_lines = st.binary(max_size=300).map(lambda b: b.replace(b"\n", b""))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(good_records, garbage_lines), max_size=40), garbage_lines)
def test_reader_keeps_every_good_line_among_garbage(items, tail) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "s"
        blob = b"".join(
            (json.dumps(i) + "\n").encode() if isinstance(i, dict) else i + b"\n" for i in items
        )
        write_log(d, blob + tail)  # an unterminated tail must not cost a good record
        got = list(iter_records(d))
        want = [i for i in items if isinstance(i, dict)]
        it = iter(got)
        assert all(any(g == w for g in it) for w in want), "a good record was lost"


# ---------------------------------------------------------------- directories


def test_default_state_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TETHER_STATE_DIR", str(tmp_path / "t"))
    assert audit.default_state_dir() == tmp_path / "t"
    monkeypatch.delenv("TETHER_STATE_DIR")
    if sys.platform == "win32":
        monkeypatch.setenv("LOCALAPPDATA", str(tmp_path))
        assert audit.default_state_dir() == tmp_path / "tether"
        return
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert audit.default_state_dir() == tmp_path / "xdg" / "tether"
    monkeypatch.setenv("XDG_STATE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert audit.default_state_dir() == tmp_path / "home" / ".local" / "state" / "tether"


def test_check_dir_creates_private(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        d = audit.check_dir(tmp_path / "a" / "b")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    with pytest.raises(FileNotFoundError):
        audit.check_dir(tmp_path / "missing", create=False)
    (tmp_path / "ok").mkdir(mode=0o755)
    os.chmod(tmp_path / "ok", 0o755)  # readable by others is fine, writable is not
    assert audit.check_dir(tmp_path / "ok") == tmp_path / "ok"


def test_insecure_dirs_are_refused_with_a_clear_message(tmp_path: Path) -> None:
    good = tmp_path / "good"
    good.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(good)
    bad = [("is a symbolic link", link)]
    for name, mode in (("group", 0o770), ("others", 0o702), ("sticky", 0o1777)):
        p = tmp_path / name
        p.mkdir()
        os.chmod(p, mode)
        bad.append(("is writable by group or others", p))
    f = tmp_path / "file"
    f.write_text("")
    bad.append(("is not a directory", f))
    if IS_ROOT:
        other = tmp_path / "other"
        other.mkdir(mode=0o700)
        os.chown(other, NOBODY, NOBODY)
        bad.append((f"is owned by uid {NOBODY}", other))
    else:
        bad.append(("is owned by uid 0", Path("/usr")))  # root's, not ours
    for want, path in bad:
        for call in (
            lambda p=path: audit.check_dir(p),
            lambda p=path: AuditWriter(p),
            lambda p=path: read_records(p),
        ):
            with pytest.raises(AuditDirError) as e:
                call()
            msg = str(e.value)
            assert want in msg and str(path) in msg and "\n" not in msg, msg
    # nothing was written through the refused symlink
    assert list(good.iterdir()) == []


# ---------------------------------------------------------------- losses

LOSS_CHILD = r"""
import json, sys
from tether.audit import AuditWriter
state, mode = sys.argv[1], sys.argv[2]
msgs = []
w = AuditWriter(state, on_loss=msgs.append if mode == "callback" else None, retry_interval=0)
ok = [w.write("spawn", seq=i) for i in range(5)]
print(json.dumps({"ok": ok, "msgs": msgs, "lost": w.lost, "reason": w.reason}))
"""


@pytest.fixture
def nobody_dir():
    """A 0500 state dir owned by the user who will write in it (nobody when root)."""
    base = Path(tempfile.mkdtemp(prefix="tether-ro-"))
    try:
        os.chmod(base, 0o755)
        d = base / "state"
        d.mkdir(mode=0o700)
        if IS_ROOT:
            os.chown(d, NOBODY, NOBODY)
        os.chmod(d, 0o500)
        yield d
    finally:
        os.chmod(base / "state", 0o700)
        shutil.rmtree(base)


def run_as_writer(args: list[str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", LOSS_CHILD, *args]
    if IS_ROOT:
        # root ignores mode bits: a read-only dir is only real for another user
        setpriv = shutil.which("setpriv")
        if not setpriv:
            pytest.skip("running as root without setpriv: cannot make a read-only dir real")
        cmd = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=60)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX mode bits")
def test_read_only_dir_write_fails_and_is_reported_once(nobody_dir: Path) -> None:
    if IS_ROOT:
        # nobody must be able to run this Python and import this checkout
        why = unprivileged_blocker(sys.executable, NOBODY)
        if why:
            pytest.skip(why)
    r = run_as_writer([str(nobody_dir), "callback"])
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["ok"] == [False] * 5
    assert out["lost"] == 5
    assert len(out["msgs"]) == 1, out["msgs"]
    assert out["msgs"][0].startswith("tether: audit log disabled: ")
    assert str(nobody_dir) in out["msgs"][0]
    assert r.stderr == ""
    # the default report: exactly one line on stderr
    r = run_as_writer([str(nobody_dir), "stderr"])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ok"] == [False] * 5
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tether: audit log disabled: "), r.stderr
    assert "Permission denied" in lines[0]
    assert list(nobody_dir.iterdir()) == []


@pytest.fixture
def tiny_fs():
    """A real 64 KiB file system (tmpfs), mounted for this test and unmounted after."""
    if not IS_ROOT or not sys.platform.startswith("linux"):
        pytest.skip("mounting a tiny tmpfs needs root on Linux")
    base = Path(tempfile.mkdtemp(prefix="tether-full-"))
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tether-audit-test", str(base)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if r.returncode != 0:
        base.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield base
    finally:
        subprocess.run(["umount", str(base)], capture_output=True, timeout=30)
        if os.path.ismount(base):
            subprocess.run(["umount", "-l", str(base)], capture_output=True, timeout=30)
        base.rmdir()


def test_full_disk_write_fails_is_reported_once_and_recovers(tiny_fs: Path) -> None:
    filler = tiny_fs / "filler"
    filler.write_bytes(b"\0" * 16384)
    msgs: list[str] = []
    w = AuditWriter(tiny_fs, on_loss=msgs.append, retry_interval=0)
    try:
        results = []
        for i in range(400):  # ~ 400 x 300 B: the disk fills on the way
            results.append((i, w.write("spawn", seq=i, pad="p" * 250)))
        written = [i for i, ok in results if ok]
        failed = [i for i, ok in results if not ok]
        assert written and failed, "the tmpfs never filled up"
        assert failed == list(range(failed[0], 400)), "once full, every write fails"
        assert len(msgs) == 1 and "No space left on device" in msgs[0], msgs
        assert w.lost == len(failed) and not w.ok
        # space comes back: the next write works and says how much was lost
        filler.unlink()
        assert w.write("spawn", seq=1000)
        assert w.ok and len(msgs) == 1
    finally:
        w.close()
    s = ReadStats()
    got = list(read_records(tiny_fs, stats=s))
    seqs = [r["seq"] for r in got if r["event"] == "spawn"]
    assert seqs == written + [1000], "a write that returned True is missing"
    gap = [r for r in got if r["event"] == "error"]
    assert len(gap) == 1 and gap[0]["error"] == "audit-gap" and gap[0]["lost"] == len(failed)
    assert s.corrupt <= 1  # at most the one line a short write cut


def test_vanished_dir_is_a_loss_then_recreated(state: Path) -> None:
    msgs: list[str] = []
    w = AuditWriter(state, on_loss=msgs.append, retry_interval=3600)
    try:
        assert w.write("run-start", run="r")
        shutil.rmtree(state)
        assert not w.write("spawn", seq=1)  # the unlinked file must not swallow it
        assert not w.write("spawn", seq=2)  # cheap no-op until retry_interval
        assert len(msgs) == 1 and str(state) in msgs[0]
        w.retry_interval = 0
        w._retry_at = 0.0  # time travel instead of waiting an hour
        assert w.write("spawn", seq=3)
    finally:
        w.close()
    got = records(state)
    assert [r.get("error") or r["seq"] for r in got] == ["audit-gap", 3]
    assert got[0]["lost"] == 2
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o700


def _lose_a_record(state: Path, on_loss) -> None:
    """One record written, the directory removed, the next record lost."""
    w = AuditWriter(state, on_loss=on_loss, retry_interval=3600)
    try:
        assert w.write("run-start", run="r")
        shutil.rmtree(state)
        assert not w.write("spawn", seq=1)
    finally:
        w.close()


def test_a_failing_on_loss_callback_still_gets_the_loss_said(state: Path, capsys) -> None:
    # The callback raised and the loss was said nowhere (neither by it nor on stderr).
    def broken(msg: str) -> None:
        raise RuntimeError("app bug")

    _lose_a_record(state, broken)
    err = capsys.readouterr().err
    assert "tether: audit log disabled" in err and str(state) in err and "app bug" in err
    # the control: a working callback gets it, and stderr stays quiet
    msgs: list[str] = []
    _lose_a_record(state, msgs.append)
    assert len(msgs) == 1 and capsys.readouterr().err == ""


def test_parse_start_and_pid_take_only_usable_values():
    assert record_fields.parse_start("123@b00t") == (123, "b00t")
    assert record_fields.parse_start("123", "b00t") == (123, "b00t")
    assert record_fields.parse_start(123, "b00t") == (123, "b00t")
    for bad in (None, "", "@b", "x@b", "-1@b", "12", True, 1.5, ["1@b"]):
        assert record_fields.parse_start(bad) is None, bad
    assert record_fields.parse_start(True, "b") is None and record_fields.parse_start(-3, "b") is None
    assert record_fields.parse_pid(7) == 7
    for bad in (0, -1, True, "7", 7.0, None):
        assert record_fields.parse_pid(bad) is None, bad
