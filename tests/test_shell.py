"""tether-shell as a real agent uses it: the installed console script, real processes.

Every process these tests start carries the ``procs`` fixture's mark in its
environment; the fixture's finalizer ends whatever is left (see conftest).
Kill tests have a control: the same tree under plain ``sh -c`` must be seen
surviving by the same check.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import time

import pytest
from procutil import (
    SHELL_KINDS,
    native_shell,
    ptrace_hold,
    ptrace_kill,
    sigint_inside,
    tether_shell,
    wait_until,
)

from tether import _shellargs as sa
from tether import gate, identity

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX/Linux wrapper tests")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IS_ROOT = os.geteuid() == 0


# -- the installed console script ----------------------------------------------------

@pytest.fixture(scope="session", params=SHELL_KINDS)
def ts(request, tmp_path_factory) -> str:
    """Path of an installed tether-shell: each test runs against the native
    program and against the Python one (``procutil.tether_shell``)."""
    path = tether_shell(request.param, tmp_path_factory.mktemp("bin"))
    if path is None:
        pytest.skip("no native tether-shell here (not built: no C compiler at install time)")
    return path


@pytest.fixture
def env(procs, tmp_path):
    """Environment for the wrapper: marked, its own state dir, no tether-shell settings."""
    e = procs.env()
    for k in list(e):
        if k.startswith("TETHER_SHELL") or k in ("TETHER_STATE_DIR",):
            del e[k]
    e["XDG_STATE_HOME"] = str(tmp_path / "state")
    e["P"] = str(tmp_path / "pids")
    e["LC_ALL"] = "C.UTF-8"
    return e


def run_py(procs, env, code: str, timeout: float = 20) -> tuple[int, bytes]:
    """``python -c code`` (marked); its exit status and stdout."""
    p = procs.popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE)
    out, _ = p.communicate(timeout=timeout)
    return p.returncode, out


def run(procs, ts, args, env, *, input=None, timeout=20, **kw):
    p = procs.popen([ts, *args], env=env, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)
    out, err = p.communicate(input, timeout=timeout)
    return p.returncode, out, err


# -- process helpers (identity-checked) -----------------------------------------------

def read_pids(path, n: int, timeout: float = 10.0, gone_ok: bool = False) -> list[identity.Identity]:
    """Wait until ``path`` lists ``n`` pids; return their identities (start ticks pinned).

    ``gone_ok``: for checks after the fact, a pid already gone (reaped) is
    dead and simply left out.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(path) as f:
                pids = [int(x) for x in f.read().split()]
        except FileNotFoundError:
            pids = []
        if len(pids) >= n:
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"the tree wrote {len(pids)} of {n} pids to {path}")
        time.sleep(0.01)
    out = []
    for pid in pids:
        ident = identity.read(pid)
        if ident is None and gone_ok:
            continue
        assert ident is not None, f"pid {pid} was gone before it could be recorded"
        out.append(ident)
    return out


def living(idents) -> list[identity.Identity]:
    """Those still running (a zombie counts as dead; a reused pid does not match)."""
    return [i for i in idents if identity.is_alive(i)]


def wait_dead(idents, timeout: float = 3.0) -> list[identity.Identity]:
    deadline = time.monotonic() + timeout
    left = living(idents)
    while left and time.monotonic() < deadline:
        time.sleep(0.01)
        left = living(left)
    return left


# The adversarial tree: a plain child, sleep &, nohup, a setsid escapee, a
# double-forked setsid daemon, one ignoring SIGTERM/SIGHUP, and the foreground.
# The double fork is `setsid -f` (setsid forks, its parent exits at once), not
# `( ... & )`: under bash (root's login shell, tether-shell's real shell) the
# subshell's forked child is a `bash` with PPID 1 until it execs - an orphan
# bash of our own, if only for a moment.
TREE = r"""
echo $$ >> "$P"
sleep 60 & echo $! >> "$P"
nohup sleep 60 >/dev/null 2>&1 & echo $! >> "$P"
setsid sh -c 'echo $$ >> "$P"; exec sleep 60' >/dev/null 2>&1 &
setsid -f sh -c 'sleep 60 & echo $! >> "$P"' >/dev/null 2>&1
sh -c 'trap "" TERM HUP; echo $$ >> "$P"; exec sleep 60' &
sleep 60 & echo $! >> "$P"
wait
"""
TREE_N = 7

MECHS = ["auto"] + (["subreaper"] if IS_ROOT else [])


# -- 1. forms, exit codes and transparency of the basic cases ------------------------

FORMS = [["-c"], ["-lc"], ["-l", "-c"], ["-lc", "-c"], ["-lc", "-l", "-c"], ["-c", "-l"],
         ["--login", "-c"], ["-cl"], ["-c", "--"]]


@pytest.mark.parametrize("form", FORMS, ids=" ".join)
def test_every_form_runs_the_command(procs, ts, env, form):
    rc, out, err = run(procs, ts, [*form, "echo hello; exit 7"], env)
    assert (rc, out, err) == (7, b"hello\n", b"")


def test_args_after_cmd_become_dollar0_and_positionals(procs, ts, env):
    rc, out, _ = run(procs, ts, ["-c", 'printf "[%s]" "$0" "$@"', "zero", "a b", "", "-x"], env)
    assert (rc, out) == (0, b"[zero][a b][][-x]")


def test_dollar0_is_the_real_shell_without_args(procs, ts, env):
    rc, out, _ = run(procs, ts, ["-c", "echo $0"], env)
    shell = out.decode().strip()
    assert rc == 0 and os.path.isabs(shell) and "tether" not in shell


@pytest.mark.parametrize("code", [0, 1, 3, 42, 255])
def test_exit_codes_come_back(procs, ts, env, code):
    assert run(procs, ts, ["-c", f"exit {code}"], env)[0] == code


@pytest.mark.parametrize("cmd,out", [
    ("""python3 -c "print('a b')" """, b"a b\n"),
    ("""echo "a  b" 'c  d'""", b"a  b c  d\n"),
    ("""printf '%s\\n' "it's" 'say "hi"'""", b"it's\nsay \"hi\"\n"),
    ("""sh -c 'sh -c "echo \\"deep \\$0\\"" nested'""", b"deep nested\n"),
    ("echo héllo ✓ 日本語", "héllo ✓ 日本語\n".encode()),
    ("printf 'b\\na\\nc\\n' | sort | head -n 2", b"a\nb\n"),
    ("true && echo yes || echo no", b"yes\n"),
    ("false && echo yes || echo no", b"no\n"),
    ("echo a\necho b", b"a\nb\n"),
    ("x=1; for i in 1 2 3; do x=$((x*2)); done; echo $x", b"8\n"),
    ("printf '\\000\\377\\001'", b"\x00\xff\x01"),
    ("", b""),
], ids=["python-quotes", "spaces", "nested-quotes", "nested-sh", "unicode", "pipes", "and-chain",
        "or-chain", "multiline", "arithmetic", "binary", "empty"])
def test_quoting_pipes_and_bytes_pass_through(procs, ts, env, cmd, out):
    if cmd.startswith("python3"):
        cmd = cmd.replace("python3", sys.executable, 1)
    rc, got, err = run(procs, ts, ["-c", cmd], env)
    assert (rc, got, err) == (0, out, b"")


def test_long_output_is_complete(procs, ts, env):
    rc, out, _ = run(procs, ts, ["-c", "seq 1 20000"], env)
    assert rc == 0 and out == b"".join(b"%d\n" % i for i in range(1, 20001))
    assert len(out) > 1000


def test_stdin_passes_through(procs, ts, env):
    data = bytes(range(256)) * 64
    rc, out, _ = run(procs, ts, ["-c", "cat"], env, input=data)
    assert (rc, out) == (0, data)


def test_env_vars_pass_through(procs, ts, env):
    env["TETHER_SHELL_TEST_VAR"] = "va lue=1 ✓"
    rc, out, _ = run(procs, ts, ["-c", 'echo "$TETHER_SHELL_TEST_VAR"; FOO=x sh -c \'echo $FOO\''], env)
    assert (rc, out) == (0, "va lue=1 ✓\nx\n".encode())


def test_env_is_unchanged(procs, ts, env):
    rc, out, _ = run(procs, ts, ["-c", "env -0"], env)
    seen = dict(kv.split(b"=", 1) for kv in out.split(b"\0") if kv)
    for k in (b"_", b"PWD", b"SHLVL", b"OLDPWD"):  # set by the shell itself
        seen.pop(k, None)
    # ... and the job's cookie, which every process tether starts carries (issue 13)
    assert seen.pop(b"TETHER_JOB").count(b":") == 2
    want = {k.encode(): v.encode() for k, v in env.items() if k not in ("_", "PWD", "SHLVL", "OLDPWD")}
    assert seen == want


def test_stderr_and_nonzero_exit(procs, ts, env):
    rc, out, err = run(procs, ts, ["-c", "echo out; echo oops >&2; exit 4"], env)
    assert (rc, out, err) == (4, b"out\n", b"oops\n")


def test_missing_command_in_shell_is_127(procs, ts, env):
    rc, out, err = run(procs, ts, ["-c", "no_such_command_tether_xyz"], env)
    # dash says "Permission denied" when PATH holds a directory it may not search
    assert rc == 127 and out == b"" and b"no_such_command_tether_xyz" in err


def test_big_command_passes_through(procs, ts, env):
    # One argument may be up to 128 KiB on Linux (MAX_ARG_STRLEN).
    rc, out, _ = run(procs, ts, ["-c", ": " + "x" * 120_000 + "; echo big-ok"], env)
    assert (rc, out) == (0, b"big-ok\n")


@pytest.mark.parametrize("path", ["oneshot", "generic"])
def test_big_environment_passes_through(procs, ts, env, path):
    # Over the generic keeper socket's send buffer (~208 KiB): sh accepts up to ARG_MAX.
    if path == "generic":
        env["TETHER_STATE_DIR"] = env["XDG_STATE_HOME"]  # the spawn-audit log: the generic path
    env["BIG1"] = "y" * 120_000
    env["BIG2"] = "z" * 120_000
    rc, out, err = run(procs, ts, ["-c", 'echo ${#BIG1} ${#BIG2}'], env)
    assert (rc, out) == (0, b"120000 120000\n"), err


@pytest.mark.parametrize("path", ["oneshot", "generic"])
def test_deleted_working_directory_runs_as_under_sh(procs, ts, env, tmp_path, path):
    # sh runs in a deleted working directory; so does the command under the wrapper
    # (bash's own "shell-init: error retrieving current directory" goes to stderr).
    gone = tmp_path / "gone"
    gone.mkdir()
    env.pop("PYTHONPATH", None)  # a relative entry would stop Python itself from starting there
    if path == "generic":
        env["TETHER_STATE_DIR"] = env["XDG_STATE_HOME"]
    show = 'echo ran; readlink /proc/$$/cwd'
    code = (f"import os, subprocess, sys; os.chdir({str(gone)!r}); os.rmdir({str(gone)!r}); "
            f"r = subprocess.run([{ts!r}, '-c', {show!r}], capture_output=True); "
            "sys.stdout.buffer.write(r.stdout); sys.exit(r.returncode)")
    rc, out = run_py(procs, env, code)
    assert (rc, out) == (0, f"ran\n{gone} (deleted)\n".encode()), out


def test_cwd_passes_through(procs, ts, env, tmp_path):
    rc, out, _ = run(procs, ts, ["-c", "pwd"], env, cwd=str(tmp_path))
    assert (rc, out.decode().strip()) == (0, str(tmp_path))


def test_inherited_fds_pass_through(procs, ts, env):
    r, w = os.pipe()
    try:
        # /dev/fd/N rather than >&N: dash takes single-digit fds only
        rc, _, _ = run(procs, ts, ["-c", f"echo via-fd > /dev/fd/{w}"], env, pass_fds=(w,))
        os.close(w)
        w = -1
        assert rc == 0 and os.read(r, 100) == b"via-fd\n"
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL, signal.SIGINT])
def test_command_killed_by_signal_kills_wrapper_by_it(procs, ts, env, sig):
    rc, _, _ = run(procs, ts, ["-c", f"kill -{int(sig)} $$"], env)
    assert rc == -sig


