"""The bounded capture of the process table: one snapshot of every process
(or of every one born after a point), and the safe walks over it.

Finding a job's processes from outside - by parentage, session, process
group - asks about many processes at once. A :class:`Capture` reads each
process once, within a time cap and a memory cap (``complete`` and
``reason`` say when a cap cut it short), and its walks never list PID <= 2,
this process or its ancestors: a walk by session or group could otherwise
reach the whole machine. :mod:`tether.sparse_capture` subclasses it to read
only what a walk reaches; both read a process through :func:`captured_at`.

What a process *is* (:class:`~tether.identity.Identity`, the boot id, our
ancestors, psutil) is :mod:`tether.identity`'s; this module builds on it and
it does not import this one, so there is no cycle (``identity.capture`` and
``identity.Capture`` still resolve, lazily). Like identity, it imports only
``os`` and ``time`` at the top; psutil is imported when first needed.
"""

import os
import time

from . import identity
from .identity import (
    _F_PGRP,
    _F_PPID,
    _F_SID,
    _F_START,
    _F_STATE,
    _F_THREADS,
    _STATES,
    Identity,
    _from_psutil_info,
    _ps_attrs,
    _ps_name,
    _psutil,
    boot_id,
    own_ancestors,
)

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~20 ms of import time on a bare interpreter
    from collections.abc import Iterable

__all__ = ["Capture", "capture", "captured_at"]

# Rough bytes one captured entry costs (Identity tuple, its ints and comm str,
# the dict slot). Measured with tracemalloc at ~260 bytes; rounded up.
_ENTRY_BYTES = 400


