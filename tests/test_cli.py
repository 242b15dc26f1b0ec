"""`tether run`, `tether doctor`, `tether demo` as a user runs them."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time

import pytest
from procutil import SHELL_KINDS, available, native_cli, sigint_inside

TETHER = [sys.executable, "-m", "tether"]

pytestmark = pytest.mark.mechanism


@pytest.fixture(params=SHELL_KINDS)
def tether(request) -> list[str]:
    """How `tether run` is started: the native `tether` pip installs on Linux
    (it serves `run` itself, no interpreter), and the Python CLI."""
    if request.param == "python":
        return TETHER
    path = native_cli()
    if path is None:
        pytest.skip("no native tether here (not built: no C compiler at install time)")
    return [path]


def run(args, cli=TETHER, **kw):
    kw.setdefault("capture_output", True)
    kw.setdefault("timeout", 60)
    return subprocess.run(cli + args, **kw)


@pytest.mark.parametrize("cmd,code", [
    (["sh", "-c", "exit 0"], 0),
    (["sh", "-c", "exit 7"], 7),
    (["sh", "-c", "kill -TERM $$"], 128 + 15),
    (["sh", "-c", "kill -KILL $$"], 128 + 9),
    (["no-such-command-tether"], 127),
    (["/etc/hostname"], 126),
])
def test_run_exit_status(tether, cmd, code, procs):
    r = run(["run", "--", *cmd], tether, env=procs.env())
    assert r.returncode == code, r.stderr


def test_run_tether_failure_is_125_with_one_line(tether, procs):
    r = run(["run", "--mechanism", "subreaper", "--require", "kernel", "--", "true"], tether, env=procs.env())
    assert r.returncode == 125
    assert r.stderr.decode().count("\n") == 1 and "kernel" in r.stderr.decode()
    r = run(["run"], tether, env=procs.env())
    assert r.returncode == 125 and b"missing command" in r.stderr
    r = run(["run", "--grace", "abc", "--", "true"], tether, env=procs.env())
    assert r.returncode == 125


def test_run_stdio_passthrough_bytes(tether, procs):
    data = bytes(range(256)) * 400 + "ünïcødé ✓".encode()
    r = run(["run", "--", "sh", "-c", "cat; echo err >&2"], tether, input=data, env=procs.env())
    assert r.returncode == 0
    assert r.stdout == data
    assert r.stderr == b"err\n"


def test_run_ends_leftovers_when_command_exits(tether, procs):
    t0 = time.monotonic()
    r = run(["run", "--grace", "0.5", "--", "sh", "-c",
             "sleep 300 & (setsid sh -c 'trap \"\" TERM; sleep 301' &); nohup sleep 302 >/dev/null 2>&1 & exit 3"],
            tether, env=procs.env())
    assert r.returncode == 3
    assert time.monotonic() - t0 < 10
    assert not procs.wait_all_dead(0.5)


def test_run_control_plain_sh_leaves_them(procs):
    subprocess.run(["sh", "-c", "sleep 300 & (setsid sleep 301 &); exit 3"], env=procs.env(), timeout=10)
    assert procs.seen_alive()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signal_to_tether_stops_job_gracefully(tether, procs, sig):
    # tether run keeps a stop signal it was started with ignored (the next test);
    # under `nohup pytest` SIGHUP comes ignored, so this test gives it back.
    def default_disposition():
        signal.signal(sig, signal.SIG_DFL)

    p = procs.popen(tether + ["run", "--grace", "1", "--", "sh", "-c", "sleep 300 & wait"],
                    stdout=subprocess.PIPE, preexec_fn=default_disposition)
    assert procs.wait_count(2)  # tether (marked) + sh + sleep
    time.sleep(0.2)
    p.send_signal(sig)
    assert p.wait(timeout=10) == 128 + sig
    assert not procs.wait_all_dead(3)


@pytest.mark.parametrize("delay_ms", [1, 2, 4, 7, 10, 20])
def test_an_early_sigint_to_the_python_cli_is_a_stop_not_a_traceback(procs, delay_ms):
    # SIGINT while the Python `tether run` still imports, opens the job or
    # starts the command (before it blocks the stop signals to wait): it was
    # a KeyboardInterrupt traceback and exit 1. Now exit 130, as a SIGINT a
    # moment later (the test above), and the job ended. The SIGINT lands in
    # main() (procutil.sigint_inside): the interpreter's start-up is before.
    code = ("import sys\nfrom tether.cli import main\n" + sigint_inside("main", delay_ms / 1000)
            + "sys.exit(main(['run', '--grace', '1', '--', 'sh', '-c', 'sleep 300 & wait']))\n")
    p = procs.popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, err = p.communicate(timeout=30)
    assert (p.returncode, err) == (128 + signal.SIGINT, b"")
    assert not procs.wait_all_dead(3)


LOST_SIGINT = r"""
import gc, os, signal, sys, weakref
from tether import _sigwatch
from tether.cli import main
_sigwatch.catch_interrupts()
if sys.argv[1] == "lost":
    # Python prints an exception raised in a weakref callback and goes on
    # ("Exception ignored in"): the KeyboardInterrupt of a SIGINT taken there
    # is lost, as one taken in an import lock's callback once was in CI.
    class Box:
        pass
    box = Box()
    ref = weakref.ref(box, lambda _r: os.kill(os.getpid(), signal.SIGINT))
    del box
    gc.collect()