# -- 2. bad invocations: exit 2, one line, nothing run -------------------------------

# [] and ["-l"] were bad invocations until tether-shell served interactive
# shells (issue 14): they are tested in section 10 now; "--" alone is still bad.
@pytest.mark.parametrize("args", [
    ["--"], ["-c"], ["-l", "--"], ["-k", "-c", "true"], ["-i", "-c"], ["-i", "script.sh"],
    ["-e"], ["-x", "script.sh"], ["-c", "-o"], ["+c", "true"], ["-c", "+i", "true"],
    ["--norc", "-c", "true"], ["script.sh"], ["-l", "script.sh"], ["/k", "dir"], ["/c"],
    ["/c", "echo hi"], ["/d", "/s", "/c", "echo hi"], ["/D", "/S", "/C", "echo hi"],
], ids=repr)
def test_bad_invocation_is_exit_2_with_one_line(procs, ts, env, args, tmp_path):
    marker = tmp_path / "ran"
    env["MARK_FILE"] = str(marker)
    rc, out, err = run(procs, ts, args, env)
    assert rc == 2 and out == b""
    assert err.count(b"\n") == 1 and err.startswith(b"tether-shell: ")
    assert not marker.exists()


def test_comspec_flags_never_fall_through_to_shell_mode(procs, ts, env, tmp_path):
    # "/d" then a shell flag: refused, not run as `sh -c`.
    marker = tmp_path / "ran"
    rc, _, err = run(procs, ts, ["/d", "-c", f"touch {marker}"], env)
    assert rc == 2 and not marker.exists() and b"unrecognised flag" in err


# -- 3. TETHER_SHELL and the recursion guard -----------------------------------------

def fake_shell(tmp_path, name="fakesh") -> str:
    path = tmp_path / name
    path.write_text('#!/bin/sh\nprintf "FAKE"; printf " [%s]" "$@"; echo\n')
    path.chmod(0o755)
    return str(path)


def test_tether_shell_valid(procs, ts, env, tmp_path):
    env["TETHER_SHELL"] = fake_shell(tmp_path)
    rc, out, _ = run(procs, ts, ["-lc", "echo hi", "a0"], env)
    assert (rc, out) == (0, b"FAKE [-l] [-c] [echo hi] [a0]\n")


@pytest.mark.parametrize("form,shell_gets", [
    (["-eu", "-o", "pipefail", "-c"], ["-e", "-u", "-o", "pipefail", "-c"]),  # make's .SHELLFLAGS
    (["-euo", "pipefail", "-c"], ["-e", "-u", "-o", "pipefail", "-c"]),
    (["-ec"], ["-e", "-c"]), (["-c", "-x"], ["-x", "-c"]), (["+e", "-lc"], ["-l", "+e", "-c"]),
    (["+o", "errexit", "-c"], ["+o", "errexit", "-c"]), (["-c", "--"], ["-c"]),
], ids=repr)
def test_set_options_are_handed_to_the_real_shell(procs, ts, env, tmp_path, form, shell_gets):
    # POSIX sh's set options, given with -c, reach the real shell in order,
    # one per word; everything else as before
    env["TETHER_SHELL"] = fake_shell(tmp_path)
    rc, out, _ = run(procs, ts, [*form, "echo hi", "a0"], env)
    assert (rc, out) == (0, b"FAKE " + b" ".join(b"[%s]" % w.encode() for w in shell_gets)
                         + b" [echo hi] [a0]\n")


@pytest.mark.parametrize("form,shell_gets", [
    (["-i", "-c"], ["-i", "-c"]), (["-ic"], ["-i", "-c"]), (["-ci"], ["-i", "-c"]),
    (["-i", "-l", "-c"], ["-l", "-i", "-c"]), (["-lic"], ["-l", "-i", "-c"]),
    (["--login", "-i", "-c"], ["-l", "-i", "-c"]), (["-i", "-e", "-c"], ["-i", "-e", "-c"]),
], ids=repr)
def test_interactive_command_forms_run_the_real_shell_with_i(procs, ts, env, tmp_path, form,
                                                             shell_gets):
    # OMP runs `$SHELL -i -c CMD` for zsh and fish users: refused before
    # (exit 2, every `!` command failed under the zsh launcher, issue 35);
    # now the real shell gets -i (and -l) as the caller gave them
    env["TETHER_SHELL"] = fake_shell(tmp_path)
    rc, out, err = run(procs, ts, [*form, "echo hi", "a0"], env)
    assert (rc, out, err) == (0, b"FAKE " + b" ".join(b"[%s]" % w.encode() for w in shell_gets)
                              + b" [echo hi] [a0]\n", b"")


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_interactive_command_runs_in_its_own_job(procs, ts, env, tmp_path, shell):
    # `-i -c CMD` in a real bash/zsh: the shell is interactive ($- has i),
    # the status is the command's, and what the command leaves behind is
    # ended when it returns, as with -c. Control: the real shell run the same
    # way directly leaves the sleep running.
    real = shutil.which(shell)
    if real is None:
        pytest.skip(f"no {shell}")
    env["TETHER_SHELL"] = real
    cmd = "case $- in *i*) echo interactive;; esac; sleep 600 >/dev/null 2>&1 & exit 3"
    for direct in (False, True):
        argv = [real, "-i", "-c", cmd] if direct else [ts, "-i", "-c", cmd]
        p = procs.popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                        stdin=subprocess.DEVNULL, start_new_session=True)
        out, _ = p.communicate(timeout=30)
        assert (p.returncode, out) == (3, b"interactive\n")
        if direct:
            # control: the sleep is left (zsh forks, then execs it: wait for the exec)
            wait_until(lambda: [i.comm for i in procs.alive()] == ["sleep"])
        else:
            assert procs.wait_all_dead(timeout=5) == [], "the job ends what -i -c CMD left"


@pytest.mark.parametrize("name", ["pwsh", "powershell", "cmd"])
def test_a_powershell_or_cmd_real_shell_gets_its_own_argv_and_no_set_options(procs, ts, env,
                                                                            tmp_path, name):
    # the same from both programs (the native one gave `pwsh -c CMD`, the
    # Python one `pwsh -NoLogo -Command CMD`); `-e` would be PowerShell's
    # -EncodedCommand: refused
    env["TETHER_SHELL"] = fake_shell(tmp_path, name)
    rc, out, _ = run(procs, ts, ["-c", "echo hi"], env)
    want = {"cmd": b"[/d] [/c]"}.get(name, b"[-NoLogo] [-Command]")
    assert (rc, out) == (0, b"FAKE " + want + b" [echo hi]\n")
    marker = tmp_path / "ran"
    for form in (["-e", "-c"], ["-i", "-c"]):  # -i too: PowerShell and cmd.exe have none
        rc, out, err = run(procs, ts, [*form, f"touch {marker}"], env)
        assert rc == 2 and out == b"" and err.count(b"\n") == 1 and name.encode() in err
        assert form[0].encode() + b" is a POSIX shell's option" in err
        assert not marker.exists()


@pytest.mark.parametrize("cmd", ["-q", "+x", "--version"])
def test_a_command_that_looks_like_an_option_is_not_read_as_one(procs, ts, env, tmp_path, cmd):
    # `tether-shell -c -- -q` runs the command `-q`: the real shell reads
    # options after -c too, so it gets `-c -- -q` (it got `-c -q`: "invalid
    # option", exit 2). Control: bash run the same way as the caller ran us.
    prog = tmp_path / cmd
    prog.write_text("#!/bin/sh\necho ran \"$0\"\n")
    prog.chmod(0o755)
    env["PATH"] = f"{tmp_path}:{env['PATH']}"
    want = subprocess.run(["bash", "-c", "--", cmd], env=env, capture_output=True, timeout=20)
    assert (want.returncode, want.stdout) == (0, f"ran {prog}\n".encode())
    rc, out, err = run(procs, ts, ["-c", "--", cmd], env)
    assert (rc, out, err) == (want.returncode, want.stdout, b"")
    env["TETHER_SHELL"] = fake_shell(tmp_path)
    assert run(procs, ts, ["-c", "--", cmd, "a0"], env)[1] == f"FAKE [-c] [--] [{cmd}] [a0]\n".encode()


def test_make_with_strict_shellflags_runs_every_recipe(procs, ts, env, tmp_path):
    # SHELL=tether-shell with `.SHELLFLAGS := -eu -o pipefail -c`: refused
    # before (unrecognised option '-e'), so every recipe failed. pipefail and
    # errexit hold, as under plain bash.
    if shutil.which("make") is None:
        if os.environ.get("CI"):
            pytest.fail("make is not installed; .ci/run must install it (apt-get install -y make)")
        pytest.skip("no make")
    (tmp_path / "Makefile").write_text(
        ".SHELLFLAGS := -eu -o pipefail -c\nall: ok strict\nok:\n\t@echo \"ok $$-\"\n"
        "strict:\n\t@false | true; echo not-reached\n")
    env["TETHER_SHELL"] = shutil.which("bash") or "/bin/bash"
    outs = []
    for shell in (env["TETHER_SHELL"], ts):
        p = subprocess.run(["make", "-s", f"SHELL={shell}"], cwd=tmp_path, env=env,
                           capture_output=True, timeout=60)
        outs.append((p.returncode, p.stdout))
    assert outs[0][0] == 2 and b"ok " in outs[0][1] and b"not-reached" not in outs[0][1]
    assert outs[1] == outs[0]


@pytest.mark.parametrize("args,shell_gets", [([], ["-l"]), (["-i"], ["-l", "-i"]),
                                             (["-c", "echo hi"], ["-l", "-c", "echo hi"]),
                                             (["-lc", "echo hi"], ["-l", "-c", "echo hi"])], ids=repr)
