"""Who a process is, and what is read about it: the process reader.
(Signalling is :mod:`tether.gate`'s, which reads through this.)

A process is its pid **plus** its kernel start time **plus** the boot it
belongs to. A bare pid is not an identity: the kernel hands a reaped pid to
the next process soon after. psutil's ``create_time()`` is not one either on
Linux: it is ``boot_time + ticks / HZ`` where ``boot_time`` is derived from the
wall clock and drifts with NTP, so the same process can read back with a
different float. Here, on Linux, ``start`` is the raw field 22 of
``/proc/PID/stat`` (clock ticks since boot) and ``boot`` is
``/proc/sys/kernel/random/boot_id``; both are exact and stable.

Elsewhere (macOS, BSD, Windows) psutil is used, imported lazily; ``start`` is
psutil's ``create_time`` in integer microseconds (there the kernel keeps a
fixed start timestamp, so it does not drift the way Linux's derivation does).

It is also THE process reader: everything tether reads about processes is
here (stat and status fields, the command line, fds and pidfds, ancestors)
or in a module built on it: :mod:`tether.proctree` (children, descendants),
:mod:`tether.environ` (the environment), :mod:`tether.capture` (the bounded
capture of the table). Those import this one; their names still resolve here,
imported on first use. Mechanisms and features call these; none keeps a copy.

This module is a leaf on hot paths (shell wrapper start-up, contained spawn):
it imports only ``os``, ``sys`` and ``time`` at the top, and ``tether.errors``
(no ``subprocess``, ``threading`` or ``dataclasses``). ``signal`` (which pulls
in ``enum``) and psutil are imported when first needed.
"""

import os
import sys
import time

try:  # the C module itself: `operator` costs ~0.4 ms on a bare interpreter
    from _operator import itemgetter
except ImportError:  # pragma: no cover - other Pythons
    from operator import itemgetter

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~20 ms of import time on a bare interpreter
    from collections.abc import Callable

    from .capture import *  # noqa: F403 - moved out, still found here: see __getattr__
    from .environ import *  # noqa: F403
    from .proctree import *  # noqa: F403

__all__ = [
    "Identity",
    "boot_id",
    "clock_ticks",
    "now_ticks",
    "read",
    "matches",
    "is_alive",
    "status_fields",
    "rlimits",
    "self_status",
    "start_ticks",
    "nspid",
    "cmdline",
    "open_fds",
    "open_pidfd",
    "pidfd_pid",
    "pidfd_targets",
    "HAVE_PIDFD",
    "own_ancestors",
    "is_own_ancestor",
    "exiting",
    "read_stat",
    "parent_pid",
    "reap_exited",
    "COOKIE_VAR",
]

_LINUX = sys.platform.startswith("linux")
#: pidfds (Linux >= 5.3 and Python >= 3.9): signals that cannot reach a reused pid.
HAVE_PIDFD = _LINUX and hasattr(os, "pidfd_open")

# Fields after the ')' that closes comm in /proc/PID/stat, 0-based:
# 0 state, 1 ppid, 2 pgrp, 3 session, ..., 17 num_threads, 19 starttime (field 22
# of proc(5)).
_F_STATE, _F_PPID, _F_PGRP, _F_SID, _F_THREADS, _F_START = 0, 1, 2, 3, 17, 19

# One shared str per state letter instead of a fresh one per process.
_STATES = {s.encode(): s for s in "RSDZTtXxKWPIL"}


