"""tether.identity against real processes and the real /proc.

Safety: every process here is started by the test and recorded; the
``spawn`` fixture ends each one (and whatever it started, found only among
processes born after it) in its finalizer, through identity-checked signals.
Refusal tests use SIGURG, whose default action is to be ignored, so even a
broken refusal could not end anything; the strace test proves the refusals
make no signal system call at all.
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import threading
import time

import procutil
import pytest

from tether import gate, identity
from tether.errors import SignalRefused
from tether.identity import Identity

wait_until = functools.partial(procutil.wait_until, timeout=3.0, interval=0.005)

psutil = pytest.importorskip("psutil")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")

SLEEP = shutil.which("sleep") or "/bin/sleep"
# Captures that must be complete get a generous time cap: the default 1 s can
# be reached on a crowded box under load, and the caps have their own test.
CAP = 30.0



def _end_tree(p: subprocess.Popen, born: int, session: bool) -> None:
    """End ``p`` and every process it started (found only among processes
    born after it), each by identity; bounded."""
    deadline = time.monotonic() + 5.0
    try:
        while True:
            c = identity.capture(born_after=born, time_cap=CAP)
            targets = {i.pid: i for i in c.descendants([p.pid], born)}
            if session:
                targets.update({i.pid: i for i in c.by_session(p.pid, born) if i.pid != p.pid})
            live = [i for i in targets.values() if i.state not in ("Z", "X")]
            for i in live:
                try:
                    gate.send_signal(i, signal.SIGKILL, member=True)
                except SignalRefused:
                    pass
            if p.poll() is None:
                p.kill()
            if not live or time.monotonic() > deadline:
                break
            time.sleep(0.01)
    finally:
        # even if the capture above failed: the direct child is ours to end
        if p.poll() is None:
            p.kill()
        p.wait(timeout=5)


@pytest.fixture
def spawn():
    started: list[tuple[subprocess.Popen, int, bool]] = []

    def _spawn(args, **kw) -> subprocess.Popen:
        kw.setdefault("stdin", subprocess.DEVNULL)
        kw.setdefault("stdout", subprocess.DEVNULL)
        born = identity.now_ticks()
        p = subprocess.Popen(args, **kw)
        started.append((p, born, bool(kw.get("start_new_session"))))
        return p

    yield _spawn
    for p, born, session in started:
        _end_tree(p, born, session)


@pytest.fixture
def sigurg_counter():
    """Count SIGURG deliveries to this process (default action: ignore)."""
    got: list[int] = []
    old = signal.signal(signal.SIGURG, lambda s, f: got.append(s))
    yield got
    signal.signal(signal.SIGURG, old)


# ---------------------------------------------------------------- parsing


def test_read_matches_proc_and_psutil(spawn):
    before = identity.now_ticks()
    p = spawn([SLEEP, "30"])
    after = identity.now_ticks()
    ident = identity.read(p.pid)
    assert ident is not None
    assert ident.pid == p.pid
    assert ident.ppid == os.getpid()
    assert ident.pgid == os.getpgid(p.pid)
    assert ident.sid == os.getsid(p.pid)
    assert ident.uid == os.getuid()
    assert ident.state in ("R", "S", "D")
    with open(f"/proc/{p.pid}/comm") as f:
        assert ident.comm == f.read().rstrip("\n") == "sleep"
    assert ident.boot == identity.boot_id()
    assert len(ident.boot) == 36 and ident.boot.count("-") == 4
    # the born_after contract: a process started after now_ticks() has start >= it
    assert before <= ident.start <= after
    pp = psutil.Process(p.pid)
    assert pp.ppid() == ident.ppid
    assert pp.uids().real == ident.uid
    # psutil's create_time is boot_time + ticks/HZ (boot_time from the wall clock)
    derived = psutil.boot_time() + ident.start / identity.clock_ticks()
    assert abs(derived - pp.create_time()) < 1.0
    assert identity.matches(ident) and identity.is_alive(ident)


def test_new_session_ids(spawn):
    p = spawn([SLEEP, "30"], start_new_session=True)
    ident = identity.read(p.pid)
    assert ident is not None
    assert ident.sid == ident.pgid == p.pid
    assert ident.sid != os.getsid(0)


def test_comm_with_parens_and_spaces(spawn, tmp_path):
    # comm is the executable's basename: one that mimics stat fields
    exe = tmp_path / "x) S 1 2 (y"
    shutil.copy(SLEEP, exe)
    p = spawn([str(exe), "30"])
    ident = identity.read(p.pid)
    assert ident is not None
    assert ident.comm == "x) S 1 2 (y"
    assert ident.ppid == os.getpid()
    assert ident.pgid == os.getpgid(p.pid)
    assert ident.state in ("R", "S", "D")
    c = identity.capture(time_cap=CAP)
    assert c.procs[p.pid] == ident._replace(state=c.procs[p.pid].state)


def test_read_absent_and_invalid():
    assert identity.read(0) is None
    assert identity.read(-1) is None
    assert identity.read(4_194_305) is None  # above the largest possible pid_max
    assert identity.read(True) is None  # a bool is not a pid


def test_thread_id_is_not_a_process(sigurg_counter):
    ready = threading.Event()
    stop = threading.Event()
    tid: list[int] = []

    def body():
        tid.append(threading.get_native_id())
        ready.set()
        stop.wait(5)

    t = threading.Thread(target=body)
    t.start()
    try:
        ready.wait(3)
        assert tid[0] != os.getpid()
        assert os.path.exists(f"/proc/{tid[0]}/stat")  # /proc resolves a tid...
        assert identity.read(tid[0]) is None  # ...but it is no process
        me = identity.read(os.getpid())
        fake = me._replace(pid=tid[0])
        assert gate.send_signal(fake, signal.SIGURG) is False
    finally:
        stop.set()
        t.join(5)
    time.sleep(0.05)
    assert sigurg_counter == []


def test_zombie_matches_but_is_not_alive(spawn):
    p = spawn([SLEEP, "0.2"])
    ident = identity.read(p.pid)
    assert ident is not None
    assert identity.is_alive(ident)  # control: alive before it exits
    # Not reaped (no poll/wait): it turns into a zombie.
    wait_until(lambda: (identity.read(p.pid) or ident).state == "Z")
    assert identity.matches(ident) is True
    assert identity.is_alive(ident) is False
    p.wait(timeout=3)
    assert identity.matches(ident) is False
    assert gate.send_signal(ident, signal.SIGKILL) is False


def test_own_ancestors():
    anc = identity.own_ancestors()
    expected = {p.pid for p in psutil.Process().parents()} | {os.getpid(), 0, 1}
    assert anc == expected
    assert os.getppid() in anc


def test_own_is_this_process_and_a_fork_reads_its_own():
    me = identity.own()
    assert me is not None and me.same_process(identity.read(os.getpid()))
    assert identity.own() is me  # read once per pid
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own pid and start, never the parent's cached one
        try:
            os.close(r)
            child = identity.own()
            fresh = identity.read(os.getpid())
            ok = child is not None and fresh is not None and child.same_process(fresh) \
                and not child.same_process(me)
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w)
    try:
        with os.fdopen(r, "rb") as f:
            assert f.read() == b"1"
    finally:
        os.waitpid(pid, 0)


def test_parent_pid_is_getppid_off_windows():
    # On Windows it reads NtQueryInformationProcess instead (tests/windows, under Wine).
    assert identity.parent_pid() == os.getppid() == psutil.Process().ppid()


def test_identity_tuple_roundtrips():
    ident = identity.read(os.getpid())
    assert ident is not None
    pid, start, boot, *_rest = ident
    assert (pid, start, boot) == (ident.pid, ident.start, ident.boot)
    assert ident.token() == f"{ident.start}@{ident.boot}"
    assert pickle.loads(pickle.dumps(ident)) == ident
    assert Identity.from_dict(json.loads(json.dumps(ident.to_dict()))) == ident
    old = Identity.from_dict({"pid": 5, "start": 7, "boot": "b"})
    assert old == Identity(5, 7, "b") and old.uid == -1 and old.state == ""
    assert ident._replace(start=1).start == 1 and ident._replace(start=1).pid == ident.pid
    assert ident.same_process(ident._replace(state="Z"))
    assert not ident.same_process(ident._replace(start=ident.start + 1))
    assert "pid=" in repr(ident)
    assert {ident: 1}[Identity(*ident)] == 1


def test_now_ticks_is_monotonic_and_tick_sized():
    a = identity.now_ticks()
    time.sleep(0.05)
    b = identity.now_ticks()
    hz = identity.clock_ticks()
    assert hz == os.sysconf("SC_CLK_TCK")
    assert 0 < b - a <= 5 * hz  # 50 ms later: at least one tick (generous bound: load)
    assert identity.read(os.getpid()).start <= a


# ---------------------------------------------------------------- children / pidfd


def test_children_lists_direct_children(spawn):
    p = spawn(["sh", "-c", f"{SLEEP} 30 & {SLEEP} 30 & wait"])

    def both_sleeping():  # a forked child reads as "sh" until it has exec'd sleep
        kids = identity.children(p.pid)
        comms = [(identity.read(k) or Identity(k, 0, "")).comm for k in kids]
        return kids if comms == ["sleep", "sleep"] else None

    kids = wait_until(both_sleeping)
    for k in kids:
        i = identity.read(k)
        assert i is not None and i.ppid == p.pid and i.comm == "sleep"
    assert identity.children(4_194_305) == []
    assert os.getpid() not in identity.children(p.pid)


def test_pidfd_pid(spawn):
    p = spawn([SLEEP, "30"])
    fd = os.pidfd_open(p.pid)
    try:
        assert identity.pidfd_pid(fd) == p.pid
        p.kill()
        p.wait(timeout=3)
        assert identity.pidfd_pid(fd) is None  # the kernel reports -1 once exited
    finally:
        os.close(fd)
    r, w = os.pipe()
    try:
        assert identity.pidfd_pid(r) is None  # not a pidfd
    finally:
        os.close(r)
        os.close(w)


# ---------------------------------------------------------------- send_signal


def test_pid_reuse_is_never_signalled(spawn):
    p = spawn([SLEEP, "30"])
    ident = identity.read(p.pid)
    assert ident is not None
    reused = ident._replace(start=ident.start - 1)  # same pid, another process's start
    other_boot = ident._replace(boot="00000000-0000-0000-0000-000000000000")
    assert identity.matches(reused) is False
    assert identity.matches(other_boot) is False
    assert gate.send_signal(reused, signal.SIGKILL) is False
    assert gate.send_signal(other_boot, signal.SIGKILL) is False
    time.sleep(0.1)
    assert p.poll() is None, "a mismatched identity reached the process"
    assert identity.is_alive(ident)
    # control: the true identity does reach it, so the check above could fail
    assert gate.send_signal(ident, signal.SIGKILL) is True
    assert p.wait(timeout=3) == -signal.SIGKILL


def test_send_signal_to_gone_process(spawn):
    p = spawn(["true"])
    ident = identity.read(p.pid) or Identity(p.pid, 0, identity.boot_id())
    p.wait(timeout=3)
    assert gate.send_signal(ident, signal.SIGKILL) is False


def _refusal_targets() -> list[Identity]:
    boot = identity.boot_id()
    out = [Identity(pid, 0, boot) for pid in (0, 1, -1, -os.getpid())]
    for pid in sorted(identity.own_ancestors() | {os.getpid(), os.getppid()}):
        real = identity.read(pid)
        # the exact identity too: a correct record must be refused as well
        out.append(real if real is not None else Identity(pid, 0, boot))
    out.append(Identity(True, 0, boot))  # bool is not a pid (True == 1)
    return out


def test_refuses_init_self_and_ancestors(sigurg_counter):
    targets = _refusal_targets()
    assert any(t.pid == os.getppid() for t in targets)
    for t in targets:
        with pytest.raises(SignalRefused):
            gate.send_signal(t, signal.SIGURG)
        with pytest.raises(SignalRefused):
            gate.send_signal(t, signal.SIGURG, member=True)  # vouching does not help
    time.sleep(0.05)
    assert sigurg_counter == [], "a refused signal reached this process"
    # control: the counter does see a SIGURG sent to us
    os.kill(os.getpid(), signal.SIGURG)
    wait_until(lambda: sigurg_counter)


_STRACE_SCRIPT = r"""
import os, signal, subprocess, sys, json
from tether import gate, identity
from tether.errors import SignalRefused
from tether.identity import Identity
boot = identity.boot_id()
targets = [Identity(p, 0, boot) for p in (0, 1, -1)]
for pid in sorted(identity.own_ancestors() | {os.getpid(), os.getppid()}):
    targets.append(identity.read(pid) or Identity(pid, 0, boot))