def test_started_as_a_login_shell_by_name_the_real_shell_is_one(procs, ts, env, tmp_path, args,
                                                               shell_gets):
    # login(1), sshd, `su -` and tmux start a login shell with argv[0] "-NAME":
    # as someone's login shell (chsh -s), tether-shell gave a non-login shell
    # (no /etc/profile, no ~/.profile: another PATH). The control: the same
    # start without the "-" gives no -l.
    if os.path.basename(ts) != "tether-shell":
        pytest.skip("the Python tether-shell is a script: the kernel drops its argv[0] (docs/shell.md)")
    env["TETHER_SHELL"] = fake_shell(tmp_path)
    for argv0, want in (("-tether-shell", shell_gets),
                        ("tether-shell", [a for a in shell_gets if a != "-l" or "-lc" in args])):
        p = procs.popen([argv0, *args], executable=ts, env=env, stdout=subprocess.PIPE,
                        stdin=subprocess.DEVNULL)
        out, _ = p.communicate(timeout=20)
        words = [b"[%s]" % w.encode() for w in want] or [b"[]"]  # (printf with no args: once)
        assert (p.returncode, out) == (0, b" ".join([b"FAKE", *words]) + b"\n"), argv0
    if shutil.which("bash"):  # and a real bash says it is one
        env["TETHER_SHELL"] = shutil.which("bash")
        p = procs.popen(["-tether-shell", "-c", "shopt -q login_shell && echo login"], executable=ts,
                        env=env, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        assert p.communicate(timeout=20)[0] == b"login\n"


def test_tether_shell_real_bash(procs, ts, env):
    bash = shutil.which("bash")
    if not bash:
        pytest.skip("no bash")
    env["TETHER_SHELL"] = bash
    rc, out, _ = run(procs, ts, ["-c", 'echo "$BASH_VERSION" $0'], env)
    assert rc == 0 and out.split()[-1] == bash.encode() and out[0:1].isdigit()


@pytest.mark.parametrize("value", ["sh", "bin/sh", "./fakesh", "/nonexistent/tether/sh", "/etc/passwd",
                                   "/tmp"])
def test_tether_shell_invalid_is_exit_2_without_fallback(procs, ts, env, tmp_path, value):
    fake_shell(tmp_path)
    env["TETHER_SHELL"] = value
    marker = tmp_path / "ran"
    rc, out, err = run(procs, ts, ["-c", f"touch {marker}"], env, cwd=str(tmp_path))
    assert rc == 2 and out == b"" and b"TETHER_SHELL" in err and err.count(b"\n") == 1
    assert not marker.exists()


@pytest.mark.parametrize("how", ["self", "symlink", "copy", "hardlink", "wrapper-script"])
def test_tether_shell_pointing_at_itself_is_refused(procs, ts, env, tmp_path, how):
    target = tmp_path / "notashell"
    if how == "self":
        target = ts
    elif how == "symlink":
        os.symlink(ts, target)
    elif how == "copy":
        shutil.copy2(ts, target)
    elif how == "hardlink":
        try:
            os.link(ts, target)
        except OSError as exc:
            pytest.skip(f"no hard link across file systems: {exc}")
    else:
        target.write_text(f"#!/bin/sh\nexec {ts} \"$@\"\n")
        target.chmod(0o755)
    env["TETHER_SHELL"] = str(target)
    marker = tmp_path / "ran"
    rc, _, err = run(procs, ts, ["-c", f"touch {marker}"], env, timeout=10)
    assert rc == 2 and b"itself" in err and not marker.exists()


def test_shell_env_pointing_back_at_it(procs, ts, env):
    # An agent sets SHELL=tether-shell; the command sees that, and a nested
    # "$SHELL -c" is a nested wrapper, not a loop.
    env["SHELL"] = ts
    rc, out, _ = run(procs, ts, ["-c", 'echo "$SHELL"; "$SHELL" -c "echo nested \\$0"'], env)
    lines = out.decode().splitlines()
    assert rc == 0 and lines[0] == ts
    assert lines[1].startswith("nested /") and "tether" not in lines[1]


def test_login_shell_that_is_tether_shell_is_skipped(ts, tmp_path):
    # The password database cannot be edited in a test; the search function is
    # run with the login shell it would read, against real files.
    check = sa.SelfCheck([ts])
    link = tmp_path / "login-shell"
    os.symlink(ts, link)
    got = sa.find_posix_shell({"PATH": os.environ.get("PATH", os.defpath)}, check, login=str(link))
    assert got != str(link) and not check(got) and os.access(got, os.X_OK)
    got = sa.find_posix_shell({"PATH": ""}, check, login=ts)
    assert got == "/bin/sh"
    got = sa.find_posix_shell({"PATH": ""}, check, login="/usr/sbin/nologin")
    assert got == "/bin/sh"


def test_default_search_uses_the_login_shell(procs, ts, env):
    import pwd

    login = pwd.getpwuid(os.getuid()).pw_shell
    if not login or os.path.basename(login) in ("nologin", "false") or not os.access(login, os.X_OK):
        pytest.skip("no usable login shell for this user")
    rc, out, _ = run(procs, ts, ["-c", "echo $0"], env)
    assert (rc, out.decode().strip()) == (0, login)


# -- 4. kill tests: SIGKILL of the wrapper, or of its whole process group -------------

def start_tree(procs, ts, env, mech: str, plain: bool = False):
    if mech != "auto":
        env["TETHER_SHELL_MECHANISM"] = mech
    args = ["sh", "-c", TREE] if plain else [ts, "-c", TREE]
    p = procs.popen(args, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL)
    return p, read_pids(env["P"], TREE_N)


@pytest.mark.mechanism
@pytest.mark.parametrize("mech", MECHS)
def test_sigkill_wrapper_ends_whole_tree(procs, ts, env, mech):
    p, tree = start_tree(procs, ts, env, mech)
    p.kill()
    p.wait(timeout=5)
    assert wait_dead(tree, 3.0) == []
    assert procs.wait_all_dead(3.0) == []  # the keeper too, and anything unrecorded


@pytest.mark.mechanism
@pytest.mark.parametrize("mech", MECHS)
def test_sigkill_wrapper_process_group_ends_whole_tree(procs, ts, env, mech):
    p, tree = start_tree(procs, ts, env, mech)
    os.killpg(p.pid, signal.SIGKILL)  # its own group: started with start_new_session
    p.wait(timeout=5)
    assert wait_dead(tree, 3.0) == []
    assert procs.wait_all_dead(3.0) == []


@pytest.mark.mechanism
@pytest.mark.parametrize("kill", ["wrapper", "group", "sigterm"])
def test_control_plain_sh_leaves_survivors(procs, env, kill):
    # The same tree and the same check, without tether: survivors are seen.
    p, tree = start_tree(procs, None, env, "auto", plain=True)
    if kill == "wrapper":
        p.kill()
    elif kill == "sigterm":
        p.terminate()
    else:
        os.killpg(p.pid, signal.SIGKILL)
    p.wait(timeout=5)
    time.sleep(0.3)
    left = living(tree)
    assert len(left) >= 2, left  # at least the setsid escapees
    assert wait_dead(tree, 0.5) != []


@pytest.mark.mechanism
def test_sigterm_to_wrapper_ends_tree_and_wrapper_dies_by_it(procs, ts, env):
    p, tree = start_tree(procs, ts, env, "auto")
    t0 = time.monotonic()
    p.terminate()
    assert p.wait(timeout=5) == -signal.SIGTERM
    # one member ignores SIGTERM: it gets SIGKILL after the grace
    assert time.monotonic() - t0 < 3.0
    assert wait_dead(tree, 1.0) == []


@pytest.mark.mechanism
def test_agent_timeout_sigterm_then_sigkill_to_the_group(procs, ts, env):
    # OpenCode's timeout: SIGTERM to the process group, SIGKILL 200 ms later -
    # in the middle of the wrapper's grace for the member that ignores SIGTERM.
    p, tree = start_tree(procs, ts, env, "auto")
    os.killpg(p.pid, signal.SIGTERM)
    time.sleep(0.2)
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # the group was already gone
    p.wait(timeout=5)
    assert wait_dead(tree, 3.0) == []
    assert procs.wait_all_dead(3.0) == []


@pytest.mark.mechanism
def test_two_wrappers_killing_one_keeps_the_other(procs, ts, env, tmp_path):
    env_b = dict(env)
    env_b["P"] = str(tmp_path / "pids-b")
    pa, tree_a = start_tree(procs, ts, env, "auto")
    pb, tree_b = start_tree(procs, ts, env_b, "auto")
    pa.kill()
    pa.wait(timeout=5)
    assert wait_dead(tree_a, 3.0) == []
    time.sleep(0.2)
    assert living(tree_b) == tree_b
    assert pb.poll() is None
    pb.kill()
    pb.wait(timeout=5)
    assert wait_dead(tree_b, 3.0) == []


# -- 5. background leftovers end when the command returns ----------------------------

LEFTOVERS = {
    "sleep&": 'sleep 60 & echo $! >> "$P"',
    "nohup&": 'nohup sleep 60 >/dev/null 2>&1 & echo $! >> "$P"',
    "double-fork": 'setsid -f sh -c \'sleep 60 & echo $! >> "$P"\' >/dev/null 2>&1; '
                   'while [ ! -s "$P" ]; do sleep 0.01; done',
}


@pytest.mark.mechanism
@pytest.mark.parametrize("mech", MECHS)
@pytest.mark.parametrize("kind", list(LEFTOVERS))
def test_leftovers_end_before_wrapper_exits(procs, ts, env, kind, mech):
    if mech != "auto":
        env["TETHER_SHELL_MECHANISM"] = mech
    rc, _, _ = run(procs, ts, ["-c", LEFTOVERS[kind]], env)
    tree = read_pids(env["P"], 1, timeout=1, gone_ok=True)
    assert rc == 0
    assert living(tree) == []  # already gone when the wrapper returned


@pytest.mark.parametrize("kind", list(LEFTOVERS))
def test_control_leftovers_survive_plain_sh(procs, env, kind):
    p = procs.popen(["sh", "-c", LEFTOVERS[kind]], env=env, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL)
    assert p.wait(timeout=10) == 0
    tree = read_pids(env["P"], 1, timeout=1)
    assert living(tree) == tree


@pytest.mark.mechanism
def test_leftover_ignoring_sigterm_gets_only_the_grace(procs, ts, env):
    env["TETHER_SHELL_GRACE"] = "0.3"
    t0 = time.monotonic()
    rc, _, _ = run(procs, ts, ["-c", 'sh -c \'trap "" TERM HUP; echo $$ >> "$P"; exec sleep 60\' &'
                                     ' while [ ! -s "$P" ]; do sleep 0.01; done'], env)
    took = time.monotonic() - t0
    tree = read_pids(env["P"], 1, timeout=1, gone_ok=True)
    assert rc == 0 and living(tree) == []
    assert took < 0.3 + 2.5


@pytest.mark.mechanism
def test_caller_reading_to_eof_is_not_held_by_a_leftover(procs, ts, env):
    # The agent hang: `sleep 60 &` keeps the stdout pipe open after the shell exits.
    rc, out, _ = run(procs, ts, ["-c", 'sleep 60 & echo $! >> "$P"; echo done'], env, timeout=10)
    assert (rc, out) == (0, b"done\n")


def test_control_caller_reading_to_eof_hangs_on_plain_sh(procs, env):
    p = procs.popen(["sh", "-c", 'sleep 60 & echo $! >> "$P"; echo done'], env=env,
                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    with pytest.raises(subprocess.TimeoutExpired):
        p.communicate(timeout=1.0)
    assert p.poll() == 0  # sh itself is long gone; the pipe is held by the leftover


# -- 6. transparency: real PIDs, same user, same process group, the terminal ----------

@pytest.mark.mechanism
def test_dollar_bang_is_a_pid_the_outside_knows(procs, ts, env, tmp_path):
    go = tmp_path / "go"
    env["GO"] = str(go)
    p = procs.popen([ts, "-c", 'sleep 30 & echo $! >> "$P"; echo $$ >> "$P"; '
                               'while [ ! -e "$GO" ]; do sleep 0.01; done'],
                    env=env, stdout=subprocess.DEVNULL)
    bg, sh = read_pids(env["P"], 2)
    deadline = time.monotonic() + 5  # $! is known before the forked shell has exec'd sleep
    while True:
        with open(f"/proc/{bg.pid}/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0")[0]
        if argv0 == b"sleep" or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert argv0 == b"sleep"
    bg = identity.read(bg.pid)  # after exec: same pid and start, new comm
    assert bg.ppid == sh.pid and bg.uid == os.getuid()
    with open(f"/proc/{bg.pid}/status") as f:
        nspid = [ln.split()[1:] for ln in f if ln.startswith("NSpid:")]
    assert nspid == [[str(bg.pid)]]  # no PID namespace: one level, the outside's number
    assert sh.pgid == p.pid  # the command is in the wrapper's process group
    go.touch()
    assert p.wait(timeout=10) == 0
    assert living([bg]) == []


def test_kill_reaches_a_process_started_outside(procs, ts, env, tmp_path):
    outside = procs.popen(["sleep", "60"], env=env)
    pidfile = tmp_path / "devserver.pid"
    pidfile.write_text(str(outside.pid))
    rc, _, err = run(procs, ts, ["-c", f"kill $(cat {pidfile})"], env)
    assert rc == 0, err
    assert outside.wait(timeout=5) == -signal.SIGTERM


# Standard signals only: glibc's posix_spawn (the keeper's) leaves its two
# internal signals 32/33 SIG_IGN across exec, which glibc programs reset at start.
_STD = (1 << 31) - 1


def _signal_state_under(procs, ts, env, caller_state) -> dict[str, tuple[int, int]]:
    """(SigIgn, SigBlk) of a program exec'd by the shell, with tether and with plain sh."""
    env["TETHER_SHELL"] = "/bin/sh"
    show = 'exec grep -E "^Sig(Ign|Blk)" /proc/self/status'
    got = {}
    for name, argv in (("tether", [ts, "-c", show]), ("plain", ["/bin/sh", "-c", show])):
        p = procs.popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        preexec_fn=caller_state)
        out, err = p.communicate(timeout=20)
        assert p.returncode == 0, err
        fields = dict(line.split(b":") for line in out.splitlines())
        got[name] = (int(fields[b"SigIgn"], 16) & _STD, int(fields[b"SigBlk"], 16) & _STD)
    return got


def test_ignored_signals_pass_through(procs, ts, env):
    # Signals the caller ignores (nohup, a background job) stay ignored for the
    # command, exactly as under plain sh; the others are default.
    def caller_state():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    got = _signal_state_under(procs, ts, env, caller_state)
    assert got["tether"] == got["plain"]
    ign = got["plain"][0]
    assert ign & (1 << (signal.SIGINT - 1)) and ign & (1 << (signal.SIGHUP - 1))
    assert not ign & (1 << (signal.SIGTERM - 1))


@pytest.mark.parametrize("path", ["oneshot", "generic"])
def test_blocked_signal_mask_passes_through(procs, ts, env, path):
    if path == "generic":
        env["TETHER_STATE_DIR"] = env["XDG_STATE_HOME"]
    def caller_state():
        signal.pthread_sigmask(signal.SIG_SETMASK, [signal.SIGUSR1])

    got = _signal_state_under(procs, ts, env, caller_state)
    assert got["tether"] == got["plain"]
    assert got["plain"][1] & (1 << (signal.SIGUSR1 - 1))


def test_same_user_and_no_namespace(procs, ts, env):
    rc, out, _ = run(procs, ts, ["-c", "id -u; readlink /proc/self/ns/pid /proc/self/ns/user"], env)
    uid, pidns, userns = out.decode().split()
    assert rc == 0 and int(uid) == os.getuid()
    assert pidns == os.readlink("/proc/self/ns/pid") and userns == os.readlink("/proc/self/ns/user")


@pytest.mark.mechanism
def test_terminal_passes_through_and_ctrl_c_reaches_the_command(procs, ts, env):
    import fcntl
    import pty
    import termios

    master, slave = pty.openpty()

    def take_tty():  # a new session whose controlling terminal is the pty
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        # as from an interactive shell, whatever this test runner inherited
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    try:
        p = procs.popen([ts, "-c", 'test -t 0 && test -t 1 && echo TTY-OK; echo $$ >> "$P"; '
                                   'sleep 30; echo not-reached'],
                        env=env, stdin=slave, stdout=slave, stderr=slave, preexec_fn=take_tty)
        os.close(slave)
        slave = -1
        (sh,) = read_pids(env["P"], 1)
        buf = b""
        deadline = time.monotonic() + 10
        while b"TTY-OK" not in buf and time.monotonic() < deadline:
            buf += os.read(master, 1024)
        assert b"TTY-OK" in buf
        # the command's group is the terminal's foreground group
        assert os.tcgetpgrp(master) == sh.pgid == p.pid
        # ^C only once `sleep` has exec'd: a SIGINT between the shell's fork and
        # exec is taken by the forked shell's handler and lost (dash, also without tether)
        deadline = time.monotonic() + 10
        while not any(c.comm == "sleep" for c in map(identity.read, identity.children(sh.pid)) if c):
            assert time.monotonic() < deadline, "the command never started sleep"
            time.sleep(0.01)
        os.write(master, b"\x03")
        assert p.wait(timeout=5) == -signal.SIGINT
        assert wait_dead([sh], 3.0) == []
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)