class Identity(tuple):
    """A process: ``(pid, start, boot)`` plus what was seen of it.

    A tuple (like a ``NamedTuple``: indexable, unpackable, hashable,
    picklable, ``_replace``/``_asdict``), written by hand because importing
    ``typing`` would cost more than this whole module on a bare interpreter.

    Fields, in order: ``pid``, ``start`` (Linux: clock ticks since boot, field
    22 of ``/proc/PID/stat``; elsewhere: create time in integer microseconds),
    ``boot`` (boot id), ``ppid``, ``pgid``, ``sid``, ``uid`` (real uid from
    :func:`read`; see :func:`tether.capture.capture` for the cheaper uid it records),
    ``state`` (one letter, as in ``/proc``: R S D Z T t X I ...), ``comm``.

    Two identities name the same process when ``pid``, ``start`` and ``boot``
    are equal; the other fields are observations.
    """

    __slots__ = ()
    _fields = ("pid", "start", "boot", "ppid", "pgid", "sid", "uid", "state", "comm")
    # Declared for type checkers; the accessors are set below, one per field.
    pid: int
    start: int
    boot: str
    ppid: int
    pgid: int
    sid: int
    uid: int
    state: str
    comm: str

    def __new__(
        cls,
        pid: int,
        start: int,
        boot: str,
        ppid: int = 0,
        pgid: int = 0,
        sid: int = 0,
        uid: int = -1,
        state: str = "",
        comm: str = "",
    ) -> "Identity":
        return tuple.__new__(cls, (pid, start, boot, ppid, pgid, sid, uid, state, comm))

    def __getnewargs__(self) -> tuple:
        return tuple(self)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in zip(self._fields, self, strict=True))
        return f"Identity({inner})"

    def token(self) -> str:
        """``"{start}@{boot}"``: the start-time token stored in audit records."""
        return f"{self[1]}@{self[2]}"

    def same_process(self, other: "Identity") -> bool:
        """True when both name the same process (pid, start and boot equal)."""
        return self[0] == other[0] and self[1] == other[1] and self[2] == other[2]

    def _replace(self, **changes: object) -> "Identity":
        d = dict(zip(self._fields, self, strict=True))
        d.update(changes)
        return Identity(**d)  # type: ignore[arg-type]

    def _asdict(self) -> dict:
        return dict(zip(self._fields, self, strict=True))

    def to_dict(self) -> dict:
        """A JSON-ready dict with every field."""
        return self._asdict()

    @classmethod
    def from_dict(cls, d: dict) -> "Identity":
        """Inverse of :meth:`to_dict`; unknown keys are ignored, missing
        optional ones take their defaults (older records stay readable)."""
        return cls(
            int(d["pid"]),
            int(d["start"]),
            str(d["boot"]),
            int(d.get("ppid", 0)),
            int(d.get("pgid", 0)),
            int(d.get("sid", 0)),
            int(d.get("uid", -1)),
            str(d.get("state", "")),
            str(d.get("comm", "")),
        )


for _i, _name in enumerate(Identity._fields):
    setattr(Identity, _name, property(itemgetter(_i), doc=f"Field {_i}: ``{_name}``."))
del _i, _name


# --------------------------------------------------------------------------
# Clocks and the boot id

_boot_id: str | None = None
_clk_tck: int | None = None


def boot_id() -> str:
    """This boot's id (Linux: ``/proc/sys/kernel/random/boot_id``; elsewhere
    ``str(int(psutil.boot_time()))``). Cached: it cannot change while we run."""
    global _boot_id
    if _boot_id is None:
        if _LINUX:
            try:
                with open("/proc/sys/kernel/random/boot_id", "rb") as f:
                    _boot_id = f.read().strip().decode("ascii")
            except OSError:
                # No /proc (a bare container): identities still compare
                # within this boot; records of other boots cannot be told apart.
                _boot_id = ""
        else:
            _boot_id = str(int(_psutil().boot_time()))
    return _boot_id


def clock_ticks() -> int:
    """Units of ``Identity.start`` per second: ``SC_CLK_TCK`` on Linux
    (usually 100), 1 000 000 elsewhere (start is in microseconds there).
    Cached. Convert a duration with ``int(seconds * clock_ticks())``."""
    global _clk_tck
    if _clk_tck is None:
        _clk_tck = os.sysconf("SC_CLK_TCK") if _LINUX else 1_000_000
    return _clk_tck


