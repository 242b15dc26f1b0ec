"""Pure pieces of ``tether-shell``: argument parsing and finding the real shell.

Kept apart from ``tether.shell`` so they can be tested (and property-tested)
as plain functions on any platform, and so the wrapper's hot path imports
nothing heavy: only ``os`` and ``sys``, which the interpreter has loaded anyway.

SHELL mode (what ``$SHELL -c CMD`` callers pass)::

    -c CMD [ARG0 [ARG...]]        -lc CMD    -l -c CMD    -lc -c CMD    -c -l CMD
    -i -c CMD    -ic CMD    -i -l -c CMD    --login -i -c CMD    (the real shell gets -i too)
    --login, -, -- accepted as bash does; ARG0 ARG... become $0 $1 ... as with sh -c

INTERACTIVE mode (what a terminal that starts ``$SHELL`` passes)::

    (no arguments)    -i    -l    --login    -il    -i -l ...
    the real shell runs with the same arguments, on the same terminal

COMSPEC mode (what ``%COMSPEC% /c CMD`` callers pass, Windows only)::

    /c CMD      /d /s /c CMD      (flags case-insensitive; /d and /s in any order)
    /c"CMD"     /cCMD             (the command glued to /c, as cmd.exe accepts it)

``-h``, ``--help`` or ``/?`` as the only argument asks for the usage (``USAGE``;
see :func:`wants_help`).

Anything else - an unknown flag, a missing command, a script operand - is a
``UsageError`` (exit 2, one line); one mode never falls through to the other.
"""

import os
import sys

from .errors import ShellNotFound, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:  # collections.abc/typing cost milliseconds of start-up: hints only
    from collections.abc import Callable, Mapping, Sequence

SHELL = "shell"
COMSPEC = "comspec"
INTERACTIVE = "interactive"

from ._constants import EXIT_NOT_FOUND as EXIT_NOT_FOUND  # noqa: E402 - shared with C
from ._constants import EXIT_USAGE as EXIT_USAGE  # noqa: E402

# Login shells that only refuse logins; never use one as the real shell.
_NOT_SHELLS = frozenset({"nologin", "false", "true", "sync", "halt", "shutdown"})
# Bytes that mark a file as (a launcher or copy of) tether-shell.
_MARKERS = (b"tether.shell", b"tether-shell", b"tether shell")
_PROBE = 4096
# File names of tether's own wrapper: the POSIX launcher and Windows' console script.
_SELF_NAMES = frozenset({"tether-shell", "tether-shell.exe", "tether-cmd", "tether-cmd.exe"})


class Parsed:
    """One parsed invocation.

    ``mode``: ``"shell"``, ``"comspec"`` or ``"interactive"``. ``login``:
    ``-l``/``--login`` was given. ``command``: CMD (``""`` in interactive
    mode). ``args``: what follows CMD (``$0 $1 ...``; in COMSPEC mode the
    words after ``/c`` are joined into ``command`` instead). ``flags``: the
    COMSPEC flags as given, e.g. ``("/d", "/s", "/c")``; in interactive mode
    the arguments as given, which the real shell gets unchanged.
    ``options``: the POSIX ``set`` options given with ``-c`` (``-e``, ``+x``,
    ``-o pipefail`` ...), one per word, in order, for the real shell.
    ``interactive``: ``-i`` given with ``-c`` (OMP runs ``$SHELL -i -c CMD``
    for zsh and fish users): the real shell gets ``-i`` too.
    """

    __slots__ = ("mode", "login", "command", "args", "flags", "options", "interactive")

    def __init__(self, mode: str, command: str, args: "Sequence[str]" = (), login: bool = False,
                 flags: "Sequence[str]" = (), options: "Sequence[str]" = (),
                 interactive: bool = False) -> None:
        self.mode = mode
        self.command = command
        self.args = tuple(args)
        self.login = login
        self.flags = tuple(flags)
        self.options = tuple(options)
        self.interactive = interactive

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Parsed):
            return NotImplemented
        return all(getattr(self, a) == getattr(other, a) for a in self.__slots__)

    def __repr__(self) -> str:
        return (f"Parsed(mode={self.mode!r}, command={self.command!r}, args={self.args!r}, "
                f"login={self.login!r}, flags={self.flags!r}, options={self.options!r}, "
                f"interactive={self.interactive!r})")