# -- 7. the audit log ----------------------------------------------------------------

def log_records(state_home) -> list[dict]:
    """tether-shell's records in the audit log (every rotated copy, oldest first)."""
    from tether.audit import read_records

    d = os.path.join(state_home, "tether")
    return [r for r in read_records(d) if r.get("app") == "tether-shell"]


def wait_start_record(state_home, timeout: float = 10.0) -> dict:
    """The last start (``job-open``) record, waiting for the wrapper to write it.

    While the command already runs, the wrapper may not yet have created the
    log's directory, or may be part way through its one line: both mean "not
    yet", never a failure."""
    import json

    def starts():
        try:
            return [r for r in log_records(state_home) if r["event"] == "job-open"]
        except (FileNotFoundError, json.JSONDecodeError):
            return []

    return wait_until(starts, timeout)[-1]


def test_audit_records_metadata_and_never_the_secret(procs, ts, env, tmp_path):
    secret = "hunter2-Tether-SECRET-5f3a"
    env["API_TOKEN"] = secret
    rc, out, _ = run(procs, ts, ["-lc", f'echo ok; test "$API_TOKEN" = {secret} && exit 5', f"{secret}-arg0",
                                 f"{secret}-arg1"], env)
    assert (rc, out) == (5, b"ok\n")
    run(procs, ts, ["-x", secret], env)  # an error record too
    state = env["XDG_STATE_HOME"]
    recs = log_records(state)
    start, spawn, exit_, close, error = recs[-5:]
    assert start["event"] == "job-open" and start["mode"] == "shell" and start["login"] is True
    assert start["argc"] == 4 and spawn["event"] == "spawn" and spawn["pid"] > 0
    assert exit_["event"] == "exit" and exit_["status"] == 5 and exit_["pid"] == spawn["pid"]
    assert close["event"] == "job-close" and close["job"] == start["job"] == exit_["job"]
    assert start["mechanism"] in ("cgroup", "subreaper", "pgroup")
    assert error["event"] == "error" and error["error"] == "usage"
    assert {r["wrapper"] for r in recs[-5:-1]} == {start["wrapper"]}
    for dirpath, _, files in os.walk(state):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as f:
                data = f.read()
            assert secret.encode() not in data and b"echo ok" not in data


def test_audit_counts_leftovers(procs, ts, env):
    run(procs, ts, ["-c", "sleep 60 & sleep 60 &"], env)
    rec = [r for r in log_records(env["XDG_STATE_HOME"]) if r["event"] == "exit"][-1]
    assert rec["leftovers"] == 2


@pytest.mark.parametrize("where", ["uncreatable", "a-file", "world-writable", "symlink"])
def test_audit_dir_unusable_logging_off_command_runs(procs, ts, env, tmp_path, where):
    base = tmp_path / "statebase"
    if where == "uncreatable":
        env["XDG_STATE_HOME"] = "/proc/tether-cannot-create"
    elif where == "a-file":
        base.write_text("")
        env["XDG_STATE_HOME"] = str(base)
    elif where == "world-writable":
        (base / "tether").mkdir(parents=True)
        (base / "tether").chmod(0o777)
        env["XDG_STATE_HOME"] = str(base)
    else:
        real = tmp_path / "elsewhere"
        real.mkdir(mode=0o700)
        base.mkdir()
        os.symlink(real, base / "tether")
        env["XDG_STATE_HOME"] = str(base)
    rc, out, err = run(procs, ts, ["-c", "echo still-runs"], env)
    assert (rc, out, err) == (0, b"still-runs\n", b"")
    if where in ("world-writable", "symlink"):
        target = base / "tether" if where == "world-writable" else tmp_path / "elsewhere"
        assert list(target.iterdir()) == []


def test_audit_off_by_env(procs, ts, env):
    env["TETHER_SHELL_LOG"] = "off"
    assert run(procs, ts, ["-c", "true"], env)[0] == 0
    assert not os.path.exists(os.path.join(env["XDG_STATE_HOME"], "tether"))


@pytest.mark.parametrize("last_prune_days", [2, 0])
def test_audit_retention_prunes_old_day_files(procs, ts, env, last_prune_days):
    # An older tether-shell's day files age out by the audit log's age rule,
    # pruned by the audit writer. tether-shell only appends (the native one
    # hands its start over, the Python one calls the writer) once the last
    # prune (the lock file's mtime) is a day old.
    # Control: a prune an instant ago - it appends and prunes nothing.
    d = os.path.join(env["XDG_STATE_HOME"], "tether")
    os.makedirs(d, mode=0o700)
    now = time.time()
    old = [time.strftime("shell-%Y-%m-%d.jsonl", time.gmtime(now - k * 86400)) for k in (15, 30, 400)]
    keep = [time.strftime("shell-%Y-%m-%d.jsonl", time.gmtime(now - k * 86400)) for k in (1, 13)]
    for name, k in [*zip(old, (15, 30, 400), strict=True), *zip(keep, (1, 13), strict=True),
                    ("unrelated.txt", 400)]:
        path = os.path.join(d, name)
        with open(path, "w") as f:
            f.write("{}\n")
        os.chmod(path, 0o600)
        os.utime(path, (now - k * 86400, now - k * 86400))
    lock = os.path.join(d, "audit.jsonl.lock")
    with open(lock, "w"):
        pass
    os.chmod(lock, 0o600)
    os.utime(lock, (now - last_prune_days * 86400, now - last_prune_days * 86400))
    env["TETHER_SHELL_LOG_DAYS"] = "14"
    assert run(procs, ts, ["-c", "true"], env)[0] == 0
    names = set(os.listdir(d))
    pruned = last_prune_days >= 1
    assert not names & set(old) if pruned else set(old) <= names
    assert set(keep) | {"unrelated.txt", "audit.jsonl"} <= names
    assert [r["event"] for r in log_records(env["XDG_STATE_HOME"])] == [
        "job-open", "spawn", "exit", "job-close"]
    if pruned:
        assert os.stat(lock).st_mtime > now - 60  # the prune is marked


def test_audit_rotates_by_size_and_loses_nothing(procs, ts, env):
    # The shell's records rotate as every audit record does (the native one
    # hands a start over to the Python writer once the live file is near its
    # size): copies .1, .2 ..., no file far past the size, every record read back.
    env["TETHER_SHELL_LOG_MAX_BYTES"] = "3000"
    for k in range(4):
        assert run(procs, ts, ["-c", f"exit {k}"], env)[0] == k
    d = os.path.join(env["XDG_STATE_HOME"], "tether")
    names = sorted(os.listdir(d))
    assert "audit.jsonl.1" in names and "audit.jsonl" in names, names
    for name in names:
        st = os.stat(os.path.join(d, name))
        assert st.st_size <= 3000 + 1024 and stat.S_IMODE(st.st_mode) == 0o600
    recs = log_records(env["XDG_STATE_HOME"])
    assert [r["status"] for r in recs if r["event"] == "exit"] == [0, 1, 2, 3]
    assert [r["event"] for r in recs].count("job-open") == 4
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700


def test_log_constants_have_one_source():
    # The shell's append-only writers (shell_log.py, shell.c) take what tether.audit
    # and tether.runs use from tether._constants (shell.c through the header
    # generated from it): no value of them is written out a second time.
    import re

    from tether import _constants as k
    from tether import audit, records, shell_log

    assert (audit.PRUNE_EVERY, audit.DEFAULT_MAX_BYTES, audit.DEFAULT_FILENAME) == \
        (k.AUDIT_PRUNE_EVERY, k.AUDIT_MAX_BYTES, k.AUDIT_FILE)
    assert (shell_log._PRUNE_EVERY, shell_log.DEFAULT_LOG_MAX_BYTES, shell_log.START_ROOM) == \
        (k.AUDIT_PRUNE_EVERY, k.AUDIT_MAX_BYTES, k.SHELL_LOG_START_ROOM)
    assert (shell_log.SHELL_JOB, shell_log.SHELL_SCOPE_JOB) == \
        (records.SHELL_JOB, records.SHELL_SCOPE_JOB) == \
        (k.SHELL_JOB, k.SHELL_SCOPE_JOB)
    with open(os.path.join(ROOT, "src", "tether", "_native", "shell.c")) as f:
        c = f.read()
    for name in ("AUDIT_FILE", "PRUNE_EVERY", "START_ROOM"):
        assert re.search(rf"#define {name} TETHER_", c), name
    assert '"TETHER_SHELL_LOG_MAX_BYTES", TETHER_AUDIT_MAX_BYTES' in c


# -- 8. misc --------------------------------------------------------------------------

def test_cli_entry_for_tether_shell_subcommand(procs, env):
    # `tether shell ARGS` calls tether.shell.cli(ARGS): same behaviour in-process.
    code = ("import sys; from tether.shell import cli; "
            "sys.exit(cli(['-c', 'echo via-cli; exit 6']))")
    rc, out = run_py(procs, env, code)
    assert (rc, out) == (6, b"via-cli\n")


def test_mechanism_env_refuses_pidns(procs, ts, env):
    env["TETHER_SHELL_MECHANISM"] = "pidns"
    rc, _, err = run(procs, ts, ["-c", "true"], env)
    assert rc == 2 and b"transparent" in err


