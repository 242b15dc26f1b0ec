"""The constants tether's Python and C sides share, defined here once.

``setup.py`` writes them as ``src/tether/_native/tether_constants.h``
(``c_header``) before it compiles ``keeper.c`` and ``shell.c``; the header
is committed too (the sanitizer builds of ``scripts/_sanitized.sh`` compile
the sources directly), and ``tests/test_protocol.py`` fails when it differs
from what this module generates, or when the keeper's hello says otherwise.
No imports (not even __future__: the one-command path loads only what it
needs), so ``setup.py`` runs this file on its own.
"""

#: Seconds between the polite signal and SIGKILL, everywhere tether has a
#: default (the shell wrapper's per-command leftovers use their own 0.5 s).
DEFAULT_GRACE = 2.0
#: The largest grace tether accepts: a typo in a config must not park a stop
#: for days.
MAX_GRACE = 3600.0
#: Seconds tether waits, after SIGKILL, for the killed to be gone.
KILL_BOUND = 5.0
#: The shell wrapper's grace for a command's leftovers (TETHER_SHELL_GRACE unset).
SHELL_GRACE = 0.5
#: The environment variable every process a tether job starts carries.
COOKIE_VAR = "TETHER_JOB"
#: The child cgroup of a job that holds its pin (cgroupfs.PIN_DIR).
PIN_DIR = "tether-pin"
#: The extended attribute on a systemd unit's cgroup that keeps systemctl's
#: answer to "was it started with Delegate=yes" (tether.systemd).
DELEGATION_MEMO = "user.tether.delegate"

#: Exit statuses of tether's front ends (tether-shell, tether run).
EXIT_USAGE = 2
EXIT_GUARD_LOST = 123  # the keeper died and the command's exit status went with it
EXIT_INTERNAL = 125  # tether's own failure
EXIT_NOEXEC = 126
EXIT_NOT_FOUND = 127

#: The audit log (tether.audit): its live file's name, the size at which it
#: rotates by default, and how often the writer prunes old copies (seconds;
#: the lock file's mtime says when it last did). tether-shell's front ends
#: only append to it, and hand a start to tether.audit's writer when the
#: live file is within SHELL_LOG_START_ROOM bytes of its rotation size (more
#: than a start's and an exit's records) or a prune is due.
AUDIT_FILE = "audit.jsonl"
AUDIT_MAX_BYTES = 5 * 2**20
AUDIT_PRUNE_EVERY = 86400
SHELL_LOG_START_ROOM = 2048
#: The job names tether-shell's records carry (a command's job; a caller's).
SHELL_JOB = "tether-shell"
SHELL_SCOPE_JOB = "tether-shell scope=caller"
#: The cgroup of a caller's scope, shared by its commands:
#: ``<base>/tether-<caller pid>-<caller start>/shell-scope``.
SHELL_SCOPE_DIR = "shell-scope"

#: The keeper protocol (docs/protocol.md): its version, said in the hello.
PROTOCOL_VERSION = 1
#: Largest frame body (CBOR bytes after the 4-byte length) a peer may send.
MAX_MSG = 64 * 1024 + 4096
#: Bigger requests travel in a memfd ({"_memfd": size} + the fd).
INLINE_MAX = 64 * 1024
#: Most file descriptors one message may carry (SCM_RIGHTS allows 253).
MAX_FDS = 250

#: name -> value, in the order the header lists them.
SHARED = {name: value for name, value in dict(globals()).items()
          if name.isupper() and not name.startswith("_")}


def c_header() -> str:
    """The C header of SHARED: TETHER_<NAME> for each."""
    lines = ["/* Generated from src/tether/_constants.py by setup.py: do not edit. */",
             "#ifndef TETHER_CONSTANTS_H", "#define TETHER_CONSTANTS_H"]
    for name, value in SHARED.items():
        if isinstance(value, str):
            text = '"' + value + '"'
        elif isinstance(value, float):
            text = repr(value)
        else:
            text = str(value)
        lines.append(f"#define TETHER_{name} {text}")
    # all of them, for a program that lists them (the keeper's hello):
    # X(name, value) with X one of INT, FLOAT, TEXT
    kinds = {str: "TEXT", float: "FLOAT", int: "INT"}
    lines.append("#define TETHER_CONSTANTS(INT, FLOAT, TEXT) \\")
    lines += [f'    {kinds[type(value)]}("{name}", TETHER_{name}) \\' for name, value in SHARED.items()]
    lines += ["", "#endif", ""]
    return "\n".join(lines)
