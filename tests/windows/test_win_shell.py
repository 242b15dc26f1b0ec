"""tether-shell on Windows as Windows programs call it, for real under Wine.

The wrapper under test is ``tether-cmd.exe`` as pip installs it: pip's own
launcher in ``Scripts\\``, in a folder whose path has a space
(scripts/windows-lane.sh installs this checkout's wheel with Windows pip and
sets TETHER_LANE_SCRIPTS; the launcher runs the checkout's code). It is
called the ways callers call a COMSPEC or a SHELL:

* ``python``: Python's ``subprocess`` with ``shell=True`` and ``COMSPEC`` set
  to it - the command line ``%COMSPEC% /c "CMD"``, the path *not* quoted;
* ``node``: Node's ``shell: true`` when the shell is named cmd.exe -
  ``"%COMSPEC%" /d /s /c "CMD"``, verbatim;
* ``shell``: ``-c CMD`` quoted by C-runtime rules (Node's ``shell: true`` for
  any other name, ``$SHELL -c``), with ``TETHER_SHELL`` = cmd.exe;
* and ``-c CMD`` with the default search, which finds PowerShell 7: a
  stand-in ``pwsh.exe`` behind the same launcher (Wine has no PowerShell)
  that reports the arguments it got.

Every cmd.exe case is compared with real cmd.exe called the same way:
stdout and stderr byte for byte, and the exit code (all 32 bits).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

SCRIPTS = os.environ.get("TETHER_LANE_SCRIPTS", "")
PWSH = os.environ.get("TETHER_LANE_PWSH", "")
TETHER_CMD = os.path.join(SCRIPTS, "tether-cmd.exe")
TETHER_EXE = os.path.join(SCRIPTS, "tether.exe")
CMD_EXE = os.path.join(os.environ.get("SystemRoot", "C:\\windows"), "System32", "cmd.exe")
PY = sys.executable
HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = os.path.join(HERE, "_child.py")
REPO = os.path.dirname(os.path.dirname(HERE))
PIPE = subprocess.PIPE

needs_programs = pytest.mark.skipif(
    not (os.path.isfile(TETHER_CMD) and os.path.isfile(PWSH)),
    reason="needs tether-cmd.exe as Windows pip installs it and the stand-in pwsh: "
           "run scripts/windows-lane.sh",
)
pytestmark = [pytest.mark.wine, needs_programs]


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    """A folder with a space in its path, a file in it and a batch file that echoes."""
    d = tmp_path_factory.mktemp("shell") / "dir with space"
    d.mkdir()
    (d / "a b.txt").write_bytes(b"content of a b\r\n")
    (d / "say.bat").write_bytes(b"@echo off\r\necho [%~1] [%2]\r\n")
    return str(d)


@pytest.fixture
def env_for(monkeypatch):
    """``env_for(comspec, **extra)``: the environment of a call, COMSPEC included.

    Python's ``shell=True`` reads COMSPEC from *this* process's environment, so
    it is set here (and put back after the test); ``extra`` go to the child only.
    """
    def make(comspec: str, **extra: str) -> dict[str, str]:
        monkeypatch.setenv("COMSPEC", comspec)
        env = dict(os.environ)
        for name, value in extra.items():  # Windows names are case-insensitive: replace
            for key in [k for k in env if k.upper() == name.upper()]:
                del env[key]
            env[name] = value
        return env

    return make


def call(form: str, comspec: str, cmd: str, env: dict[str, str], **kw):
    """Run CMD through ``comspec`` the way a caller of ``form`` does."""
    kw.setdefault("stdout", PIPE)
    kw.setdefault("stderr", PIPE)
    kw.setdefault("timeout", 60)
    if form == "python":
        return subprocess.run(cmd, shell=True, env=env, **kw)
    if form == "node":
        return subprocess.run(f'"{comspec}" /d /s /c "{cmd}"', executable=comspec, env=env, **kw)
    if form == "shell":
        return subprocess.run([comspec, "-c", cmd], env=env, **kw)
    raise ValueError(form)


class WineStartFailure(Exception):
    """cmd.exe could not start a program that exists (pytest-wine.ini reruns these)."""


def outcome(r) -> tuple[int, bytes, bytes]:
    # Wine's cmd.exe reports any CreateProcessW failure as 9009 "Can't recognize
    # ... as an internal or external command", so the Wine failure that
    # pytest-wine.ini reruns as WinError 1359 looks like this through cmd.exe.
    # Every program a seed names exists, so this result is never the one under test.
    if r.returncode == 9009 and r.stderr.startswith(b"Can't recognize"):
        raise WineStartFailure(f"cmd.exe could not start a program: {r.stderr!r}")
    return r.returncode, r.stdout, r.stderr


# --- the seed list: each command through tether-cmd.exe and through cmd.exe ---------------
SEEDS = {
    "echo": "echo hello",
    "spaces": "echo a  b   c",
    "file-with-spaces": 'type "{place}\\a b.txt"',
    "unicode-echo": "echo \u00fcn\u00efc\u00f6d\u00e9",
    "unicode-arg": '"{py}" -S -c "import sys; print(ascii(sys.argv[1]))" "\u00fcn\u00ef \u2713 \u65e5\u672c"',
    "pipe": 'echo abc| "{py}" -S -c "import sys; print(sys.stdin.read().strip().upper())"',
    "chain-and": '"{py}" -S -c "pass" && echo chained',
    "chain-or": '"{py}" -S -c "raise SystemExit(1)" || echo recovered',
    "chain-both": "echo one & echo two",
    "stderr-nonzero": '"{py}" -S -c "import sys; print(\'out\'); sys.stderr.write(\'bad thing\'); sys.exit(3)"',
    "echo-to-stderr": "echo to stderr 1>&2 & exit 4",
    "long-output": '"{py}" -S -c "print(\'x\' * 5000)"',
    "200kB": '"{py}" -S -c "print(\'y\' * 200000)"',
    "nested-quotes": '"{py}" -S -c "import sys; print(sys.argv[1:])" "a b" "c\\"d" "e f\\\\"',
    "nested-print": '"{py}" -S -c "print(\\"he said \\\\\\"hi\\\\\\"\\")"',
    "quoted-program-path": '"{place}\\say.bat" "a b" c',
    "exit-256": "exit 256",
    "exit-ntstatus": "exit -1073741819",
    "program-ntstatus": '"{py}" -S -c "import sys; sys.exit(-1073741510)"',
    "redirect": 'echo into a file> "{place}\\out.txt" & type "{place}\\out.txt"',
}


@pytest.mark.parametrize("form", ["python", "node", "shell"])
@pytest.mark.parametrize("seed", sorted(SEEDS))
def test_seed_matches_cmd_exe(env_for, place, form, seed):
    cmd = SEEDS[seed].format(py=PY, place=place)
    # The reference: cmd.exe itself, called as the caller would (for -c: as
    # tether-shell runs its TETHER_SHELL=cmd.exe, which is Node's cmd.exe form).
    want = outcome(call("node" if form == "shell" else form, CMD_EXE, cmd, env_for(CMD_EXE)))
    got = outcome(call(form, TETHER_CMD, cmd, env_for(TETHER_CMD, TETHER_SHELL=CMD_EXE)))
    assert got == want


CODES = [0, 1, 255, 256, 0xC0000005, 0xC000013A]


def _signed(code: int) -> int:
    return code - (1 << 32) if code >= 1 << 31 else code


@pytest.mark.parametrize("code", CODES, ids=hex)
@pytest.mark.parametrize("form", ["python", "node", "shell", "pwsh", "tether-shell", "module"])
def test_exit_codes_pass_through_whole(env_for, form, code):
    """All 32 bits, as cmd.exe reports them: 0xC0000005 (an access violation)
    and 0xC000013A (ended by Ctrl+C) included, in every form."""
    text = f"exit {_signed(code)}"
    if form in ("python", "node", "shell"):  # (cmd.exe itself: the exit-* seeds above)
        r = call(form, TETHER_CMD, text, env_for(TETHER_CMD, TETHER_SHELL=CMD_EXE))
    elif form == "pwsh":  # the stand-in exits with N for `exit N`, as pwsh does
        r = subprocess.run([TETHER_CMD, "-c", text], capture_output=True, timeout=60,
                           env=env_for(TETHER_CMD, TETHER_SHELL=PWSH))
    elif form == "tether-shell":  # `tether shell /c ...` through tether.exe
        r = subprocess.run([TETHER_EXE, "shell", "/c", text], capture_output=True, timeout=60)
    else:
        r = subprocess.run([PY, "-m", "tether", "shell", "/c", text], capture_output=True,
                           timeout=60)
    assert r.returncode == code, r.stderr
    assert b"Traceback" not in r.stderr


def test_glued_c_is_comspec_mode(env_for):
    """``/c"echo glued"`` - accepted by cmd.exe - runs in cmd.exe, as written."""
    env = env_for(TETHER_CMD)
    for line in ('"{c}" /c"echo glued"', '"{c}" /C"echo  \"glued\" words"', '"{c}" /cecho bare'):
        want = subprocess.run(line.format(c=CMD_EXE), executable=CMD_EXE, capture_output=True,
                              timeout=60, env=env)
        got = subprocess.run(line.format(c=TETHER_CMD), executable=TETHER_CMD, capture_output=True,
                             timeout=60, env=env)
        assert outcome(got) == outcome(want) and want.stdout.strip(), line


# --- SHELL mode with PowerShell: the stand-in reports what it was given ----------------------
PWSH_COMMANDS = [
    'Write-Output "say \\"hi\\""',
    '& "C:\\Program Files\\some tool\\tool.exe" "a b" \'c d\'',
    'echo "C:\\dir with space\\"',
    "$x = 'single'; \"$x\" + \"double\"",
    "\u00fcn\u00efc\u00f6d\u00e9 \u2713",
    "",
]


@pytest.mark.parametrize("how", ["search", "TETHER_SHELL"])
@pytest.mark.parametrize("command", PWSH_COMMANDS)
def test_pwsh_gets_the_command_as_one_argument(env_for, how, command):
    """pwsh.exe splits its command line by C-runtime rules and runs what follows
    -Command: the command must arrive as that one argument, unchanged."""
    folder = os.path.dirname(PWSH)
    if how == "search":  # the documented default: pwsh >= 7 on PATH
        env = env_for(TETHER_CMD, PATH=folder + os.pathsep + os.environ.get("PATH", ""))
        env.pop("TETHER_SHELL", None)
    else:
        env = env_for(TETHER_CMD, TETHER_SHELL=PWSH)
    r = subprocess.run([TETHER_CMD, "-c", command], capture_output=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"argv": ["-NoLogo", "-Command", command]}


@pytest.fixture
def pwsh_in_program_files():
    """The stand-in at ``%ProgramFiles%\\PowerShell\\7\\pwsh.exe`` for one test.

    Wine sets ProgramFiles afresh in every process (a child's environment
    cannot move it), so the stand-in goes where PowerShell installs itself -
    in the lane's own Wine prefix - and is removed again.
    """
    import shutil

    target = os.path.join(os.environ["ProgramFiles"], "PowerShell", "7", "pwsh.exe")
    if os.path.exists(target):
        pytest.skip(f"{target} exists already; not replacing it")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.copyfile(PWSH, target)
    yield target
    os.unlink(target)


def test_pwsh_found_in_program_files(env_for, pwsh_in_program_files):
    path = os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                           if not os.path.isfile(os.path.join(d, "pwsh.exe")))
    env = env_for(TETHER_CMD, PATH=path)
    env.pop("TETHER_SHELL", None)
    r = subprocess.run([TETHER_CMD, "-c", "exit 3"], capture_output=True, timeout=60, env=env)
    assert r.returncode == 3, r.stderr
    assert json.loads(r.stdout)["argv"] == ["-NoLogo", "-Command", "exit 3"]


# --- refusals: exit 2, one line, nothing run --------------------------------------------------
def _refused(r) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stdout == b""
    lines = r.stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tether-shell: "), lines
    return lines[0]


@pytest.mark.parametrize("args", [[], ["/c"], ["/d", "/s", "/c"], ["-c"], ["-l"]],
                         ids=["nothing", "/c", "/d /s /c", "-c", "-l"])
def test_missing_command_is_2(args):
    _refused(subprocess.run([TETHER_CMD, *args], capture_output=True, timeout=60))


@pytest.mark.parametrize("args", [["/k", "echo x"], ["/q", "/c", "echo x"],
                                  ["--norc", "-c", "echo x"], ["/C:", "echo x"]])
def test_unknown_flag_is_2(args):
    line = _refused(subprocess.run([TETHER_CMD, *args], capture_output=True, timeout=60))
    assert "unrecognised" in line or "missing" in line


def test_interactive_flag_for_cmd_is_2(env_for):
    # -i -c is a POSIX shell's form (OMP runs `$SHELL -i -c CMD` for zsh users):
    # served where the real shell is one, refused for cmd.exe with the reason.
    # (Which shell is real is known only once it is found: with none found
    # the answer is 127, as for -c.)
    cmd = os.path.join(os.environ.get("SystemRoot", r"C:\windows"), "system32", "cmd.exe")
    r = subprocess.run([TETHER_CMD, "-i", "-c", "echo x"], capture_output=True, timeout=60,
                       env=env_for(TETHER_CMD, TETHER_SHELL=cmd))
    assert "POSIX shell's option" in _refused(r)


@pytest.mark.parametrize("which", ["relative", "missing", "self", "self-by-name"])
def test_bad_tether_shell_is_2_and_nothing_runs(env_for, tmp_path, which):
    value = {"relative": "cmd.exe", "missing": "C:\\no\\such\\shell.exe", "self": TETHER_CMD,
             "self-by-name": os.path.join(SCRIPTS, "tether-cmd")}[which]
    marker = tmp_path / "ran"
    cmd = f'"{PY}" -S "{CHILD}" marker t "{marker}"'
    r = subprocess.run([TETHER_CMD, "-c", cmd], capture_output=True, timeout=60,
                       env=env_for(TETHER_CMD, TETHER_SHELL=value))
    assert "TETHER_SHELL" in _refused(r)
    assert not marker.exists()


@pytest.mark.parametrize("shell", ["cmd", "pwsh"])
def test_arguments_after_the_command_are_refused_for_cmd_and_pwsh(env_for, shell):
    r = subprocess.run([TETHER_CMD, "-c", "echo %0", "zero", "one"], capture_output=True,
                       timeout=60, env=env_for(TETHER_CMD, TETHER_SHELL=CMD_EXE if shell == "cmd"
                                               else PWSH))
    assert "takes no arguments after -c CMD" in _refused(r)


@pytest.mark.parametrize("argv", [[TETHER_CMD, "--help"], [TETHER_CMD, "-h"], [TETHER_CMD, "/?"],
                                  [TETHER_EXE, "shell", "--help"], [PY, "-m", "tether", "shell", "-h"]],
                         ids=["--help", "-h", "/?", "tether shell --help", "-m tether shell -h"])
def test_help_prints_usage_and_exits_0(argv):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout.startswith("usage: tether-shell -c CMD") and "tether-cmd /c CMD" in r.stdout


# --- no command text in any log --------------------------------------------------------------
def test_no_command_text_in_any_log(tmp_path, env_for):
    secret = "s3cr3t-c0mmand-t3xt"
    logs, state = tmp_path / "local", tmp_path / "state"
    calls = [
        ("python", env_for(TETHER_CMD, LOCALAPPDATA=str(logs))),
        ("node", env_for(TETHER_CMD, LOCALAPPDATA=str(logs))),
        ("shell", env_for(TETHER_CMD, LOCALAPPDATA=str(logs), TETHER_SHELL=CMD_EXE)),
        ("python", env_for(TETHER_CMD, TETHER_STATE_DIR=str(state))),  # + the spawn audit log
    ]
    for form, env in calls:
        r = call(form, TETHER_CMD, f"echo {secret} & exit 3", env)
        assert r.returncode == 3 and secret.encode() in r.stdout
    r = subprocess.run([TETHER_CMD, "/k", secret], capture_output=True, timeout=60,
                       env=env_for(TETHER_CMD, LOCALAPPDATA=str(logs)))
    assert r.returncode == 2
    files = [p for d in (logs, state) for p in d.rglob("*") if p.is_file()]
    records = [rec for p in files if p.name.startswith("audit.jsonl") and not p.name.endswith(".lock")
               for rec in map(json.loads, p.read_text().splitlines())
               if rec.get("app") == "tether-shell"]
    # The logs were written (so this check can fail): a start and an exit per command.
    assert [r["event"] for r in records].count("exit") == 4
    assert any(r["event"] == "error" and r["error"] == "usage" for r in records)
    # the caller's pid, read without getppid()
    assert all(r["parent"] > 0 for r in records if r["event"] in ("job-open", "error"))
    for p in files:
        data = p.read_bytes()
        assert secret.encode() not in data and secret.encode("utf-16-le") not in data, p


# --- kill of the wrapper, two wrappers, start /b ----------------------------------------------
def _start_tree(tracker, comspec: str, token: str):
    """A wrapper (or cmd.exe) running a child that starts a grandchild; returns
    (the Popen, handles of [child, grandchild])."""
    line = f'"{PY}" -S "{CHILD}" tree {token}'
    p = tracker.popen(subprocess.Popen(f'"{comspec}" /d /s /c "{line}"', executable=comspec,
                                       stdout=PIPE, stdin=subprocess.DEVNULL, text=True))
    words = tracker.first_line(p).split()
    assert words[:1] == ["pids"], words
    return p, [tracker.open(int(words[1]), token), tracker.open(int(words[2]), token)]


@pytest.mark.parametrize("target", ["launcher", "wrapper-python", "control"])
def test_killing_the_wrapper_ends_child_and_grandchild(tracker, api, token, target):
    """TerminateProcess (Task Manager's "End task") of what the caller started -
    pip's launcher - or of the Python behind it: the tree is gone within 3 s.
    The control kills cmd.exe the same way and sees the tree live on."""
    import psutil

    p, tree = _start_tree(tracker, CMD_EXE if target == "control" else TETHER_CMD, token)
    victim = int(p._handle)
    if target == "wrapper-python":
        # The tree's child runs under cmd.exe, which runs under the wrapper's Python.
        cmd_pid = psutil.Process(api.GetProcessId(tree[0])).ppid()
        victim = tracker.open(psutil.Process(cmd_pid).ppid(), token)
    api.TerminateProcess(victim, 9)
    if target == "control":
        assert tracker.wait_gone(tree, 1.0) == tree
    else:
        t0 = time.monotonic()
        assert tracker.wait_gone(tree, 3.0) == []
        assert time.monotonic() - t0 < 3.0
    p.wait(10)


def test_two_wrappers_killing_one_keeps_the_other(tracker, api, token):
    first, tree1 = _start_tree(tracker, TETHER_CMD, token + "a")
    second, tree2 = _start_tree(tracker, TETHER_CMD, token + "b")
    api.TerminateProcess(int(first._handle), 9)
    assert tracker.wait_gone(tree1, 3.0) == []
    assert tracker.wait_gone(tree2, 1.0) == tree2  # the other wrapper's tree runs on
    assert second.poll() is None
    api.TerminateProcess(int(second._handle), 9)
    assert tracker.wait_gone(tree2, 3.0) == []


@pytest.mark.parametrize("comspec", ["tether", "control"])
def test_start_b_is_ended_on_return(tracker, tmp_path, token, comspec):
    """``start /b`` leaves a process running when cmd.exe returns: the wrapper
    ends it before it returns; under cmd.exe alone it lives on."""
    exe = TETHER_CMD if comspec == "tether" else CMD_EXE
    pidfile = tmp_path / "pid"
    cmd = (f'start /b "" "{PY}" -S "{CHILD}" pidfile {token} "{pidfile}" & '
           f'"{PY}" -S "{CHILD}" waitfor {token} "{pidfile}"')
    r = subprocess.run(f'"{exe}" /d /s /c "{cmd}"', executable=exe, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, timeout=60)
    assert r.returncode == 0
    leftover = tracker.open(int(pidfile.read_text()), token)
    if comspec == "tether":
        assert tracker.wait_gone([leftover], 3.0) == []
    else:
        assert tracker.wait_gone([leftover], 1.0) == [leftover]


# --- the installed names and the docs agree ---------------------------------------------------
def test_docs_name_only_programs_pip_installs():
    """Every ``...\\Scripts\\NAME`` the docs tell Windows users to use is a
    program pip made; and the COMSPEC drop-in is tether-cmd.exe."""
    import re

    installed = set(os.listdir(SCRIPTS))
    assert {"tether.exe", "tether-cmd.exe"} <= installed
    named = set()
    for doc in ("shell.md", "windows.md"):
        with open(os.path.join(REPO, "docs", doc), encoding="utf-8") as f:
            named |= set(re.findall(r"Scripts\\([\w.-]+)", f.read()))
    assert "tether-cmd.exe" in named
    assert named <= installed, named - installed


# --- tether reap and tether ps with default settings ------------------------------------------
def test_reap_and_ps_run_with_default_settings(tracker, tmp_path, token):
    """Both read the caller's pid (the reaper keeps its ancestors out of reach)
    - os.getppid() aborts the process under Wine - and run through pip's launcher."""
    for argv in ([TETHER_EXE, "reap", "--dry-run"], [TETHER_EXE, "ps"],
                 [TETHER_EXE, "ps", "--json"]):
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (argv, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr and "wine:" not in r.stderr
    # A live wrapper with the spawn audit on: ps shows its job and members,
    # and reap --dry-run leaves a live run alone.
    env = dict(os.environ, TETHER_STATE_DIR=str(tmp_path))
    line = f'"{PY}" -S "{CHILD}" tree {token}'
    p = tracker.popen(subprocess.Popen(f'"{TETHER_CMD}" /d /s /c "{line}"', executable=TETHER_CMD,
                                       stdout=PIPE, stdin=subprocess.DEVNULL, text=True, env=env))
    _, child, grandchild = tracker.first_line(p).split()
    tree = [tracker.open(int(child), token), tracker.open(int(grandchild), token)]
    r = subprocess.run([TETHER_EXE, "ps", "--json"], capture_output=True, text=True, timeout=60,
                       env=env)
    assert r.returncode == 0, r.stderr
    shown = json.dumps(json.loads(r.stdout))
    assert child in shown and grandchild in shown
    r = subprocess.run([TETHER_EXE, "reap", "--dry-run"], capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 0 and "would end nothing" in r.stdout, r.stdout
    assert tracker.wait_gone(tree, 0.5) == tree


def test_a_shell_that_cannot_start_is_126_with_the_windows_error(env_for, tmp_path):
    """CreateProcessW's failure says its number (the words alone can be
    "Internal error."): here ERROR_BAD_EXE_FORMAT, a file that is no program."""
    bad = tmp_path / "bad.exe"
    bad.write_bytes(b"MZ but no program")
    r = subprocess.run([TETHER_CMD, "-c", "echo hi"], capture_output=True, timeout=60,
                       env=env_for(TETHER_CMD, TETHER_SHELL=str(bad)))
    assert r.returncode == 126, r
    assert b"[WinError 193]" in r.stderr and b"Traceback" not in r.stderr, r.stderr