# -- 9. the one-command path (tether.keeper.oneshot) and the generic path -----------

def _keeper_of(sh: identity.Identity) -> identity.Identity:
    keeper = identity.read(sh.ppid)
    assert keeper is not None
    return keeper


@pytest.mark.mechanism
def test_oneshot_keeper_job_layout(procs, ts, env, tmp_path):
    # The keeper: named tether-keeper, our child, its own process group, the
    # caller's session; the command in the wrapper's group; the cgroup named as
    # linux_cgroup names it (the reaper and `tether ps` rely on that).
    go = tmp_path / "go"
    env["GO"] = str(go)
    p = procs.popen([ts, "-c", 'echo $$ >> "$P"; while [ ! -e "$GO" ]; do sleep 0.01; done'],
                    env=env, stdout=subprocess.DEVNULL)
    (sh,) = read_pids(env["P"], 1)
    keeper = _keeper_of(sh)
    wrapper = identity.read(p.pid)
    assert keeper.comm == "tether-keeper" and keeper.ppid == p.pid
    assert keeper.pgid == keeper.pid and keeper.sid == wrapper.sid
    assert sh.pgid == p.pid
    with open(f"/proc/{sh.pid}/cgroup") as f:
        cg = [ln[3:].strip() for ln in f if ln.startswith("0::")][0]
    run_dir = f"tether-{p.pid}-{wrapper.start}"
    in_cgroup = cg.endswith(f"/{run_dir}/j{p.pid}-1")
    if IS_ROOT:
        assert in_cgroup, cg  # cgroup v2 is writable for root here: auto takes it
    go.touch()
    assert p.wait(timeout=10) == 0
    rec = log_records(env["XDG_STATE_HOME"])
    assert {r["mechanism"] for r in rec} == {"cgroup" if in_cgroup else "subreaper"}
    assert wait_dead([keeper], 3.0) == []
    if in_cgroup:
        from tether import cgroupfs

        base = os.path.join(cgroupfs.mount(), cg.lstrip("/"))
        assert not os.path.exists(os.path.dirname(base))  # the run directory is removed


def test_oneshot_loads_only_what_it_needs(procs, env):
    # The wrapper's hot path: no subprocess, socket, threading, dataclasses or
    # generic job machinery (site may have loaded some already: count what cli adds).
    # The process reader (tether.identity) is import-light on purpose and may load.
    heavy = {"subprocess", "socket", "threading", "dataclasses", "inspect", "json", "signal",
             "enum", "tether.job", "tether.platform.base", "tether.keeper.posix",
             "tether.keeper._keeper", "tether.keeper._keeper_socket", "tether.keeper._proto",
             "__future__", "importlib", "warnings"}
    code = ("import sys; before = set(sys.modules); from tether.shell import cli; "
            "rc = cli(['-c', 'true']); "
            f"print(rc, ' '.join(sorted((set(sys.modules) - before) & {heavy!r})))")
    rc, out = run_py(procs, env, code)
    assert rc == 0 and out.split() == [b"0"], out
    # and a later import of the package finds the same modules
    code = ("import sys; from tether.shell import cli; cli(['-c', 'true']); "
            "import tether.platform as tp; from tether.keeper import oneshot; "
            "print(tp.choose('auto') in ('cgroup', 'subreaper', 'pgroup'), "
            "oneshot is sys.modules['tether.keeper.oneshot'])")
    rc, out = run_py(procs, env, code)
    assert (rc, out) == (0, b"True True\n")


@pytest.mark.mechanism
@pytest.mark.parametrize("kill", ["sigkill", "leftovers"])
def test_generic_path_still_ends_the_tree(procs, ts, env, kill):
    # The pgroup mechanism takes the generic Job path (TETHER_STATE_DIR did too
    # until the one-command path wrote reapable records itself, issue 14).
    env["TETHER_STATE_DIR"] = str(env["XDG_STATE_HOME"])
    env["TETHER_SHELL_MECHANISM"] = "pgroup"
    if kill == "sigkill":
        p, tree = start_tree(procs, ts, env, "pgroup")
        keeper = _keeper_of(tree[0])
        assert keeper.comm == "tether-keeper"
        assert keeper.ppid == p.pid  # forked by the (single-threaded) wrapper
        p.kill()
        p.wait(timeout=5)
        assert wait_dead(tree, 3.0) == []
        assert procs.wait_all_dead(3.0) == []
    else:
        rc, _, _ = run(procs, ts, ["-c", LEFTOVERS["double-fork"]], env)
        tree = read_pids(env["P"], 1, timeout=1, gone_ok=True)
        assert rc == 0 and living(tree) == []
        assert any(name.startswith("audit") or name.endswith(".jsonl")
                   for name in os.listdir(env["TETHER_STATE_DIR"]))


def test_oneshot_api_status_and_exec_failure(procs, env, tmp_path):
    # In-process API: a failed exec raises the OSError; nothing is left behind.
    code = ("import sys; from tether.keeper import oneshot as o; "
            "r = o.run(['x', '-c', 'exit 7'], executable='/bin/sh'); "
            "import os; print(os.waitstatus_to_exitcode(r.status), r.mechanism, r.leftovers)\n"
            "try:\n    o.run(['x'], executable='/nonexistent/tether-sh')\n"
            "except FileNotFoundError as e:\n    print('ENOENT', e.filename)\n")
    rc, out = run_py(procs, env, code)
    lines = out.decode().splitlines()
    assert rc == 0 and lines[1] == "ENOENT /nonexistent/tether-sh", out
    rc, mech, left = lines[0].split()
    assert rc == "7" and mech in ("cgroup", "subreaper") and left == "0"


def test_cli_from_a_multithreaded_caller_falls_back_to_the_generic_path(procs, env):
    # cli() in a thread (no signal handlers there), and in the main thread while
    # another thread runs (no safe fork): both take the generic Job path and work.
    code = ("import sys, threading, time; from tether.shell import cli\n"
            "out = []\n"
            "t = threading.Thread(target=lambda: out.append(cli(['-c', 'exit 4']))); t.start(); t.join()\n"
            "stop = threading.Event(); b = threading.Thread(target=stop.wait); b.start()\n"
            "out.append(cli(['-c', 'exit 5'])); stop.set(); b.join()\n"
            "print(*out, 'tether.job' in sys.modules)\n")
    rc, out = run_py(procs, env, code, timeout=30)
    assert (rc, out) == (0, b"4 5 True\n")
    assert [r.get("status") for r in log_records(env["XDG_STATE_HOME"])
            if r["event"] == "exit"] == [4, 5]


# -- 10. the caller: its death ends the job (issue 14) --------------------------------

# A stand-in agent CLI: starts tether-shell in a session of its own (as OpenCode,
# Codex and Gemini start each tool call), so a kill of the caller or of its process
# group never reaches the wrapper; prints the wrapper's pid, then waits for it.
def use(env, mech: str, **extra: str) -> None:
    """The environment for mechanism ``mech`` (auto: none set) and ``extra``."""
    if mech != "auto":
        env["TETHER_SHELL_MECHANISM"] = mech
    env.update(extra)


CALLER = r"""
import os, subprocess, sys
p = subprocess.Popen(sys.argv[1:], start_new_session=True, stdin=subprocess.DEVNULL)
print(p.pid, flush=True)
sys.exit(p.wait() & 255)
"""