refused = 0
for t in targets:
    for member in (False, True):
        try:
            gate.send_signal(t, signal.SIGURG, member=member)
        except SignalRefused:
            refused += 1
print("MARK", flush=True)
child = subprocess.Popen([sys.argv[1], "30"])
ok = gate.send_signal(identity.read(child.pid), signal.SIGKILL)
child.wait()
print(json.dumps({"refused": refused, "total": 2 * len(targets), "child": child.pid, "ok": ok}))
"""


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace not installed")
def test_refusals_make_no_signal_syscall(tmp_path):
    """Under strace: the refusals make no kill/pidfd syscall at all; the one
    allowed signal afterwards (the control) shows up in the same trace."""
    trace = tmp_path / "trace"
    env = dict(os.environ)
    src = os.path.dirname(os.path.dirname(identity.__file__))
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    calls = "kill,tkill,tgkill,rt_sigqueueinfo,rt_tgsigqueueinfo,pidfd_open,pidfd_send_signal"
    cmd = ["strace", "-f", "-qq", "-e", f"trace={calls}", "-e", "signal=none", "-o", str(trace)]
    r = subprocess.run(
        cmd + [sys.executable, "-c", _STRACE_SCRIPT, SLEEP],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if r.returncode != 0 and "ptrace" in r.stderr:
        pytest.skip(f"ptrace not permitted: {r.stderr.strip()[:200]}")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.splitlines()[-1])
    assert result["refused"] == result["total"] > 6
    assert result["ok"] is True
    # The tracing process's own calls only (the SIGKILLed child can show up
    # as "???(" when it dies inside a syscall), a call split by another
    # process's line ("<unfinished ...>" ... "<... resumed>") joined again.
    child = f"{result['child']} "
    lines = []
    for ln in trace.read_text().splitlines():
        if not ln.strip() or ln.startswith(child):
            continue
        if "<... " in ln and " resumed>" in ln and lines and lines[-1].endswith("<unfinished ...>"):
            lines[-1] = lines[-1][: -len("<unfinished ...>")] + ln.split(" resumed>", 1)[1]
            continue
        lines.append(ln)
    # Only the control's two calls, both aimed at the child.
    assert len(lines) == 2, lines
    assert f"pidfd_open({result['child']}," in lines[0]
    assert "pidfd_send_signal(" in lines[1] and "SIGKILL" in lines[1]


_REPARENT_SCRIPT = r"""
import json, os, signal, sys, time
from tether import gate, identity
from tether.errors import SignalRefused
out = sys.argv[1]
r, w = os.pipe()
if os.fork():  # P: exit once C has checked (and cached) its ancestors
    os.close(w)
    os.read(r, 1)
    os._exit(0)
