"""``tether init`` as PID 1 of a PID namespace made by the test.

The namespace: ``unshare --pid --fork --mount-proc`` as root, with ``-Ur``
(a user namespace) otherwise. ``tether init`` runs as its PID 1; the
commands under it are small scripts that report what they see.

Controls, each the same check with a plain PID 1 that does not do init's
work, so each check is shown able to fail:

* zombies: the orphan-making script as PID 1 itself leaves its orphans as
  zombies; under tether init none is left;
* signals: ``sh`` as PID 1 never passes SIGUSR1 on (and, without a handler,
  the kernel drops it); under tether init the command and its process group
  get every signal;
* kill-all-on-exit: with ``sh`` as PID 1, a leftover background process gets
  no SIGTERM when the command exits (the kernel SIGKILLs the namespace); under
  tether init it gets SIGTERM first and can clean up;
* outside a namespace (tether init as a subreaper), the command's leftovers
  die with it, while the same command run plainly leaves them alive - and a
  process that is not init's descendant is left alone.

Every namespace is ended in a finalizer by SIGKILL to its init (identity-
checked), which makes the kernel end everything in it; every process started
outside a namespace is recorded and ended by identity.
"""

from __future__ import annotations

import functools
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time

import procutil
import pytest

from tether import gate, identity
from tether.errors import SignalRefused
from tether.identity import Identity

wait_until = functools.partial(procutil.wait_until, timeout=10.0)

pytestmark = [
    pytest.mark.mechanism,  # also run as an unprivileged user in CI
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux PID namespaces"),
    pytest.mark.timeout(60),
]

PY = sys.executable
INIT = [PY, "-m", "tether.init"]


