"""``tether shell --install DIR``: tether-shell under the real shell's name.

Agent CLIs look at the shell's name: OpenCode tells the model the basename of
``$SHELL`` ("Shell: bash"), Codex accepts only login shells whose name it
knows. ``DIR/bash`` (``zsh``, ``sh``) made here is tether-shell started as
``DIR/bash``: a symbolic link to the native tether-shell installed beside
this interpreter (where it was built), else
a launcher of the Python one (``tether.shell.main``). Either runs the real
shell of that name found on PATH after ``DIR``
(``tether._shellargs.find_after``), never itself or another install of it.
Kept out of ``tether.shell``, which every command loads.
"""

import os
import sys

from ._shellargs import INSTALL_NAMES
from .errors import UsageError

__all__ = ["install", "cli"]

from ._constants import EXIT_USAGE  # noqa: E402 - shared with the C side

_LAUNCHER_MARK = "made by `tether shell --install`"


def _native_program() -> "str | None":
    """The native tether-shell pip put beside this interpreter, if it was built."""
    from .keeper import native

    cand = os.path.join(os.path.dirname(sys.executable), "tether-shell")
    return cand if native.is_program(cand) else None


def _ours(target: str) -> bool:
    """Whether ``target`` is what an earlier install made (so it may be
    replaced): a link to a native tether-shell, or a marked launcher."""
    if os.path.islink(target):
        from .keeper import native

        dest = os.path.realpath(target)
        return os.path.basename(dest) == "tether-shell" and native.is_program(dest)
    try:
        with open(target, "rb") as f:
            return _LAUNCHER_MARK.encode() in f.read(4096)
    except OSError:
        return False


def _launcher(name: str) -> str:
    py = sys.executable or "/usr/bin/python3"
    src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where `tether` is
    # The kernel takes the first line as the interpreter only up to 127 bytes
    # and without spaces; else a shell line finds it (one exec more).
    if len(py) < 120 and " " not in py:
        head = f"#!{py}\n"
    else:
        head = "#!/bin/sh\n''''exec \"" + py + "\" \"$0\" \"$@\" # '''\n"
    return (f"{head}# tether-shell as {name!r}, {_LAUNCHER_MARK}: it runs the real {name}\n"
            "# found on PATH after this directory, each command in a tether job.\n"
            "import sys\n\n"
            f"sys.path.insert(0, {src!r})\n"
            "from tether.shell import main  # noqa: E402\n\n"
            "sys.exit(main())\n")


def install(directory: str, names: "tuple[str, ...] | None" = None) -> list[str]:
    """Make ``directory/bash`` (and ``zsh``, ``sh``): launchers of tether-shell
    that run the real shell of that name found on PATH after ``directory``
    (never themselves). With ``PATH=DIR:$PATH SHELL=DIR/bash`` an agent sees
    "bash". Returns the paths made; raises ``UsageError`` (nothing written)
    for a name that is not one of ``INSTALL_NAMES`` or a file in
    the way that is not such a launcher (a real shell is never replaced)."""
    if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory).strip():
        raise UsageError(f"the directory to install into must not be empty or blank: "
                         f"{directory!r}")
    names = tuple(names or INSTALL_NAMES)
    for n in names:
        if n not in INSTALL_NAMES:
            raise UsageError(f"cannot install as {n!r}: choose from {', '.join(INSTALL_NAMES)}")
    d = os.path.abspath(os.path.expanduser(directory))
    for n in names:
        target = os.path.join(d, n)
        if os.path.lexists(target) and not _ours(target):
            raise UsageError(f"{target} exists and is not a tether-shell launcher; "
                             "refusing to replace it (install into an empty directory)")
    os.makedirs(d, mode=0o755, exist_ok=True)
    native = _native_program()
    made = []
    for n in names:
        target = os.path.join(d, n)
        tmp = f"{target}.tmp-{os.getpid()}"
        if native is not None:
            # A link, not a copy: the native program finds the Python one it
            # hands over to beside its own real path.
            os.symlink(native, tmp)
        else:
            with open(tmp, "w") as f:
                f.write(_launcher(n))
            os.chmod(tmp, 0o755)
        os.replace(tmp, target)
        made.append(target)
    return made


def _say(msg: str) -> None:
    print(f"tether shell: {msg}", file=sys.stderr)


def cli(argv: list[str]) -> int:
    """``tether shell --install DIR [NAME...]``: exit 0, or 2 (one line) on bad input."""
    if not argv or argv[0].startswith("-"):
        _say("usage: tether shell --install DIR [bash|zsh|sh ...]")
        return EXIT_USAGE
    try:
        made = install(argv[0], tuple(argv[1:]) or None)
    except UsageError as exc:
        _say(str(exc))
        return EXIT_USAGE
    except OSError as exc:
        _say(f"cannot install into {argv[0]}: {exc.strerror or exc}")
        return EXIT_USAGE
    d = os.path.dirname(made[0])
    print("made " + " ".join(made))
    print(f"use:  PATH={d}:$PATH SHELL={made[0]} your-agent")
    return 0