sys.exit(main(["run", "--grace", "1", "--", "sh", "-c", "sleep 300 & sleep 1; exit 3"]))
"""


@pytest.mark.parametrize("how", ["lost", "control-none"])
def test_a_sigint_python_lost_still_stops_run(procs, how):
    """A SIGINT whose KeyboardInterrupt Python could not raise (taken inside a
    callback whose exceptions it only prints) stops `tether run` all the same:
    exit 130, nothing left. Control: no SIGINT, the command's own status."""
    p = procs.popen([sys.executable, "-c", LOST_SIGINT, how], stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE)
    _, err = p.communicate(timeout=30)
    if how == "lost":
        assert b"KeyboardInterrupt" in err  # Python said it lost one
        assert p.returncode == 128 + signal.SIGINT, err
    else:
        assert (p.returncode, err) == (3, b"")
    assert not procs.wait_all_dead(3)


def test_a_stop_signal_tether_was_started_with_ignored_stays_ignored(tether, procs):
    """`nohup tether run ...`: SIGHUP does not stop the job (the control is the
    test above, where SIGHUP to tether stops it with 128+1)."""
    def ignore_hup():
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    p = procs.popen(tether + ["run", "--", "sh", "-c", "sleep 1; exit 4"], preexec_fn=ignore_hup)
    assert procs.wait_count(2)
    time.sleep(0.2)
    p.send_signal(signal.SIGHUP)
    assert p.wait(timeout=10) == 4


def test_killing_tether_process_group_ends_job(tether, procs):
    p = procs.popen(tether + ["run", "--", "sh", "-c",
                              "sleep 300 & (setsid sleep 301 &); nohup setsid sleep 302 >/dev/null 2>&1 & wait"])
    assert len(procs.wait_count(4)) >= 4
    time.sleep(0.2)
    os.killpg(p.pid, signal.SIGKILL)  # as an agent's timeout does (p leads its own group)
    p.wait(timeout=5)
    assert not procs.wait_all_dead(3)


def test_sigkill_of_tether_alone_ends_job(tether, procs):
    p = procs.popen(tether + ["run", "--", "sh", "-c", "sleep 300 & wait"])
    assert len(procs.wait_count(3)) >= 3
    p.kill()
    p.wait(timeout=5)
    assert not procs.wait_all_dead(3)