def now_ticks() -> int:
    """Now, in the unit of ``Identity.start``.

    Take it before starting something: every process born afterwards has
    ``start >= now_ticks()``, which makes it a safe ``born_after`` bound.
    Linux: ``CLOCK_BOOTTIME`` in clock ticks, rounded down exactly as the
    kernel rounds a task's ``start_boottime`` for ``/proc/PID/stat`` (both are
    shifted alike inside a time namespace). Elsewhere: wall-clock microseconds,
    minus one so that a process created in the same microsecond still counts.
    """
    if _LINUX:
        return time.clock_gettime_ns(time.CLOCK_BOOTTIME) * clock_ticks() // 1_000_000_000
    return int(time.time() * 1_000_000) - 1


# --------------------------------------------------------------------------
# Reading one process (Linux)


# Out of file descriptors (or memory): an error to say, never "that process is gone".
_EXHAUSTED = (24, 23, 12)  # EMFILE, ENFILE, ENOMEM


def _missing(e: OSError) -> None:
    """Re-raise ``e`` unless it only means "no such process (any more)"."""
    if e.errno in _EXHAUSTED:
        raise e


def _read_fd(fd: int, size: int) -> bytes:
    try:
        return os.read(fd, size)
    finally:
        os.close(fd)


def _stat_fields(pid: int | str, split: int) -> list[bytes]:
    """The fields of /proc/PID/stat after comm (0 is the state), split at most
    ``split`` times; OSError, ValueError when it cannot be read."""
    data = _read_fd(os.open(f"/proc/{pid}/stat", os.O_RDONLY), 1024)
    return data[data.rindex(b")") + 2 :].split(None, split)


def _parse_stat(pid: int, data: bytes, boot: str, uid: int) -> "Identity":
    # comm may hold anything, ") S 1 2 (" included: the real end is the LAST ')'.
    close = data.rindex(b")")
    f = data[close + 2 :].split(None, 20)
    state = f[_F_STATE]
    return Identity(
        pid,
        int(f[_F_START]),
        boot,
        int(f[_F_PPID]),
        int(f[_F_PGRP]),
        int(f[_F_SID]),
        uid,
        _STATES.get(state) or state.decode("ascii", "replace"),
        data[data.index(b"(") + 1 : close].decode("utf-8", "backslashreplace"),
    )


def _stat_linux(pid: int) -> "Identity | None":
    """Only /proc/PID/stat (uid -1): the cheapest look, for matches()."""
    try:
        data = _read_fd(os.open(f"/proc/{pid}/stat", os.O_RDONLY), 1024)
    except OSError as e:  # ENOENT, or ESRCH when it died between open and read
        _missing(e)
        return None
    if not data:
        return None
    return _parse_stat(pid, data, boot_id(), -1)


def read_stat(pid: int) -> "Identity | None":
    """The cheapest look that settles who holds ``pid``: on Linux
    /proc/PID/stat alone (uid -1, not read), elsewhere :func:`read`. The
    gate's look at a process it has pinned."""
    return _stat_linux(pid) if _LINUX else read(pid)


_PF_EXITING = 0x4  # task flag: do_exit has begun (its memory, environ included, is going)


def exiting(pid: int) -> bool:
    """Whether ``pid`` is gone, a zombie, or inside exit (PF_EXITING)."""
    if not _LINUX:
        return read(pid) is None
    try:
        f = _stat_fields(pid, 7)
        return f[_F_STATE] in (b"Z", b"X", b"x") or bool(int(f[6]) & _PF_EXITING)
    except (OSError, ValueError, IndexError):
        return True


def _read_linux(pid: int) -> "Identity | None":
    try:
        sfd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError as e:
        _missing(e)
        return None
    try:
        tfd = os.open(f"/proc/{pid}/status", os.O_RDONLY)
    except OSError as e:
        os.close(sfd)
        _missing(e)
        return None
    # Both fds are open before either is read: an open /proc file pins the
    # process it was opened for (a read after its death fails with ESRCH), and
    # if the stat read succeeds the pid was still that process when status
    # was opened, so both describe one process even if the pid is reused.
    try:
        data = _read_fd(sfd, 1024)
    except OSError:
        os.close(tfd)
        return None
    try:
        status = _read_fd(tfd, 1024)  # Tgid and Uid are in the first ~300 bytes
    except OSError:
        return None
    if not data or not status:
        return None
    uid = -1
    for line in status.split(b"\n"):
        if line.startswith(b"Tgid:"):
            if int(line[5:]) != pid:
                return None  # a thread id, not a process: /proc/TID resolves but is no process
        elif line.startswith(b"Uid:"):
            uid = int(line[4:].split()[0])  # real, effective, saved, fs: take real
            break
    return _parse_stat(pid, data, boot_id(), uid)


