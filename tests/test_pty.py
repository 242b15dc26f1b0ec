"""tether.pty: real pseudo-terminals, real shells, real processes.

Safety: every process here carries the test's ``TETHER_TEST_MARK`` (the
``procs`` fixture of conftest.py), whose finalizer ends every live process
born after the test began that carries it, by identity; each session is also
closed by the ``sessions`` finalizer. Kill checks read ``/proc`` directly
(``_proc_*`` below), independently of the session's records and of tether's
own capture code. Fake-PID tests send SIGURG (ignored by default), so even a
broken refusal could not end anything.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
from procutil import wait_until

from tether import gate, identity, sparse_capture
from tether.errors import SignalRefused
from tether.identity import Identity
from tether.pty import COOKIE_VAR, CloseResult, PtySession, SessionClosed, SessionClosing

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc and PTYs"),
    pytest.mark.timeout(60),
]

SH = "/bin/sh"
IN_CI = bool(os.environ.get("CI"))


def _available(name: str) -> bool:
    from tether.platform import probe

    return probe(name).available


# ------------------------------------------------------------------ /proc, read directly


def _proc_stat(pid: int) -> tuple[str, int, int, int, int, int] | None:
    """(state, ppid, pgid, sid, tty_nr, start ticks) straight from /proc/PID/stat."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    f = data[data.rindex(b")") + 2 :].split()
    return f[0].decode(), int(f[1]), int(f[2]), int(f[3]), int(f[4]), int(f[19])


def _comm(pid: int) -> str | None:
    """The process's command name (what it last exec'd), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None


def _proc_alive(pid: int, start: int) -> bool:
    """The process (pid, start) exists and is not a zombie (a zombie has exited:
    PID 1 here reaps orphans only every ~2 s)."""
    st = _proc_stat(pid)
    return st is not None and st[5] == start and st[0] not in ("Z", "X")


def _proc_marked_sleeps(mark: str, born: int) -> list[tuple[int, int]]:
    """(pid, start) of every live ``sleep 120`` born after ``born`` whose
    environment carries ``TETHER_TEST_MARK=mark``: this test's own sleeps,
    found without the session's records or tether's capture."""
    out = []
    needle = f"TETHER_TEST_MARK={mark}".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        st = _proc_stat(pid)
        if st is None or st[5] < born or st[0] in ("Z", "X"):
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read() != b"sleep\x00120\x00":
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
        except OSError:
            continue
        out.append((pid, st[5]))
    return sorted(out)



# ------------------------------------------------------------------ fixtures


@pytest.fixture
def sessions():
    """Start sessions; the finalizer closes each at once and ends its job."""
    made: list[PtySession] = []

    def _make(*args, **kw) -> PtySession:
        s = PtySession(*args, **kw)
        made.append(s)
        return s

    yield _make
    for s in made:
        try:
            s.close("immediate", timeout=15)
        except Exception:  # noqa: BLE001 - best effort; procs' finalizer is the backstop
            pass
        if s.job is not None:
            s.job.close()


def _throwaway_env(procs, tmp_path, **extra: str) -> dict[str, str]:
    """The test's marked environment with a throwaway HOME and XDG dirs."""
    home = tmp_path / "home"
    env = procs.env(HOME=str(home), TERM="xterm", LANG="C", LC_ALL="C", **extra)
    for var, sub in (("XDG_CONFIG_HOME", ".config"), ("XDG_DATA_HOME", ".local/share"),
                     ("XDG_CACHE_HOME", ".cache"), ("XDG_STATE_HOME", ".local/state"),
                     ("XDG_RUNTIME_DIR", "run")):
        d = home / sub
        d.mkdir(parents=True, exist_ok=True)
        env[var] = str(d)
    os.chmod(home / "run", 0o700)
    # zsh with no startup file at all runs its interactive new-user menu.
    (home / ".zshrc").write_text("")
    for var in ("ZDOTDIR", "BASH_ENV", "ENV", "PROMPT_COMMAND", "HISTFILE"):
        env.pop(var, None)
    return env


