"""Helpers for tests that start real processes (imported by tests; the fixture is in conftest).

Every process a test starts carries ``TETHER_TEST_MARK=<unique id>`` in its
environment. The ``procs`` fixture's finalizer ends every live process that
was born after the test began *and* carries that test's mark - nothing else,
ever - so a failing test leaves nothing running, escapees included.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
import uuid

from tether import gate, identity
from tether.ending import end

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")


def wait_until(pred, timeout: float = 5.0, interval: float = 0.01):
    """Poll ``pred`` until it returns something truthy and return that; fail
    the test with AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)


def poll_until(pred, timeout: float = 3.0, interval: float = 0.01) -> bool:
    """Poll ``pred`` until it is truthy or ``timeout`` passes; say which (for
    tests that assert with a message of their own)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return bool(pred())


def read_line(p: subprocess.Popen, timeout: float = 30.0, what: str = "the child",
              stuck=None) -> str:
    """The next line ``p`` writes to its stdout pipe (``"\n"`` included), within
    ``timeout`` seconds. It reads the pipe itself and keeps what came after the
    line for the next call: ``select`` on ``p.stdout`` then ``readline()`` would
    wait in vain for a second line that arrived with the first (it sits in the
    file object's buffer, not in the pipe). ``stuck(pid)``: words on the
    child's tree for a timeout's message."""
    buf = p.__dict__.setdefault("_procutil_lines", bytearray())
    fd = p.stdout.fileno()
    deadline = time.monotonic() + timeout
    while b"\n" not in buf:
        r, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not r:
            tree = f"; its tree:\n{stuck(p.pid)}" if stuck else ""
            raise RuntimeError(f"{what} did not report in time{tree}")
        chunk = os.read(fd, 65536)
        if not chunk:
            if buf:
                break  # a last line without its newline
            try:
                status = p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                status = "still running"
            raise RuntimeError(f"{what} died before reporting (status {status})")
        buf += chunk
    end = buf.find(b"\n") + 1 or len(buf)
    line = bytes(buf[:end])
    del buf[:end]
    return line.decode()


def sigint_inside(func: str, delay_s: float) -> str:
    """Python source for a child process: ``delay_s`` after it runs, a SIGINT
    to itself, sent once ``func`` (an expression naming a function) is on the
    stack - until then the alarm comes again every 0.2 ms, so that on a busy
    machine the interrupt never lands in the child's own set-up code."""
    return ("import os, signal\n"
            f"_target = ({func}).__code__\n"
            "def _alarm(_s, f):\n"
            "    while f is not None:\n"
            "        if f.f_code is _target:\n"
            "            os.kill(os.getpid(), signal.SIGINT)\n"
            "            return\n"
            "        f = f.f_back\n"
            "    signal.setitimer(signal.ITIMER_REAL, 0.0002)\n"
            "signal.signal(signal.SIGALRM, _alarm)\n"
            f"signal.setitimer(signal.ITIMER_REAL, {delay_s})\n")


def marked(born: int, mark: str) -> list[identity.Identity]:
    """Live processes born after ``born`` whose environment carries ``mark``."""
    needle = f"TETHER_TEST_MARK={mark}".encode()
    out = []
    cap = identity.capture(born_after=born, time_cap=30.0, mem_cap=256 * 2**20)
    for ident in cap.procs.values():
        if ident.pid <= 2 or ident.pid == os.getpid():
            continue
        if identity.environ_has(ident.pid, needle) and identity.is_alive(ident):
            out.append(ident)
    return out


class Procs:
    def __init__(self) -> None:
        self.born = identity.now_ticks()
        self.mark = uuid.uuid4().hex
        self.popens: list[subprocess.Popen] = []
        self.tracked: list[identity.Identity] = []  # unmarked processes of the test's own
        import tempfile

        # A pid-hopper outruns any scan of /proc (each of its processes lives a few
        # ms), so it also appends to this log at every hop: growth means alive.
        fd, self.hoplog = tempfile.mkstemp(prefix="tether-hop-")
        os.close(fd)
        os.chmod(self.hoplog, 0o666)

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env["TETHER_TEST_MARK"] = self.mark
        env["HOPLOG"] = self.hoplog
        env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
        env.update(extra)
        return env

    def alive(self, exclude: frozenset[int] = frozenset()) -> list[identity.Identity]:
        return [i for i in marked(self.born, self.mark) if i.pid not in exclude]

    def wait_count(self, n: int, timeout: float = 15.0) -> list[identity.Identity]:
        """Wait (bounded) until at least ``n`` marked processes are up."""
        deadline = time.monotonic() + timeout
        left = self.alive()
        while len(left) < n and time.monotonic() < deadline:
            time.sleep(0.05)
            left = self.alive()
        return left

    def seen_alive(self, window: float = 0.5, exclude: frozenset[int] = frozenset()) -> list[identity.Identity]:
        """Anything alive in any scan during ``window`` (a pid-hopper can slip one scan)."""
        deadline = time.monotonic() + window
        size = os.path.getsize(self.hoplog)
        while True:
            left = self.alive(exclude)
            if left:
                return left
            if os.path.getsize(self.hoplog) != size:
                return [identity.Identity(-1, 0, "", comm="(pid-hopper still hopping)")]
            if time.monotonic() > deadline:
                return []
            time.sleep(0.005)

    def wait_all_dead(self, timeout: float = 3.0, exclude: frozenset[int] = frozenset()) -> list[identity.Identity]:
        deadline = time.monotonic() + timeout
        left = self.seen_alive(0.05, exclude)
        while left and time.monotonic() < deadline:
            time.sleep(0.01)
            left = self.seen_alive(0.05, exclude)
        return left

    def track(self, ident: identity.Identity) -> identity.Identity:
        """Also end ``ident`` at cleanup: a process of the test's own that carries
        no mark (it cleared its environment); recorded by identity, born after
        the test began."""
        assert ident.start >= self.born, "only a process born during the test"
        self.tracked.append(ident)
        return ident

    def noenv_daemons(self, n: int = 1, timeout: float = 10.0) -> list[identity.Identity]:
        """The env-clearing daemons of tests/_owner.py's daemon-noenv, tracked."""
        path = self.hoplog + ".noenv"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with open(path) as f:
                    pids = [int(x) for x in f.read().split()]
            except (OSError, ValueError):
                pids = []
            found = [i for i in map(identity.read, pids) if i is not None and i.comm == "sleep"
                     and i.start >= self.born]
            if len(found) < n and pids:
                # Written from inside a PID namespace: its own pid there (NSpid).
                cap = identity.capture(born_after=self.born)
                found = [i for i in cap.procs.values() if i.comm == "sleep"
                         and (identity.nspid(i.pid) or [0])[-1] in pids]
            if len(found) >= n:
                return [self.track(i) for i in found if i.start >= self.born]
            time.sleep(0.01)
        raise AssertionError("the env-clearing daemon never started")

    def popen(self, args, **kw) -> subprocess.Popen:
        kw.setdefault("env", self.env())
        kw.setdefault("start_new_session", True)
        p = subprocess.Popen(args, **kw)
        self.popens.append(p)
        return p

    def adopting_orphans(self):
        """A context: this process is a child subreaper within it, so what a
        control orphans on purpose (a shell whose caller was SIGKILLed, with
        no tether to end it) is re-parented here rather than to PID 1; on the
        way out everything is ended (``cleanup``), the adopted ones reaped,
        and the flag cleared."""
        import contextlib
        import ctypes

        @contextlib.contextmanager
        def ctx():
            libc = ctypes.CDLL(None, use_errno=True)
            before = set(identity.children(os.getpid()))
            if libc.prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
            try:
                yield
            finally:
                try:
                    self.cleanup()
                finally:
                    libc.prctl(36, 0, 0, 0, 0)
                    mine = {p.pid for p in self.popens}
                    adopted = set(identity.children(os.getpid())) - before - mine
                    # Adopted, and ended by cleanup: each is, or soon is, a
                    # zombie of ours. Reap only zombies (never block, never
                    # take a status that belongs to a Popen or a Job).
                    def zombies():
                        for pid in list(adopted):
                            ident = identity.read(pid)
                            if ident is None or ident.state in ("Z", "X"):
                                with contextlib.suppress(ChildProcessError):
                                    os.waitpid(pid, os.WNOHANG)
                                adopted.discard(pid)
                        return not adopted
                    if not poll_until(zombies, 5.0):
                        raise AssertionError(f"adopted and still running after cleanup: {sorted(adopted)}")
        return ctx()

    def cleanup(self) -> None:
        if getattr(self, "_cleaned", False):  # a test may clean up early; the fixture again
            return
        self._cleaned = True
        # A pid-hopper (tests/_owner.py) stops at its next hop once this exists.
        with open(self.hoplog + ".stop", "w"):
            pass
        for p in self.popens:
            if p.poll() is None:
                p.kill()
        deadline = time.monotonic() + 10
        end(lambda: self.alive() + self.tracked, born_after=self.born, grace=0, quiet=0.3,
            bound=10)
        # A hopper slips through scans: stop it by its own log (kill what it names).
        hop_quiet = time.monotonic()
        size = -1
        while time.monotonic() < deadline:
            cur = os.path.getsize(self.hoplog)
            if cur != size:
                size, hop_quiet = cur, time.monotonic()
                try:
                    with open(self.hoplog, "rb") as f:
                        last = f.read().split()[-1:]
                except OSError:
                    last = []
                for pid in _pids_after(int(last[0])) if last else ():
                    ident = identity.read(pid)
                    if ident is None or ident.start < self.born:
                        continue
                    try:
                        with open(f"/proc/{pid}/environ", "rb") as f:
                            if f"TETHER_TEST_MARK={self.mark}".encode() in f.read().split(b"\0"):
                                gate.send_signal(ident, signal.SIGKILL, member=True)
                    except Exception:  # noqa: BLE001
                        pass
            elif time.monotonic() - hop_quiet > 0.3:
                break
            time.sleep(0.001)
        if time.monotonic() - hop_quiet > 0.3:  # else the stop file stays: it still ends the hopper
            for path in (self.hoplog, self.hoplog + ".stop", self.hoplog + ".noenv"):
                try:
                    os.unlink(path)
                except OSError:
                    pass
        for p in self.popens:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            for s in (p.stdin, p.stdout, p.stderr):
                if s is not None:
                    s.close()



def _pids_after(pid: int, n: int = 64) -> list[int]:
    """The pids the kernel hands out next after ``pid``, wrapping at pid_max
    (to 300, the first pid it reuses)."""
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            pid_max = int(f.read())
    except (OSError, ValueError):
        pid_max = 1 << 22
    return [q if q < pid_max else q - pid_max + 300 for q in range(pid - 2, pid + n)]


def available(name: str) -> bool:
    from tether.platform import probe

    return probe(name).available


POSIX_MECHS = [m for m in ("cgroup", "subreaper", "pidns", "pgroup") if sys.platform.startswith("linux")]


def run_owner(procs: Procs, mechanism: str, script: str, *extra: str) -> tuple[subprocess.Popen, dict]:
    """Start tests/_owner.py; return it and its first JSON line (after it set up)."""
    import json

    p = procs.popen([sys.executable, os.path.join(ROOT, "tests", "_owner.py"), mechanism, script, *extra],
                    stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    line = p.stdout.readline()
    if not line:
        raise RuntimeError("owner died before reporting")
    return p, json.loads(line)


def unprivileged_blocker(python: str = sys.executable, uid: int = 65534) -> str | None:
    """Why user ``uid`` cannot run ``python`` and import this tree's tether
    (a checkout or an interpreter in a directory only its owner may enter),
    or None: a test that runs code as another user skips with this reason
    instead of failing for where it is checked out."""
    import shutil

    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return "setpriv is not installed: cannot run code as another user"
    r = subprocess.run([setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", python,
                        "-c", "import tether"], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=SRC))
    if r.returncode == 0:
        return None
    closed = next((d for d in _parents(SRC) + _parents(python)
                   if os.path.isdir(d) and not os.stat(d).st_mode & 0o001), None)
    where = f" ({closed} is not searchable by other users)" if closed else ""
    last = (r.stderr.strip().splitlines() or ["?"])[-1]
    return f"uid {uid} cannot import tether from {SRC} with {python}{where}: {last}"


def _parents(path: str) -> list[str]:
    out = []
    p = os.path.abspath(path)
    while True:
        out.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            return out[::-1]
        p = parent



# -- the two tether-shells -------------------------------------------------------------

SHELL_KINDS = ("native", "python")


def is_native_program(path: str) -> bool:
    """Whether ``path`` is a compiled program (the native front end), not a script."""
    from tether.keeper.native import is_program

    return is_program(path)


def _native(name: str, override: str) -> str | None:
    path = os.environ.get(override) or os.path.join(os.path.dirname(sys.executable), name)
    return path if is_native_program(path) else None


def native_shell() -> str | None:
    """The native tether-shell pip installed (under scripts/_sanitized.sh the
    same program built with ASan and UBSan), or None where it was not built."""
    return _native("tether-shell", "_TETHER_TEST_NATIVE_SHELL")


def native_cli() -> str | None:
    """The native ``tether`` pip installed on Linux (it serves ``tether run``
    itself; the sanitized build under scripts/_sanitized.sh), or None where it
    was not built."""
    return _native("tether", "_TETHER_TEST_NATIVE_CLI")


def tether_shell(kind: str, scratch) -> str | None:
    """The installed tether-shell of ``kind``: ``native`` (the C program pip
    installs as ``tether-shell`` where it could be built; None where it was
    not) or ``python`` (``tether-shell-py`` beside it, the Python launcher the
    native one hands over to - ``tether-shell`` itself where no native one was
    built). When the package is only on PYTHONPATH (not installed) the Python
    one is an equivalent launcher written into ``scratch`` (a directory), so
    the tests still run the real entry point through a real exec."""
    bindir = os.path.dirname(sys.executable)
    main = os.path.join(bindir, "tether-shell")
    if kind == "native":
        return native_shell()
    for cand in (os.path.join(bindir, "tether-shell-py"), main):
        if os.access(cand, os.X_OK) and not is_native_program(cand):
            return cand
    path = os.path.join(str(scratch), "tether-shell")
    with open(path, "w") as f:
        f.write(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {SRC!r})\n"
                "from tether.shell import main\nsys.exit(main())\n")
    os.chmod(path, 0o755)
    return path


