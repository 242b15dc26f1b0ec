"""A capture of the process table that reads a process only when a walk reaches it.

A close under ``pgroup`` (and a PTY close whose keeper is gone) must find the
job's processes by what links them to it: parentage, session, process group,
and the cookie of the orphans re-parented to an adopter (init, a subreaper
ancestor, the keeper). :func:`tether.capture.capture` reads every process's
``/proc/PID/stat`` to answer those walks, so a close costs as much as the
machine holds: 2 000 unrelated processes are 2 000 reads.

The same walks need much less. Parentage is what the kernel's children lists
say (``/proc/PID/task/TID/children``); a session or group is a pair of
syscalls per pid (``getsid``/``getpgid``: no file is opened); an adopter's
orphans are its children. So :class:`SparseCapture` lists ``/proc`` once and
reads only the processes a walk reaches: the job's, the adopters' children,
the members of the sessions and groups asked for. Its reads follow the job.

Trap: a child is on the children list of the *thread* that forked it, and an
orphan is given to any live thread of its new parent, so every thread's list
is read (:func:`tether.proctree.children`). The lists, like a scan of
``/proc``, are not atomic: a kill loop looks again, as after any capture.

Same contract as :class:`tether.capture.Capture` (its walks, its safety
exclusions, ``born_after``, ``complete``); ``procs`` holds what was read so
far, not the table. Linux only; :func:`capture` falls back to the full one
elsewhere and where the kernel has no children lists.
"""

from __future__ import annotations

import time

from . import identity, proctree
from .capture import Capture, captured_at
from .capture import capture as full_capture
from .identity import Identity


class SparseCapture(Capture):
    """A capture whose processes are read on first use (see the module)."""

    __slots__ = ("_pids", "_sids", "_absent", "_lists", "_threads", "_excl", "_boot", "_t0",
                 "_deadline")

    def __init__(self, *, time_cap: float, born_after: int) -> None:
        super().__init__({}, born_after=born_after)
        self._t0 = time.monotonic()
        self._deadline = self._t0 + time_cap
        # The one scan of the table: names only, no process is read.
        self._pids = list(proctree.pids() or ())
        self._sids: dict[int, list[int]] | None = None  # session id -> pids
        self._absent: set[int] = set()  # gone, or born before born_after
        self._lists: dict[int, list[int]] = {}  # pid -> its children (every thread's)
        self._threads: dict[int, int] = {}  # pid -> its threads, when read
        self._excl: frozenset[int] | None = None
        self._boot = identity.boot_id()

    def __repr__(self) -> str:
        return f"<SparseCapture {len(self.procs)} of {len(self._pids)} processes read>"

    def get(self, pid: int) -> Identity | None:
        known = self.procs.get(pid)
        if known is not None or pid in self._absent or pid <= 0:
            return known
        now = time.monotonic()
        self.elapsed = now - self._t0
        if now > self._deadline:
            if self.complete:
                self.complete = False
                self.reason = f"time cap reached after reading {len(self.procs)} processes"
            return None
        got = captured_at(None, str(pid), self._boot, self.born_after or 0)
        if got is None:  # gone, or born before the capture's floor
            self._absent.add(pid)
            return None
        ident, self._threads[pid] = got
        self.procs[pid] = ident
        return ident

    def _excluded(self) -> frozenset[int]:  # type: ignore[override]
        # Read once per capture, not per walk: ancestors only die (a parent's
        # death re-parents us to one of them), and a stale set only spares more.
        if self._excl is None:
            self._excl = Capture._excluded()
        return self._excl

    def __contains__(self, pid: object) -> bool:
        return isinstance(pid, int) and self.get(pid) is not None

    def _kids_of(self, pid: int) -> list[Identity]:
        pids = self._lists.get(pid)
        if pids is None:  # each list read once per capture, as a snapshot would hold it
            # One thread (read with it): one list, no listing of its threads.
            single = self._threads.get(pid) == 1
            pids = self._lists[pid] = proctree.children(pid, every_thread=not single)
        out = []
        for c in pids:
            ident = self.get(c)
            if ident is not None and ident[3] == pid:  # (re-parented since the list: not its)
                out.append(ident)
        return out

    def _with(self, index: int, value: int) -> list[Identity]:
        # Read, then filtered by what was read: the syscall and the read agree
        # unless the process moved between them, and then the read is newer.
        pids = self._session(value) if index == 5 else self._group(value)
        return [i for i in map(self.get, pids) if i is not None]

    def _session(self, sid: int) -> list[int]:
        """The pids of session ``sid``: one ``getsid`` per pid of the table,
        once per capture (no file is opened)."""
        if self._sids is None:
            self._sids = proctree.sessions(self._pids)
        return self._sids.get(sid, [])

    def _group(self, pgid: int) -> list[int]:
        """The pids of group ``pgid``, asked only of its session's pids. A
        group lives in one session, its leader's: a process whose pid names a
        group with members is that group's leader (the kernel does not hand
        out the pid meanwhile), and a group leader cannot leave its session
        (``setsid`` refuses it). Without the leader, a member read already
        names the session; else every pid is asked."""
        sid = proctree.session_of(pgid)
        if sid is None:
            sid = next((i[5] for i in self.procs.values() if i[4] == pgid), None)
        return proctree.in_group(pgid, self._session(sid) if sid is not None else self._pids)


def capture(*, time_cap: float = 1.0, mem_cap: int = 32 * 2**20,
            born_after: int) -> Capture:
    """A capture for walks from the job's own processes: sparse on Linux
    (see the module), else :func:`tether.capture.capture`."""
    if proctree.has_children_lists():
        return SparseCapture(time_cap=time_cap, born_after=born_after)
    return full_capture(time_cap=time_cap, mem_cap=mem_cap, born_after=born_after)