# --------------------------------------------------------------------------
# Elsewhere: psutil, lazily

_psutil_mod = None


def _psutil():  # -> the psutil module
    global _psutil_mod
    if _psutil_mod is None:
        import psutil

        _psutil_mod = psutil
    return _psutil_mod


_PSUTIL_STATES = {
    "running": "R",
    "sleeping": "S",
    "disk-sleep": "D",
    "stopped": "T",
    "tracing-stop": "t",
    "zombie": "Z",
    "dead": "X",
    "wake-kill": "K",
    "waking": "W",
    "idle": "I",
    "locked": "L",
    "waiting": "W",
    "parked": "P",
}


def _pg_sid(pid: int) -> tuple[int, int]:
    try:
        pgid = os.getpgid(pid)  # type: ignore[attr-defined]  # absent on Windows
    except (OSError, AttributeError):
        pgid = 0
    try:
        sid = os.getsid(pid)  # type: ignore[attr-defined]
    except (OSError, AttributeError):
        sid = 0
    return pgid, sid


def _from_psutil_info(info: dict, boot: str) -> "Identity":
    pid = info["pid"]
    pgid, sid = _pg_sid(pid)
    uids = info.get("uids")
    return Identity(
        pid,
        int(round((info.get("create_time") or 0.0) * 1_000_000)),
        boot,
        info.get("ppid") or 0,
        pgid,
        sid,
        uids[0] if uids else -1,
        _PSUTIL_STATES.get(info.get("status") or "", "S"),
        info.get("name") or "",
    )


_PS_ATTRS = ["pid", "ppid", "create_time", "uids", "status", "name"]


def _ps_attrs() -> list[str]:
    # "name" is read apart (_ps_name): psutil's Process.name() raises a bare
    # OSError (WinError 87) under Wine, which as_dict/process_iter pass on.
    return [a for a in _PS_ATTRS if a != "name" and (a != "uids" or hasattr(os, "getuid"))]


def _ps_name(p) -> str:  # p: a psutil.Process
    try:
        return p.name() or ""
    except Exception:  # the name is a label, never a reason to drop the identity
        return ""


def _read_psutil(pid: int) -> "Identity | None":
    ps = _psutil()
    try:
        p = ps.Process(pid)
        info = p.as_dict(_ps_attrs())
        info["name"] = _ps_name(p)
    except (ps.Error, OSError):
        return None
    if info.get("create_time") is None:
        return None  # as_dict swallowed an AccessDenied: no identity without a start
    return _from_psutil_info(info, boot_id())


# --------------------------------------------------------------------------
# Public one-process API


def read(pid: int) -> "Identity | None":
    """The identity of process ``pid`` now, or None if there is none.

    Linux: one read of ``/proc/PID/stat`` and one of ``/proc/PID/status`` (for
    the real uid, and to tell a thread id from a process). A thread id gives
    None: tether identifies processes, not threads.
    """
    if type(pid) is not int or pid <= 0:
        return None
    return _read_linux(pid) if _LINUX else _read_psutil(pid)


_own: "tuple[int, Identity] | None" = None  # (pid, this process as read then)


def own() -> "Identity | None":
    """This process's identity as :func:`read` gave it the first time this
    pid asked: for its pid, start and boot (``token()``), which never change
    while it runs (a fork's child has a pid of its own and reads again).
    Its other fields (group, session, state, name) are as of that read:
    :func:`read` ``os.getpid()`` for them now. A read of our own status
    costs ~20 us, and each job's opening and each audit record needs this."""
    global _own
    pid = os.getpid()
    cached = _own
    if cached is not None and cached[0] == pid:
        return cached[1]
    me = read(pid)
    if me is not None:
        _own = (pid, me)
    return me