def _shell(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if IN_CI:
            pytest.fail(f"{name} is not installed; .ci/run must install it (apt-get install -y {name})")
        pytest.skip(f"{name} is not installed")
    return path


def _sh_session(sessions, procs, script: str, **kw) -> PtySession:
    return sessions([SH, "-c", script], env=procs.env(), **kw)


# ------------------------------------------------------------------ terminal basics


def test_program_has_the_terminal_as_controlling_terminal(sessions, procs):
    s = _sh_session(sessions, procs, "echo READY; read x")
    s.read_until(b"READY", 5)
    st = _proc_stat(s.pid)
    assert st is not None
    state, ppid, pgid, sid, tty_nr, start = st
    assert sid == pgid == s.pid  # a session of its own
    assert tty_nr == os.stat(s.slave_path).st_rdev  # the pty is its controlling terminal
    with open(f"/proc/{s.pid}/stat", "rb") as f:
        tpgid = int(f.read().rsplit(b")", 1)[1].split()[5])
    assert tpgid == s.pid  # and it is in the foreground
    assert s.root is not None and s.root.start == start


def test_ctrl_c_reaches_the_foreground_program(sessions, procs):
    s = _sh_session(sessions, procs, "echo READY; exec sleep 30")
    s.read_until(b"READY", 5)
    wait_until(lambda: _comm(s.pid) == "sleep")
    s.write(b"\x03")
    assert s.wait(5) == -signal.SIGINT


def test_read_write_echo(sessions, procs):
    s = sessions(["cat"], env=procs.env())
    s.write("hello tether\n")
    out = s.read_until(b"hello tether\r\nhello tether\r\n", 5)  # the echo, then cat's copy
    assert out.endswith(b"hello tether\r\nhello tether\r\n")


def test_resize_sends_sigwinch_and_sets_size(sessions, procs):
    s = _sh_session(sessions, procs, "trap 'echo WINCH; stty size' WINCH; echo READY; "
                    "while :; do sleep 0.02; done", rows=24, cols=80)
    s.read_until(b"READY", 5)
    assert s.size == (24, 80)
    s.resize(40, 100)
    assert s.size == (40, 100)
    out = s.read_until(b"40 100", 5)
    assert b"WINCH" in out


@pytest.mark.parametrize("rows,cols,error", [(-1, 80, ValueError), (24, 65536, ValueError),
                                             (True, 80, TypeError), (24, 2.5, TypeError),
                                             (24, "80", TypeError)])
def test_a_bad_size_is_a_clear_error_and_changes_nothing(sessions, procs, rows, cols, error):
    # it used to be struct.error ("ushort format requires ..."), and True was 1 row
    with pytest.raises(error, match="rows|cols"):
        sessions([SH, "-c", "sleep 30"], env=procs.env(), rows=rows, cols=cols)
    s = _sh_session(sessions, procs, "echo READY; read x", rows=24, cols=80)
    s.read_until(b"READY", 5)
    with pytest.raises(error, match="rows|cols"):
        s.resize(rows, cols)
    assert s.size == (24, 80)
    s.resize(0, 65535)  # the control: the bounds themselves are taken
    assert s.size == (0, 65535)


def test_initial_size(sessions, procs):
    s = _sh_session(sessions, procs, "stty size; read x", rows=33, cols=77)
    assert b"33 77" in s.read_until(b"33 77", 5)


def test_exit_status(sessions, procs):
    s = _sh_session(sessions, procs, "exit 7")
    assert s.wait(5) == 7
    assert s.returncode == 7
    r = s.close()
    assert r.returncode == 7 and r.ok


def test_env_cwd_and_cookie(sessions, procs, tmp_path):
    s = sessions([SH, "-c", 'echo "[$PWD] [$FOO] [$' + COOKIE_VAR + ']"; read x'],
                 env=procs.env(FOO="bar"), cwd=str(tmp_path))
    out = s.read_until(b"]\r\n", 5).decode()
    assert f"[{tmp_path}] [bar] [{s.token}]" in out


@pytest.mark.parametrize("argv", [["no-such-program-tether"], ["/etc/passwd"], ["./plain"],
                                  ["/tmp"], ["./no-shebang"], [""], ["/no/such/dir/prog"]])
def test_a_program_that_cannot_start_raises_what_popen_raises(procs, tmp_path, argv):
    # the same exception and errno as subprocess (a non-executable file and
    # "" were FileNotFoundError), and nothing is left open
    (tmp_path / "plain").write_text("x")
    (tmp_path / "no-shebang").write_text("echo hi\n")
    (tmp_path / "no-shebang").chmod(0o755)

    def error(start) -> tuple[type, int]:
        with pytest.raises(OSError) as exc:
            start()
        return type(exc.value), exc.value.errno

    want = error(lambda: subprocess.Popen(argv, cwd=tmp_path, env=procs.env()))
    assert error(lambda: PtySession(argv, env=procs.env(), cwd=str(tmp_path))) == want
    fds = len(os.listdir("/proc/self/fd"))  # (after a first job: what tether keeps for all)
    assert error(lambda: PtySession(argv, env=procs.env(), cwd=str(tmp_path))) == want
    assert len(os.listdir("/proc/self/fd")) == fds


# ------------------------------------------------------------------ readers


def test_readers_attach_detach_and_replay(sessions, procs):
    s = sessions(["cat"], env=procs.env())
    s.write("one\n")
    s.read_until(b"one\r\none\r\n", 5)
    a = s.attach()
    b = s.attach(replay=True)
    assert b.read_until(b"one\r\none\r\n", 5)  # scrollback first
    s.write("two\n")
    assert a.read_until(b"two\r\ntwo\r\n", 5).count(b"two") == 2
    assert b.read_until(b"two\r\ntwo\r\n", 5).count(b"two") == 2
    a.detach()
    assert a.read(0.1) == b"" and a.eof  # a detached reader ends
    s.write("three\n")
    assert b.read_until(b"three\r\nthree\r\n", 5)
    assert a.read(0.1) == b""  # and receives nothing more
    r = s.close()
    assert r.ok
    for _ in range(100):  # the close ends attached readers: what is buffered, then b""
        if b.read(2) == b"":
            break
    else:
        raise AssertionError("reader never ended")
    assert b.eof


def test_slow_reader_drops_oldest_and_never_stalls(sessions, procs):
    s = _sh_session(sessions, procs, "stty -echo; echo READY; read x; i=0; "
                    "while [ $i -lt 400 ]; do echo line-$i; i=$((i+1)); done; echo DONE; read x")
    s.read_until(b"READY", 5)
    slow = s.attach(max_buffer=1024)
    s.write(b"go\n")
    s.read_until(b"DONE", 10)  # the primary reader kept up
    time.sleep(0.05)
    data = slow.read(1)
    assert len(data) <= 1024 and slow.dropped > 0
    assert data.rstrip().endswith(b"DONE")


def test_a_write_that_times_out_says_how_much_the_terminal_took(sessions, procs):
    # TimeoutError said only that it timed out: the caller could not know
    # what of its input the program would still get
    data = b"x" * (16 << 20)  # more than the terminal and the kernel's buffers hold
    s = _sh_session(sessions, procs, "sleep 30")  # reads nothing
    with pytest.raises(TimeoutError) as exc:
        s.write(data, timeout=0.3)
    assert 0 < exc.value.written < len(data), exc.value.written
    assert f"({exc.value.written} of {len(data)} bytes taken)" in str(exc.value)
    # the control: a program that reads takes it all
    r = _sh_session(sessions, procs, "stty raw -echo; cat >/dev/null")
    time.sleep(0.3)  # (stty before the write)
    assert r.write(data, timeout=20) == len(data)


def test_read_until_errors_read_as_their_message_and_carry_the_output(sessions, procs):
    # TimeoutError(message, data) printed "[Errno <message>] <data>", and
    # EOFError(message, data) a tuple
    from tether.pty import OutputEnded, OutputTimeout

    s = _sh_session(sessions, procs, "echo hi; sleep 1")
    with pytest.raises(TimeoutError) as t:
        s.read_until(b"nope", 0.3)
    assert isinstance(t.value, OutputTimeout)
    assert str(t.value) == "b'nope' not seen within 0.3 s"
    assert t.value.data == t.value.args[1] and t.value.data.startswith(b"hi")
    with pytest.raises(EOFError) as e:
        s.read_until(b"nope", 10)
    assert isinstance(e.value, OutputEnded) and str(e.value) == "output ended before b'nope'"
    assert e.value.data.startswith(b"hi")
    # the control: a needle that comes is read through
    r = _sh_session(sessions, procs, "echo there; sleep 1")
    assert r.read_until(b"there", 5).endswith(b"there")


def test_read_times_out(sessions, procs):
    s = _sh_session(sessions, procs, "read x")
    with pytest.raises(TimeoutError):
        s.read(0.05)


# ------------------------------------------------------------------ close: the real-PTY probe


def _start_probe(sessions, procs, tmp_path, shell: str, mechanism: str) -> tuple[PtySession, list]:
    sh = _shell(shell)
    if mechanism != "auto" and not _available(mechanism):
        pytest.skip(f"{mechanism} not available here")
    env = _throwaway_env(procs, tmp_path)
    s = sessions([sh, "-i"], env=env, mechanism=mechanism)
    # $((..)): the typed line is echoed back; only the output has the result.
    s.write("echo MARK-$((40+2))\n")
    s.read_until(b"MARK-42", 10)
    s.write("sleep 120 &\n")
    # Under pgroup the setsid one also drops the job's cookie (it keeps the
    # session's own): the mechanism alone cannot find it, only the close's
    # capture can, which is what the pgroup cases prove.
    s.write("setsid env -u TETHER_JOB sleep 120 &\n" if mechanism == "pgroup"
            else "setsid sleep 120 &\n")
    s.write("echo READY-$((2+3))\n")
    s.read_until(b"READY-5", 10)
    sleeps = wait_until(lambda: (lambda x: x if len(x) == 2 else None)(
        _proc_marked_sleeps(procs.mark, procs.born)))
    # One of them left the shell's session (setsid): the probe covers both kinds.
    sids = {_proc_stat(pid)[3] for pid, _ in sleeps}
    assert s.pid in sids and len(sids) == 2
    return s, sleeps


@pytest.mark.mechanism
@pytest.mark.parametrize("mechanism", ["auto", "pgroup"])
@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_probe_immediate_close_leaves_no_background_job(sessions, procs, tmp_path, shell, mechanism):
    s, sleeps = _start_probe(sessions, procs, tmp_path, shell, mechanism)
    r = s.close("immediate")
    assert isinstance(r, CloseResult) and r.ok, r
    # The capture saw both sleeps (under pgroup this is what proves the
    # capture path: the mechanism alone misses the setsid one, see the control).
    captured = {(i.pid, i.start) for i in r.captured}
    assert set(sleeps) <= captured, (sleeps, r.captured)
    # Checked right after close() returned, not after a wait: close returns
    # only once every captured process has exited.
    assert [x for x in sleeps if _proc_alive(*x)] == []
    assert _proc_marked_sleeps(procs.mark, procs.born) == []
    assert r.refused == [] and r.failed == []
    assert s.owner_record is None
    assert s.returncode is not None


@pytest.mark.mechanism
@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_probe_control_graceful_close_leaves_the_setsid_job(sessions, procs, tmp_path, shell):
    """Control: the same check sees a survivor when the close is graceful
    (normal hang-up handling: `setsid sleep &` ignores the terminal's hang-up)."""
    s, sleeps = _start_probe(sessions, procs, tmp_path, shell, "auto")
    r = s.close("graceful")
    assert r.error is None
    time.sleep(0.3)
    alive = [x for x in sleeps if _proc_alive(*x)]
    assert alive, "control: a graceful close was expected to leave the setsid sleep running"
    assert {p for p, _ in alive} <= {i.pid for i in r.left_running}
    # ...and it is still in the session's job, which ends it (procs' finalizer
    # would otherwise, by its mark).
    s.job.close()
    assert wait_until(lambda: not [x for x in sleeps if _proc_alive(*x)], 5)


@pytest.mark.mechanism
@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_probe_control_pgroup_mechanism_alone_misses_the_setsid_job(sessions, procs, tmp_path,
                                                                   shell):
    """Control for the pgroup probe: ending the job by the mechanism alone
    (no close capture) leaves the `setsid sleep`, so the probe's success
    under pgroup is the capture's doing."""
    s, sleeps = _start_probe(sessions, procs, tmp_path, shell, "pgroup")
    setsid_one = [x for x in sleeps if _proc_stat(x[0])[3] != s.pid]
    s.job.close()
    time.sleep(0.3)
    assert [x for x in setsid_one if _proc_alive(*x)], \
        "control: the pgroup mechanism alone was expected to miss the setsid sleep"


@pytest.mark.mechanism
@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_probe_control_without_tether(procs, tmp_path, shell):
    """Control: a plain PTY (os.openpty + Popen) closed by hanging up leaves
    the background job; the same /proc check sees it."""
    sh = _shell(shell)
    env = _throwaway_env(procs, tmp_path)
    master, slave = os.openpty()
    p = None
    try:
        # The same controlling-terminal shim the session uses, without a job.
        p = procs.popen(["/bin/sh", "-c", 'exec "$@" <>"$0" >&0 2>&0', os.ttyname(slave), sh, "-i"],
                        stdin=slave, stdout=slave, stderr=slave, env=env)
        os.close(slave)
        slave = -1
        buf = b""

        def until(needle: bytes) -> None:
            nonlocal buf
            deadline = time.monotonic() + 10
            while needle not in buf:
                assert time.monotonic() < deadline, buf
                import select

                if select.select([master], [], [], 0.1)[0]:
                    buf += os.read(master, 65536)

        os.write(master, b"echo MARK-$((40+2))\n")
        until(b"MARK-42")
        os.write(master, b"sleep 120 &\nsetsid sleep 120 &\necho READY-$((2+3))\n")
        until(b"READY-5")
        sleeps = wait_until(lambda: (lambda x: x if len(x) == 2 else None)(
            _proc_marked_sleeps(procs.mark, procs.born)))
        os.close(master)  # hang up, as a closing terminal window does
        master = -1
        p.wait(5)
        time.sleep(0.3)
        assert [x for x in sleeps if _proc_alive(*x)], "control: expected a survivor without tether"
    finally:
        for fd in (master, slave):
            if fd >= 0:
                os.close(fd)
        # procs' finalizer ends the marked survivors by identity.


# ------------------------------------------------------------------ close: concurrency


_STUBBORN = ("trap '' HUP TERM; sleep 120 & echo BG=$!; echo READY; "
             "while :; do sleep 0.05; done")


def _bg_identity(s: PtySession) -> Identity:
    out = s.read_until(b"READY", 5).decode()
    pid = int(out.split("BG=")[1].split()[0])
    ident = identity.read(pid)
    assert ident is not None and identity.is_alive(ident)
    return ident


@pytest.mark.mechanism
def test_second_close_joins_the_same_operation(sessions, procs):
    s = _sh_session(sessions, procs, _STUBBORN, grace=0.6)
    bg = _bg_identity(s)
    results: list[CloseResult] = []
    t = threading.Thread(target=lambda: results.append(s.close("immediate")))
    t.start()
    wait_until(lambda: s.state == "closing")
    op = s.close("graceful", wait=False)  # joins, whatever mode it asks for
    assert not op.done()  # still pending: the stubborn processes ignore TERM/HUP
    assert op.mode == "immediate"
    with pytest.raises(SessionClosing):
        s.attach()
    with pytest.raises(SessionClosing):
        s.write(b"x")
    assert s.owner_record is not None  # kept while the close is pending
    r2 = s.close()
    t.join(10)
    assert results and results[0] is r2 is op.result(0)
    assert r2.ok
    killed = {i.pid for i in r2.killed}
    assert bg.pid in killed and s.pid in killed  # they ignored TERM: SIGKILL after the grace
    assert r2.elapsed >= 0.5
    assert not identity.is_alive(bg)
    with pytest.raises(SessionClosed):
        s.attach()


@pytest.mark.mechanism
@pytest.mark.parametrize("first", ["graceful", "immediate"])
def test_immediate_and_graceful_closes_meet_as_one_immediate_close(sessions, procs, first):
    """An immediate close during a pending graceful one escalates it; a
    graceful one during a pending immediate one joins it. Either order: one
    immediate result for both callers, and nothing of the session is left
    (the program and its background job ignore SIGHUP and SIGTERM)."""
    s = _sh_session(sessions, procs, _STUBBORN, grace=1.0)
    bg = _bg_identity(s)
    root = identity.read(s.pid)
    op1 = s.close(first, wait=False)
    wait_until(lambda: s.state == "closing")
    time.sleep(0.2)  # well inside the first close: graceful waits for the root
    assert not op1.done()
    second = "immediate" if first == "graceful" else "graceful"
    op2 = s.close(second, wait=False)
    assert op2 is op1 and op1.mode == "immediate"
    r = op1.result(20)
    assert r is op2.result(0) is s.close()  # every caller: the same immediate result
    assert r.mode == "immediate" and r.ok, r
    assert r.left_running == []
    assert any(i.same_process(bg) for i in r.captured)
    killed = {(i.pid, i.start) for i in r.killed}
    assert (bg.pid, bg.start) in killed and (root.pid, root.start) in killed  # after the grace
    assert not identity.is_alive(bg) and not identity.is_alive(root)
    assert _proc_marked_sleeps(procs.mark, procs.born) == []


@pytest.mark.mechanism
def test_control_a_graceful_close_alone_leaves_the_stubborn_background_job(sessions, procs):
    """Control for the test above: the graceful close by itself leaves the
    background job running (reported, in the session's job)."""
    s = _sh_session(sessions, procs, _STUBBORN, grace=0.3)
    bg = _bg_identity(s)
    r = s.close("graceful")
    assert r.mode == "graceful"
    assert identity.is_alive(bg)
    assert any(i.same_process(bg) for i in r.left_running)
    s.job.close()
    assert wait_until(lambda: not identity.is_alive(bg), 5)


@pytest.mark.mechanism
def test_close_completing_while_an_attach_waits(sessions, procs):
    s = _sh_session(sessions, procs, "echo READY; while :; do echo tick; sleep 0.01; done")
    s.read_until(b"READY", 5)
    blocked_reader = s.attach()
    outcome: list[object] = []
    # Hold the output lock, as the pump does while it delivers a chunk: an
    # attach now has to wait for it.
    s._io_lock.acquire()
    try:
        t = threading.Thread(target=lambda: outcome.append(_attach_outcome(s)))
        t.start()
        time.sleep(0.1)
        assert t.is_alive() and not outcome  # the attach is waiting
        r = s.close("immediate", timeout=10)  # ...and the whole close completes meanwhile
        assert r.ok and s.state == "closed"
    finally:
        s._io_lock.release()
    t.join(5)
    assert len(outcome) == 1 and isinstance(outcome[0], SessionClosed), outcome
    # A reader that was attached and reading sees the end, not a hang.
    deadline = time.monotonic() + 5
    while blocked_reader.read(5) != b"":
        assert time.monotonic() < deadline


def _attach_outcome(s: PtySession) -> object:
    try:
        return s.attach()
    except SessionClosing as exc:
        return exc


@pytest.mark.mechanism
@pytest.mark.parametrize("mechanism", ["auto", "pgroup"])
def test_shell_exits_by_itself_during_the_capture(sessions, procs, mechanism):
    if mechanism != "auto" and not _available(mechanism):
        pytest.skip(f"{mechanism} not available here")
    # The first sleep ignores SIGHUP, so it outlives the hang-up the kernel
    # sends the foreground group when the shell (the session leader) exits:
    # an orphan left in the session, whose leader is gone.
    s = _sh_session(sessions, procs, "(trap '' HUP; exec sleep 120) & setsid sleep 120 & "
                    "echo READY; read x; exit 3", mechanism=mechanism)
    s.read_until(b"READY", 5)
    sleeps = wait_until(lambda: (lambda x: x if len(x) == 2 else None)(
        _proc_marked_sleeps(procs.mark, procs.born)))
    root = s.root

    def capture_after_the_shell_left(real, **kw):
        # The close has begun (input is refused by now); the shell gets its
        # line through the terminal and exits by itself before the capture.
        os.write(s._master, b"\n")
        wait_until(lambda: not identity.is_alive(root), 5, 0.001)
        return real(**kw)

    _wrap_captures(s, capture_after_the_shell_left)
    r = s.close("immediate")
    assert r.ok and r.error is None
    assert r.returncode == 3  # it exited by itself, not by our signals
    assert set(sleeps) <= {(i.pid, i.start) for i in r.captured}
    assert [x for x in sleeps if _proc_alive(*x)] == []


@pytest.mark.mechanism
def test_failed_signal_is_retried(sessions, procs):
    s = _sh_session(sessions, procs, "sleep 120 & echo BG=$!; echo READY; read x")
    bg = _bg_identity(s)
    calls: list[tuple[int, int]] = []
    real_send = s._send

    def flaky_send(ident, sig, member=False, **kw):
        # A transient failure (as from pidfd_open under EMFILE/ENOMEM) on the
        # first attempt at each process; then the real, identity-checked call.
        calls.append((ident.pid, sig))
        if calls.count((ident.pid, sig)) == 1:
            raise OSError(errno.EAGAIN, "injected transient failure")
        return real_send(ident, sig, member=member, **kw)

    s._send = flaky_send
    r = s.close("immediate")
    assert r.ok and r.failed == []
    assert calls.count((bg.pid, signal.SIGTERM)) == 2  # failed once, retried once
    assert any(i.same_process(bg) for i in r.terminated)
    assert not identity.is_alive(bg)


@pytest.mark.mechanism
def test_signal_failing_every_time_is_reported_and_the_job_still_ends(sessions, procs):
    # The background sleep ignores the terminal's hang-up, so only signals
    # (which fail for it here) or the job's end can stop it.
    s = _sh_session(sessions, procs, "(trap '' HUP; exec sleep 120) & echo BG=$!; echo READY; "
                    "read x", grace=0.2)
    bg = _bg_identity(s)
    # Only once it is sleep has the subshell set its trap: before that the
    # hang-up ends it, and no SIGKILL is ever tried (a loaded CI replica).
    wait_until(lambda: _comm(bg.pid) == "sleep")
    real_send = s._send

    def broken_for_bg(ident, sig, member=False, **kw):
        if ident.pid == bg.pid:
            raise OSError(errno.EAGAIN, "injected persistent failure")
        return real_send(ident, sig, member=member, **kw)

    s._send = broken_for_bg
    r = s.close("immediate")
    assert {(i.pid, sig) for i, sig, _ in r.failed} >= {(bg.pid, signal.SIGTERM),
                                                        (bg.pid, signal.SIGKILL)}
    assert r.job_ended
    assert not identity.is_alive(bg)  # the job's mechanism ended it
    assert r.survivors == []


@pytest.mark.mechanism
def test_stopped_background_job_ends_within_the_grace(sessions, procs):
    # In a session of its own, so no kernel hang-up or orphaned-group SIGCONT
    # reaches it: only the close's own SIGCONT lets it act on SIGTERM.
    s = _sh_session(sessions, procs, "setsid sleep 120 & kill -STOP $!; echo BG=$!; echo READY; "
                    "read x", grace=5.0)
    bg = _bg_identity(s)
    wait_until(lambda: (identity.read(bg.pid) or bg).state == "T")
    r = s.close("immediate")
    assert r.ok
    assert any(i.same_process(bg) for i in r.terminated)
    assert not any(i.same_process(bg) for i in r.killed)
    assert r.elapsed < 3.0  # not after the 5 s grace
    assert not identity.is_alive(bg)


def test_control_a_stopped_process_ignores_sigterm_alone(procs):
    p = procs.popen(["sleep", "120"])
    p.send_signal(signal.SIGSTOP)
    wait_until(lambda: (identity.read(p.pid) or Identity(0, 0, "")).state == "T")
    p.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert p.poll() is None  # pending, not acted on: the test above would see a survivor


# ------------------------------------------------------------------ close: safety


def test_fake_pids_of_the_runner_are_refused(sessions, procs, sigurg_seen):
    s = _sh_session(sessions, procs, "read x")
    res = CloseResult(mode="immediate")
    me = identity.read(os.getpid())
    parent = identity.read(os.getppid())
    fakes = [me, parent, Identity(1, 0, identity.boot_id()), Identity(0, 0, identity.boot_id()),
             Identity(-1, 0, identity.boot_id())]
    fakes += [a for a in (identity.read(p) for p in identity.own_ancestors()) if a is not None]
    for f in fakes:
        assert s._signal(f, signal.SIGURG, res) is False
    assert len(res.refused) == len(fakes)
    assert res.failed == []
    time.sleep(0.05)
    assert sigurg_seen == []


@pytest.mark.parametrize("control", [False, True], ids=["reused-pid", "control-real-start"])
def test_fake_pids_injected_into_the_capture_never_reach_a_signal(sessions, procs, sigurg_seen,
                                                                   control):
    s = _sh_session(sessions, procs, "read x")
    # real, ours, and must survive: its start is faked. Control: it carries the
    # session's cookie and keeps its real start, so the gate's proof lets a
    # signal land (without the cookie the proof alone would spare it).
    env = procs.env()
    if control:
        env[COOKIE_VAR] = s.token
    victim = procs.popen(["sleep", "120"], env=env)
    v = identity.read(victim.pid)
    assert v is not None
    me = identity.read(os.getpid())
    parent = identity.read(os.getppid())
    sent: list[tuple[int, int]] = []
    real_send = s._send

    def capture_with_fakes(real, **kw):
        cap = real(**kw)
        if isinstance(cap, sparse_capture.SparseCapture):
            # A full snapshot instead, same walks: nothing can be injected
            # in the kernel's children lists the sparse one reads.
            cap = identity.capture(**kw)
        # As a torn or hostile snapshot could show them: the runner, its
        # parent and PID 1 as children of the session's root, and a reused
        # pid (a real process of ours whose start does not match).
        for f in (me, parent, Identity(1, 0, identity.boot_id())):
            cap.procs[f.pid] = f._replace(ppid=s.pid, start=max(f.start, s.born_after))
        # start + 1: born after the session, so the walks take it, yet not
        # the real process's start.
        # Control: with its real start, the same injected process is ended,
        # so the check below can see a signal land.
        cap.procs[v.pid] = v._replace(ppid=s.pid, start=v.start if control else v.start + 1)
        cap._kids = None
        return cap

    def guarded_send(ident, sig, member=False, **kw):
        sent.append((ident.pid, sig))
        if ident.pid in identity.own_ancestors() or ident.pid <= 1:
            # Tripwire: the real refusal is exercised with a harmless signal,
            # never with the close's SIGTERM/SIGKILL.
            return real_send(ident, signal.SIGURG, member=member, **kw)
        return real_send(ident, sig, member=member, **kw)

    _wrap_captures(s, capture_with_fakes)
    s._send = guarded_send
    r = s.close("immediate")
    pids = {i.pid for i in r.captured}
    assert os.getpid() not in pids and os.getppid() not in pids and 1 not in pids
    assert victim.pid in pids  # the reused-pid fake was captured...
    assert (victim.pid, signal.SIGTERM) in sent  # ...a signal was attempted...
    if control:
        assert victim.wait(5) == -signal.SIGTERM
    else:
        assert victim.poll() is None and identity.is_alive(v)  # ...and the identity check stopped it
    assert all(pid not in (os.getpid(), os.getppid(), 1) for pid, _ in sent)
    assert sigurg_seen == []


def _wrap_captures(s, fn) -> None:
    """Put ``fn(real, **kw)`` around both of the close's captures: the job's
    members (cgroup, live subreaper or pidns keeper) and the whole table."""
    table, job = s._capture, s._capture_job
    s._capture = lambda **kw: fn(table, **kw)
    s._capture_job = lambda: fn(job)


@pytest.fixture
def sigurg_seen():
    got: list[int] = []
    old = signal.signal(signal.SIGURG, lambda sig, frame: got.append(sig))
    yield got
    signal.signal(signal.SIGURG, old)


def test_signal_refusal_is_the_identity_layer():
    # The session's signals go through gate.send_signal, which refuses
    # these before any signal system call.
    with pytest.raises(SignalRefused):
        gate.send_signal(identity.read(os.getpid()), signal.SIGURG)
    with pytest.raises(SignalRefused):
        gate.send_signal(identity.read(os.getppid()), signal.SIGURG)


# ------------------------------------------------------------------ graceful close, plain


@pytest.mark.mechanism
def test_graceful_close_of_a_program_that_ignores_hangup(sessions, procs):
    s = _sh_session(sessions, procs, "trap '' HUP; echo READY; while :; do sleep 0.05; done",
                    grace=0.3)
    s.read_until(b"READY", 5)
    r = s.close("graceful")
    assert r.ok
    assert r.returncode == -signal.SIGTERM
    assert s.state == "closed"


def test_context_manager_closes_immediately(procs):
    with PtySession([SH, "-c", "sleep 120 & echo READY; read x"], env=procs.env()) as s:
        s.read_until(b"READY", 5)
        sleeps = wait_until(lambda: _proc_marked_sleeps(procs.mark, procs.born))
    assert s.state == "closed"
    assert [x for x in sleeps if _proc_alive(*x)] == []