def start_caller(procs, ts, env, cmd, *, extra=()):
    caller = procs.popen([sys.executable, "-c", CALLER, ts, *extra, "-c", cmd], env=env,
                         stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    wrapper = identity.read(int(caller.stdout.readline()))
    assert wrapper is not None
    return caller, wrapper


@pytest.mark.mechanism
@pytest.mark.parametrize("mech", MECHS)
@pytest.mark.parametrize("how", ["caller", "caller-group"])
def test_caller_sigkilled_mid_command_ends_the_tree(procs, ts, env, mech, how):
    use(env, mech)
    caller, wrapper = start_caller(procs, ts, env, TREE)
    tree = read_pids(env["P"], TREE_N)
    if how == "caller":
        caller.kill()
    else:
        os.killpg(caller.pid, signal.SIGKILL)  # its group: the wrapper is not in it
    caller.wait(timeout=5)
    assert wait_dead(tree, 3.0) == []
    assert wait_dead([wrapper], 3.0) == []  # and the wrapper follows (not needed for the above)
    assert procs.wait_all_dead(3.0) == []


@pytest.mark.mechanism
def test_caller_sigkilled_under_pgroup_keeps_the_exit_record(procs, ts, env):
    # The generic Job path (pgroup) on the caller's death: it ended the job with
    # Job.kill_all(), which does not exist - the wrapper died of AttributeError
    # (its job still closed by `finally`) and wrote no exit record. Now it ends
    # the job at once and records how the command ended, as on the fast path.
    # Control: the same run before the fix had a start record and no exit record.
    use(env, "pgroup")
    caller, wrapper = start_caller(procs, ts, env, TREE)
    tree = read_pids(env["P"], TREE_N)
    caller.kill()
    caller.wait(timeout=5)
    assert wait_dead(tree, 3.0) == []
    assert wait_dead([wrapper], 5.0) == []
    recs = [r for r in log_records(env["XDG_STATE_HOME"]) if r.get("pid") == tree[0].pid]
    assert [r["event"] for r in recs] == ["spawn", "exit"], recs
    assert recs[1]["mechanism"] == "pgroup" and recs[1].get("status") == -signal.SIGKILL, recs[1]
    assert procs.wait_all_dead(3.0) == []


@pytest.mark.mechanism
def test_control_caller_sigkilled_with_the_watch_off_leaves_the_tree(procs, ts, env):
    # The same caller and kill, TETHER_SHELL_WITH_CALLER=0 (and plain bash does
    # the same): nothing ends the command, which runs on in its own session.
    env["TETHER_SHELL_WITH_CALLER"] = "0"
    # the wrapper and its tree, orphaned on purpose, are held here, not by PID 1
    with procs.adopting_orphans():
        caller, wrapper = start_caller(procs, ts, env, TREE)
        tree = read_pids(env["P"], TREE_N)
        caller.kill()
        caller.wait(timeout=5)
        time.sleep(0.5)
        assert len(living(tree)) == TREE_N and identity.is_alive(wrapper)
        assert identity.read(wrapper.pid).ppid == os.getpid()  # adopted here


def test_a_leftover_is_never_re_parented_to_pid_1(procs, ts, env, tmp_path):
    # `sh -c 'sleep 60 & exit'` inside the command: the sleep's parent exits
    # while the command goes on. Under a cgroup job it went to PID 1 (the
    # keeper is no subreaper): an orphan of ours, if only until the job ended.
    # Now the wrapper adopts it, as `tether run` does. Control: plain sh.
    out = tmp_path / "ppid"

    def parent_of_leftover(argv) -> int:
        p = procs.popen([*argv, f'sh -c \'sleep 60 & echo $! > {out}.pid\'; sleep 0.5; '
                         f'cut -d" " -f4 /proc/$(cat {out}.pid)/stat > {out}'], env=env,
                        stdin=subprocess.DEVNULL)
        assert p.wait(timeout=20) == 0
        return int(out.read_text())

    assert parent_of_leftover(["sh", "-c"]) == 1  # the control (no subreaper above it)
    p = procs.popen([ts, "-c", f'sh -c \'sleep 60 & echo $! > {out}.pid\'; sleep 0.5; '
                     f'cut -d" " -f4 /proc/$(cat {out}.pid)/stat > {out}; echo $PPID'],
                    env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    keeper, _ = p.communicate(timeout=20)  # the real shell's parent
    assert p.returncode == 0
    # the wrapper (cgroup), or the keeper where it is the subreaper: never PID 1
    assert int(out.read_text()) in (p.pid, int(keeper))
    assert living(read_pids(f"{out}.pid", 1, gone_ok=True)) == []


def test_caller_alive_nothing_changes(procs, ts, env):
    # A live caller gets the status and output as before; leftovers still end
    # with the command; the record names the caller.
    caller = procs.popen([sys.executable, "-c", CALLER, ts, "-c",
                          'sleep 60 & echo $! >> "$P"; echo out; exit 9'], env=env,
                         stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    out, _ = caller.communicate(timeout=20)
    # (the command's line may come before the caller's: the native wrapper
    # runs it within a millisecond of the caller's fork)
    words = out.split()
    assert caller.returncode == 9 and len(words) == 2 and words.count(b"out") == 1
    assert next(w for w in words if w != b"out").isdigit()  # the caller's line: the wrapper's pid
    assert living(read_pids(env["P"], 1, gone_ok=True)) == []
    start = [r for r in log_records(env["XDG_STATE_HOME"]) if r["event"] == "job-open"][-1]
    assert start["caller"]["pid"] == caller.pid and start["parent"] == caller.pid


# The wrapper's caller is not its creator: an orphan adopted at start by a
# sub-reaper in another session (the creator exits at once), and the control -
# the creator stays and is the one killed.
ADOPTED = r"""
import ctypes, os, subprocess, sys, time
adopt = sys.argv[1] == "adopt"
# (started in a session of its own: the wrapper's will be another)
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
mid = os.fork()
if mid == 0:
    os.setsid()
    argv = sys.argv[2:]
    if adopt:
        # Adopted before it starts: it waits (same pid) until this process,
        # its creator, is gone, then becomes the wrapper. (A native wrapper
        # starts in a millisecond: it would still see its creator alive.)
        argv = [sys.executable, "-c", "import os, sys, time\n"
                "while os.getppid() == int(sys.argv[1]): time.sleep(0.002)\n"
                "os.execv(sys.argv[2], sys.argv[2:])", str(os.getpid()), *argv]
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    print(p.pid, os.getpid(), flush=True)
    if adopt:
        os._exit(0)  # the wrapper is adopted by our parent, the sub-reaper
    p.wait()
    os._exit(0)
while True:
    try:
        os.waitpid(-1, 0)
    except ChildProcessError:
        time.sleep(0.05)
"""


@pytest.mark.mechanism
@pytest.mark.parametrize("adopt", [True, False], ids=["adopted", "control-creator"])
def test_an_orphan_adopted_at_start_does_not_watch_its_adopter(procs, ts, env, adopt):
    helper = procs.popen([sys.executable, "-c", ADOPTED, "adopt" if adopt else "stay", ts,
                          "-c", 'echo $$ >> "$P"; sleep 60'], env=env, stdout=subprocess.PIPE)
    wrapper, mid = map(int, helper.stdout.readline().split())
    (sh,) = read_pids(env["P"], 1)
    # The wrapper writes its start record once it has the keeper's report:
    # the command may already run by then.
    start = wait_start_record(env["XDG_STATE_HOME"])
    assert start["wrapper"] == wrapper
    if adopt:
        assert "caller" not in start  # its parent is not its caller: not watched
        helper.kill()
        time.sleep(0.5)
        assert living([sh]) == [sh]
    else:
        assert start["caller"]["pid"] == mid
        os.kill(mid, signal.SIGKILL)
        assert wait_dead([sh], 3.0) == []


# -- 11. an interactive shell, under a real terminal (issue 14) -----------------------

def _pty_spawn(procs, argv, env):
    """Start ``argv`` as the session leader of a new pty, as a terminal app does."""
    import fcntl
    import pty
    import termios

    master, slave = pty.openpty()

    def take_tty():
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    try:
        p = procs.popen(argv, env=env, stdin=slave, stdout=slave, stderr=slave, preexec_fn=take_tty)
    finally:
        os.close(slave)
    return p, master


class Term:
    def __init__(self, master: int) -> None:
        self.fd = master
        self.buf = b""

    def expect(self, what: bytes, timeout: float = 10.0) -> bytes:
        import select

        deadline = time.monotonic() + timeout
        while what not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{what!r} never came; got {self.buf[-400:]!r}")
            r, _, _ = select.select([self.fd], [], [], left)
            if r:
                try:
                    data = os.read(self.fd, 4096)
                except OSError:
                    data = b""
                if not data:
                    raise AssertionError(f"terminal closed before {what!r}; got {self.buf[-400:]!r}")
                self.buf += data
        head, _, self.buf = self.buf.partition(what)
        return head

    def send(self, data: bytes) -> None:
        os.write(self.fd, data)


def _interactive_env(env, tmp_path, shell):
    env["TETHER_SHELL"] = shell
    env["PS1"] = "PROMPT$ "  # bash (ignored by zsh, whose rc sets it)
    env["HOME"] = str(tmp_path)
    (tmp_path / ".zshrc").write_text("PS1='PROMPT$ '\nunsetopt zle\n")
    for rc in (".bashrc", ".bash_profile"):
        (tmp_path / rc).write_text("PS1='PROMPT$ '\n")
    env["ZDOTDIR"] = str(tmp_path)
    env["TERM"] = "dumb"
    return env


SHELLS = [s for s in ("bash", "zsh") if shutil.which(s)]


@pytest.mark.mechanism
@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("args", [[], ["-i"], ["-l"], ["--login"]], ids=repr)
def test_interactive_shell_with_job_control(procs, ts, env, tmp_path, shell, args):
    env = _interactive_env(env, tmp_path, shutil.which(shell))
    p, master = _pty_spawn(procs, [ts, *args], env)
    t = Term(master)
    try:
        t.expect(b"PROMPT$ ")
        # the real shell, a child of the job's keeper, in the job
        t.send(b'echo "S""H:$$:$PPID:$TETHER_JOB"\n')  # the echoed input has no "SH:"
        t.expect(b"SH:")
        pid, ppid, cookie = t.expect(b"\n").strip().split(b":", 2)
        assert identity.read(int(ppid)).comm == "tether-keeper" and cookie.count(b":") == 2
        t.expect(b"PROMPT$ ")
        # Ctrl+Z stops the foreground job, fg resumes it, Ctrl+C reaches it
        t.send(b"sleep 100; echo after-sleep-$?\n")
        time.sleep(0.5)
        t.send(b"\x1a")
        t.expect(b"PROMPT$ ")
        t.send(b"jobs\n")
        t.expect(b"sleep 100")
        t.expect(b"PROMPT$ ")
        t.send(b"fg\n")
        time.sleep(0.5)
        t.send(b"\x03")
        t.expect(b"PROMPT$ ")
        # a background job left at exit ends with the shell
        t.send(b"sleep 120 </dev/null >/dev/null 2>&1 & echo B''G:$!; disown\n")
        t.expect(b"BG:")
        (bg,) = [identity.read(int(t.expect(b"\n").strip()))]
        t.expect(b"PROMPT$ ")
        t.send(b"exit 7\n")
        assert p.wait(timeout=10) == 7
        assert wait_dead([bg], 3.0) == []
    finally:
        os.close(master)


@pytest.mark.mechanism
@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("plain", [False, True], ids=["tether-shell", "control-plain"])
def test_terminal_app_sigkilled_ends_the_interactive_shell(procs, ts, env, tmp_path, shell, plain):
    # A terminal app (the caller) runs `$SHELL -i` on a terminal and is
    # SIGKILLed. The terminal stays open (this test holds it), so no hang-up
    # ends anything: only the caller watch can. The shell's rc file (HOME is
    # tmp_path) starts a background child. Control: the plain shell - both stay.
    import pty

    env = _interactive_env(env, tmp_path, shutil.which(shell))
    rc = 'sleep 120 </dev/null >/dev/null 2>&1 & echo $! >> "$P"; echo $$ >> "$P"\n'
    for name in (".zshrc", ".bashrc"):
        (tmp_path / name).write_text((tmp_path / name).read_text() + rc)
    app = ("import fcntl, os, sys, termios, time\n"
           "pid = os.fork()\n"
           "if pid == 0:\n"
           "    os.setsid()\n"
           "    fcntl.ioctl(0, termios.TIOCSCTTY, 0)\n"
           "    os.execv(sys.argv[1], sys.argv[1:])\n"
           "time.sleep(600)\n")
    master, slave = pty.openpty()
    # The control's shell and child outlive their caller on purpose: they are
    # adopted by this test process, not by PID 1, until the test ends them.
    held = procs.adopting_orphans() if plain else contextlib.nullcontext()
    try:
        with held:
            argv = [shutil.which(shell), "-i"] if plain else [ts, "-i"]
            caller = procs.popen([sys.executable, "-c", app, *argv], env=env, stdin=slave,
                                 stdout=slave, stderr=slave)
            bg, sh = read_pids(env["P"], 2)
            caller.kill()
            caller.wait(timeout=5)
            if plain:
                time.sleep(0.5)
                assert living([bg, sh]) == [bg, sh]  # control: nothing ends them
                assert identity.read(sh.pid).ppid == os.getpid()  # held here, not by PID 1
            else:
                assert wait_dead([bg, sh], 3.0) == []
    finally:
        os.close(master)
        os.close(slave)


# -- 12. TETHER_SHELL_SCOPE=caller: background work for the agent's lifetime ---------

# Command 1 starts a server and returns; command 2 asks it; the server is the
# caller's until the caller ends. A stand-in agent: runs the commands it reads
# on stdin one by one through "$SHELL -c" (each in a session of its own), prints
# each status, then waits to be killed.
AGENT = r"""
import os, subprocess, sys, time
for line in sys.stdin:
    p = subprocess.Popen([sys.argv[1], "-c", line], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    out, _ = p.communicate()
    print(p.returncode, out.decode().strip(), flush=True)
time.sleep(600)
"""

SERVER = ('python3 -c \'import http.server, os, socketserver; '
          's = socketserver.TCPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler); '
          'open(os.environ["P"] + ".port", "w").write(str(s.server_address[1])); '
          's.serve_forever()\' </dev/null >/dev/null 2>&1 & echo $! >> "$P"; echo started\n')
ASK = ('python3 -c \'import os, urllib.request; '
       'port = open(os.environ["P"] + ".port").read(); '
       'print(urllib.request.urlopen("http://127.0.0.1:" + port, timeout=5).status)\' 2>&1 '
       '| tail -n 1\n')


def _agent(procs, ts, env):
    agent = procs.popen([sys.executable, "-c", AGENT, ts], env=env, stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE)
    agent.stdin.write(SERVER.encode())
    agent.stdin.flush()
    assert agent.stdout.readline().split() == [b"0", b"started"]
    # Scope command (the control) may have ended it already: then None.
    (server,) = read_pids(env["P"], 1, gone_ok=True) or (None,)
    deadline = time.monotonic() + 10
    while not os.path.exists(env["P"] + ".port") and time.monotonic() < deadline:
        if server is None or not identity.is_alive(server):
            break  # ended with its command (the control): it will write no port
        time.sleep(0.02)
    time.sleep(0.1)
    agent.stdin.write(ASK.encode())
    agent.stdin.flush()
    return agent, server, agent.stdout.readline().split()


@pytest.mark.mechanism
@pytest.mark.parametrize("mech", MECHS)
def test_scope_caller_server_lives_until_the_agent_is_killed(procs, ts, env, mech):
    use(env, mech, TETHER_SHELL_SCOPE="caller")
    agent, server, answer = _agent(procs, ts, env)
    assert answer == [b"0", b"200"]  # command 2 reached command 1's server
    assert server is not None and identity.is_alive(server)
    # `tether ps` lists the caller-scoped job with its caller (the agent) as owner
    from tether import ps

    jobs = [j for j in ps.collect(os.path.join(env["XDG_STATE_HOME"], "tether"))
            if any(m.ident.pid == server.pid for m in _walk_members(j.members))]
    assert len(jobs) == 1 and jobs[0].owner.pid == agent.pid and jobs[0].owner_alive
    assert jobs[0].name == "tether-shell scope=caller"
    agent.kill()
    agent.wait(timeout=5)
    assert wait_dead([server], 3.0) == []
    assert procs.wait_all_dead(3.0) == []  # its scope keeper / lingering keeper too


def _walk_members(ms):
    for m in ms:
        yield m
        yield from _walk_members(m.children)


@pytest.mark.mechanism
def test_control_scope_command_ends_the_server_with_its_command(procs, ts, env):
    agent, server, answer = _agent(procs, ts, env)
    assert answer[0] == b"0" and answer[1:] != [b"200"]  # connection refused: it was ended
    assert server is None or not identity.is_alive(server)


@pytest.mark.mechanism
@pytest.mark.parametrize("mech", MECHS)
def test_scope_caller_keeps_status_and_ends_a_stopped_command(procs, ts, env, mech):
    # Per-command status and transparency stay; a command stopped (SIGTERM to
    # the wrapper, as an agent's timeout does) is still ended whole.
    use(env, mech, TETHER_SHELL_SCOPE="caller")
    caller, wrapper = start_caller(procs, ts, env, 'echo $$ >> "$P"; sleep 60 & echo $! >> "$P"; '
                                   'setsid -f sh -c \'echo $$ >> "$P"; exec sleep 60\'; sleep 60')
    tree = read_pids(env["P"], 3)
    os.kill(wrapper.pid, signal.SIGTERM)
    assert wait_dead(tree + [wrapper], 3.0) == []
    rc, out = run_py(procs, env, "import os, subprocess, sys; "
                     f"print(subprocess.run([{ts!r}, '-c', 'exit 5']).returncode)")
    assert out == b"5\n"


# A caller that runs two commands at once (as an agent's parallel tool calls):
# prints both wrappers' pids, then waits to be killed.
TWO_AT_ONCE = r"""
import subprocess, sys, time
a = subprocess.Popen([sys.argv[1], "-c", sys.argv[2]])
time.sleep(0.1)
b = subprocess.Popen([sys.argv[1], "-c", sys.argv[3]])
print(a.pid, b.pid, flush=True)
b.wait()
print(b.returncode, flush=True)
time.sleep(600)
"""


def _two_commands(procs, ts, env, mech, two: str):
    """Two commands of one caller at once (``TWO_AT_ONCE``), in scope caller
    (as root: in cgroups below the caller's). Command 1 starts a process 0.5 s
    in - after command 2 began - and keeps it (pid in $P1); command 2 is
    ``two``, which writes two pids to $P2. Returns the caller, command 2's
    wrapper, command 1's process and command 2's."""
    use(env, mech, TETHER_SHELL_SCOPE="caller", P1=env["P"] + "1", P2=env["P"] + "2")
    one = 'sleep 0.5; sleep 60 & echo $! >> "$P1"; wait'
    caller = procs.popen([sys.executable, "-c", TWO_AT_ONCE, ts, one, two], env=env,
                         stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    wrapper2 = identity.read(int(caller.stdout.readline().split()[1]))
    assert wrapper2 is not None
    (late,) = read_pids(env["P1"], 1)
    return caller, wrapper2, late, read_pids(env["P2"], 2)


def _only_the_caller_ends_it(procs, caller, late) -> None:
    """Command 1's process lived through command 2's ending (the control);
    the caller's death ends it."""
    assert identity.is_alive(late)
    caller.kill()
    caller.wait(timeout=5)
    assert wait_dead([late], 3.0) == []
    assert procs.wait_all_dead(3.0) == []


@pytest.mark.mechanism
@pytest.mark.parametrize("mech", MECHS)
def test_scope_caller_stop_ends_that_command_only(procs, ts, env, mech):
    # Command 2, stopped, ignores SIGTERM, so it is ended by the kill: its own
    # cgroup's, not the caller's (as root, each command's cgroup is below the
    # caller's). Control: command 1's process lives on until the caller dies.
    caller, wrapper2, late, mine = _two_commands(
        procs, ts, env, mech, 'trap "" TERM; sleep 60 & echo $! >> "$P2"; echo $$ >> "$P2"; wait')
    assert gate.send_signal(wrapper2, signal.SIGTERM, member=True)
    assert caller.stdout.readline() != b""  # command 2 returned
    assert wait_dead(mine, 3.0) == []
    _only_the_caller_ends_it(procs, caller, late)


# -- 13. named after the real shell: tether shell --install DIR ----------------------

# `tether shell --install` as where no native tether-shell was built.
_NO_NATIVE = ("import sys, tether._shellinstall as s; s._native_program = lambda: None; "
              "from tether.cli import main; sys.exit(main(sys.argv[1:]))")


def _install(procs, env, d, *names, python=False):
    """``tether shell --install``: links to the native tether-shell where it is
    built, Python launchers where not (or with ``python``: as there)."""
    how = ["-c", _NO_NATIVE] if python else ["-m", "tether"]
    p = procs.popen([sys.executable, *how, "shell", "--install", str(d), *names], env=env,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate(timeout=20)
    return p.returncode, out, err


@pytest.mark.parametrize("kind", SHELL_KINDS)
def test_installed_bash_runs_the_real_bash_after_its_directory(procs, env, tmp_path, kind):
    native = native_shell()
    if kind == "native" and native is None:
        pytest.skip("the native tether-shell is not built here (no C compiler at install time)")
    py = kind == "python"
    d, d2 = tmp_path / "tbin", tmp_path / "tbin2"
    rc, out, _ = _install(procs, env, d, python=py)
    assert rc == 0 and f"SHELL={d}/bash".encode() in out
    assert sorted(os.listdir(d)) == ["bash", "sh", "zsh"]
    assert os.path.islink(d / "bash") == (kind == "native")
    assert _install(procs, env, d2, "bash", python=py)[0] == 0
    real = shutil.which("bash")
    # Another install first on PATH, and this one twice: never itself, never the other.
    env["PATH"] = f"{d2}:{d}:{d}:{env['PATH']}"
    env["SHELL"] = str(d2 / "bash")
    p = procs.popen([str(d2 / "bash"), "-c", 'echo "$0 $BASH_VERSION"; exit 3'], env=env,
                    stdout=subprocess.PIPE)
    out, _ = p.communicate(timeout=20)
    assert p.returncode == 3
    got, version = out.decode().split(maxsplit=1)
    assert os.path.samefile(got, real) and version[0].isdigit()
    # it ran in a job: its log says so
    assert [r["event"] for r in log_records(env["XDG_STATE_HOME"])][-4:] == [
        "job-open", "spawn", "exit", "job-close"]
    # installed again over itself (the links or the launchers are its own)
    assert _install(procs, env, d, python=py)[0] == 0


def test_installed_name_without_a_real_shell_after_it_is_127(procs, env, tmp_path):
    d = tmp_path / "tbin"
    assert _install(procs, env, d, "zsh")[0] == 0
    env["PATH"] = str(d)  # nothing after it
    p = procs.popen([str(d / "zsh"), "-c", "echo ran"], env=env, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE)
    out, err = p.communicate(timeout=20)
    assert (p.returncode, out) == (127, b"") and err.count(b"\n") == 1 and b"zsh" in err


def test_install_never_replaces_a_real_file(procs, env, tmp_path):
    d = tmp_path / "tbin"
    d.mkdir()
    (d / "bash").write_text("#!/bin/sh\necho real\n")
    rc, out, err = _install(procs, env, d)
    assert rc == 2 and err.count(b"\n") == 1 and b"refusing" in err
    assert (d / "bash").read_text() == "#!/bin/sh\necho real\n" and sorted(os.listdir(d)) == ["bash"]
    assert _install(procs, env, d, "fish")[0] == 2
    assert _install(procs, env, tmp_path / "x")[0] == 0 and _install(procs, env, tmp_path / "x")[0] == 0


# -- 14. bad TETHER_SHELL_* values: exit 2, one line, nothing run (issue 13) ----------

@pytest.mark.parametrize("name,value", [
    ("TETHER_SHELL_GRACE", "inf"), ("TETHER_SHELL_GRACE", "1e308"), ("TETHER_SHELL_GRACE", "-1"),
    ("TETHER_SHELL_GRACE", "nan"), ("TETHER_SHELL_GRACE", "soon"), ("TETHER_SHELL_LOG", "maybe"),
    ("TETHER_SHELL_LOG_DAYS", "0"), ("TETHER_SHELL_LOG_DAYS", "two"),
    ("TETHER_SHELL_LOG_MAX_BYTES", "-5"), ("TETHER_SHELL_SCOPE", "agent"),
    ("TETHER_SHELL_WITH_CALLER", "2"), ("TETHER_SHELL_MECHANISM", "strict"),
])
def test_bad_tether_shell_values_are_exit_2(procs, ts, env, tmp_path, name, value):
    marker = tmp_path / "ran"
    env[name] = value
    rc, out, err = run(procs, ts, ["-c", f"touch {marker}"], env)
    assert rc == 2 and out == b"" and err.count(b"\n") == 1 and name.encode() in err
    assert not marker.exists()


@pytest.mark.parametrize("value", ["state", "./state", "  "])
def test_a_relative_state_dir_is_exit_2_and_writes_nothing(procs, ts, env, tmp_path, value):
    # `tether run`, `tether ps` and `tether reap` refuse it (the audit's rule):
    # the shell used to write its log under each command's working directory
    marker = tmp_path / "ran"
    env["TETHER_STATE_DIR"] = value
    rc, out, err = run(procs, ts, ["-c", f"touch {marker}"], env, cwd=tmp_path)
    assert rc == 2 and out == b"" and err.count(b"\n") == 1 and b"TETHER_STATE_DIR" in err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("extra", [{"TETHER_SHELL_WITH_CALLER": "0"},
                                   {"TETHER_SHELL_MECHANISM": "pgroup"}], ids=repr)
def test_scope_caller_that_cannot_be_served_is_exit_2(procs, ts, env, tmp_path, extra):
    marker = tmp_path / "ran"
    env.update(extra, TETHER_SHELL_SCOPE="caller")
    rc, out, err = run(procs, ts, ["-c", f"touch {marker}"], env)
    assert rc == 2 and err.count(b"\n") == 1 and b"TETHER_SHELL_SCOPE" in err
    assert not marker.exists()


def test_good_values_are_taken(procs, ts, env):
    env.update(TETHER_SHELL_GRACE="0", TETHER_SHELL_LOG="on", TETHER_SHELL_LOG_DAYS="3",
               TETHER_SHELL_SCOPE="command", TETHER_SHELL_WITH_CALLER="1")
    assert run(procs, ts, ["-c", "exit 4"], env)[0] == 4


# -- 15. a hostile log path never hangs the wrapper (issue 13) ------------------------

def _day_file(env) -> str:
    d = os.path.join(env["XDG_STATE_HOME"], "tether")
    os.makedirs(d, mode=0o700, exist_ok=True)
    return os.path.join(d, "audit.jsonl")


@pytest.mark.parametrize("what", ["fifo", "fifo-with-reader", "other-writable", "regular"])
def test_hostile_day_file_is_not_written_and_nothing_hangs(procs, ts, env, what):
    path = _day_file(env)
    reader = None
    if what.startswith("fifo"):
        os.mkfifo(path, 0o600)
        if what == "fifo-with-reader":
            reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    else:
        with open(path, "w"):
            pass
        os.chmod(path, 0o666 if what == "other-writable" else 0o600)
    try:
        t0 = time.monotonic()
        rc, out, err = run(procs, ts, ["-c", "echo ran"], env, timeout=10)
        assert (rc, out, err) == (0, b"ran\n", b"") and time.monotonic() - t0 < 5
        if reader is not None:
            try:
                assert os.read(reader, 4096) == b""  # nothing was written into the FIFO
            except BlockingIOError:
                pass
        if not what.startswith("fifo"):
            size = os.path.getsize(path)
            assert (size > 0) == (what == "regular")  # control: a good file is written
    finally:
        if reader is not None:
            os.close(reader)


def test_fifo_log_wrapper_stays_responsive_to_sigterm(procs, ts, env):
    os.mkfifo(_day_file(env), 0o600)
    p = procs.popen([ts, "-c", 'echo $$ >> "$P"; sleep 60'], env=env, stdout=subprocess.DEVNULL)
    (sh,) = read_pids(env["P"], 1)
    t0 = time.monotonic()
    p.terminate()
    assert p.wait(timeout=5) == -signal.SIGTERM and time.monotonic() - t0 < 3
    assert wait_dead([sh], 3.0) == []


# -- 16. the keeper's death, and tether reap as the backstop (issue 13) --------------

def _tree_and_keeper(procs, ts, env, mech, stderr):
    use(env, mech)
    p = procs.popen([ts, "-c", TREE], env=env, stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, stderr=stderr)
    tree = read_pids(env["P"], TREE_N)
    return p, tree, _keeper_of(tree[0])


@pytest.mark.mechanism
@pytest.mark.parametrize("mech", MECHS)
def test_keeper_killed_mid_command_is_said_and_the_job_ended(procs, ts, env, mech):
    # (The control is the next test: with the wrapper killed too, the tree stays.)
    # The keeper's children lose their parent when it is killed: held here, not
    # under PID 1, for the moment until the wrapper ends them.
    with procs.adopting_orphans():
        p, tree, keeper = _tree_and_keeper(procs, ts, env, mech, subprocess.PIPE)
        t0 = time.monotonic()
        assert gate.send_signal(keeper, signal.SIGKILL, member=True)
        _, err = p.communicate(timeout=10)
        assert p.returncode == 123 and time.monotonic() - t0 < 5
        # one line from tether (the shell, sharing stderr, may report its killed children)
        assert [ln for ln in err.splitlines() if b"tether" in ln] == [
            b"tether: keeper died; the job is no longer guarded"]
        assert wait_dead(tree, 3.0) == []
    assert [r for r in log_records(env["XDG_STATE_HOME"])
            if r["event"] == "exit"][-1]["error"] == "keeper-died"


@pytest.mark.mechanism
@pytest.mark.parametrize("mech", MECHS)
def test_scope_caller_keeper_killed_ends_that_command_only(procs, ts, env, mech):
    # Command 2's keeper is SIGKILLed: its wrapper ends command 2's processes
    # from the outside - its own cgroup and its cookie, never the caller's
    # cgroup, which would end command 1's too (the control).
    with procs.adopting_orphans():
        caller, _, late, mine = _two_commands(
            procs, ts, env, mech, 'sleep 60 & echo $! >> "$P2"; echo $$ >> "$P2"; wait')
        assert gate.send_signal(_keeper_of(mine[1]), signal.SIGKILL, member=True)
        assert caller.stdout.readline().split() == [b"123"]  # command 2: the guard lost
        assert wait_dead(mine, 3.0) == []
        _only_the_caller_ends_it(procs, caller, late)


@pytest.mark.mechanism
@pytest.mark.parametrize("mech", MECHS)
def test_keeper_and_wrapper_sigkilled_tether_reap_ends_the_rest(procs, ts, env, mech):
    # Control: with both gone nothing guards the tree; then `tether reap`, from
    # the shell's own records (the cookie finds even the double-forked daemon).
    with procs.adopting_orphans():  # the tree, orphaned on purpose, is held here, not by PID 1
        _keeper_and_wrapper_sigkilled(procs, ts, env, mech)


def _keeper_and_wrapper_sigkilled(procs, ts, env, mech):
    p, tree, keeper = _tree_and_keeper(procs, ts, env, mech, subprocess.DEVNULL)
    # The wrapper writes its start record once the keeper reports the command
    # started, so a loaded machine can run the tree before it: killed before
    # the record, nothing would tell `tether reap` of this run (a CI replica
    # left all 7 to the fixture so). The case here is the recorded one.
    wait_start_record(env["XDG_STATE_HOME"])
    # Both, with the wrapper unable to act on the keeper's death in between (the
    # native one does so within microseconds): the wrapper is held first - by
    # ptrace, not SIGSTOP, whose stopped process group, orphaned by the
    # keeper's death, would get SIGHUP + SIGCONT from the kernel (the tree
    # is in that group). A ptrace stop is no job-control stop.
    held = ptrace_hold(p.pid)
    assert gate.send_signal(keeper, signal.SIGKILL, member=True)
    assert wait_dead([keeper], 3.0) == []
    ptrace_kill(p, held, timeout=5)
    time.sleep(0.3)
    assert len(living(tree)) == TREE_N  # control: all still running
    state = os.path.join(env["XDG_STATE_HOME"], "tether")
    # (cgroup_dirs=(): the stale cgroups this log names, not every test's in our cgroup)
    r = procs.popen([sys.executable, "-c", "import json, sys; from tether import reaper; "
                     "print(json.dumps(reaper.reap(sys.argv[1], grace=0.5, "
                     "cgroup_dirs=()).to_dict()))", state], env=env, stdout=subprocess.PIPE)
    out, _ = r.communicate(timeout=60)
    assert r.returncode == 0, out
    assert wait_dead(tree, 3.0) == [], out
    import json

    ended = {e["pid"] for e in json.loads(out)["ended"]}
    assert {i.pid for i in tree} <= ended | {i.pid for i in tree if not identity.is_alive(i)}


def test_the_command_carries_the_cookie_first_and_the_log_names_it(procs, ts, env):
    rc, out, _ = run(procs, ts, ["-c", "tr '\\0' '\\n' < /proc/$$/environ | head -n 1"], env)
    name, _, cookie = out.decode().strip().partition("=")
    assert rc == 0 and name == "TETHER_JOB"
    start = [r for r in log_records(env["XDG_STATE_HOME"]) if r["event"] == "job-open"][-1]
    assert start["cookie"] == cookie and start["job"] in cookie and start["run"] in cookie
    assert start["owner"]["pid"] == start["wrapper"] and start["keeper"]["pid"] > 0


# -- 12. the native program, and the Python one it hands over to (issue 18) -----------

@pytest.mark.mechanism
@pytest.mark.parametrize("form", [["-c"], ["-eu", "-o", "pipefail", "-c"]], ids=" ".join)
@pytest.mark.parametrize("native_off", [False, True], ids=["native", "control-python"])
def test_the_native_tether_shell_runs_no_interpreter(procs, env, tmp_path, native_off, form):
    """The command's parent is the job's keeper, forked from the wrapper: both
    run the native program. The Python one the native one hands over to (the
    control: the same check sees the interpreter) runs the same keeper, the
    native program's one-command driver, by exec."""
    native = native_shell()
    if native is None:
        pytest.skip("the native tether-shell is not built here (no C compiler at install time)")
    wrapper = tether_shell("python", tmp_path) if native_off else native
    script = 'k=$PPID; w=$(cut -d" " -f4 /proc/$k/stat); readlink /proc/$k/exe /proc/$w/exe; echo $w'
    p = procs.popen([wrapper, *form, script], env=env, stdout=subprocess.PIPE,
                    stdin=subprocess.DEVNULL)
    out, _ = p.communicate(timeout=20)
    keeper_exe, wrapper_exe, wrapper = out.decode().split()
    assert p.returncode == 0 and int(wrapper) == p.pid
    if native_off:
        from tether.keeper.native import HELPER

        assert wrapper_exe == os.path.realpath(sys.executable)
        assert keeper_exe == os.path.realpath(HELPER)
    else:
        assert keeper_exe == wrapper_exe == os.path.realpath(native)


@pytest.mark.mechanism
@pytest.mark.parametrize("native_off", [False, True], ids=["native", "control-python"])
def test_the_native_tether_shell_serves_scope_caller(procs, env, tmp_path, native_off):
    """TETHER_SHELL_SCOPE=caller is served by the native program too, with no
    interpreter (control: the Python one's wrapper is the interpreter), and
    its records name the caller's job, owned by the caller. The caller, a
    shell that exits after the command, ends what the scope kept."""
    native = native_shell()
    if native is None:
        pytest.skip("the native tether-shell is not built here (no C compiler at install time)")
    wrapper = tether_shell("python", tmp_path) if native_off else native
    env["TETHER_SHELL_SCOPE"] = "caller"
    script = 'k=$PPID; w=$(cut -d" " -f4 /proc/$k/stat); readlink /proc/$w/exe'
    p = procs.popen(["sh", "-c", '"$0" -c "$1"; exit $?', wrapper, script], env=env,
                    stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    out, _ = p.communicate(timeout=20)
    assert p.returncode == 0
    want = sys.executable if native_off else native
    assert out.decode().strip() == os.path.realpath(want)
    start = [r for r in log_records(env["XDG_STATE_HOME"]) if r["event"] == "job-open"][-1]
    assert (start["scope"], start["name"]) == ("caller", "tether-shell scope=caller")
    assert start["owner"]["pid"] == start["caller"]["pid"] == p.pid
    assert start["run"] == f"{p.pid}-{start['caller']['start'].split('@')[0]}"
    assert procs.wait_all_dead(3.0) == []


@pytest.mark.parametrize("delay_ms", [0.1, 0.3, 0.6, 1, 2, 4, 10])
def test_an_early_sigint_to_the_python_wrapper_is_no_traceback(procs, env, delay_ms):
    # SIGINT (kill(), not the terminal) while tether-shell-py still sets up:
    # a KeyboardInterrupt traceback, exit 1. Now it is ignored from main()'s
    # first line, as the native program ignores it from its first
    # instruction: the wrapper waits for the command and returns its status.
    code = ("import sys\nsys.argv = ['tether-shell', '-c', 'sleep 0.3 & sleep 0.5']\n"
            # cli: what main() calls once its first line has set the handler
            "from tether.shell import main, cli\n" + sigint_inside("cli", delay_ms / 1000)
            + "main()\n")
    p = procs.popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    _, err = p.communicate(timeout=30)
    assert (p.returncode, err) == (0, b"")
    assert not procs.wait_all_dead(3)


def test_a_caller_that_ignores_sigchld_still_gets_the_status(procs, ts, env):
    # An ignored SIGCHLD is inherited: the wrapper and its keeper must still
    # wait for their children (else the kernel reaps them unseen and nothing
    # ever returns).
    p = procs.popen([ts, "-c", "exit 3"], env=env, stdin=subprocess.DEVNULL,
                    preexec_fn=lambda: signal.signal(signal.SIGCHLD, signal.SIG_IGN))
    assert p.wait(timeout=10) == 3


def test_a_gone_stderr_reader_does_not_kill_the_wrapper(procs, ts, env, tmp_path):
    # The one line the wrapper says goes to a pipe nobody reads any more:
    # EPIPE, not death by SIGPIPE; the exit status is still the documented one.
    bad = tmp_path / "not-a-shell"
    bad.write_bytes(b"\x00\x01 not an executable format")
    bad.chmod(0o755)
    env["TETHER_SHELL"] = str(bad)
    r, w = os.pipe()
    os.close(r)
    try:
        p = procs.popen([ts, "-c", "true"], env=env, stdin=subprocess.DEVNULL, stderr=w)
    finally:
        os.close(w)
    assert p.wait(timeout=10) == 126


# -- a caller's closed stdio stays closed, and costs the wrapper nothing --------------

# Which of the shell's fds 0-2 are open, written on fd 9 (opened last, at 9);
# exit 3.
FD_PROBE = 'exec 9>"$0"; for f in 0 1 2; do [ -e /proc/$$/fd/$f ] && printf $f >&9; done; exit 3'
CLOSED = ["<&-", ">&-", "2>&-", "<&- >&-", "<&- 2>&-", ">&- 2>&-", "<&- >&- 2>&-"]


def closed_run(procs, env, closed: str, *argv: str) -> int:
    """``argv`` started with the caller's fds closed as ``closed`` says."""
    p = procs.popen(["sh", "-c", f'exec "$@" {closed}', "sh", *argv], env=env)
    return p.wait(timeout=20)


@pytest.mark.parametrize("closed", CLOSED)
def test_a_callers_closed_stdio_stays_closed(procs, ts, env, tmp_path, closed):
    """Started with stdin, stdout or stderr closed (any of them), the command
    finds the same ones closed and its exit status comes back, as under
    plain sh. Before: the wrapper's log file, the caller's pidfd or a pipe
    took a closed fd's number, and the keeper's own /dev/null stdio made that
    pidfd read as the caller's death: the command was SIGKILLed, and so the
    wrapper (137). Control: plain sh, the same way."""
    want, got = tmp_path / "sh", tmp_path / "ts"
    assert closed_run(procs, env, closed, "sh", "-c", FD_PROBE, str(want)) == 3
    assert closed_run(procs, env, closed, ts, "-c", FD_PROBE, str(got)) == 3
    assert got.read_text() == want.read_text()