def _ns_prefix() -> list[str] | None:
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    base = [unshare, "--pid", "--fork", "--mount-proc"]
    prefix = base if os.geteuid() == 0 else [unshare, "-Ur", "--pid", "--fork", "--mount-proc"]
    try:
        r = subprocess.run([*prefix, "true"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return prefix if r.returncode == 0 else None


_PREFIX: list[str] | None | bool = False


@pytest.fixture(scope="module")
def ns() -> list[str]:
    global _PREFIX
    if _PREFIX is False:
        _PREFIX = _ns_prefix()
    if _PREFIX is None:
        pytest.skip("cannot make a PID namespace here (unshare missing or refused)")
    return list(_PREFIX)  # type: ignore[arg-type]



class Lines:
    """Lines from a pipe, with a timeout per line (select on the raw fd: a
    buffered file object may already hold the next line select cannot see)."""

    def __init__(self, f) -> None:
        self.fd = f.fileno()
        self.buf = b""

    def next(self, timeout: float = 15.0) -> str | None:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([self.fd], [], [], left)
            if r:
                chunk = os.read(self.fd, 4096)
                if not chunk:
                    return None
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode() + "\n"


class Procs:
    """Processes a test started; ended in the finalizer, by identity."""

    def __init__(self) -> None:
        self.popens: list[subprocess.Popen] = []
        self.idents: list[Identity] = []

    def popen(self, args, **kw) -> subprocess.Popen:
        p = subprocess.Popen(args, **kw)
        self.popens.append(p)
        return p

    def ns_init(self, p: subprocess.Popen) -> Identity:
        """The namespace's init, as the outside sees it: unshare's one child."""
        def found():
            kids = identity.children(p.pid)
            if kids:
                i = identity.read(kids[0])
                if i is not None and i.comm != "unshare":  # exec'd already
                    return i
            return None

        i = wait_until(found)
        self.idents.append(i)
        return i

    def end(self) -> None:
        for i in self.idents:
            try:
                gate.send_signal(i, signal.SIGKILL)  # a namespace's init: ends it all
            except SignalRefused:
                pass
        for p in self.popens:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)
            for f in (p.stdin, p.stdout, p.stderr):
                if f is not None:
                    f.close()
        deadline = time.monotonic() + 5
        while any(identity.is_alive(i) for i in self.idents) and time.monotonic() < deadline:
            time.sleep(0.01)


@pytest.fixture
def procs():
    p = Procs()
    yield p
    p.end()


# ---------------------------------------------------------------------------
# Zombies

ORPHANS = r'''
import os, sys, time
n, want = int(sys.argv[1]), int(sys.argv[2])
r, w = os.pipe()
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        if os.fork() == 0:       # the grandchild: orphaned when its parent exits
            os.close(r)
            time.sleep(0.05)
            os._exit(0)          # ... then exits: a zombie unless PID 1 reaps it
        os._exit(0)
    os.waitpid(pid, 0)
os.close(w)
os.read(r, 1)                    # EOF: every grandchild has exited

def zombies():
    n = 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    n += f.read().rsplit(")", 1)[1].split()[0] == "Z"
            except OSError:
                pass
    return n

deadline = time.monotonic() + 5
while zombies() != want and time.monotonic() < deadline:
    time.sleep(0.01)
print(os.getpid(), zombies(), flush=True)
'''


def test_zombies_are_reaped(ns, procs):
    r = subprocess.run([*ns, *INIT, "--", PY, "-c", ORPHANS, "5", "0"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    pid, zombies = map(int, r.stdout.split())
    assert pid != 1  # the script is init's child, not PID 1
    assert zombies == 0


def test_control_zombies_pile_up_under_a_plain_pid1(ns, procs):
    r = subprocess.run([*ns, PY, "-c", ORPHANS, "5", "5"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    pid, zombies = map(int, r.stdout.split())
    assert pid == 1 and zombies == 5


# ---------------------------------------------------------------------------
# Signals

SIGS = r'''
import os, signal, sys, time
names = ["SIGHUP", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGWINCH", "SIGQUIT", "SIGTERM"]
def say(s):
    os.write(1, (s + "\n").encode())
if os.fork() == 0:
    # A second member of CMD's process group: it must get them too.
    for n in names:
        signal.signal(getattr(signal, n), signal.SIG_IGN)
    signal.signal(signal.SIGUSR2, lambda *_: say("member SIGUSR2"))
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    say("member ready")
    while True:
        time.sleep(1)
def handler(sig, _frame):
    name = signal.Signals(sig).name
    say(name)
    if name == "SIGTERM":
        os._exit(7)
for n in names:
    signal.signal(getattr(signal, n), handler)
time.sleep(0.05)
say("ready")
while True:
    time.sleep(1)
'''


def _start_sigs(procs, cmd):
    p = procs.popen(cmd, stdout=subprocess.PIPE)
    out = Lines(p.stdout)
    lines = {out.next(), out.next()}
    assert lines == {"ready\n", "member ready\n"}, lines
    return p, out, procs.ns_init(p)


def test_signals_are_forwarded_to_the_command_and_its_group(ns, procs, tmp_path):
    script = tmp_path / "sigs.py"
    script.write_text(SIGS)
    p, out, init = _start_sigs(procs, [*ns, *INIT, "--", PY, str(script)])
    assert init.comm.startswith("python")
    for name in ("SIGHUP", "SIGINT", "SIGUSR1", "SIGWINCH", "SIGQUIT"):
        assert gate.send_signal(init, getattr(signal, name))
        assert out.next(10) == f"{name}\n"
    assert gate.send_signal(init, signal.SIGUSR2)
    got = {out.next(10), out.next(10)}
    assert got == {"SIGUSR2\n", "member SIGUSR2\n"}
    # docker stop: SIGTERM; the command exits 7 and so does init.
    assert gate.send_signal(init, signal.SIGTERM)
    assert out.next(10) == "SIGTERM\n"
    assert p.wait(timeout=20) == 7


def test_control_a_plain_pid1_forwards_nothing(ns, procs, tmp_path):
    # sh as PID 1 (the script is its child, not exec'd): SIGUSR1 goes nowhere.
    script = tmp_path / "sigs.py"
    script.write_text(SIGS)
    p, out, init = _start_sigs(procs, [*ns, "sh", "-c", f"{PY} {script}; exit $?"])
    assert init.comm == "sh"
    assert gate.send_signal(init, signal.SIGUSR1)
    assert out.next(1.5) is None  # the same check as above sees nothing
    assert p.poll() is None


# ---------------------------------------------------------------------------
# Exit status


@pytest.mark.parametrize("cmd, code", [
    (["sh", "-c", "exit 7"], 7),
    (["sh", "-c", "exit 0"], 0),
    (["sh", "-c", "kill -TERM $$"], 128 + 15),
    (["sh", "-c", "kill -KILL $$"], 128 + 9),
    (["tether-no-such-command"], 127),
    (["NOT-EXECUTABLE"], 126),
])
def test_exit_status_is_the_commands(ns, cmd, code, tmp_path):
    if cmd == ["NOT-EXECUTABLE"]:
        f = tmp_path / "data.txt"
        f.write_text("not a program\n")
        f.chmod(0o644)  # no x bit: EACCES from execve, even for root
        cmd = [str(f)]
    r = subprocess.run([*ns, *INIT, "--", *cmd], capture_output=True, text=True, timeout=30)
    assert r.returncode == code, r.stderr
    if code in (126, 127):
        assert r.stderr.startswith("tether init: ")


def test_usage_errors():
    r = subprocess.run([*INIT], capture_output=True, text=True, timeout=30)
    assert r.returncode == 125 and "missing command" in r.stderr
    r = subprocess.run([*INIT, "--grace", "soon", "--", "true"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 125 and "not a number" in r.stderr
    r = subprocess.run([*INIT, "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.startswith("usage: tether init")


# ---------------------------------------------------------------------------
# Everything ends when CMD exits

LEFTOVER = r'''
trap 'echo got-TERM > "$1"; exit 0' TERM
sleep 300 &
touch "$1.ready"
wait
'''


def _leftover_cmd(tmp_path) -> tuple[list[str], str]:
    script = tmp_path / "leftover.sh"
    script.write_text(LEFTOVER)
    mark = str(tmp_path / "mark")
    cmd = ["sh", "-c",
           f'sh {script} {mark} & while [ ! -e {mark}.ready ]; do sleep 0.01; done; exit 3']
    return cmd, mark


def test_leftovers_get_sigterm_when_the_command_exits(ns, tmp_path):
    cmd, mark = _leftover_cmd(tmp_path)
    t0 = time.monotonic()
    r = subprocess.run([*ns, *INIT, "--grace", "20", "--", *cmd],
                       capture_output=True, text=True, timeout=40)
    took = time.monotonic() - t0
    assert r.returncode == 3, r.stderr
    assert os.path.exists(mark), "the leftover never saw SIGTERM"
    assert open(mark).read().strip() == "got-TERM"
    # init stopped waiting as soon as nothing was left, not after the grace.
    assert took < 15, f"took {took:.1f} s"


def test_control_a_plain_pid1_gives_leftovers_no_sigterm(ns, tmp_path):
    cmd, mark = _leftover_cmd(tmp_path)
    r = subprocess.run([*ns, *cmd], capture_output=True, text=True, timeout=40)
    assert r.returncode == 3, r.stderr
    assert os.path.exists(mark + ".ready")  # it ran ...
    time.sleep(0.3)
    assert not os.path.exists(mark)  # ... and was SIGKILLed by the kernel, no SIGTERM


def test_a_leftover_that_ignores_sigterm_is_killed_after_the_grace(ns, tmp_path):
    cmd = ["sh", "-c", "sh -c 'trap \"\" TERM; while :; do sleep 0.05; done' & sleep 0.2; exit 5"]
    t0 = time.monotonic()
    r = subprocess.run([*ns, *INIT, "--grace", "1", "--", *cmd],
                       capture_output=True, text=True, timeout=40)
    took = time.monotonic() - t0
    assert r.returncode == 5, r.stderr
    assert 1.0 <= took < 15


# Outside any namespace: tether init is not PID 1, so it is a subreaper and
# ends its own descendants, each by identity (no broadcast signal).

LEAVER = r'''
import json, os, subprocess, sys
from tether import gate, identity
# Their stdout is not ours: a leftover holding the caller's pipe open would
# make the caller wait for it.
null = os.open(os.devnull, os.O_WRONLY)
p = subprocess.Popen(["sleep", "300"], stdout=null, stderr=null)  # orphaned when we exit
r, w = os.pipe()
if os.fork() == 0:                              # a double-forked setsid daemon
    os.setsid()
    if os.fork() == 0:
        os.close(r)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.write(w, str(os.getpid()).encode())
        os.close(w)
        os.execvp("sleep", ["sleep", "301"])
    os._exit(0)
os.close(w)
daemon = int(os.read(r, 32))
out = [identity.read(p.pid).to_dict(), identity.read(daemon).to_dict()]
print(json.dumps(out), flush=True)
os._exit(0)
'''


@pytest.fixture
def recorded():
    idents: list[Identity] = []
    yield idents
    for i in idents:
        try:
            gate.send_signal(i, signal.SIGKILL)
        except SignalRefused:
            pass
    deadline = time.monotonic() + 5
    while any(identity.is_alive(i) for i in idents) and time.monotonic() < deadline:
        time.sleep(0.01)


def test_outside_a_namespace_init_ends_its_descendants_only(recorded):
    bystander = subprocess.Popen(["sleep", "309"])  # not under init: must survive
    recorded.append(identity.read(bystander.pid))
    try:
        r = subprocess.run([*INIT, "--", PY, "-c", LEAVER], capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 0, r.stderr
        left = [Identity.from_dict(d) for d in json.loads(r.stdout)]
        recorded.extend(left)
        for i in left:
            assert not identity.is_alive(i), f"{i.pid} ({i.comm}) survived tether init"
        assert bystander.poll() is None and identity.is_alive(recorded[0])
    finally:
        bystander.kill()
        bystander.wait(timeout=10)


def test_control_without_init_the_same_leftovers_survive(recorded):
    r = subprocess.run([PY, "-c", LEAVER], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    left = [Identity.from_dict(d) for d in json.loads(r.stdout)]
    recorded.extend(left)
    for i in left:
        assert identity.is_alive(i)