def matches(ident: "Identity") -> bool:
    """Whether the very process ``ident`` names still exists (same pid, start
    and boot). A zombie still exists here; see :func:`is_alive`."""
    if ident[2] != boot_id():
        return False
    cur = _stat_linux(ident[0]) if _LINUX else read(ident[0])
    return cur is not None and cur[1] == ident[1]


def group_has_members(pgid: int) -> bool:
    """Whether process group ``pgid`` has a member now: the kernel's own
    answer (``killpg`` with signal 0 sends nothing; EPERM means a member of
    another user's exists). Never true for pgid <= 1."""
    if pgid <= 1:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def is_alive(ident: "Identity") -> bool:
    """:func:`matches` and not a zombie (or dead): a zombie counts as dead,
    because orphan reaping by PID 1 can lag by seconds."""
    if ident[2] != boot_id():
        return False
    cur = _stat_linux(ident[0]) if _LINUX else read(ident[0])
    return cur is not None and cur[1] == ident[1] and cur[7] not in ("Z", "X", "x")


def pidfd_pid(fd: int) -> int | None:
    """The pid that pidfd ``fd`` refers to, as this process sees it (the
    ``Pid:`` line of ``/proc/self/fdinfo/FD``); None once that process has
    exited (the kernel shows -1), when it is outside our PID namespace (0),
    or where this cannot be read (not Linux, not a pidfd)."""
    if not _LINUX:
        return None
    try:
        data = _read_fd(os.open(f"/proc/self/fdinfo/{fd}", os.O_RDONLY), 4096)
    except OSError:
        return None
    for line in data.split(b"\n"):
        if line.startswith(b"Pid:"):
            pid = int(line[4:])
            return pid if pid > 0 else None
    return None


def open_pidfd(pid: int) -> int | None:
    """A pidfd of ``pid`` (close-on-exec), or None: gone, a thread id, or no
    pidfd here. It pins whichever process holds ``pid`` at this instant."""
    if not HAVE_PIDFD or type(pid) is not int or pid <= 0:
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def status_fields(pid: int | str, *names: bytes) -> dict[bytes, bytes]:
    """The named lines of ``/proc/PID/status`` (``b"Threads"``, ``b"SigIgn"``,
    ``b"NSpid"``...) as raw values; missing ones are absent. {} where the file
    cannot be read (gone, not Linux)."""
    out: dict[bytes, bytes] = {}
    try:
        data = b"\n" + _read_fd(os.open(f"/proc/{pid}/status", os.O_RDONLY), 8192)
    except OSError:
        return out
    for name in names:  # a few finds beat splitting ~55 lines (the wrapper's hot path)
        i = data.find(b"\n" + name + b":")
        if i >= 0:
            j = data.find(b"\n", i + 1)
            out[name] = data[i + len(name) + 2 : j if j >= 0 else len(data)].strip()
    return out


def self_status() -> tuple[int, int, int]:
    """``(threads, ignored-signal mask, blocked-signal mask)`` of this
    process from one read of its status; raises OSError or ValueError where
    that cannot be read (a fork is then not known to be safe)."""
    f = status_fields("self", b"Threads", b"SigIgn", b"SigBlk")
    if b"Threads" not in f:
        raise OSError("/proc/self/status is not readable")
    return int(f[b"Threads"]), int(f.get(b"SigIgn", b"0"), 16), int(f.get(b"SigBlk", b"0"), 16)


_RLIMIT_RESOURCES: "tuple[int, ...] | None" = None


def rlimit_resources() -> "tuple[int, ...]":
    """The ``RLIMIT_*`` resources this Python knows, in order (read once)."""
    global _RLIMIT_RESOURCES
    if _RLIMIT_RESOURCES is None:
        import resource

        _RLIMIT_RESOURCES = tuple(sorted({getattr(resource, n) for n in dir(resource)
                                          if n.startswith("RLIMIT_")}))
    return _RLIMIT_RESOURCES