def pidns_command() -> list[str] | None:
    """util-linux unshare for a fresh PID namespace with its own /proc (with a
    user namespace when unprivileged), or None where it is not installed."""
    import shutil

    if not shutil.which("unshare"):
        return None
    if os.geteuid() == 0:
        return ["unshare", "--pid", "--fork", "--mount-proc"]
    return ["unshare", "-Ur", "--pid", "--fork", "--mount-proc"]


def run_in_pidns(script: str, *args: str, timeout: float, env: dict | None = None) -> dict:
    """Run ``python -c script args`` as PID 1's child in a fresh PID namespace
    (where a test may set ``ns_last_pid`` to hand a stranger a chosen pid)
    and return the JSON object its last line prints. Skips where there is no
    unshare or no PID namespace; fails on a non-zero exit."""
    import json

    import pytest

    cmd = pidns_command()
    if cmd is None:
        pytest.skip("util-linux unshare is not installed")
    e = dict(os.environ)
    e["PYTHONPATH"] = SRC + os.pathsep + e.get("PYTHONPATH", "")
    for k in ("TETHER_STATE_DIR", "TETHER_JOB"):
        e.pop(k, None)
    e.update(env or {})
    r = subprocess.run([*cmd, sys.executable, "-c", script, *args], capture_output=True,
                       text=True, timeout=timeout, env=e)
    if r.returncode != 0 and ("Operation not permitted" in r.stderr or "unshare failed" in r.stderr):
        pytest.skip(f"no PID namespace here: {r.stderr.strip()[:200]}")
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1])