def is_comspec_flag(arg: str) -> bool:
    """``/c``-like: a slash and one letter (or ``?``), as cmd.exe's switches are,
    or ``/c`` with its command glued on (see :func:`is_glued_c`)."""
    return (len(arg) == 2 and arg[0] == "/" and (arg[1].isalpha() or arg[1] == "?")) \
        or is_glued_c(arg)


def is_glued_c(arg: str) -> bool:
    """``/c`` with the command glued on: cmd.exe runs ``/c"echo hi"`` (which the
    C runtime hands us as ``/cecho hi``) and ``/cdir``. ``/c:...`` stays a
    malformed switch (cmd.exe's switches with values are written ``/X:VALUE``)."""
    return len(arg) > 2 and arg[0] == "/" and arg[1] in "cC" and arg[2] != ":"


USAGE = """\
usage: tether-shell -c CMD [ARG0 [ARG...]]   run CMD in the real shell, in a job of its own
       tether-shell -lc CMD ...               the same as a login shell (-l -c, --login -c, -c -l)
       tether-shell -ic CMD ...               the same, the real shell interactive (-i -c, -i -l -c)
       tether-shell -eu -o pipefail -c CMD    sh's set options, given with -c, go to the real shell
       tether-cmd /c CMD | /d /s /c CMD       Windows COMSPEC mode: CMD runs in cmd.exe
       tether shell ARGS                      the same as tether-shell ARGS

What CMD leaves behind is ended when it returns; if the wrapper is killed, the
command's whole tree ends. The command sees the same pids, environment, files
and terminal as under the real shell; its exit status is the wrapper's.

Environment: TETHER_SHELL (absolute path of the real shell; default: the login
shell, bash on PATH, /bin/sh; Windows: pwsh 7), TETHER_SHELL_GRACE (seconds,
0.5), TETHER_SHELL_MECHANISM (auto), TETHER_SHELL_LOG (off turns the audit log
off), TETHER_SHELL_LOG_DAYS, TETHER_SHELL_LOG_MAX_BYTES, TETHER_STATE_DIR.

Exit status: the command's; 2 bad invocation or TETHER_SHELL; 125 no job could
be created; 126 the shell could not be executed; 127 no shell found.
Documentation: docs/shell.md.
"""


def wants_help(argv: "Sequence[str]") -> bool:
    """``-h``, ``--help`` or ``/?`` alone. Only alone: with anything after it,
    it is an unknown flag (exit 2), so no command is ever skipped for help."""
    return len(argv) == 1 and argv[0] in ("-h", "--help", "/?")


def parse(argv: "Sequence[str]") -> "Parsed":
    """Parse the arguments after the program name; raise ``UsageError``."""
    if not argv:
        return Parsed(INTERACTIVE, "", ())
    if is_comspec_flag(argv[0]):
        return _parse_comspec(argv)
    return _parse_shell(argv)


_SUPPORTED = ("supported: -c CMD, -l, --login, -i, and with -c the POSIX set options "
              "-abCefhmnuvx, -o NAME and their + forms; -i, -l or --login alone for an "
              "interactive shell")

#: The option letters of POSIX ``sh`` that ``set`` takes too (errexit,
#: nounset, xtrace...): given with ``-c`` they are handed to the real shell as
#: they came (``make``'s ``.SHELLFLAGS = -eu -o pipefail -c``). ``o`` takes
#: the next word as its name.
SET_LETTERS = frozenset("abCefhmnuvx")


def _parse_shell(argv: "Sequence[str]") -> "Parsed":
    login = False
    saw_c = saw_i = ended = False
    options: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--", "-"):
            i += 1
            ended = True
            break
        if arg == "--login":
            login = True
        elif arg.startswith("--"):
            raise UsageError(f"unrecognised option {arg!r} ({_SUPPORTED})")
        elif arg[:1] in ("-", "+") and arg[1:]:
            sign = arg[0]
            for ch in arg[1:]:
                if sign == "-" and ch == "c":
                    saw_c = True
                elif sign == "-" and ch == "l":
                    login = True
                elif sign == "-" and ch == "i":
                    saw_i = True
                elif ch in SET_LETTERS:
                    options.append(sign + ch)
                elif ch == "o":
                    i += 1
                    if i >= len(argv):
                        raise UsageError(f"{sign}o requires an option name")
                    options += [sign + "o", argv[i]]
                else:
                    raise UsageError(f"unrecognised option '{sign}{ch}' in {arg!r} ({_SUPPORTED})")
        else:
            break
        i += 1
    if options and not saw_c:
        raise UsageError(f"{options[0]} needs -c CMD: set options are taken with a command "
                         "string; an interactive shell takes only -i, -l, --login")
    if not saw_c:
        if i < len(argv):
            raise UsageError("missing -c: tether-shell runs a command string (-c CMD) or an "
                             "interactive shell, not a script")
        if ended:
            raise UsageError(f"missing -c CMD ({_SUPPORTED})")
        # Only -i, -l, --login: an interactive shell, given the same arguments.
        return Parsed(INTERACTIVE, "", (), login=login, flags=argv)
    if i >= len(argv):
        raise UsageError("-c requires a command")
    return Parsed(SHELL, argv[i], argv[i + 1:], login=login, options=options, interactive=saw_i)


