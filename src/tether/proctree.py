"""The live process tree and the pids in use, as the kernel lists them now:
the children of a task, walks of descendants by those lists, the listing of
``/proc``, the pids handed out last, and sessions and groups asked by
syscall.

Nothing here is a snapshot (that is :class:`tether.capture.Capture`): each
call asks the kernel at that moment, so its cost follows the subtree walked
or the pids asked, not the machine - what a kill loop and
:mod:`tether.sparse_capture` want. None of it is atomic: a loop that kills
looks again.

Built on :mod:`tether.identity` (what a process is, our ancestors); identity
does not import this module, so there is no cycle (``identity.children`` and
the others still resolve, lazily). Like identity, it imports only ``os`` at
the top; psutil (where there is no ``/proc``) is imported when first needed.
"""

import os

from . import identity
from .identity import _missing, _psutil, _read_fd, _stat_linux, own_ancestors, read

__all__ = [
    "children",
    "newest_pids",
    "last_pid",
    "pids_since",
    "proc_is_ours",
    "pids",
    "has_children_lists",
    "sessions",
    "session_of",
    "in_group",
    "descendant_pids",
    "descendants",
]

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~20 ms of import time on a bare interpreter
    from collections.abc import Iterable

    from .identity import Identity


def children(pid: int, *, every_thread: bool = True) -> list[int]:
    """Direct children of ``pid`` (of all its threads: a child belongs to the
    thread that forked it); [] if ``pid`` is gone. Not atomic: a loop that
    kills must rescan. ``every_thread=False``: its main thread's only (one
    file, not a directory and a file per thread), for a kill loop, to which
    a dead process's other children come anyway (Linux; elsewhere all)."""
    if type(pid) is not int or pid <= 0:
        return []
    if not identity._LINUX:
        ps = _psutil()
        try:
            return [c.pid for c in ps.Process(pid).children()]
        except ps.Error:
            return []
    base = f"/proc/{pid}/task"
    if every_thread:
        try:
            tids = os.listdir(base)
        except OSError as e:
            _missing(e)
            return []
    else:
        tids = [str(pid)]
    out: list[int] = []
    seen: set[int] = set()
    for tid in tids:
        try:
            fd = os.open(f"{base}/{tid}/children", os.O_RDONLY)
        except OSError as e:
            _missing(e)
            continue  # the thread exited meanwhile
        chunks = []
        try:
            while True:  # a subreaper can have tens of thousands: read to EOF
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                chunks.append(chunk)
        except OSError:
            continue
        finally:
            os.close(fd)
        data = b"".join(chunks)
        for tok in data.split():
            c = int(tok)
            if c not in seen:
                seen.add(c)
                out.append(c)
    return out


def newest_pids(span: int = 64) -> list[int]:
    """The ``span`` pids the kernel handed out last, newest first (from the
    last-pid field of /proc/loadavg, wrapping at pid_max); [] elsewhere. A
    pid-hopper lives a millisecond at a pid: a scan of the whole table never
    reaches it in time, a look at the newest pids does."""
    last, pid_max = last_pid()
    if last <= 0:
        return []
    out = []
    for back in range(span):
        p = last - back
        if p <= 1:
            p += pid_max - 300  # wrapped: the kernel reuses from 300 on
        out.append(p)
    return out


def last_pid() -> tuple[int, int]:
    """(the pid the kernel handed out last in this PID namespace, pid_max),
    from /proc/loadavg; (0, 0) where it cannot be read. Unchanged between two
    looks: no process was created in between."""
    if not identity._LINUX:
        return 0, 0
    try:
        last = int(_read_fd(os.open("/proc/loadavg", os.O_RDONLY), 256).split()[-1])
        pid_max = int(_read_fd(os.open("/proc/sys/kernel/pid_max", os.O_RDONLY), 64))
    except (OSError, ValueError, IndexError):
        return 0, 0
    return last, pid_max


def pids_since(last: int, now: int, pid_max: int, cap: int = 4096) -> list[int] | None:
    """The pids handed out after ``last`` up to ``now`` (wrapping at
    ``pid_max``; the kernel reuses from 300 on), oldest first; None when more
    than ``cap`` (then read the whole table instead)."""
    if now == last:
        return []
    if now > last:
        n = now - last
        return list(range(last + 1, now + 1)) if n <= cap else None
    n = (pid_max - last - 1) + (now - 300 + 1)
    if n > cap or pid_max <= 0:
        return None
    return list(range(last + 1, pid_max)) + list(range(300, now + 1))


