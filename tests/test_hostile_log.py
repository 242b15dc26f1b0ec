"""The audit log is the owner's alone: a FIFO, a file another user can write
(mode bits or ACL) or a forged record in one never steers, blocks or stops
anything. Each case runs the real entry points with a bounded wall time, and
each refusal has a control showing the same input is acted on once it is the
owner's own file."""

from __future__ import annotations

import json
import os
import pwd
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procutil import SRC

from tether import audit, gate, identity
from tether.reaper import reap

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="FIFOs and POSIX modes, Linux"),
]
ROOT = os.geteuid() == 0


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("TETHER_STATE_DIR", None)
    return env


def _tether(*args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tether", *args], capture_output=True, text=True,
                          timeout=timeout, env=_env(), stdin=subprocess.DEVNULL)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    return d


def _forged_spawn(victim: identity.Identity) -> dict:
    """A record claiming ``victim`` was started by a run whose owner is gone."""
    gone = subprocess.Popen(["true"])
    ghost = identity.read(gone.pid)
    gone.wait()
    return {"v": 1, "ts": time.time(), "event": "spawn", "run": "forged",
            "owner": {"pid": ghost.pid, "start": ghost.token()}, "job": "j1",
            "pid": victim.pid, "start": victim.token()}


@pytest.mark.parametrize("where", ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.lock"])
def test_a_fifo_anywhere_in_the_log_blocks_nothing(state, where, procs):
    os.mkfifo(state / where, 0o600)
    if where != "audit.jsonl":
        (state / "audit.jsonl").write_text("")
        os.chmod(state / "audit.jsonl", 0o600)
    t0 = time.monotonic()
    r = _tether("run", "--state-dir", str(state), "--", "sh", "-c", "echo ran")
    assert r.returncode == 0 and r.stdout == "ran\n", r.stderr
    r = _tether("reap", "--json", "--no-cgroups", "--state-dir", str(state))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    if where != "audit.jsonl.lock":
        assert doc["log"]["refused_files"] >= 1
        assert any("not a regular file" in n for n in doc["notes"])
    r = _tether("ps", "--json", "--state-dir", str(state))
    assert r.returncode == 0, r.stderr
    code = ("import sys; from tether import Host; h = Host('fifo-test', state_dir=sys.argv[1]); "
            "s = h.session('k'); p = s.popen(['true']); p.wait(); h.close(); print('ok')")
    r = subprocess.run([sys.executable, "-c", code, str(state)], capture_output=True, text=True,
                       timeout=20, env=_env())
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr
    # The reader, directly: the FIFO is skipped and said, nothing hangs.
    stats = audit.ReadStats()
    list(audit.read_records(state, stats=stats))
    assert time.monotonic() - t0 < 60
    # Control: a FIFO opened the way the reader used to (no O_NONBLOCK) blocks.
    if where != "audit.jsonl":
        p = subprocess.Popen([sys.executable, "-c", f"open({str(state / where)!r}, 'rb').read()"])
        with pytest.raises(subprocess.TimeoutExpired):
            p.wait(timeout=0.5)
        p.kill()
        p.wait()


def _write_acl_xattr(path: Path, uid: int) -> None:
    """setfacl -m u:UID:rw PATH, as the raw system.posix_acl_access xattr."""
    st = os.stat(path)
    mode = st.st_mode
    entries = [(0x01, (mode >> 6) & 7, 0xFFFFFFFF), (0x02, 6, uid), (0x04, (mode >> 3) & 7, 0xFFFFFFFF),
               (0x10, 6, 0xFFFFFFFF), (0x20, mode & 7, 0xFFFFFFFF)]
    raw = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", t, p, i) for t, p, i in entries)
    os.setxattr(path, "system.posix_acl_access", raw)


@pytest.mark.skipif(not ROOT, reason="needs root to act as another user (nobody)")
@pytest.mark.parametrize("how", ["mode", "acl"])
def test_another_user_cannot_steer_roots_reaper(tmp_path, procs, how):
    import shutil
    import tempfile

    # Not under pytest's own 0700 tmp tree: nobody must be able to reach the file.
    state = Path(tempfile.mkdtemp(prefix="tether-hostile-", dir="/tmp"))
    try:
        _steer(state, procs, how)
    finally:
        shutil.rmtree(state, ignore_errors=True)


def _steer(state: Path, procs, how: str) -> None:
    victim_p = procs.popen(["sleep", "300"])  # root's, unrelated to any run
    victim = identity.read(victim_p.pid)
    log = state / "audit.jsonl"
    log.write_text("")
    if how == "mode":
        os.chmod(log, 0o666)
    else:
        os.chmod(log, 0o600)
        try:
            _write_acl_xattr(log, pwd.getpwnam("nobody").pw_uid)
        except OSError as e:
            pytest.skip(f"no POSIX ACLs on this file system: {e}")
    os.chmod(state, 0o711)  # so nobody can reach the file (the dir stays non-writable)
    line = json.dumps(_forged_spawn(victim)) + "\n"
    # nobody appends the forged record through the permission it was given.
    r = subprocess.run(["runuser", "-u", "nobody", "--", "/bin/sh", "-c", 'cat >> "$0"', str(log)],
                       input=line, capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    assert log.read_text() == line  # the attack landed
    os.chmod(state, 0o700)
    # (cgroup_dirs=(): not the stale tether-* cgroups of other tests running beside)
    rep = reap(state, grace=0.2, cgroup_dirs=())
    assert identity.is_alive(victim) and rep.ended == []
    assert rep.log_stats.refused_files == 1
    assert any("another user" in n or "group or others" in n for n in rep.notes)
    # Control: the very same record in a file that is the owner's own is believed.
    os.remove(log)
    log.write_text(line)
    os.chmod(log, 0o600)
    rep = reap(state, grace=0.2, cgroup_dirs=())
    assert [e.pid for e in rep.ended] == [victim.pid]
    victim_p.wait(timeout=5)


def test_a_refused_state_dir_never_stops_the_command(tmp_path):
    bad = tmp_path / "open-to-all"
    bad.mkdir()
    os.chmod(bad, 0o777)
    r = _tether("run", "--state-dir", str(bad), "--", "sh", "-c", "echo ran; exit 3")
    assert r.returncode == 3 and r.stdout == "ran\n"
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("tether: audit log disabled:"), r.stderr
    assert "writable by group or others" in lines[0]
    assert os.listdir(bad) == []
    # Control: a safe directory gets the log.
    good = tmp_path / "good"
    r = _tether("run", "--state-dir", str(good), "--", "true")
    assert r.returncode == 0 and r.stderr == "" and (good / "audit.jsonl").exists()


def test_a_hostile_rotated_copy_is_skipped_and_the_rest_is_read(state, procs):
    victim_p = procs.popen(["sleep", "300"])
    victim = identity.read(victim_p.pid)
    bad = state / "audit.jsonl.1"
    bad.write_text(json.dumps(_forged_spawn(victim)) + "\n")
    os.chmod(bad, 0o622)
    (state / "audit.jsonl").write_text(json.dumps({"v": 1, "ts": 1.0, "event": "run-start",
                                                   "run": "r"}) + "\n")
    os.chmod(state / "audit.jsonl", 0o600)
    stats = audit.ReadStats()
    recs = list(audit.read_records(state, stats=stats))
    assert [r["event"] for r in recs] == ["run-start"]
    assert stats.refused_files == 1 and "audit.jsonl.1" in stats.refusals[0]
    assert identity.is_alive(victim)
    os.kill(victim_p.pid, signal.SIGKILL)  # our own child, by the pid Popen holds
    victim_p.wait(timeout=5)


def _cgroup_available() -> bool:
    from tether.platform import probe

    return probe("cgroup").available


@pytest.mark.skipif(not ROOT or not _cgroup_available(), reason="needs a writable cgroup v2 (root)")
@pytest.mark.parametrize("via", ["host-resume", "reap"])
def test_a_forged_record_naming_a_live_jobs_cgroup_ends_nothing(state, procs, via):
    from procutil import wait_until

    from tether import Host, cgroupfs

    # A live `tether run` job: its owner runs, so its run directory is not stale.
    runner = procs.popen([sys.executable, "-m", "tether", "run", "-m", "cgroup", "--",
                          "sleep", "300"], env=procs.env(PYTHONPATH=SRC), stdin=subprocess.DEVNULL)
    base, _ = cgroupfs.base_dir()
    owner = wait_until(lambda: identity.read(runner.pid))
    run_dir = os.path.join(base, cgroupfs.run_dir_name(owner.pid, owner.start))
    job_dir = wait_until(lambda: next((os.path.join(run_dir, n) for n in os.listdir(run_dir)
                                       if os.path.isdir(os.path.join(run_dir, n))), None)
                         if os.path.isdir(run_dir) else None)
    member = wait_until(lambda: next((i for i in map(identity.read, cgroupfs.procs(job_dir))
                                      if i is not None and i.comm == "sleep"), None))
    gone = subprocess.Popen(["true"])
    ghost = identity.read(gone.pid)
    gone.wait()
    w = audit.AuditWriter(state)
    o = {"pid": ghost.pid, "start": ghost.token()}
    w.write("job-open", run="forged", owner=o, app="victim-app", job=os.path.basename(job_dir),
            session="chat-1", cgroup=job_dir)
    w.close()
    if via == "reap":
        rep = reap(state, grace=0.2, cgroup_dirs=())
        # Nothing of the live job. (The reaper also ends what stale run
        # directories hold - another test's, running beside this one, may
        # be one for a moment as its finalizer ends it: not this test's.)
        assert [e for e in rep.ended if (e.cgroup or "").startswith(run_dir)] == []
        assert [c for c in rep.cgroups_removed if c.startswith(run_dir)] == []
    else:
        h = Host("victim-app", state_dir=state)
        try:
            s = h.session("chat-1")
            assert not s.resumed.processes
        finally:
            h.close()
    time.sleep(0.2)
    assert identity.is_alive(member) and runner.poll() is None, "the live job was touched"
    assert cgroupfs.prove_stale(run_dir) is not None  # what protected it: its owner lives
    # Control: once the run is really over (keeper SIGKILLed first, so its
    # member survives; then the owner), the same records end what is left.
    keeper = identity.read(member.ppid)  # it started the command (in the cgroup or not)
    assert keeper is not None and keeper.comm == "tether-keeper"
    assert gate.send_signal(keeper, signal.SIGKILL, member=True)
    wait_until(lambda: not identity.is_alive(keeper))
    os.kill(runner.pid, signal.SIGKILL)  # our own child, by the pid Popen holds
    runner.wait(timeout=5)
    time.sleep(0.2)
    assert identity.is_alive(member) and cgroupfs.prove_stale(run_dir) is None
    # What that run itself would have recorded (its own run id and owner).
    w = audit.AuditWriter(state)
    w.write("job-open", run=f"{owner.pid}-{owner.start}", owner={"pid": owner.pid,
            "start": owner.token()}, app="victim-app", job=os.path.basename(job_dir),
            session="chat-1", cgroup=job_dir)
    w.close()
    if via == "reap":
        rep = reap(state, grace=0.2, cgroup_dirs=())
        assert member.pid in [e.pid for e in rep.ended]
    else:
        h = Host("victim-app", state_dir=state, reap=False)
        try:
            s = h.session("chat-1")
            # (issue 15: what the agent started is reported as work, in .tasks)
            assert member.pid in [p.pid for p in s.resumed.all_processes]
        finally:
            h.close()
    assert wait_until(lambda: not identity.is_alive(member))