def as_login(parsed: "Parsed") -> "Parsed":
    """``parsed`` for a wrapper started as a login shell by name (``argv[0]``
    starting with ``-``): the real shell gets ``-l`` too (in front of an
    interactive shell's arguments). COMSPEC mode knows no login."""
    if parsed.mode == COMSPEC or parsed.login:
        return parsed
    flags = ("-l", *parsed.flags) if parsed.mode == INTERACTIVE else parsed.flags
    return Parsed(parsed.mode, parsed.command, parsed.args, login=True, flags=flags,
                  options=parsed.options, interactive=parsed.interactive)


def _parse_comspec(argv: "Sequence[str]") -> "Parsed":
    flags: list[str] = []
    for i, arg in enumerate(argv):
        low = arg.lower()
        if low in ("/d", "/s"):
            flags.append(arg)
            continue
        if low == "/c":
            flags.append(arg)
            rest = argv[i + 1:]
            if not rest:
                raise UsageError(f"{arg} requires a command")
            return Parsed(COMSPEC, " ".join(rest), (), flags=flags)
        if is_glued_c(arg):
            flags.append(arg[:2])
            return Parsed(COMSPEC, " ".join([arg[2:], *argv[i + 1:]]), (), flags=flags)
        if arg.startswith("/") or arg.startswith("-"):
            raise UsageError(f"unrecognised flag {arg!r} (supported: /c CMD, /d /s /c CMD)")
        raise UsageError("missing /c: COMSPEC mode runs a command (/c CMD or /d /s /c CMD)")
    raise UsageError("missing /c CMD (supported: /c CMD, /d /s /c CMD)")


# -- Windows command lines ------------------------------------------------------