os.close(r)
res = {"pid": os.getpid()}
P = identity.read(os.getppid())
try:
    gate.send_signal(P, signal.SIGURG)
    res["before"] = "sent"
except SignalRefused:
    res["before"] = "refused"
os.write(w, b"x")
deadline = time.monotonic() + 5
while os.getppid() == P.pid and time.monotonic() < deadline:
    time.sleep(0.005)
res["reparented"] = os.getppid() != P.pid
while identity.matches(P) and time.monotonic() < deadline:
    time.sleep(0.005)  # until P, a zombie for a moment, is reaped by the test
res["fresh"] = P.pid in identity.own_ancestors()
try:
    res["after"] = gate.send_signal(P, signal.SIGURG)
except SignalRefused:
    res["after"] = "refused"
with open(out + ".tmp", "w") as f:
    json.dump(res, f)
os.rename(out + ".tmp", out)
"""


def test_ancestor_check_follows_reparenting(tmp_path):
    """A parent that exits stops being an ancestor: no stale refusal (which
    would let a job member that took over its pid survive), and a live parent
    is refused even though a forked child inherits the parent's cached view."""
    out = tmp_path / "result.json"
    env = dict(os.environ)
    src = os.path.dirname(os.path.dirname(identity.__file__))
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    subprocess.run([sys.executable, "-c", _REPARENT_SCRIPT, str(out)], env=env, timeout=30)
    # C is an orphan now (not ours to wait for): it writes its answer and exits
    res = wait_until(lambda: out.exists() and json.loads(out.read_text()), timeout=10)
    assert res["before"] == "refused"
    assert res["reparented"] is True
    assert res["fresh"] is False
    assert res["after"] is False  # checked, found gone: not refused, not sent


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a process as nobody")
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv not installed")
def test_other_users_process_needs_member(spawn):
    p = spawn(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", SLEEP, "30"])

    def as_nobody():
        i = identity.read(p.pid)
        return i if i and i.uid == 65534 and i.comm == "sleep" else None

    ident = wait_until(as_nobody)
    assert identity.capture(time_cap=CAP).procs[p.pid].uid == 65534
    with pytest.raises(SignalRefused, match="uid 65534"):
        gate.send_signal(ident, signal.SIGTERM)
    time.sleep(0.1)
    assert p.poll() is None and identity.is_alive(ident)
    # a job member may be another user's (setuid inside the job): caller vouches
    assert gate.send_signal(ident, signal.SIGTERM, member=True) is True
    assert p.wait(timeout=3) == -signal.SIGTERM


# ---------------------------------------------------------------- capture


TREE = f"{SLEEP} 30 & sh -c '{SLEEP} 30 & wait' & ({SLEEP} 30 &) ; wait"


def test_capture_finds_fresh_tree(spawn):
    born = identity.now_ticks()
    p = spawn(["sh", "-c", TREE], start_new_session=True)

    def session_ready():
        c = identity.capture(born_after=born, time_cap=CAP)
        # leader sh, sleep, inner sh, its sleep, the orphaned sleep; every fork
        # exec'd and the orphan's short-lived subshell gone
        comms = sorted(i.comm for i in c.by_session(p.pid, born))
        ready = comms == ["sh", "sh", "sleep", "sleep", "sleep"]
        return c if ready and len(c.descendants([p.pid], born)) == 3 else None

    c = wait_until(session_ready)
    assert c.complete and c.reason == ""
    assert all(i.start >= born for i in c.procs.values())
    desc = c.descendants([p.pid], born)
    by_pid = {i.pid: i for i in desc}
    assert len(desc) == 3  # the orphan left the ppid tree...
    assert sorted(i.comm for i in desc) == ["sh", "sleep", "sleep"]
    for i in desc:  # ...and each listed one hangs below the root by ppid
        assert i.ppid == p.pid or by_pid[i.ppid].ppid == p.pid
        assert i.sid == p.pid
    session = c.by_session(p.pid, born)
    assert {i.pid for i in session} >= set(by_pid) | {p.pid}
    assert {i.pid for i in c.by_pgid(p.pid, born)} == {i.pid for i in session}
    orphan = [i for i in session if i.pid != p.pid and i.pid not in by_pid]
    assert len(orphan) == 1 and orphan[0].comm == "sleep"
    # a full capture filtered afterwards agrees with born_after while reading
    full = identity.capture(time_cap=CAP)
    assert {i.pid for i in full.descendants([p.pid], born)} == set(by_pid)
    # born_after after the tree: nothing of it is young enough
    later = identity.now_ticks() + 1
    assert full.descendants([p.pid], later) == []
    assert full.by_session(p.pid, later) == []


def test_capture_walks_never_include_init_self_or_ancestors(spawn):
    born = identity.now_ticks()
    p = spawn([SLEEP, "30"])
    c = identity.capture(time_cap=CAP)
    anc = identity.own_ancestors()
    # control: the capture did see us, our parent and the child
    assert os.getpid() in c.procs and os.getppid() in c.procs and p.pid in c.procs
    assert c.procs[os.getpid()].pgid == os.getpgid(0)
    # own pid as a root is walked (a subreaper guardian lists its own descendants)
    assert [i.pid for i in c.descendants([os.getpid()], born)] == [p.pid]
    walks = {
        "desc(1)": c.descendants([1]),
        "desc(0,1,2)": c.descendants([0, 1, 2]),
        "desc(parent)": c.descendants([os.getppid()]),
        "desc(ancestors)": c.descendants(sorted(anc)),
        "children_of(1)": c.children_of(1),
        "children_of(parent)": c.children_of(os.getppid()),
        "session": c.by_session(os.getsid(0), 0),
        "pgid": c.by_pgid(os.getpgid(0), 0),
    }
    for name, walk in walks.items():
        pids = {i.pid for i in walk}
        assert not any(x <= 2 for x in pids), name
        assert os.getpid() not in pids, name
        assert not (pids & anc), name
    assert c.by_session(0, 0) == [] and c.by_session(1, 0) == []
    assert c.by_pgid(0, 0) == [] and c.by_pgid(1, 0) == []
    with pytest.raises(TypeError):
        c.by_session(os.getsid(0), None)  # type: ignore[arg-type]


def test_capture_caps():
    c = identity.capture(time_cap=CAP)
    assert c.complete and c.reason == "" and 0 <= c.elapsed < 3
    assert os.getpid() in c and len(c) > 3
    t = identity.capture(time_cap=0.0)
    assert t.complete is False and t.reason.startswith("time cap 0 s reached")
    m = identity.capture(mem_cap=1)
    assert m.complete is False and m.reason.startswith("memory cap") and len(m) == 0
    m3 = identity.capture(mem_cap=3 * identity._ENTRY_BYTES)
    assert m3.complete is False and len(m3) == 3 and "after 3 processes" in m3.reason


# ---------------------------------------------------------------- portable path


@pytest.fixture
def portable(monkeypatch):
    """Run the psutil code path (macOS/BSD/Windows) here, on real processes.

    Not a mock: the same module with its Linux switch off, so psutil does the
    reading. The caches that differ between the two paths are reset, and
    restored by monkeypatch afterwards.
    """
    monkeypatch.setattr(identity, "_LINUX", False)
    monkeypatch.setattr(identity, "_boot_id", None)
    monkeypatch.setattr(identity, "_clk_tck", None)
    monkeypatch.setattr(identity, "_anc_cache", (-1, frozenset()))
    return identity


def test_portable_path_reads_signals_and_captures(spawn, portable):
    p = spawn([SLEEP, "30"], start_new_session=True)
    ident = portable.read(p.pid)
    assert ident is not None
    assert portable.clock_ticks() == 1_000_000
    assert ident.boot == str(int(psutil.boot_time()))
    assert (ident.pid, ident.ppid, ident.pgid, ident.sid) == (p.pid, os.getpid(), p.pid, p.pid)
    assert ident.uid == os.getuid() and ident.comm == "sleep" and ident.state in ("R", "S", "D")
    assert ident.start == round(psutil.Process(p.pid).create_time() * 1_000_000)
    assert portable.matches(ident) and portable.is_alive(ident)
    # psutil is several times slower than the /proc reader: on a crowded,
    # loaded box the default 1 s cap can cut it short; that is not under test
    c = portable.capture(born_after=ident.start, time_cap=60.0)
    assert c.complete and c.procs[p.pid] == ident._replace(state=c.procs[p.pid].state)
    assert [i.pid for i in c.by_session(p.pid, ident.start)] == [p.pid]
    assert [i.pid for i in c.descendants([os.getpid()], ident.start)] == [p.pid]
    anc = portable.own_ancestors()
    for walk in (c.descendants([1]), c.by_session(os.getsid(0), 0)):
        assert not ({i.pid for i in walk} & anc)
    with pytest.raises(SignalRefused):
        portable.send_signal(portable.read(os.getppid()), signal.SIGURG)
    reused = ident._replace(start=ident.start - 1)
    assert portable.send_signal(reused, signal.SIGKILL) is False
    time.sleep(0.05)
    assert p.poll() is None
    assert portable.send_signal(ident, signal.SIGKILL) is True  # control
    wait_until(lambda: not portable.is_alive(ident))
    assert portable.matches(ident)  # a zombie until reaped
    p.wait(timeout=3)
    assert not portable.matches(ident)


def test_signal_child_signals_only_a_child_of_the_parent_named(procs):
    """gate.signal_child (the subreaper kill loop's): a grandchild is
    signalled when the parent named is still its parent, not otherwise; a
    child of ours, always; PID <= 1 and ourselves never."""
    p = procs.popen(["sh", "-c", "sleep 30 & echo $!; wait"], stdout=subprocess.PIPE, text=True)
    other = procs.popen(["sleep", "30"])
    g = int(p.stdout.readline())
    # named with the wrong parent (another child of ours): refused, and it lives
    assert gate.signal_child(g, signal.SIGKILL, other.pid) is False
    time.sleep(0.1)
    assert identity.read(g) is not None and identity.read(g).state != "Z"
    # named with its parent: sent (control: it dies)
    assert gate.signal_child(g, signal.SIGKILL, p.pid) is True
    procutil.wait_until(lambda: (lambda i: i is None or i.state == "Z")(identity.read(g)), 3)
    # a child of ours: sent
    assert gate.signal_child(other.pid, signal.SIGKILL, os.getpid()) is True
    assert other.wait(timeout=3) == -signal.SIGKILL
    for bad in (0, 1, -1, os.getpid()):
        with pytest.raises(SignalRefused):
            gate.signal_child(bad, signal.SIGKILL, os.getpid())


REAP_SCRIPT = r"""
import os, signal, sys, time
from tether import gate, identity
a = os.fork()
if a == 0:
    os._exit(3)
b = os.fork()
if b == 0:
    signal.alarm(30)  # bounded, whatever happens to this script
    signal.pause()
    os._exit(0)
time.sleep(0.3)
got = []
note = lambda pid, st: got.append((pid, os.waitstatus_to_exitcode(st)))
print(identity.reap_exited(note), got == [(a, 3)])
os.kill(b, signal.SIGKILL)  # our own child: only we reap it
print(identity.reap_exited(note, wait=True), got[1:] == [(b, -9)])
print(identity.reap_exited())
"""


def test_reap_exited_reaps_what_exited_and_says_when_none_is_left():
    """identity.reap_exited (the one reap loop): without waiting it reaps the
    child that exited and reports it, and says another still runs; with wait,
    it reaps that one too once it is killed; then there is none left. Run in
    a process of its own: a wait for any child here would reap the test
    worker's. Control: a loop that reaped nothing would report nothing."""
    r = subprocess.run([sys.executable, "-c", REAP_SCRIPT], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, PYTHONPATH=procutil.SRC))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:3] == ["True True", "False True", "False"], r.stdout