def test_die_with_stdin_ends_job_when_writer_dies(tether, procs):
    r, w = os.pipe()
    writer = procs.popen(["sleep", "300"], stdout=w)  # holds the write end, like an ssh link
    os.close(w)
    p = procs.popen(tether + ["run", "--die-with-stdin", "--grace", "0.5", "--",
                              "sh", "-c", "sleep 300 & (setsid sleep 301 &); wait"], stdin=r)
    os.close(r)
    assert len(procs.wait_count(5)) >= 5
    assert p.poll() is None
    writer.kill()  # the link drops
    writer.wait()
    assert p.wait(timeout=10) == 128 + signal.SIGHUP
    assert not procs.wait_all_dead(3)


def _pty_run(args, env, send=None, timeout=20):
    pid, fd = pty.fork()
    if pid == 0:
        os.execvpe(args[0], args, env)
    out = b""
    deadline = time.monotonic() + timeout
    sent = False
    try:
        while time.monotonic() < deadline:
            r, _, _ = select.select([fd], [], [], 0.1)
            if r:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:
                    break
                if not chunk:
                    break
                out += chunk
            if send and not sent and b"READY" in out:
                time.sleep(0.2)
                os.write(fd, send)
                sent = True
        _, st = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(st), out
    finally:
        os.close(fd)


@pytest.mark.parametrize("mechanism", ["auto", "pgroup", "pidns"])
def test_run_under_pty_command_has_terminal_and_ctrl_c(tether, procs, mechanism):
    if mechanism != "auto" and not available(mechanism):
        pytest.skip(f"{mechanism} not available")
    prog = ("import os, signal, sys, time\n"
            "fg = os.tcgetpgrp(0) == os.getpgrp()\n"
            "print('TTY', os.isatty(0), 'FG', fg, flush=True)\n"
            "got = []\n"
            "signal.signal(signal.SIGINT, lambda *a: got.append(1))\n"
            "print('READY', flush=True)\n"
            "t = time.time()\n"
            "while not got and time.time() - t < 10: time.sleep(0.01)\n"
            "print('GOT-INT' if got else 'NO-INT', flush=True)\n"
            "sys.exit(5)\n")
    code, out = _pty_run(tether + ["run", "-m", mechanism, "--", sys.executable, "-c", prog],
                         procs.env(), send=b"\x03")
    text = out.decode(errors="replace")
    assert "TTY True FG True" in text, text
    assert "GOT-INT" in text, text  # Ctrl+C reached the command, which handled it
    assert code == 5, text  # and tether followed the command, not the keyboard


def test_doctor_text_and_json():
    r = run(["doctor"])
    assert r.returncode == 0
    assert b"auto" in r.stdout and b"strict" in r.stdout
    r = run(["doctor", "--json"])
    assert r.returncode == 0
    data = json.loads(r.stdout)
    assert data["schema"] == 1
    names = {m["mechanism"] for m in data["mechanisms"]}
    assert names == {"cgroup", "subreaper", "pgroup", "pidns", "jobobject"}
    for m in data["mechanisms"]:
        assert isinstance(m["available"], bool) and m["reason"]
        assert "kernel_enforced" in m["guarantee"]
    assert data["auto"] in ("cgroup", "subreaper", "pgroup")
    if sys.platform.startswith("linux"):  # how an owner's death is seen, with which keeper
        k = data["keeper"]
        assert ("beacon" in k["owner_watch"]) == k["native"], k
        assert f"an owner's death seen by: {k['owner_watch']}" in run(["doctor"]).stdout.decode()


def test_demo_nothing_survives_and_control_shows_survivors(procs):
    r = run(["demo", "--json"], env=procs.env())
    res = json.loads(r.stdout)
    assert r.returncode == 0, res
    assert res["survivors"] == 0 and all(x["seen"] for x in res["results"])
    r = run(["demo", "--control", "--json"], env=procs.env())
    res = json.loads(r.stdout)
    assert r.returncode == 1
    assert res["survivors"] >= 4