class Capture:
    """One snapshot of the process table, and safe walks over it.

    Every listing (``children_of``, ``descendants``, ``by_session``,
    ``by_pgid``) leaves out PID <= 2, this process and each of its ancestors
    (read when the listing is made), because a walk by ppid, session or
    group can otherwise reach the whole machine: PID 1's session is 0, and
    seen through a PID namespace a session id can read as 0 too.
    """

    __slots__ = ("procs", "complete", "reason", "elapsed", "born_after", "_kids")

    def __init__(
        self,
        procs: "dict[int, Identity]",
        complete: bool = True,
        reason: str = "",
        elapsed: float = 0.0,
        born_after: int | None = None,
    ) -> None:
        self.procs = procs
        self.complete = complete
        self.reason = reason
        self.elapsed = elapsed
        self.born_after = born_after  # the filter applied while reading, if any
        self._kids: dict[int, list[Identity]] | None = None

    def __repr__(self) -> str:
        how = "complete" if self.complete else f"incomplete: {self.reason}"
        return f"<Capture {len(self.procs)} processes, {self.elapsed * 1e3:.1f} ms, {how}>"

    def __len__(self) -> int:
        return len(self.procs)

    def __contains__(self, pid: object) -> bool:
        return pid in self.procs

    def get(self, pid: int) -> "Identity | None":
        return self.procs.get(pid)

    def _children_map(self) -> "dict[int, list[Identity]]":
        if self._kids is None:
            kids: dict[int, list[Identity]] = {}
            for p in self.procs.values():
                lst = kids.get(p[3])
                if lst is None:
                    kids[p[3]] = [p]
                else:
                    lst.append(p)
            self._kids = kids
        return self._kids

    @staticmethod
    def _excluded() -> frozenset[int]:
        return own_ancestors() | {2, os.getpid()}

    def _kids_of(self, pid: int) -> "Iterable[Identity]":
        """Captured processes whose ppid is ``pid``, unfiltered: what every
        walk below asks (a sparse capture reads the kernel's list here)."""
        return self._children_map().get(pid, ())

    def children_of(self, pid: int) -> "list[Identity]":
        """Captured processes whose ppid is ``pid`` (safety exclusions apply)."""
        return self.adopted((pid,))

    def adopted(self, adopters: "Iterable[int]") -> "list[Identity]":
        """Captured processes whose parent is one of ``adopters`` (safety
        exclusions apply): the orphans init, a subreaper or a keeper holds."""
        excl = self._excluded()
        out: dict[int, Identity] = {}
        for a in set(adopters):
            out.update((c[0], c) for c in self._kids_of(a) if c[0] > 2 and c[0] not in excl)
        return list(out.values())

    def descendants(self, roots: "Iterable[int]", born_after: int | None = None) -> "list[Identity]":
        """Every captured process below ``roots`` by ppid, breadth first.

        The roots themselves are not listed (but are walked, even this
        process: a subreaper keeper lists its own descendants). With
        ``born_after``, only processes with ``start >= born_after`` are
        listed or walked through (a child is never older than its parent).
        Excluded processes (PID <= 2, this process, its ancestors) are
        neither listed nor walked through.
        """
        excl = self._excluded()
        queue = [r for r in roots]
        seen = set(queue)
        out: list[Identity] = []
        i = 0
        while i < len(queue):
            parent = queue[i]
            i += 1
            for c in self._kids_of(parent):
                pid = c[0]
                if pid in seen:
                    continue  # a torn snapshot can show a ppid loop
                seen.add(pid)
                if pid <= 2 or pid in excl:
                    continue
                if born_after is not None and c[1] < born_after:
                    continue
                out.append(c)
                queue.append(pid)
        return out

    def _by(self, index: int, value: int, born_after: int, what: str) -> "list[Identity]":
        if born_after is None:
            raise TypeError(f"{what}: born_after is required (a walk by {what} must be bounded)")
        if value <= 1:
            return []  # 0: PID 1's session/group, or a pid from outside our namespace
        excl = self._excluded()
        return [
            p
            for p in self._with(index, value)
            if p[index] == value and p[1] >= born_after and p[0] > 2 and p[0] not in excl
        ]

    def _with(self, index: int, value: int) -> "Iterable[Identity]":
        """The processes that may have field ``index`` (5: session, 4: group)
        equal to ``value``, unfiltered (a sparse capture asks the kernel)."""
        return self.procs.values()

    def by_session(self, sid: int, born_after: int) -> "list[Identity]":
        """Captured processes of session ``sid`` born at or after ``born_after``
        (safety exclusions apply; ``sid <= 1`` gives [])."""
        return self._by(5, sid, born_after, "session")

    def by_pgid(self, pgid: int, born_after: int) -> "list[Identity]":
        """Captured processes of process group ``pgid`` born at or after
        ``born_after`` (safety exclusions apply; ``pgid <= 1`` gives [])."""
        return self._by(4, pgid, born_after, "process group")


def captured_at(pfd: int | None, name: str, boot: str, floor: int, *,
                _open=os.open, _read=os.read, _fstat=os.fstat, _close=os.close,
                _rdonly=os.O_RDONLY, _new=tuple.__new__,
                _states=_STATES) -> "tuple[Identity, int] | None":
    """Process ``name`` (its pid, as text) as a capture records it, read
    relative to ``pfd`` (an open ``/proc``: no path walk from / per
    process; None: by its path), and its number of threads; None if it is
    gone or was born before ``floor``. The uid is the owner of /proc/PID - the
    effective uid (0 when it is not dumpable): a cheap fstat instead of
    parsing the much costlier /proc/PID/status for the real uid. The thread count tells a
    sparse capture whether a process's children are on one list or several.
    Every capture reads through here, thousands of calls: kept lean. The
    parse is inlined rather than a call of :func:`_parse_stat`, the Identity
    built by tuple.__new__ without a Python call, and the os functions bound
    as defaults (locals: no global and attribute lookups per call); each of
    these cost a full capture a few per cent."""
    try:
        fd = _open(name + "/stat", _rdonly, dir_fd=pfd) if pfd is not None \
            else _open(f"/proc/{name}/stat", _rdonly)
        try:
            data = _read(fd, 1024)
            uid = _fstat(fd).st_uid
        finally:
            _close(fd)
    except OSError:
        return None  # it exited while we looked
    if not data:
        return None
    rp = data.rindex(b")")  # comm may contain ") ": the LAST ')' ends it
    f = data[rp + 2 :].split(None, 20)
    start = int(f[_F_START])
    if start < floor:
        return None
    st = f[_F_STATE]
    return _new(Identity, (
        int(name), start, boot, int(f[_F_PPID]), int(f[_F_PGRP]), int(f[_F_SID]), uid,
        _states.get(st) or st.decode("ascii", "replace"),
        data[data.index(b"(") + 1 : rp].decode("utf-8", "backslashreplace"),
    )), int(f[_F_THREADS])