def split_windows(cmdline: str) -> list[tuple[str, int, int]]:
    """Split a Windows command line the way the C runtime does, keeping spans.

    Returns ``(word, start, end)`` for each argument; ``cmdline[start:end]``
    is the raw text of the argument. The program name (first word) follows
    its own rule: up to the next quote if it starts with one, else up to
    white space, with no backslash processing. The rest follow
    CommandLineToArgvW: ``2n`` backslashes before a quote give ``n`` and
    toggle quoting, ``2n+1`` give ``n`` and a literal quote, ``""`` inside
    quotes is a literal quote.
    """
    out: list[tuple[str, int, int]] = []
    n = len(cmdline)
    i = 0
    ws = " \t"
    # program name
    while i < n and cmdline[i] in ws:
        i += 1
    if i >= n:
        return out
    start = i
    if cmdline[i] == '"':
        j = cmdline.find('"', i + 1)
        if j < 0:
            out.append((cmdline[i + 1:], start, n))
            return out
        out.append((cmdline[i + 1:j], start, j + 1))
        i = j + 1
    else:
        while i < n and cmdline[i] not in ws:
            i += 1
        out.append((cmdline[start:i], start, i))
    while True:
        while i < n and cmdline[i] in ws:
            i += 1
        if i >= n:
            return out
        start = i
        word: list[str] = []
        quoted = False
        while i < n:
            c = cmdline[i]
            if c == "\\":
                j = i
                while j < n and cmdline[j] == "\\":
                    j += 1
                count = j - i
                if j < n and cmdline[j] == '"':
                    word.append("\\" * (count // 2))
                    if count % 2:
                        word.append('"')
                        i = j + 1
                    else:
                        i = j  # the quote toggles below
                else:
                    word.append("\\" * count)
                    i = j
                continue
            if c == '"':
                if quoted and i + 1 < n and cmdline[i + 1] == '"':
                    word.append('"')
                    i += 2
                    continue
                quoted = not quoted
                i += 1
                continue
            if c in ws and not quoted:
                break
            word.append(c)
            i += 1
        out.append(("".join(word), start, i))


def comspec_tail(cmdline: str, user_args: "Sequence[str]") -> str | None:
    """The raw text of a COMSPEC invocation, from its first flag to the end.

    ``cmdline`` is the process's whole command line (``GetCommandLineW``),
    which may start with a launcher's prefix (``python.exe script ...``);
    ``user_args`` is ``sys.argv[1:]``. The flags ``/d /s /c`` are found at
    the first position where the split words equal ``user_args``' flags;
    from there on the text is returned verbatim, so cmd.exe gets exactly the
    quoting the caller wrote (``/s`` quote stripping depends on it).
    Returns None when the flags cannot be found (caller falls back to a
    re-quoted command).
    """
    nflags = 0
    glued = False
    for a in user_args:
        nflags += 1
        if a.lower() == "/c":
            break
        if is_glued_c(a):
            glued = True  # the command is inside the last flag's word
            break
    else:
        return None
    want = [a.lower() for a in user_args[:nflags]]
    words = split_windows(cmdline)
    for k in range(1, len(words) - nflags + glued):
        if [w[0].lower() for w in words[k:k + nflags]] == want:
            return cmdline[words[k][1]:].rstrip()
    return None


def unsplit_program(argv: "Sequence[str]", program: str) -> list[str]:
    """``argv`` without the leading words that are the rest of our own path.

    Python's ``shell=True`` writes ``%COMSPEC% /c "CMD"`` without quoting the
    path, and pip's ``.exe`` launcher cuts its own name from the command line
    at the first space: ``C:\\Program Files\\x\\tether-cmd.exe /c "CMD"``
    arrives as the arguments ``Files\\x\\tether-cmd.exe /c CMD``. cmd.exe
    itself never sees such a line (it lives in System32); for it to reach us
    whole, those words are dropped when, joined with spaces, they are the end
    of ``program`` (``sys.argv[0]``: the launcher's full path, from which it
    removed ``.exe``), so nothing else is ever dropped.
    """
    # A first word starting with "/" is a flag (no path component does); one
    # starting with "-" may be the rest of the path ("C:\\a -b\\...").
    if not argv or argv[0][:1] == "/" or " " not in program:
        return list(argv)
    low = program.lower()
    ends = (low[:-4], low) if low.endswith(".exe") else (low, low + ".exe")
    for k in range(1, min(len(argv), program.count(" ")) + 1):
        tail = " " + " ".join(argv[:k]).lower()
        if any(e.endswith(tail) for e in ends):
            return list(argv[k:])
    return list(argv)


def windows_command_line(shell: str, parsed: "Parsed") -> str:
    """The command line for a SHELL-mode invocation on Windows, written with
    the target's own rules (a command line is what a Windows program gets;
    each program splits it itself).

    * cmd.exe: ``"SHELL" /d /s /c "CMD"`` - the form Node uses: with ``/s``
      cmd.exe drops the first and the last quote and runs the rest as
      written, so quotes inside CMD stay as they are (cmd.exe knows no
      ``\\"``: re-quoting CMD as a C-runtime argument would change it).
    * PowerShell: ``SHELL -NoLogo -Command CMD`` with CMD as one C-runtime
      argument (pwsh.exe and powershell.exe split their command line by those
      rules, where ``\\"`` is a quote; ``-Command`` then runs its argument).
    * anything else (a POSIX shell such as Git's bash.exe): the C-runtime
      quoting of ``shell_argv``, as ``subprocess`` writes a list.

    cmd.exe and PowerShell have no ``$0 $1 ...``: ARG0 ARG... after CMD are
    refused (``UsageError``) rather than glued into the command text.
    """
    from subprocess import list2cmdline

    flavour = shell_flavour(shell)
    if flavour in ("cmd", "pwsh") and parsed.args:
        raise UsageError(f"{os.path.basename(shell.replace(chr(92), '/'))} takes no arguments "
                         f"after -c CMD ({len(parsed.args)} given); put them into CMD")
    if flavour == "cmd":
        shell_argv(shell, parsed, windows=True)  # refuses -i and set options, as elsewhere
        return f'"{shell}" /d /s /c "{parsed.command}"'
    return list2cmdline(shell_argv(shell, parsed, windows=True))


# -- finding the real shell -----------------------------------------------------

def _is_exe_file(path: str) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return (st.st_mode & 0o170000) == 0o100000 and os.access(path, os.X_OK)


def which(name: str, path_env: str | None) -> str | None:
    """execvp-style search of ``name`` in a PATH string (no shutil: start-up cost)."""
    for d in (path_env or "").split(os.pathsep):
        if not d or not os.path.isabs(d):
            continue  # a relative PATH entry would depend on the command's cwd
        cand = os.path.join(d, name)
        if _is_exe_file(cand):
            return cand
    return None


def _file_marks(path: str) -> bytes:
    """The first and last few KiB of a file (launchers put their script at one end)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return b""
    try:
        head = os.read(fd, _PROBE)
        size = os.fstat(fd).st_size
        if size > 2 * _PROBE:
            os.lseek(fd, size - _PROBE, os.SEEK_SET)
            return head + os.read(fd, _PROBE)
        return head + os.read(fd, _PROBE)
    except OSError:
        return b""
    finally:
        os.close(fd)


class SelfCheck:
    """Is a path tether-shell itself - the same file, a symlink, a hard link or a copy?

    ``self_paths``: paths this process was started through (the console
    script, ``sys.argv[0]``). A candidate is "self" when it resolves to the
    same file, is byte-identical to it, or is a launcher/script that names
    tether's shell module (``tether.shell`` / ``tether-shell``): a copy of the
    console script from another environment, or a wrapper that execs it.
    """

    def __init__(self, self_paths: "Sequence[str]") -> None:
        # One stat each: the same file (a symlink or hard link to it) is the
        # same (device, inode); a copy has the same size. (Every check runs on
        # every command: a stat beats a realpath, which lstats each component.)
        self.paths: list[str] = []
        self._ids: set[tuple[int, int]] = set()
        self._sizes: dict[str, int] = {}
        for p in self_paths:
            try:
                st = os.stat(p) if p else None
            except OSError:
                continue
            if st is not None and (st.st_mode & 0o170000) == 0o100000:
                self.paths.append(p)
                self._ids.add((st.st_dev, st.st_ino))
                self._sizes[p] = st.st_size
        self._bytes: dict[str, bytes] = {}

    def __call__(self, cand: str) -> bool:
        if os.path.basename(cand).lower() in _SELF_NAMES:
            return True
        try:
            st = os.stat(cand)
        except OSError:
            st = None
        if st is not None and (st.st_dev, st.st_ino) in self._ids:
            return True
        marks = _file_marks(cand)
        if any(m in marks for m in _MARKERS):
            return True
        if st is None:
            return False
        for p in self.paths:
            try:
                if self._sizes[p] != st.st_size:
                    continue
                if p not in self._bytes:
                    with open(p, "rb") as f:
                        self._bytes[p] = f.read()
                with open(cand, "rb") as f:
                    if f.read() == self._bytes[p]:
                        return True
            except OSError:
                continue
        return False


def check_tether_shell(value: str, is_self: "Callable[[str], bool]", windows: bool = False) -> str:
    """Validate ``$TETHER_SHELL``: absolute, existing, executable, not tether-shell."""
    if not (os.path.isabs(value) if not windows else _win_isabs(value)):
        raise UsageError(f"TETHER_SHELL must be an absolute path, not {value!r}")
    if not os.path.exists(value):
        raise UsageError(f"TETHER_SHELL={value} does not exist")
    if not windows and not _is_exe_file(value):
        raise UsageError(f"TETHER_SHELL={value} is not an executable file")
    if windows and not os.path.isfile(value):
        raise UsageError(f"TETHER_SHELL={value} is not a file")
    if is_self(value):
        raise UsageError(f"TETHER_SHELL={value} is tether-shell itself; "
                         "point it at a real shell such as /bin/bash")
    return value


def _win_isabs(p: str) -> bool:
    # ntpath.isabs without importing ntpath on POSIX: drive + separator, or UNC.
    return (len(p) >= 3 and p[1] == ":" and p[2] in "\\/") or p.startswith(("\\\\", "//"))


def login_shell() -> str | None:
    """The user's login shell from the password database (not ``$SHELL``: that is us)."""
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_shell or None
    except (ImportError, KeyError, OSError):
        return None


def find_posix_shell(env: "Mapping[str, str]", is_self: "Callable[[str], bool]",
                     login: str | None = None, fallback: str = "/bin/sh") -> str:
    """The documented POSIX search: login shell (if not tether-shell), bash on PATH, /bin/sh."""
    for k in range(3):
        # PATH is searched only when the login shell will not do (a stat per entry).
        c = login if k == 0 else which("bash", env.get("PATH", os.defpath)) if k == 1 else fallback
        if not c or not os.path.isabs(c):
            continue
        if os.path.basename(c) in _NOT_SHELLS or not _is_exe_file(c):
            continue
        if is_self(c):
            continue
        return c
    raise ShellNotFound("no shell found (tried the login shell, bash on PATH, /bin/sh); "
                        "set TETHER_SHELL to an absolute path")


def pwsh_major(path: str) -> int | None:
    """PowerShell's major version from its install, without running it (too slow).

    ``pwsh.deps.json`` next to the binary names the app as ``"pwsh/7.4.1"``;
    else an install folder named ``7``, ``7-preview`` or ``7.4.1`` tells.
    None when neither does.
    """
    d = os.path.dirname(path)
    deps = os.path.join(d, "pwsh.deps.json")
    try:
        with open(deps, "rb") as f:
            data = f.read(1 << 16)
        k = data.find(b'"pwsh/')
        if k >= 0:
            digits = data[k + 6:k + 12].split(b".")[0]
            if digits.isdigit():
                return int(digits)
    except OSError:
        pass
    base = os.path.basename(d.rstrip("\\/").replace("\\", "/").split("/")[-1])
    head = base.split("-")[0].split(".")[0]
    return int(head) if head.isdigit() else None


def find_windows_shell(env: "Mapping[str, str]", is_self: "Callable[[str], bool]",
                       pathsep: str = ";", sep: str = "\\") -> str:
    """The documented Windows SHELL-mode search: pwsh >= 7 on PATH, then
    ``%ProgramFiles%\\PowerShell\\7\\pwsh.exe``.

    ``pathsep``/``sep`` are Windows' own; tests on POSIX pass ``:`` and ``/``
    to run the same search over real files.
    """
    path = _env_get(env, "PATH") or ""
    for d in path.split(pathsep):
        d = d.strip().strip('"')
        if not d:
            continue
        cand = _win_join(d, "pwsh.exe", sep=sep)
        if os.path.isfile(cand) and not is_self(cand):
            major = pwsh_major(cand)
            if major is None or major >= 7:
                return cand
    pf = _env_get(env, "ProgramFiles")
    if pf:
        cand = _win_join(pf, "PowerShell", "7", "pwsh.exe", sep=sep)
        if os.path.isfile(cand) and not is_self(cand):
            return cand
    raise ShellNotFound("no PowerShell 7 found (pwsh.exe on PATH or in "
                        "%ProgramFiles%\\PowerShell\\7); set TETHER_SHELL to a shell's full path")


def comspec_path(env: "Mapping[str, str]") -> str:
    """``%SystemRoot%\\System32\\cmd.exe`` - never ``%COMSPEC%``, which is us."""
    root = _env_get(env, "SystemRoot") or _env_get(env, "windir") or "C:\\Windows"
    return _win_join(root, "System32", "cmd.exe")


def _env_get(env: "Mapping[str, str]", name: str) -> str | None:
    # Windows environment names are case-insensitive.
    if name in env:
        return env[name]
    low = name.lower()
    for k, v in env.items():
        if k.lower() == low:
            return v
    return None


def _win_join(*parts: str, sep: str = "\\") -> str:
    out = parts[0]
    for p in parts[1:]:
        out = out.rstrip("\\/") + sep + p
    return out


def shell_flavour(path: str) -> str:
    """``posix``, ``pwsh`` or ``cmd``: how to pass ``-c CMD`` to this shell."""
    base = path.replace("\\", "/").rsplit("/", 1)[-1].lower()
    if base.endswith(".exe"):
        base = base[:-4]
    if base in ("pwsh", "powershell"):
        return "pwsh"
    if base == "cmd":
        return "cmd"
    return "posix"


def shell_argv(shell: str, parsed: "Parsed", windows: bool = False) -> list[str]:
    """The real shell's argv for a SHELL-mode invocation.

    POSIX shells get ``[shell, -l, -i, OPTIONS..., -c, CMD, ARG0, ...]`` (``-l``,
    ``-i`` and the set options only when asked; ``--`` before a CMD that starts
    with ``-`` or ``+``): argv[0] is the real shell's path, as when a caller runs it
    directly. PowerShell gets ``-Command CMD`` (its ``-Login`` is
    Linux/macOS-only, so dropped on Windows); cmd.exe gets ``/d /c CMD``.
    """
    flavour = shell_flavour(shell)
    posix_only = ("-i",) if parsed.interactive else parsed.options
    if posix_only and flavour != "posix":
        raise UsageError(f"{posix_only[0]} is a POSIX shell's option, and the real shell "
                         f"is {flavour} ({shell})")
    if parsed.mode == INTERACTIVE:
        # The same arguments, unchanged (a POSIX shell reads -i, -l, --login
        # as tether-shell did); PowerShell only understands the login part.
        if flavour == "posix":
            return [shell, *parsed.flags]
        return [shell, "-Login"] if parsed.login and flavour == "pwsh" and not windows else [shell]
    if flavour == "pwsh":
        argv = [shell, "-NoLogo"]
        if parsed.login and not windows:
            argv.insert(1, "-Login")  # must be the first parameter
        return argv + ["-Command", parsed.command, *parsed.args]
    if flavour == "cmd":
        return [shell, "/d", "/c", parsed.command, *parsed.args]
    argv = [shell]
    if parsed.login:
        argv.append("-l")
    if parsed.interactive:
        argv.append("-i")
    # A CMD that looks like an option ("-q", "+x") would be read as one by
    # the real shell, which reads options after -c too: end them first.
    end = ["--"] if parsed.command[:1] in ("-", "+") else []
    return argv + [*parsed.options, "-c", *end, parsed.command, *parsed.args]


#: The names ``tether shell --install DIR`` gives tether-shell: run as
#: ``DIR/bash``, it runs the real ``bash`` found on PATH after DIR.
INSTALL_NAMES = ("bash", "zsh", "sh")


def installed_name(argv0: str) -> "tuple[str, str] | None":
    """``(name, directory)`` when tether-shell was started as an installed
    shell name (``DIR/bash``: one of :data:`INSTALL_NAMES`), else None."""
    name = os.path.basename(argv0)
    if name not in INSTALL_NAMES:
        return None
    return name, os.path.dirname(os.path.abspath(argv0))


def find_after(name: str, directory: str, path_env: str | None,
               is_self: "Callable[[str], bool]") -> str:
    """The real ``name`` on PATH after ``directory`` (all of PATH when it is
    not on it), never tether-shell itself (another install of it included)."""
    dirs = [d for d in (path_env or "").split(os.pathsep) if d and os.path.isabs(d)]
    real = os.path.realpath(directory)
    for k, d in enumerate(dirs):
        if os.path.realpath(d) == real:
            dirs = dirs[k + 1:]
            break
    for d in dirs:
        cand = os.path.join(d, name)
        if _is_exe_file(cand) and not is_self(cand):
            return cand
    raise ShellNotFound(f"no real {name} found on PATH after {directory}; "
                        "put the directory of the real shell after it, or set TETHER_SHELL")


def resolve(parsed: "Parsed", env: "Mapping[str, str]", is_self: "Callable[[str], bool]",
            windows: bool | None = None, login: str | None = None,
            installed: "tuple[str, str] | None" = None) -> str:
    """The program to run for ``parsed``: ``TETHER_SHELL``, else the real
    shell of the installed name (``installed``, see :func:`installed_name`),
    else the documented search.

    COMSPEC mode always runs ``%SystemRoot%\\System32\\cmd.exe``.
    """
    if windows is None:
        windows = sys.platform == "win32"
    if parsed.mode == COMSPEC:
        if not windows:
            raise UsageError("COMSPEC mode (/c CMD) is only available on Windows; "
                             "use -c CMD here")
        return comspec_path(env)
    value = _env_get(env, "TETHER_SHELL") if windows else env.get("TETHER_SHELL")
    if value:
        return check_tether_shell(value, is_self, windows)
    if installed is not None and not windows:
        return find_after(installed[0], installed[1], env.get("PATH", os.defpath), is_self)
    if windows:
        return find_windows_shell(env, is_self)
    return find_posix_shell(env, is_self, login if login is not None else login_shell())