def ptrace_hold(pid: int) -> list[int]:
    """Stop every thread of our child ``pid`` where it is, by ptrace
    (PTRACE_SEIZE, then PTRACE_INTERRUPT), and wait for each stop: it runs no
    more code until it is killed (SIGKILL still ends a tracee). Returns the
    thread ids held, for :func:`ptrace_kill`.

    Not SIGSTOP: a test that then kills a keeper orphans the process group of
    the stopped owner (the owner shares it with its command's tree), and the
    kernel sends an orphaned group with a stopped member SIGHUP + SIGCONT -
    the owner runs again and the tree is hung up. A ptrace stop is no
    job-control stop. Every thread: a ptrace stop holds one thread only.
    Skips the test where ptrace is not allowed."""
    import ctypes
    import errno

    import pytest

    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    held: set[int] = set()
    for _ in range(16):  # again while a thread appeared meanwhile
        tids = {int(t) for t in os.listdir(f"/proc/{pid}/task")} - held
        if not tids:
            return sorted(held)
        for tid in sorted(tids):
            for request in (0x4206, 0x4207):  # PTRACE_SEIZE, PTRACE_INTERRUPT
                if libc.ptrace(request, tid, None, None) != 0:
                    err = ctypes.get_errno()
                    if err == errno.ESRCH:
                        break  # the thread ended meanwhile
                    pytest.skip(f"ptrace is not allowed here: {os.strerror(err)}")
            else:
                _, status = os.waitpid(tid, getattr(os, "__WALL", 0x40000000))
                assert os.WIFSTOPPED(status), status
            held.add(tid)
    raise AssertionError(f"pid {pid} kept starting threads")


def ptrace_kill(p: subprocess.Popen, held: list[int], timeout: float = 10.0) -> int:
    """SIGKILL our child ``p``, held by :func:`ptrace_hold`, and reap it: its
    other threads first, which as tracees wait for their tracer (us) to take
    their exit before the process can be reaped. Returns its exit status."""
    p.kill()
    deadline = time.monotonic() + timeout
    for tid in held:
        while tid != p.pid and time.monotonic() < deadline:
            try:
                if os.waitpid(tid, os.WNOHANG | getattr(os, "__WALL", 0x40000000))[0]:
                    break
            except ChildProcessError:
                break
            time.sleep(0.005)
    return p.wait(timeout=max(0.1, deadline - time.monotonic()))