def rlimits(pid: int | str) -> list[tuple[int, int, int]]:
    """``(resource, soft, hard)`` for each of ``pid``'s resource limits, from
    ``/proc/PID/limits`` (0444: readable where ``prlimit`` is not, from a PID
    namespace that cannot name the process); ``resource.RLIM_INFINITY`` for
    unlimited. One line per resource in RLIMIT_* order after a header, the
    name in a 25-character column. Raises OSError (ValueError for a file not
    in that form)."""
    import resource

    known = rlimit_resources()
    with open(f"/proc/{pid}/limits", "rb") as f:
        lines = f.read().split(b"\n")[1:]
    out = []
    for res in known:
        fields = lines[res][26:].split() if res < len(lines) else []
        if len(fields) < 2:
            raise ValueError(f"/proc/{pid}/limits: no line for resource {res}")
        soft, hard = (resource.RLIM_INFINITY if v == b"unlimited" else int(v) for v in fields[:2])
        out.append((res, soft, hard))
    return out


def mask_signals(mask: int) -> list[int]:
    """The signal numbers set in a ``SigIgn``/``SigBlk`` mask."""
    out = []
    while mask:  # one step per set bit, not 64
        low = mask & -mask
        out.append(low.bit_length())
        mask ^= low
    return [n for n in out if n <= 64]


def start_ticks(pid: int | str = "self") -> int | None:
    """Kernel start ticks of ``pid`` (field 22 of its stat), or None."""
    try:
        return int(_stat_fields(pid, 20)[_F_START])
    except (OSError, ValueError, IndexError):
        return None


def nspid(pid: int) -> list[int]:
    """``NSpid`` of ``pid``: its pid in each PID namespace from ours inward
    (one entry when it is in ours only); [] where unknown."""
    raw = status_fields(pid, b"NSpid").get(b"NSpid")
    try:
        return [int(x) for x in raw.split()] if raw else []
    except ValueError:
        return []


def cmdline(pid: int, limit: int = 4096) -> str:
    """The command line of ``pid`` as one printable line (arguments joined by
    spaces, control characters blanked, at most ``limit`` bytes read); "" when
    it cannot be read. Never stored by tether unless a caller opts in."""
    if not _LINUX:
        return ""
    try:
        data = _read_fd(os.open(f"/proc/{pid}/cmdline", os.O_RDONLY), limit)
    except OSError:
        return ""
    text = data.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "backslashreplace")
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())


def argv(pid: int, limit: int = 65536) -> list[str]:
    """The arguments of ``pid`` as the kernel holds them (at most ``limit``
    bytes read; undecodable bytes escaped); [] when they cannot be read."""
    if not _LINUX:
        return []
    try:
        data = _read_fd(os.open(f"/proc/{pid}/cmdline", os.O_RDONLY), limit)
    except OSError:
        return []
    return [a.decode("utf-8", "surrogateescape") for a in data.split(b"\0")[:-1]] \
        if data.endswith(b"\0") else [a.decode("utf-8", "surrogateescape")
                                       for a in data.split(b"\0")]


def open_fds(pid: int | str = "self") -> list[int] | None:
    """The fd numbers ``pid`` has open, or None where that cannot be listed."""
    try:
        return [int(n) for n in os.listdir(f"/proc/{pid}/fd")]
    except (OSError, ValueError):
        return None


def pidfd_targets(pid: int) -> list[int]:
    """Pids that process ``pid`` holds pidfds for (its fdinfo ``Pid:`` lines,
    in our PID namespace's numbering); [] where we may not look."""
    out: list[int] = []
    for fd in open_fds(pid) or ():
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:[pidfd]":
                continue
            data = _read_fd(os.open(f"/proc/{pid}/fdinfo/{fd}", os.O_RDONLY), 4096)
        except OSError:
            continue
        for line in data.split(b"\n"):
            if line.startswith(b"Pid:"):
                try:
                    target = int(line[4:])
                except ValueError:
                    break
                if target > 0:
                    out.append(target)
                break
    return out


def _ppid_of(pid: int) -> int:
    if _LINUX:
        cur = _stat_linux(pid)
        return cur[3] if cur is not None else 0
    cur = read(pid)
    return cur[3] if cur is not None else 0