def _keeper_of_run(runner_pid: int, timeout: float = 10.0):
    """The keeper of a `tether run` (its child named tether-keeper), by identity."""
    from tether import identity

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for c in identity.children(runner_pid):
            i = identity.read(c)
            if i is not None and i.comm == "tether-keeper":
                return i
        time.sleep(0.01)
    raise AssertionError("no keeper")


@pytest.mark.parametrize("mech", ["cgroup", "subreaper", "pgroup"])
def test_run_when_its_keeper_dies_says_so_and_returns_the_commands_status(tether, procs, mech, tmp_path):
    """The keeper SIGKILLed mid-command: one line on stderr, the command's own
    status (not 137), and what the command left is still ended."""
    if not available(mech):
        pytest.skip(f"{mech} not available here")
    from tether import gate, identity

    mark = tmp_path / "left"
    # The mark only after 0.5 s: by then the spawn's reply has reached tether
    # run (a Python keeper replies after the command's exec, and sh can write
    # a file first); a keeper killed before it replied is another case.
    p = procs.popen(tether + ["run", "-m", mech, "--", "sh", "-c",
                              f"sleep 0.5; sleep 300 & echo $! > {mark}; sleep 1; exit 5"],
                    stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    keeper = _keeper_of_run(p.pid)
    left = _wait_exec(int(_wait_file(mark)), "sleep")
    assert gate.send_signal(keeper, signal.SIGKILL, member=True)
    rc = p.wait(timeout=20)
    err = p.stderr.read().decode()
    assert rc == 5, err
    assert err.splitlines() == ["tether: keeper died; the job is no longer guarded"], err
    t0 = time.monotonic()
    while identity.is_alive(left) and time.monotonic() - t0 < 3:
        time.sleep(0.01)
    assert not identity.is_alive(left), "tether walked away from the command's leftover"


def test_control_keeper_and_runner_killed_leave_the_tree(tether, procs, tmp_path):
    """Control: with both the keeper and `tether run` SIGKILLed, nothing ends
    the subreaper job's tree (the guarantee says so), so the checks above can fail."""
    if not available("subreaper"):
        pytest.skip("subreaper not available here")
    from tether import gate, identity

    mark = tmp_path / "left"
    p = procs.popen(tether + ["run", "-m", "subreaper", "--", "sh", "-c",
                              f"sleep 300 & echo $! > {mark}; sleep 300"],
                    stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    keeper = _keeper_of_run(p.pid)
    left = identity.read(int(_wait_file(mark)))
    gate.send_signal(keeper, signal.SIGKILL, member=True)
    p.kill()
    p.wait(timeout=10)
    time.sleep(0.5)
    assert identity.is_alive(left)


def _wait_exec(pid: int, comm: str, timeout: float = 10.0):
    """The identity of `pid` once it runs `comm`: the shell writes `$!` as
    soon as it has forked, before the child has exec'd."""
    from tether import identity

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        i = identity.read(pid)
        assert i is not None, f"pid {pid} ended before it ran {comm}"
        if i.comm == comm:
            return i
        time.sleep(0.005)
    raise AssertionError(f"pid {pid} never ran {comm}")


def _wait_file(path, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            text = path.read_text().strip()
            if text:
                return text
        except OSError:
            pass
        time.sleep(0.01)
    raise AssertionError(f"{path} never written")


@pytest.mark.parametrize("native_off", [False, True], ids=["native", "control-python-cli"])
def test_native_tether_run_runs_no_interpreter(procs, native_off):
    """The command's parent is the job's keeper, forked from `tether run`: both
    run the native program - or, for the Python CLI (the control: the same
    check sees the interpreter), not."""
    path = native_cli()
    if path is None:
        pytest.skip("the native tether is not built here (no C compiler at install time)")
    env = procs.env()
    script = 'k=$PPID; w=$(cut -d" " -f4 /proc/$k/stat); readlink /proc/$k/exe /proc/$w/exe; echo $w'
    cli = TETHER if native_off else [path]
    p = procs.popen([*cli, "run", "--", "sh", "-c", script], env=env, stdout=subprocess.PIPE,
                    stdin=subprocess.DEVNULL)
    out, _ = p.communicate(timeout=20)
    keeper_exe, runner_exe, runner = out.decode().split()
    assert p.returncode == 0 and int(runner) == p.pid
    if native_off:
        # the Python CLI's keeper is a process of its own: the interpreter again
        assert runner_exe == os.path.realpath(sys.executable)
        assert keeper_exe != os.path.realpath(path)
    else:
        assert keeper_exe == runner_exe == os.path.realpath(path)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="native programs: Linux")
def test_doctor_says_which_commands_are_native():
    from procutil import is_native_program

    data = json.loads(run(["doctor", "--json"]).stdout)
    got = {c["name"]: c["native"] for c in data["commands"]}
    bindir = os.path.dirname(sys.executable)
    assert got == {n: is_native_program(os.path.join(bindir, n)) for n in ("tether-shell", "tether")}


@pytest.mark.parametrize("closed", ["<&-", ">&-", "2>&-", "<&- >&-", "<&- >&- 2>&-"])
def test_run_keeps_a_callers_closed_stdio_closed(procs, tether, tmp_path, closed):
    """`tether run` started with stdin, stdout or stderr closed: the command
    finds the same ones closed (not a socket or pidfd of tether's in their
    place) and its status comes back. Before: the Python CLI handed the
    command its keeper's socket as stdin, and the native one lost its keeper
    (123). Control: plain sh, the same way."""
    probe = ('exec 9>"$0"; for f in 0 1 2; do [ -e /proc/$$/fd/$f ] && '
             'printf "$f:%s " "$(readlink /proc/$$/fd/$f)" >&9; done; exit 3')
    want, got = tmp_path / "sh", tmp_path / "run"
    outer = ["sh", "-c", f'exec "$@" {closed}', "sh"]
    env = procs.env()
    assert procs.popen([*outer, "sh", "-c", probe, str(want)], env=env).wait(timeout=30) == 3
    assert procs.popen([*outer, *tether, "run", "--", "sh", "-c", probe, str(got)],
                       env=env).wait(timeout=30) == 3
    assert got.read_text() == want.read_text()


@pytest.mark.parametrize("nofile", [8, 9, 10, 11, 12, 14])
def test_run_under_a_low_open_file_limit_says_so(procs, tether, nofile):
    """`ulimit -n` so low that the job cannot be set up: exit 125 and one
    line that names the open-file limit, never a "malformed request", a
    keeper "gone" or a bare "Bad file descriptor"; or, with room enough, the
    command runs. Before: the keeper that could not take a request's fds
    called it malformed, and one spawn failed with EBADF."""
    import resource

    def low() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    p = procs.popen([*tether, "run", "--", "echo", "ran"], stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, preexec_fn=low,
                    env=procs.env())
    out, err = p.communicate(timeout=60)
    if p.returncode == 0:
        assert out == b"ran\n"
        return
    assert p.returncode == 125 and out == b"" and err.count(b"\n") == 1, (p.returncode, err)
    assert any(w in err for w in (b"open-file limit", b"Too many open files",
                                  b"No file descriptors available")), err


def test_cli_main_gives_sigint_back_and_forgets_a_remembered_interrupt(capsys):
    # cli.main takes SIGINT to remember a Ctrl+C Python loses; an app (or a
    # test) calling it in-process gets its handler back, and a SIGINT that
    # one call remembered does not stop the next call's `tether run`.
    # (Control: the old main left both behind.)
    from tether import _sigwatch, cli

    before = signal.getsignal(signal.SIGINT)
    _sigwatch.INTERRUPTS.append(signal.SIGINT)  # as an earlier call left it
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("tether ")
    assert signal.getsignal(signal.SIGINT) is before
    assert _sigwatch.INTERRUPTS == []