def _capture_linux(time_cap: float, mem_cap: int, born_after: int | None) -> "Capture":
    clock = time.monotonic
    t0 = clock()
    deadline = t0 + time_cap
    max_entries = mem_cap // _ENTRY_BYTES
    boot = boot_id()
    procs: dict[int, Identity] = {}
    complete, reason = True, ""
    read = captured_at
    floor = -1 if born_after is None else born_after
    n = 0
    pfd = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
    try:
        with os.scandir(pfd) as it:  # streamed: never a full listing in memory
            for entry in it:
                name = entry.name
                if not name[0].isdigit():
                    continue
                n += 1
                # the clock on the 1st process and every 16th after: cheap
                if (n & 15) == 1 and clock() > deadline:
                    complete = False
                    reason = f"time cap {time_cap:g} s reached after {n - 1} processes"
                    break
                if len(procs) >= max_entries:
                    complete = False
                    reason = (
                        f"memory cap {mem_cap / 2**20:g} MiB reached after {len(procs)} processes"
                    )
                    break
                got = read(pfd, name, boot, floor)
                if got is not None:
                    procs[got[0][0]] = got[0]
    finally:
        os.close(pfd)
    return Capture(procs, complete, reason, clock() - t0, born_after)


def _capture_psutil(time_cap: float, mem_cap: int, born_after: int | None) -> "Capture":
    ps = _psutil()
    clock = time.monotonic
    t0 = clock()
    deadline = t0 + time_cap
    max_entries = mem_cap // _ENTRY_BYTES
    boot = boot_id()
    procs: dict[int, Identity] = {}
    complete, reason = True, ""
    attrs = _ps_attrs()
    n = 0
    for p in ps.process_iter(attrs):
        if clock() > deadline:
            complete = False
            reason = f"time cap {time_cap:g} s reached after {n} processes"
            break
        n += 1
        if len(procs) >= max_entries:
            complete = False
            reason = f"memory cap {mem_cap / 2**20:g} MiB reached after {len(procs)} processes"
            break
        info = p.info
        if info.get("create_time") is None:
            continue  # access denied or gone: no identity without a start time
        info["name"] = _ps_name(p)
        ident = _from_psutil_info(info, boot)
        if born_after is not None and ident[1] < born_after:
            continue
        procs[ident[0]] = ident
    return Capture(procs, complete, reason, clock() - t0, born_after)


def capture(
    *, time_cap: float = 1.0, mem_cap: int = 32 * 2**20, born_after: int | None = None
) -> "Capture":
    """One bounded capture of the process table.

    Records pid, ppid, pgid, sid, uid, start, state and comm of every process
    (with ``born_after``: of every process with ``start >= born_after``).
    Stops early, with ``complete=False`` and a ``reason``, when ``time_cap``
    seconds have passed or the estimated memory reaches ``mem_cap`` bytes.
    Processes that exit while being read are skipped.

    Linux reads ``/proc`` directly (several times cheaper than psutil). The
    ``uid`` recorded there is the owner of ``/proc/PID`` -- the effective uid,
    or 0 for a non-dumpable process -- not the real uid
    :func:`tether.identity.read` gives; :func:`send_signal` re-reads the real
    uid itself. Elsewhere psutil.
    """
    if identity._LINUX:  # identity's switch (a test turns it off: the psutil path)
        return _capture_linux(time_cap, mem_cap, born_after)
    return _capture_psutil(time_cap, mem_cap, born_after)