def parent_pid() -> int:
    """This process's parent pid: ``os.getppid()``, except on Windows, where
    CPython 3.12+ asks ``PssCaptureSnapshot`` - missing under Wine, where the
    call aborts the whole process - so the creator's pid is read with one
    ``NtQueryInformationProcess`` instead (0 when none is known)."""
    if sys.platform != "win32":
        return os.getppid()
    from tether.platform._winapi import parent_pid as _win_parent_pid

    try:
        return _win_parent_pid()
    except OSError:
        return 0


def own_ancestors() -> frozenset[int]:
    """This process, every ancestor up to PID 1 (as far as this PID namespace
    shows them), and 0 and 1 always. Read fresh each call: ancestors change
    when a parent dies and we are reparented."""
    me = os.getpid()
    out = {0, 1, me}
    pid = parent_pid()
    # Bounded in case /proc shows a ppid loop mid-reparenting.
    for _ in range(4096):
        if pid in out:
            break
        out.add(pid)
        pid = _ppid_of(pid)
    return frozenset(out)


_anc_cache: tuple[int, frozenset[int]] = (-1, frozenset())


def is_own_ancestor(pid: int) -> bool:
    """``pid in own_ancestors()``, cheap on repeat (kill loops ask per process).

    The set of ancestors can only shrink while we run -- a process is
    reparented to an existing ancestor (subreaper or init), never to a new
    one -- so a pid outside the cached set is not an ancestor now. A pid inside
    it may be a dead ancestor's pid reused, so that case is re-read fresh.
    Keyed by our pid: a forked child has other ancestors.
    """
    global _anc_cache
    me = os.getpid()
    if _anc_cache[0] != me:
        _anc_cache = (me, own_ancestors())
    if pid not in _anc_cache[1]:
        return False
    fresh = own_ancestors()
    _anc_cache = (me, fresh)
    return pid in fresh


# --------------------------------------------------------------------------
# The job's cookie, and the processes that exit, reaped

#: The environment variable every process a tether job starts carries, first
#: in its environment: ``TETHER_JOB=<the job's cookie>``. A ``Job`` can name
#: it otherwise (``Job(cookie_var=...)``); the audit records the name.
from ._constants import COOKIE_VAR  # noqa: E402 - shared with the C side


def reap_exited(on_reaped: "Callable[[int, int], object] | None" = None, *, wait: bool = False) -> bool:
    """Reap every child of this process that has exited, calling
    ``on_reaped(pid, status)`` for each; False once there is no child left
    (ECHILD), True while some still run. ``wait``: block until none is left
    (always False). The one reap loop: the Python keeper, the warden and
    ``tether init`` call it."""
    flags = 0 if wait else os.WNOHANG
    while True:
        try:
            pid, status = os.waitpid(-1, flags)
        except ChildProcessError:
            return False
        except InterruptedError:
            continue
        if pid == 0:
            return True
        if on_reaped is not None:
            on_reaped(pid, status)


# Moved to modules of their own that import this one (an import of them here
# would be a cycle): still found here, imported on first use, then bound.
_MOVED = {**dict.fromkeys(("Capture", "capture", "captured_at", "_ENTRY_BYTES"), "capture"),
          **dict.fromkeys(("environ_has", "environ_empty", "environ_value", "carriers"), "environ"),
          **dict.fromkeys(("children", "newest_pids", "last_pid", "pids_since", "proc_is_ours",
                           "pids", "has_children_lists", "sessions", "session_of", "in_group",
                           "descendant_pids", "descendants"), "proctree")}


def __getattr__(name: str) -> object:
    home = _MOVED.get(name)
    if home is not None:
        __import__("tether." + home)  # (importlib itself is not loaded at start-up)
        value = getattr(sys.modules["tether." + home], name)
        globals()[name] = value  # later lookups: a plain attribute read
        return value
    # The signal gate lived here before tether.gate: its names still resolve.
    if name in ("Proof", "send_signal", "signal_child"):
        from tether import gate

        return getattr(gate, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
