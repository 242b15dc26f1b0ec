"""Property-based tests of tether-shell's argument parser and Windows command-line
handling, plus the shell search run over real files (Windows layouts included,
with the path separators passed in: the search logic is the same)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from procutil import SHELL_KINDS, tether_shell

from tether import _shellargs as sa

# -- SHELL mode -----------------------------------------------------------------------

OPTS = st.sampled_from(["-c", "-l", "-lc", "-cl", "-lcl", "-cc", "--login", "-ll",
                        "-i", "-ic", "-il", "-lic", "-ci"])  # -i with -c: OMP's form (issue 35)
TEXT = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=30)


@given(st.lists(TEXT, max_size=8))
def test_parse_never_raises_anything_but_usage_error(argv):
    try:
        p = sa.parse(argv)
    except sa.UsageError as exc:
        msg = str(exc)
        assert msg and "\n" not in msg
        return
    if p.mode == sa.INTERACTIVE:  # only -i, -l, --login (issue 14): the real shell gets them
        assert p.flags == tuple(argv)
        assert all(a == "--login" or (a[:1] == "-" and a[1:] and set(a[1:]) <= set("il"))
                   for a in argv)
    elif p.mode == sa.SHELL:
        assert p.command in argv
        head = argv[: argv.index("--") if "--" in argv else len(argv)]
        assert any(a.startswith("-") and not a.startswith("--") and "c" in a for a in head)
        assert list(p.args) == argv[len(argv) - len(p.args):]
    else:
        assert sa.is_comspec_flag(argv[0])
        assert p.flags[-1].lower() == "/c"


@given(st.lists(OPTS, min_size=1, max_size=5), st.booleans(), TEXT, st.lists(TEXT, max_size=5))
def test_valid_shell_forms_parse_to_command_and_dollar_args(opts, dashdash, cmd, rest):
    assume(any("c" in o and not o.startswith("--") for o in opts))
    argv = list(opts)
    if dashdash or cmd[:1] == "-" or (cmd[:1] == "+" and cmd[1:]):  # sh reads - and + options
        argv.append("--")
    argv += [cmd, *rest]
    p = sa.parse(argv)
    assert p.mode == sa.SHELL
    assert p.command == cmd and p.args == tuple(rest)
    assert p.login == any(o == "--login" or (not o.startswith("--") and "l" in o) for o in opts)
    assert p.interactive == any(not o.startswith("--") and "i" in o for o in opts)
    real = sa.shell_argv("/bin/zsh", p)  # the real shell gets the same -l and -i
    c = real.index("-c")
    assert real[1:c] == ["-l"] * p.login + ["-i"] * p.interactive
    assert real[c + 1:] == (["--"] if cmd[:1] in ("-", "+") else []) + [cmd, *rest]
    if p.interactive:  # PowerShell and cmd.exe have no -i: refused with the reason
        for other in ("/usr/bin/pwsh", "cmd.exe"):
            with pytest.raises(sa.UsageError, match="-i is a POSIX shell's option"):
                sa.shell_argv(other, p)


@given(st.lists(OPTS, max_size=3), st.sampled_from("dgjkpqrstwyzABDLZ0123456789"),
       st.lists(TEXT, max_size=3))
def test_unknown_option_letter_is_refused(before, letter, rest):
    with pytest.raises(sa.UsageError, match="unrecognised"):
        sa.parse([*before, f"-{letter}", "-c", "true", *rest])


SET_WORDS = st.lists(st.one_of(
    st.tuples(st.sampled_from("-+"), st.text(st.sampled_from(sorted(sa.SET_LETTERS)), min_size=1,
                                             max_size=3)).map(lambda t: [t[0] + t[1]]),
    st.tuples(st.sampled_from(["-o", "+o"]), st.sampled_from(["pipefail", "errexit", "x"]))
    .map(list)), max_size=4)


@given(SET_WORDS, st.lists(OPTS, min_size=1, max_size=3), TEXT, st.lists(TEXT, max_size=3))
def test_set_options_reach_the_real_shell_in_order(words, opts, cmd, rest):
    assume(any("c" in o and not o.startswith("--") for o in opts))
    argv = [w for ws in words for w in ws] + list(opts) + ["--", cmd, *rest]
    p = sa.parse(argv)
    assert p.mode == sa.SHELL and p.command == cmd and p.args == tuple(rest)
    want = []
    for ws in words:
        if len(ws) == 2:
            want += ws
        else:
            want += [ws[0][0] + ch for ch in ws[0][1:]]
    assert list(p.options) == want
    real = sa.shell_argv("/bin/sh", p)
    c = real.index("-c")
    assert real[1:c] == ["-l"] * p.login + ["-i"] * p.interactive + want
    assert real[c + 1:] == (["--"] if cmd[:1] in ("-", "+") else []) + [cmd, *rest]
    with pytest.raises(sa.UsageError):  # never given to PowerShell, which reads -e otherwise
        if want or p.interactive:
            sa.shell_argv("/usr/bin/pwsh", p)
        else:
            raise sa.UsageError("nothing to refuse")


@given(st.lists(st.sampled_from(["-l", "--login"]), max_size=3), st.lists(TEXT, min_size=1, max_size=3))
def test_without_c_is_refused(opts, operands):
    # Operands without -c (a script) are refused; flags alone are an
    # interactive shell since issue 14 (below), so min_size=1 here.
    assume(not operands[0].startswith("-"))
    assume(not (operands and sa.is_comspec_flag(operands[0]) and not opts))
    with pytest.raises(sa.UsageError):
        sa.parse([*opts, *operands])


@given(st.lists(st.sampled_from(["-i", "-l", "--login", "-il", "-li", "-ii"]), max_size=4))
def test_flags_alone_are_an_interactive_shell(flags):
    p = sa.parse(flags)
    assert p.mode == sa.INTERACTIVE and p.flags == tuple(flags) and p.command == ""
    assert p.login == any(f == "--login" or (f != "--login" and "l" in f) for f in flags)
    assert sa.shell_argv("/bin/bash", p) == ["/bin/bash", *flags]


# -- COMSPEC mode -----------------------------------------------------------------------

@given(st.lists(st.sampled_from(["/d", "/s", "/D", "/S"]), max_size=3), st.sampled_from(["/c", "/C"]),
       st.lists(TEXT, min_size=1, max_size=4))
def test_comspec_forms(flags, c, words):
    p = sa.parse([*flags, c, *words])
    assert p.mode == sa.COMSPEC and p.flags == (*flags, c)
    assert p.command == " ".join(words) and p.args == ()


@given(st.lists(st.sampled_from(["/d", "/s"]), max_size=2),
       st.sampled_from(["/k", "/q", "/e", "/x", "/?", "-c", "-l", "/C:", "foo"]), st.lists(TEXT, max_size=3))
def test_comspec_never_falls_through(flags, bad, rest):
    assume(flags or sa.is_comspec_flag(bad))
    with pytest.raises(sa.UsageError):
        sa.parse([*flags, bad, *rest])


# -- Windows command lines ---------------------------------------------------------------

WIN_TEXT = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=20)


@given(st.lists(WIN_TEXT, max_size=6))
def test_split_windows_inverts_list2cmdline(args):
    # list2cmdline implements the MS C runtime rules; split_windows must undo it.
    line = '"C:\\Program Files\\x\\prog.exe" ' + subprocess.list2cmdline(args)
    words = sa.split_windows(line)
    assert words[0][0] == "C:\\Program Files\\x\\prog.exe"
    assert [w for w, _, _ in words[1:]] == args
    for _w, start, end in words:
        assert 0 <= start < end <= len(line)


@given(st.sampled_from([["C:\\Python\\python.exe"], ["python.exe", "C:\\venv\\Scripts\\tether-shell.exe"],
                        ["C:\\x y\\tether-shell.exe"]]),
       st.lists(st.sampled_from(["/d", "/s", "/D"]), max_size=2), st.sampled_from(["/c", "/C"]),
       st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), min_size=1,
               max_size=40))
def test_comspec_tail_is_the_raw_text_after_the_prefix(prefix, flags, c, raw):
    assume(raw.strip(" \t"))
    own = " ".join([*flags, c]) + " " + raw.lstrip(" \t")
    line = subprocess.list2cmdline(prefix) + " " + own
    words = sa.split_windows(line)
    user_args = [w for w, _, _ in words[len(prefix):]]
    assert sa.comspec_tail(line, user_args) == own.rstrip()


def test_comspec_tail_examples():
    line = '"C:\\Py\\python.exe" "C:\\v\\tether-shell.exe" /d /s /c "echo "a b" > "c d.txt""'
    args = [w for w, _, _ in sa.split_windows(line)][2:]
    assert args[:3] == ["/d", "/s", "/c"]
    assert sa.comspec_tail(line, args) == '/d /s /c "echo "a b" > "c d.txt""'
    assert sa.comspec_tail("prog /c", ["/c"]) is None  # nothing after /c: fall back
    assert sa.comspec_tail("prog -c x", ["-c", "x"]) is None


@given(st.lists(st.sampled_from(["/d", "/s", "/D"]), max_size=2), st.sampled_from(["/c", "/C"]),
       st.text(st.characters(blacklist_characters="\0:", blacklist_categories=("Cs",)), min_size=1,
               max_size=30), st.lists(WIN_TEXT, max_size=3))
def test_glued_c_is_comspec_mode(flags, c, glued, rest):
    """cmd.exe runs ``/c"echo hi"`` (the C runtime hands us ``/cecho hi``) and ``/cdir``."""
    p = sa.parse([*flags, c + glued, *rest])
    assert p.mode == sa.COMSPEC and p.flags == (*flags, c)
    assert p.command == " ".join([glued, *rest])


def test_glued_c_examples_and_what_stays_refused():
    assert sa.parse(["/cecho glued"]).command == "echo glued"
    assert sa.parse(["/d", '/C"x"']).command == '"x"'
    line = '"C:\\Py\\python.exe" "C:\\v\\tether-cmd.exe" /d /c"echo glued" & exit 3'
    args = [w for w, _, _ in sa.split_windows(line)][2:]
    assert args[:2] == ["/d", "/cecho glued"]
    assert sa.comspec_tail(line, args) == '/d /c"echo glued" & exit 3'
    assert sa.comspec_tail('prog /c"x"', ["/cx"]) == '/c"x"'  # nothing after the glued word
    for bad in (["/C:", "x"], ["/c:x"], ["/d", "/k", "x"], ["/dc", "x"]):
        with pytest.raises(sa.UsageError):
            sa.parse(bad)


# How pip's launcher (distlib's) passes its command line on: its own name is cut
# at the first space when unquoted, then everything after it follows verbatim.
def _launcher_argv(program: str, line_after_program: str) -> list[str]:
    raw = program + " " + line_after_program  # Python's shell=True: the path is not quoted
    rest = raw[raw.index(" ") + 1:]
    child = f'"C:\\Py\\python.exe" "{program}" {rest}'
    return [w for w, _, _ in sa.split_windows(child)][2:]


@given(st.lists(st.text(st.characters(whitelist_categories=("L", "N"), whitelist_characters="-_."),
                        min_size=1, max_size=8), min_size=1, max_size=4),
       st.sampled_from(["/c", "/d /s /c", "-c", "-lc"]), st.lists(WIN_TEXT, min_size=1, max_size=4))
@example(dirs=["0", "-"], flags="/c", rest=[""])  # a path word that starts with "-"
def test_unsplit_program_restores_an_unquoted_path_with_spaces(dirs, flags, rest):
    program = "C:\\" + " ".join(dirs) + "\\Scripts\\tether-cmd.exe"
    args = [*flags.split(), *rest]
    argv = _launcher_argv(program, subprocess.list2cmdline(args))
    # sys.argv[0] is the launcher's own full path, with ".exe" taken off.
    assert sa.unsplit_program(argv, program[:-4]) == args


def test_unsplit_program_drops_only_our_own_path():
    prog = "C:\\Program Files\\x\\tether-cmd"
    assert sa.unsplit_program(["Files\\x\\tether-cmd.exe", "/c", "dir"], prog) == ["/c", "dir"]
    assert sa.unsplit_program(["/c", "Files\\x\\tether-cmd.exe"], prog) == ["/c", "Files\\x\\tether-cmd.exe"]
    assert sa.unsplit_program(["Files\\y\\other.exe", "/c", "dir"], prog) == ["Files\\y\\other.exe", "/c", "dir"]
    assert sa.unsplit_program(["x", "/c"], "C:\\NoSpace\\tether-cmd") == ["x", "/c"]
    assert sa.unsplit_program([], prog) == []


CMD_EXE = "C:\\Windows\\System32\\cmd.exe"


@given(WIN_TEXT)
def test_windows_command_line_for_cmd_keeps_the_command_as_written(cmd):
    """``/d /s /c "CMD"``: with /s, cmd.exe drops the first and the last quote
    after /c and runs the rest - which must be CMD, quotes and all."""
    line = sa.windows_command_line(CMD_EXE, sa.Parsed(sa.SHELL, cmd))
    head = f'"{CMD_EXE}" /d /s /c "'
    assert line.startswith(head) and line.endswith('"')
    assert line[len(head):-1] == cmd


@given(WIN_TEXT, st.sampled_from(["C:\\Program Files\\PowerShell\\7\\pwsh.exe",
                                  "C:\\WINDOWS\\System32\\WindowsPowerShell\\v1.0\\powershell.exe"]))
def test_windows_command_line_for_pwsh_is_one_c_runtime_argument(cmd, shell):
    """pwsh.exe splits its command line by C-runtime rules and runs the
    argument after -Command: it must come back as exactly CMD."""
    line = sa.windows_command_line(shell, sa.Parsed(sa.SHELL, cmd))
    assert [w for w, _, _ in sa.split_windows(line)] == [shell, "-NoLogo", "-Command", cmd]


@given(WIN_TEXT, st.lists(WIN_TEXT, max_size=3), st.booleans())
def test_windows_command_line_for_other_shells_round_trips(cmd, args, login):
    shell = "C:\\Program Files\\Git\\bin\\bash.exe"
    parsed = sa.Parsed(sa.SHELL, cmd, args, login=login)
    line = sa.windows_command_line(shell, parsed)
    assert [w for w, _, _ in sa.split_windows(line)] == sa.shell_argv(shell, parsed, True)


@pytest.mark.parametrize("shell", [CMD_EXE, "C:\\PS\\7\\pwsh.exe"])
def test_windows_command_line_refuses_dollar_args_for_cmd_and_pwsh(shell):
    with pytest.raises(sa.UsageError, match="takes no arguments after -c CMD"):
        sa.windows_command_line(shell, sa.Parsed(sa.SHELL, "echo %0", ["a0"]))


def test_wants_help_only_alone():
    for argv in (["-h"], ["--help"], ["/?"]):
        assert sa.wants_help(argv)
    for argv in ([], ["-h", "-c", "x"], ["-c", "--help"], ["--help", "x"], ["/?", "/c", "x"]):
        assert not sa.wants_help(argv)
    assert "tether-cmd /c CMD" in sa.USAGE and all(len(line) <= 100 for line in sa.USAGE.splitlines())


# -- the real argument path, through real processes ----------------------------------------

ARG_TEXT = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=12)


@pytest.fixture(scope="module", params=SHELL_KINDS)
def ts(request, tmp_path_factory) -> str:
    """An installed tether-shell, native and Python (see test_shell.ts)."""
    path = tether_shell(request.param, tmp_path_factory.mktemp("bin"))
    if path is None:
        pytest.skip("no native tether-shell here (not built: no C compiler at install time)")
    return path


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX wrapper")
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(ARG_TEXT, min_size=1, max_size=4))
def test_dollar_args_round_trip_through_tether_shell(procs, ts, args):
    env = procs.env()
    env["TETHER_SHELL_LOG"] = "off"
    env.pop("TETHER_SHELL", None)
    p = procs.popen([ts, "-c", 'printf "%s\\0" "$0" "$@"', *args], env=env, stdout=subprocess.PIPE,
                    stdin=subprocess.DEVNULL)
    out, _ = p.communicate(timeout=20)
    assert p.returncode == 0
    assert out.split(b"\0")[:-1] == [os.fsencode(a) for a in args]


@pytest.mark.parametrize("how", ["script", "tether shell"])
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_usage_and_exits_0(procs, ts, how, flag):
    argv = [ts, flag] if how == "script" else [sys.executable, "-m", "tether", "shell", flag]
    p = procs.popen(argv, env=procs.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    stdin=subprocess.DEVNULL)
    out, err = p.communicate(timeout=20)
    assert (p.returncode, err) == (0, b"")
    assert out.decode() == sa.USAGE
    # Not alone, it is no help: --help is an unknown flag (exit 2); -h is sh's
    # set option (hashall), which the real shell gets, as `sh -h -c CMD` does.
    # Nothing is ever skipped for help.
    p = procs.popen([*argv, "-c", "echo ran"], env=procs.env(), stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    out, err = p.communicate(timeout=20)
    if flag == "--help":
        assert p.returncode == 2 and out == b"" and b"unrecognised" in err
    else:
        assert (p.returncode, out, err) == (0, b"ran\n", b"")


# -- the shell search over real files --------------------------------------------------------

def exe(path, text="#!/bin/sh\nexit 0\n"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)
    return str(path)


def never_self(_path):
    return False


def test_windows_search_pwsh7_on_path(tmp_path):
    old = exe(tmp_path / "ps6" / "pwsh.exe")
    (tmp_path / "ps6" / "pwsh.deps.json").write_text('{"targets": {"x": {"pwsh/6.2.7": {}}}}')
    new = exe(tmp_path / "ps7" / "pwsh.exe")
    (tmp_path / "ps7" / "pwsh.deps.json").write_text('{"targets": {"x": {"pwsh/7.4.1": {}}}}')
    env = {"Path": f"{tmp_path / 'nothing'}:{tmp_path / 'ps6'}:{tmp_path / 'ps7'}"}
    assert sa.find_windows_shell(env, never_self, pathsep=":", sep="/") == new
    assert sa.pwsh_major(old) == 6 and sa.pwsh_major(new) == 7


def test_windows_search_program_files_fallback_and_not_found(tmp_path):
    pf = tmp_path / "Program Files"
    env = {"PATH": str(tmp_path / "empty"), "ProgramFiles": str(pf)}
    with pytest.raises(sa.ShellNotFound, match="PowerShell 7"):
        sa.find_windows_shell(env, never_self, pathsep=":", sep="/")
    want = exe(pf / "PowerShell" / "7" / "pwsh.exe")
    assert sa.find_windows_shell(env, never_self, pathsep=":", sep="/") == want


def test_windows_search_skips_a_pwsh_that_is_tether_shell(tmp_path):
    fake = exe(tmp_path / "a" / "pwsh.exe", "#!/x/python\nfrom tether.shell import main\n")
    real = exe(tmp_path / "b" / "pwsh.exe")
    check = sa.SelfCheck([])
    assert check(fake) and not check(real)
    env = {"PATH": f"{tmp_path / 'a'}:{tmp_path / 'b'}"}
    assert sa.find_windows_shell(env, check, pathsep=":", sep="/") == real


def test_comspec_path_and_resolution():
    env = {"SYSTEMROOT": "D:\\Win"}
    assert sa.comspec_path(env) == "D:\\Win\\System32\\cmd.exe"
    assert sa.comspec_path({}) == "C:\\Windows\\System32\\cmd.exe"
    p = sa.parse(["/d", "/s", "/c", "echo hi"])
    assert sa.resolve(p, env, never_self, windows=True) == "D:\\Win\\System32\\cmd.exe"
    with pytest.raises(sa.UsageError, match="only available on Windows"):
        sa.resolve(p, env, never_self, windows=False)


def test_windows_tether_shell_must_be_absolute():
    p = sa.parse(["-c", "x"])
    for bad in ("bash.exe", "bin\\bash.exe", "C:bash.exe"):
        with pytest.raises(sa.UsageError, match="absolute"):
            sa.resolve(p, {"tether_shell": bad}, never_self, windows=True)
    with pytest.raises(sa.UsageError, match="does not exist"):
        sa.resolve(p, {"TETHER_SHELL": "C:\\no\\such\\bash.exe"}, never_self, windows=True)


@pytest.mark.parametrize("shell,login,windows,want", [
    ("/bin/bash", True, False, ["/bin/bash", "-l", "-c", "CMD", "a0"]),
    ("/bin/sh", False, False, ["/bin/sh", "-c", "CMD", "a0"]),
    ("C:\\PS\\7\\pwsh.exe", True, True, ["C:\\PS\\7\\pwsh.exe", "-NoLogo", "-Command", "CMD", "a0"]),
    ("/usr/bin/pwsh", True, False, ["/usr/bin/pwsh", "-Login", "-NoLogo", "-Command", "CMD", "a0"]),
    ("C:\\Windows\\System32\\CMD.EXE", False, True,
     ["C:\\Windows\\System32\\CMD.EXE", "/d", "/c", "CMD", "a0"]),
])
def test_shell_argv_per_flavour(shell, login, windows, want):
    p = sa.Parsed(sa.SHELL, "CMD", ["a0"], login=login)
    assert sa.shell_argv(shell, p, windows) == want
