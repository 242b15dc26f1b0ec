"""Issue 36, the log and state items: a stepped wall clock decides nothing the
reaper ends (4), a full disk loses no job-open record silently (5), state
directories are ours or refused (8), bad input is refused and names from
/proc are printed escaped (9), and bounded resources (10).

Every process here is one this test started (the ``procs`` fixture ends it);
audit records name only those.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_reaper import Log, _dead_owner, do_reap

from tether import Job, gate, identity, reaper
from tether.identity import Identity

pytestmark = [pytest.mark.timeout(60)]

IS_LINUX = sys.platform.startswith("linux")
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _sleep_with(procs, env: dict[str, str] | None = None, argv0: str = "sleep"
                ) -> tuple[subprocess.Popen, Identity]:
    from procutil import poll_until

    p = procs.popen([argv0, "300"], stdin=subprocess.DEVNULL, env=procs.env(**(env or {})))
    # Popen returns once the exec is past its point of no return, before the
    # new program's environment is set up: until then /proc/PID/environ
    # reads empty (seen under load), and a cookie in it cannot be found.
    assert poll_until(lambda: identity.environ_value(p.pid, b"TETHER_TEST_MARK") is not None)
    ident = identity.read(p.pid)
    assert ident is not None
    return p, ident


def _next_tick() -> None:
    """Wait until the boot clock has moved on by a tick: what starts after
    this has a later start tick than what started before."""
    t = identity.now_ticks()
    deadline = time.monotonic() + 2
    while identity.now_ticks() <= t + 1 and time.monotonic() < deadline:
        time.sleep(0.005)


# --------------------------------------------------------------------------
# 4. A stepped wall clock decides nothing


@pytest.mark.skipif(not IS_LINUX, reason="start ticks of the boot clock: Linux")
@pytest.mark.parametrize("step_s", [30.0, -3600.0, 0.0],
                         ids=["clock-stepped-back", "clock-stepped-forward", "no-step"])
def test_cookie_window_does_not_follow_the_wall_clock(procs, tmp_path: Path,
                                                      step_s: float) -> None:
    """A job-open record as a stepped clock writes it: its ``ts`` is ahead of
    the wall clock now by ``step_s`` (the clock stepped back after the record
    was written) or behind by an hour (it stepped forward). The keeper was
    SIGKILLed; a leftover that carries the job's cookie and was born after
    the keeper must be ended, and a process that carries the same cookie but
    was born before the keeper (so not the job's) must not.

    On the old code (the window drawn from ``ts``) the stepped-back case
    missed the leftover and said ok, and the stepped-forward case ended the
    process born before the job."""
    state = tmp_path / "state"
    owner = _dead_owner(procs)
    cookie = f"{owner.pid}-{owner.start}:j1:{secrets.token_hex(8)}"
    _next_tick()
    _, before = _sleep_with(procs, {identity.COOKIE_VAR: cookie})  # born before the job
    _next_tick()
    keeper_p, keeper = _sleep_with(procs)
    keeper_p.kill()
    keeper_p.wait(timeout=5)
    _next_tick()
    _, leftover = _sleep_with(procs, {identity.COOKIE_VAR: cookie})
    assert before.start < keeper.start < leftover.start

    log = Log(state, owner)
    log.w.close()
    rec = {"v": 1, "ts": time.time() + step_s, "event": "job-open", "run": log.run,
           "owner": log.owner, "job": "j1", "mechanism": "subreaper", "name": "j",
           "cookie": cookie, "cookie_var": identity.COOKIE_VAR,
           "keeper": {"pid": keeper.pid, "start": keeper.token()}}
    import json

    with open(state / "audit.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")

    assert identity.is_alive(leftover) and identity.is_alive(before)
    report = do_reap(state)

    assert [e.pid for e in report.ended] == [leftover.pid], (str(report), report.skipped)
    assert not identity.is_alive(leftover)
    # Control: a process with the cookie that predates the job is no leftover.
    assert identity.is_alive(before)
    assert report.ok


# --------------------------------------------------------------------------
# 9. Bad input


def _tether(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tether", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("args", [
    ("shell", "--install", ""),
    ("shell", "--install", "  "),
    ("reap", "--session", ""),
    ("reap", "--session", " \t"),
    ("reap", "--app", ""),
    ("reap", "--state-dir", ""),
    ("ps", "--state-dir", " "),
])
def test_empty_or_blank_paths_and_keys_are_usage_errors(tmp_path: Path, args) -> None:
    r = _tether(*args, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.strip(), "a usage error says what is wrong"
    assert list(tmp_path.iterdir()) == [], "nothing written"


def test_empty_or_blank_keys_in_the_api_are_value_errors(tmp_path: Path) -> None:
    from tether import _shellinstall
    from tether.errors import UsageError

    for bad in ("", "  "):
        with pytest.raises(ValueError):
            reaper.reap(tmp_path / "s", session=bad)
        with pytest.raises(ValueError):
            reaper.reap(tmp_path / "s", app=bad)
        with pytest.raises(UsageError):
            _shellinstall.install(bad)
        with pytest.raises(ValueError):
            Job(session=bad)
    assert not (tmp_path / "s").exists()
    # Control: a real key and directory are accepted.
    assert reaper.reap(tmp_path / "s", session="k", cgroups=False).ok
    with Job(session="k") as job:
        assert job.session == "k"
    made = _shellinstall.install(str(tmp_path / "bin"), ("sh",))
    assert made == [str(tmp_path / "bin" / "sh")]


def test_host_session_key_blank_is_a_value_error(tmp_path: Path) -> None:
    from tether.host import Host

    with Host("t-blank", state_dir=tmp_path / "s", allow_unprotected=True) as h:
        for bad in ("", " ", "\t\n"):
            with pytest.raises(ValueError):
                h.session(bad)
        assert h.session("k").key == "k"  # control


@pytest.mark.skipif(not IS_LINUX, reason="/proc names")
def test_reap_prints_proc_names_escaped(procs, tmp_path: Path) -> None:
    """A leftover whose name (comm, from /proc) holds a terminal escape: the
    report's table shows it cleaned, the JSON keeps it as data."""
    state = tmp_path / "state"
    evil = "\x1b]0;pwn\x07\x1b[2J"
    link = tmp_path / evil
    link.symlink_to("/bin/sleep")
    p, ident = _sleep_with(procs, argv0=str(link))
    assert "\x1b" in ident.comm  # control: the kernel keeps the raw name
    owner = _dead_owner(procs)
    log = Log(state, owner)
    log.spawn(ident)
    report = do_reap(state, dry_run=True)
    assert [e.pid for e in report.ended] == [p.pid]
    assert report.ended[0].comm == ident.comm
    text = str(report)
    assert not any(c in text for c in "\x1b\x07"), repr(text)
    assert "]0;pwn" in text  # the printable rest stays
    r = _tether("reap", "--dry-run", "--state-dir", str(state), "--no-cgroups", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert str(p.pid) in r.stdout
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout
    p.kill()


# --------------------------------------------------------------------------
# 5. Nothing lost silently to a full disk

from test_audit import tiny_fs  # noqa: E402,F401 - a real 64 KiB tmpfs (root), else skipped

from tether import audit  # noqa: E402


def _fill(fs: Path) -> Path:
    """Fill the file system: a file as big as it lets us write."""
    filler = fs / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for size in (4096, 512, 1):
            try:
                while os.write(fd, b"\0" * size) == size:
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


def test_job_open_on_a_full_disk_is_written_when_space_returns(tiny_fs: Path) -> None:  # noqa: F811
    state = tiny_fs / "state"
    state.mkdir(mode=0o700)
    filler = _fill(tiny_fs)
    msgs: list[str] = []
    w = audit.AuditWriter(state, on_loss=msgs.append, retry_interval=0)
    try:
        assert not w.write("job-open", run="r-1", job="j1", cookie="c-1")
        assert not w.write("spawn", run="r-1", job="j1", pid=99999, seq=1)
        assert len(msgs) == 1 and "No space left on device" in msgs[0], msgs
        assert w.lost == 1  # the spawn; the job-open is kept
        filler.unlink()  # space comes back
        assert w.write("spawn", run="r-1", job="j1", pid=99998, seq=2)
    finally:
        w.close()
    got = list(audit.read_records(state))
    events = [(r["event"], r.get("error")) for r in got]
    assert events == [("error", "audit-gap"), ("job-open", None), ("spawn", None)], got
    gap, opened = got[0], got[1]
    assert gap["lost"] == 1 and gap["kept"] == 1 and gap["runs"] == ["r-1"]
    assert opened["cookie"] == "c-1" and opened["late"] is True
    assert opened["ts"] < gap["ts"]  # its own time, not the time it was written


def test_kept_record_is_written_at_close(tiny_fs: Path) -> None:  # noqa: F811
    state = tiny_fs / "state"
    state.mkdir(mode=0o700)
    filler = _fill(tiny_fs)
    w = audit.AuditWriter(state, on_loss=lambda m: None, retry_interval=3600)
    assert not w.write("run-start", run="r-2")
    filler.unlink()
    w.close()  # no later write: close() tries once more
    got = list(audit.read_records(state))
    assert [r["event"] for r in got] == ["error", "run-start"], got
    assert got[0]["lost"] == 0 and got[0]["kept"] == 1


def test_reaper_reports_a_gap_and_does_not_say_ok(procs, tmp_path: Path) -> None:
    """An over run whose records a full disk lost (an audit-gap record names
    it): the reap says so and is not ok (exit 1); once a reap has fallen
    back for it, the next one does not report it again. Control: the same
    log without the gap record is ok."""
    state = tmp_path / "state"
    owner = _dead_owner(procs)
    log = Log(state, owner)
    log.event("job-open", job="j1", cookie="x")
    control = do_reap(state)
    assert control.ok and control.gaps == []
    log.w.write("error", error="audit-gap", lost=3, runs=[log.run], pid=owner.pid)
    log.w.close()

    r = _tether("reap", "--dry-run", "--no-cgroups", "--state-dir", str(state), cwd=tmp_path)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert f"audit gap: 3 record(s) of run {log.run} were lost" in r.stdout
    report = do_reap(state)
    assert not report.ok and report.gaps == [{"run": log.run, "lost": 3}]
    assert report.to_dict()["gaps"] == report.gaps
    again = do_reap(state)
    assert again.ok and again.gaps == [], "the first reap fell back for it"


def test_reaper_gap_of_a_live_run_is_not_its_to_report(procs, tmp_path: Path) -> None:
    state = tmp_path / "state"
    _, owner = _sleep_with(procs)  # alive
    log = Log(state, owner)
    log.w.write("error", error="audit-gap", lost=2, runs=[log.run])
    log.w.close()
    report = do_reap(state)
    assert report.ok and report.gaps == []


FULL_OWNER = r"""
import json, os, subprocess, sys, time
from tether import Job, gate, identity

job = Job(name="full-disk", mechanism="subreaper", state_dir=sys.argv[1], grace=0.1)
keeper = identity.read(job.trace()["keeper_pid"])
print(json.dumps({"keeper": keeper.to_dict(), "cookie": job.cookie}), flush=True)
sys.stdin.readline()  # the test gives the disk its space back
p = job.popen(["/bin/sh", "-c", "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!"],
              stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
daemon = int(p.stdout.readline())
p.wait()
print(json.dumps({"daemon": identity.read(daemon).to_dict()}), flush=True)
time.sleep(600)
"""


@pytest.mark.mechanism
def test_full_disk_at_job_open_leftover_is_still_reaped(procs, tiny_fs: Path) -> None:  # noqa: F811
    """A real job opened while its audit disk is full; space comes back
    before its first spawn, a double-forked daemon (no parent link: only its
    cookie ties it to the job); then keeper and owner are SIGKILLed. The
    job-open record (the cookie) was kept and written late, so the reaper
    ends the daemon. On the old code it was lost for good: the reap ended
    nothing and said ok, the daemon alive (the control below shows that
    nothing else ends it)."""
    import json

    from procutil import poll_until, read_line

    from tether.platform import probe

    if not probe("subreaper").available:
        pytest.skip("subreaper mechanism not available")
    state = tiny_fs / "state"
    state.mkdir(mode=0o700)
    filler = _fill(tiny_fs)
    owner = procs.popen([sys.executable, "-c", FULL_OWNER, str(state)], stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = json.loads(read_line(owner, 30, "owner"))
    assert not (state / "audit.jsonl").exists() or b"job-open" not in (
        state / "audit.jsonl").read_bytes(), "the disk was not full at job open"
    filler.unlink()
    owner.stdin.write("go\n")
    owner.stdin.flush()
    daemon = Identity.from_dict(json.loads(read_line(owner, 30, "owner"))["daemon"])
    keeper = Identity.from_dict(first["keeper"])
    assert gate.send_signal(keeper, signal.SIGKILL, member=True)
    assert poll_until(lambda: not identity.is_alive(keeper))
    owner.kill()
    owner.wait(timeout=10)
    time.sleep(0.3)
    assert identity.is_alive(daemon), "control: nothing but the reaper ends it now"
    env = identity.environ_value(daemon.pid, identity.COOKIE_VAR.encode())
    assert env == first["cookie"].encode()

    report = do_reap(state)

    assert daemon.pid in [e.pid for e in report.ended], str(report)
    assert poll_until(lambda: not identity.is_alive(daemon))
    assert report.ok
    gap = [r for r in audit.read_records(state) if r.get("error") == "audit-gap"]
    assert len(gap) == 1 and gap[0]["kept"] >= 1, gap


# --------------------------------------------------------------------------
# 8. State directories are ours or refused

SQUAT_HOST = r"""
import json, sys
from tether.errors import SessionHeld
from tether.host import Host

h = Host("squat-test", audit="off", allow_unprotected=True, reap=False)
try:
    h.session("chat-1")
    print(json.dumps({"held": True, "dir": str(h._lock_dir)}), flush=True)
except SessionHeld as e:
    print(json.dumps({"held": False, "why": str(e)}), flush=True)
sys.stdin.readline()
h.close()
"""


@pytest.fixture
def squatted_tmp():
    """A private $TMPDIR (mode 1777, like /tmp) in which another user
    (nobody, uid 65534) made ``tether-<our uid>`` first, writable by all."""
    import shutil
    import tempfile

    if not IS_ROOT or not IS_LINUX:
        pytest.skip("another uid squats the directory: needs root on Linux")
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv is not installed")
    base = Path(tempfile.mkdtemp(prefix="tether-squat-"))
    try:
        tmp = base / "tmp"
        tmp.mkdir()
        os.chmod(base, 0o755)
        os.chmod(tmp, 0o1777)
        squat = tmp / f"tether-{os.geteuid()}"
        r = subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups",
                            "mkdir", "-m", "777", str(squat)], capture_output=True, text=True,
                           timeout=30)
        if r.returncode != 0:
            pytest.skip(f"cannot act as uid 65534 here: {r.stderr.strip()}")
        assert os.stat(squat).st_uid == 65534
        yield base, tmp, squat
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("runtime_dir", [False, True], ids=["home", "xdg-runtime"])
def test_squatted_session_dir_is_refused_never_shared(procs, squatted_tmp, runtime_dir) -> None:
    """Two hosts of one app with the audit off, after another user made
    ``$TMPDIR/tether-<uid>`` first: the second must not get ``chat-1`` too.
    On the old code both held it (the squatted directory was refused and the
    keys were then held within each process only)."""
    import json

    from procutil import read_line

    base, tmp, squat = squatted_tmp
    env = {k: v for k, v in os.environ.items()
           if k not in ("XDG_RUNTIME_DIR", "XDG_STATE_HOME", "TETHER_STATE_DIR")}
    env.update(TMPDIR=str(tmp), HOME=str(base / "home"))
    if runtime_dir:
        run = base / "run"
        run.mkdir(mode=0o700)
        env["XDG_RUNTIME_DIR"] = str(run)
    hosts = []
    for _ in range(2):
        p = procs.popen([sys.executable, "-c", SQUAT_HOST], stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        hosts.append((p, json.loads(read_line(p, 30, "host"))))
    (first, a), (second, b) = hosts
    assert a["held"], a
    assert not b["held"], f"both hosts hold chat-1: {b}"
    assert str(squat) not in a["dir"]
    want = base / ("run/tether" if runtime_dir else "home/.local/state/tether")
    assert a["dir"] == str(want / "sessions")
    assert list(squat.iterdir()) == [], "nothing of ours in the squatted directory"
    for p, _ in hosts:
        p.stdin.write("\n")
        p.stdin.flush()
        p.wait(timeout=30)
    assert "refusing to use it" in first.stderr.read()


def test_unsquatted_tmp_dir_is_still_the_first_choice(procs, tmp_path: Path) -> None:
    """Control for the order: with nothing squatted, the audit-off lock
    directory stays ``$TMPDIR/tether-<uid>`` (what running hosts use)."""
    import json

    from procutil import read_line

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp), HOME=str(tmp_path / "home"),
               XDG_RUNTIME_DIR=str(tmp_path))
    p = procs.popen([sys.executable, "-c", SQUAT_HOST], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    got = json.loads(read_line(p, 30, "host"))
    uid = os.geteuid() if hasattr(os, "geteuid") else None
    assert got["held"] and got["dir"] == str(tmp / f"tether-{uid}" / "sessions"), got
    p.stdin.write("\n")
    p.stdin.flush()
    p.wait(timeout=30)


# --------------------------------------------------------------------------
# 10. Bounded and said

FD_HOST = r"""
import gc, os, sys
gc.disable()
from tether.host import Host

def nfd():
    return len(os.listdir("/proc/self/fd"))

h = Host("fd-test", state_dir=sys.argv[1], allow_unprotected=True, reap=False)
h.session("warm").stop()
base = nfd()
for i in range(500):
    h.session(f"k{i}").stop()
after = nfd()
held = [h.session(f"open{i}") for i in range(5)]  # control: open sessions do hold fds
print(base, after, nfd())
h.close()
"""


@pytest.mark.skipif(not IS_LINUX, reason="counts /proc/self/fd")
def test_host_releases_a_stopped_sessions_fds_at_once(tmp_path: Path) -> None:
    """500 sessions opened and stopped with the garbage collector off: the
    fd count is flat (the old code held 2 per stopped session: 1 000)."""
    r = subprocess.run([sys.executable, "-c", FD_HOST, str(tmp_path / "state")],
                       capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    base, after, with_open = map(int, r.stdout.split())
    assert after <= base + 2, (base, after)
    assert with_open >= after + 5, "control: five open sessions hold fds"


@pytest.mark.skipif(not IS_LINUX, reason="/proc names and states")
def test_reaper_ends_a_stopped_keeper_of_a_dead_owner(procs, tmp_path: Path) -> None:
    """A keeper that outlived its owner, stopped (a job's child can
    ``kill -STOP`` it), named by its job-open record, with a member still
    running: the reap ends the member and the keeper. On the old code the
    keeper was left stopped for ever (only its member was ended).

    Here every mechanism's keeper dies with its owner (its parent-death
    signal is SIGKILL, which ends a stopped process too), so the keeper is a
    process named ``tether-keeper`` this test starts and stops; a process of
    that name whose identity the record does not name is left alone."""
    state = tmp_path / "state"
    owner = _dead_owner(procs)
    link = tmp_path / "tether-keeper"
    link.symlink_to("/bin/sleep")
    kp, keeper = _sleep_with(procs, argv0=str(link))
    other_p, other = _sleep_with(procs, argv0=str(link))  # control: not the recorded keeper
    assert keeper.comm == "tether-keeper"
    kp.send_signal(signal.SIGSTOP)  # our own child, by its Popen
    from procutil import poll_until

    assert poll_until(lambda: identity.read(keeper.pid).state in ("T", "t"))  # (asynchronous)
    cookie = f"{owner.pid}-{owner.start}:j1:{secrets.token_hex(8)}"
    _, member = _sleep_with(procs, {identity.COOKIE_VAR: cookie})
    log = Log(state, owner)
    log.event("job-open", job="j1", mechanism="subreaper", cookie=cookie,
              keeper={"pid": keeper.pid, "start": keeper.token()})
    log.spawn(member)
    log.w.close()
    assert identity.read(keeper.pid).state in ("T", "t")

    report = do_reap(state)

    ended = {e.pid: e for e in report.ended}
    assert set(ended) == {keeper.pid, member.pid}, str(report)
    assert ended[keeper.pid].label == "tether keeper (stopped, owner gone)"
    assert not identity.is_alive(keeper) and not identity.is_alive(member)
    assert identity.is_alive(other)
    assert report.ok


@pytest.mark.skipif(not IS_LINUX, reason="/proc names")
def test_host_stop_sentences_print_names_escaped(tmp_path: Path) -> None:
    """A session's agent whose name holds a terminal escape: the stop's
    announcement and report show it cleaned (stops.oneline); the label
    itself stays as it was, for the app."""
    from tether.host import Host

    evil = "ag\x1b]0;pwn\x07ent\x9b2J"
    link = tmp_path / evil
    link.symlink_to("/bin/sleep")
    said: list[str] = []
    with Host("t-escape", state_dir=tmp_path / "s", allow_unprotected=True,
              announce=lambda plan: said.append(plan.announcement())) as h:
        s = h.session("k")
        p = s.popen([str(link), "300"], stdin=subprocess.DEVNULL)
        report = s.stop()
        p.wait(timeout=10)
    text = str(report)
    assert report.processes and evil in report.processes[0].label  # the data is kept
    assert "ag ]0;pwn ent 2J" in text, text
    for line in [text, *said]:
        assert not any(c in line for c in "\x1b\x07\x9b"), repr(line)
    assert said, "control: the stop was announced"


def test_host_start_says_an_earlier_runs_gap(procs, tmp_path: Path, caplog) -> None:
    import logging

    from tether.host import Host

    state = tmp_path / "state"
    owner = _dead_owner(procs)
    log = Log(state, owner)
    log.event("run-start", app="t-gap")
    log.w.write("error", error="audit-gap", lost=4, runs=[log.run])
    log.w.close()
    with caplog.at_level(logging.WARNING, logger="tether"):
        with Host("t-gap", state_dir=state, allow_unprotected=True) as h:
            assert h.reap_report.gaps == [{"run": log.run, "lost": 4}]
    said = [r.getMessage() for r in caplog.records if f"lost 4 record(s) of run {log.run}"
            in r.getMessage()]
    assert len(said) == 1, caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tether"):
        with Host("t-gap", state_dir=state, allow_unprotected=True) as h:  # said once
            assert h.reap_report.gaps == []
    assert "lost 4 record(s)" not in caplog.text


def test_gap_of_no_known_run_is_reported_once(tmp_path: Path) -> None:
    """A gap record that names no run (an older writer's): an unlimited reap
    reports it, not ok, once; an app-limited reap cannot tell whose it is."""
    from tether import audit as _audit

    state = tmp_path / "state"
    with _audit.AuditWriter(state) as w:
        w.write("error", error="audit-gap", lost=2, pid=1)
    assert do_reap(state, app="some-app").gaps == []
    first = do_reap(state)
    assert first.gaps == [{"run": None, "lost": 2}] and not first.ok
    assert "audit gap: 2 record(s) of an unknown run" in str(first)
    again = do_reap(state)
    assert again.ok and again.gaps == []


@pytest.mark.parametrize("bad", ["", "  ", "\t"])
def test_blank_state_dirs_are_value_errors(tmp_path: Path, monkeypatch, bad) -> None:
    """A blank state_dir was a directory named by blanks in the current
    directory (Host('x', state_dir='  ') made one)."""
    from tether import Job
    from tether import audit as _audit
    from tether.host import Host

    monkeypatch.chdir(tmp_path)
    for make in (lambda: Host("t-blank-dir", state_dir=bad, allow_unprotected=True),
                 lambda: Job(state_dir=bad, mechanism="none"),
                 lambda: _audit.AuditWriter(bad)):
        with pytest.raises(ValueError, match="must not be empty"):
            make()
    assert list(tmp_path.iterdir()) == [], "nothing made"


def test_ps_notes_a_gap(procs, tmp_path: Path) -> None:
    state = tmp_path / "state"
    owner = _dead_owner(procs)
    log = Log(state, owner)
    log.w.write("error", error="audit-gap", lost=5, runs=[log.run])
    log.w.close()
    r = _tether("ps", "--state-dir", str(state), "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"lost 5 record(s) of run {log.run}" in r.stdout, r.stdout


@pytest.mark.skipif(not IS_ROOT or not IS_LINUX, reason="cgroup v2 is writable only by root here")
def test_gap_makes_an_app_limited_reap_fall_back_to_the_stale_cgroup(procs, tmp_path: Path
                                                                     ) -> None:
    """A run of app ``a`` whose records a full disk lost except the gap
    record: an app-limited reap (what a host's start does) normally looks
    only at cgroups the app's records name; with the gap it also looks for
    the run's own stale cgroup directory and ends what is in it. Control:
    the same reap without the gap record ends nothing."""
    from test_reaper import available

    from tether import cgroupfs as lc

    if not available("cgroup"):
        pytest.skip("cgroup v2 not writable here")
    base, _ = lc.base_dir()
    parent = os.path.join(base, f"log-state-test-{os.getpid()}-{time.monotonic_ns()}")
    dead = _dead_owner(procs)
    run_id = f"{dead.pid}-{dead.start}"
    stale = os.path.join(parent, f"tether-{run_id}")
    job = os.path.join(stale, "j1")
    made = [parent, stale, job]
    try:
        for d in made:
            os.mkdir(d)
        _, member = _sleep_with(procs)
        Path(job, "cgroup.procs").write_text(str(member.pid))
        state = tmp_path / "state"
        with audit.AuditWriter(state) as w:
            w.write("run-start", run="other", app="a")  # the app has a log
        control = do_reap(state, app="a", cgroup_dirs=[parent])
        assert control.ended == [] and identity.is_alive(member)

        with audit.AuditWriter(state) as w:
            w.write("error", error="audit-gap", lost=3, runs=[run_id])
        report = do_reap(state, app="a", cgroup_dirs=[parent], grace=0)

        assert [(e.pid, e.cgroup) for e in report.ended] == [(member.pid, job)], str(report)
        assert not identity.is_alive(member)
        assert report.gaps == [{"run": run_id, "lost": 3}] and not report.ok
    finally:
        for d in reversed(made):
            if os.path.isdir(d):
                lc.kill(d, timeout=3)  # only this test's process is in it
                lc.remove_tree(d)