def proc_is_ours() -> bool:
    """Whether the mounted /proc is this PID namespace's (``/proc/self`` names
    this process): in a new PID namespace with the host's /proc it does not,
    and then no pid read from it is ours to name."""
    try:
        return os.readlink("/proc/self") == str(os.getpid())
    except OSError:
        return False


def pids() -> set[int] | None:
    """Every pid now (a listing of /proc, nothing read), or None where there
    is no /proc: for dropping records of processes that are gone for good."""
    if not identity._LINUX:
        return None
    try:
        return {int(n) for n in os.listdir("/proc") if n.isdigit()}
    except OSError:
        return None


_HAS_CHILDREN_LISTS: bool | None = None


def has_children_lists() -> bool:
    """Whether this kernel keeps /proc/PID/task/TID/children
    (``CONFIG_PROC_CHILDREN``), which :func:`children` reads."""
    global _HAS_CHILDREN_LISTS
    if _HAS_CHILDREN_LISTS is None:
        me = os.getpid()
        _HAS_CHILDREN_LISTS = identity._LINUX and os.path.exists(f"/proc/{me}/task/{me}/children")
    return _HAS_CHILDREN_LISTS


def sessions(pids: "Iterable[int]") -> dict[int, list[int]]:
    """Session id -> the ``pids`` in it, by one ``getsid`` each (no file is
    opened); a pid gone meanwhile is left out."""
    out: dict[int, list[int]] = {}
    for pid in pids:
        try:
            out.setdefault(os.getsid(pid), []).append(pid)
        except OSError:
            continue
    return out


def session_of(pid: int) -> int | None:
    """``pid``'s session id, or None once it is gone."""
    try:
        return os.getsid(pid)
    except OSError:
        return None


def in_group(pgid: int, pids: "Iterable[int]") -> list[int]:
    """Those of ``pids`` in process group ``pgid``, by one ``getpgid`` each."""
    out = []
    for pid in pids:
        try:
            if os.getpgid(pid) == pgid:
                out.append(pid)
        except OSError:
            continue
    return out


def descendant_pids(root: int, limit: int = 100_000) -> list[int]:
    """Every descendant of ``root`` by the kernel's children lists, depth
    first, without reading any of them (the kill loop's fast walk). Not
    atomic, and a pid seen here may be reaped and reused at once: use it only
    below a process whose subtree cannot leave it (a subreaper, a PID
    namespace's init), or read identities with :func:`descendants`."""
    out: list[int] = []
    stack = children(root)
    seen = {root}
    while stack and len(out) < limit:
        pid = stack.pop()
        if pid in seen or pid <= 1:
            continue
        seen.add(pid)
        out.append(pid)
        stack.extend(children(pid))
    return out


def descendants(roots: "Iterable[int]", *, born_after: int | None = None,
                limit: int = 100_000, stable: bool = False) -> "list[Identity]":
    """Live-read identities of every descendant of ``roots`` (roots left out).

    Walks the kernel's children lists, so its cost follows the subtree, not
    the machine. Each process is read once; a child born before its parent
    (or, with ``born_after``, before that tick) is a reused pid and is
    neither listed nor walked through. PID <= 2, this process and its
    ancestors are never listed. ``stable``: the lists are not atomic (a fork
    during the walk can be missed), so walk again until two walks agree
    (at most 8 times).
    """
    roots = [r for r in roots if type(r) is int and r > 0]
    excluded = own_ancestors() | {2, os.getpid()}
    floor = -1 if born_after is None else born_after
    found: dict[int, Identity] = {}
    for _ in range(8 if stable else 1):
        before = len(found)
        stack: list[tuple[int, int]] = []
        for r in roots:
            ri = _stat_linux(r) if identity._LINUX else read(r)
            stack.append((r, ri[1] if ri is not None else -1))
        seen = set(roots)
        while stack and len(found) < limit:
            parent, pstart = stack.pop()
            for c in children(parent):
                if c in seen:
                    continue
                seen.add(c)
                if c <= 2 or c in excluded:
                    continue  # a reused pid of ours: never listed nor walked through
                ident = found.get(c) or read(c)
                if ident is None or ident[1] < pstart or ident[1] < floor:
                    continue
                found[c] = ident
                stack.append((c, ident[1]))
        if len(found) == before and _ > 0:
            break
    return list(found.values())
