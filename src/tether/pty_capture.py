"""Which processes are a terminal session's: the close's bounded capture,
and the proof its signals carry.

A :class:`tether.pty.PtySession` close finds every process of the session
first, before anything is signalled (a hang-up makes processes exit and
reparent, which would hide their descendants). Where the session's job holds
every process it started (a cgroup; a subreaper or PID-namespace keeper that
is alive) the job is read. Elsewhere (``pgroup``, a dead keeper) one bounded
capture of the process table (:mod:`tether.sparse_capture`, at most
``CAPTURE_TIME_CAP`` seconds and ``CAPTURE_MEM_CAP`` bytes) is walked from the
program by descent, session, process group and the session's environment
cookie (:data:`COOKIE_VAR`). What the capture proved is then what each of the
close's signals carries as its :class:`tether.gate.Proof` (``_proof``).

:class:`_SessionCapture` holds these steps as methods that ``PtySession``
inherits (``PtySession.capture`` is public: read-only, safe to call any
time). They read the session's attributes, set by ``PtySession.__init__`` and
declared on the class below. This is the one place that decides what belongs
to a session; the terminal, its readers and the close's signals are in
:mod:`tether.pty`, which imports this module (never the reverse).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable

from . import environ, gate, identity, proctree
from .capture import Capture
from .errors import TetherError
from .identity import Identity

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .job import Job

__all__ = ["COOKIE_VAR", "CAPTURE_TIME_CAP", "CAPTURE_MEM_CAP"]

#: Environment variable that tags every process of a session. A double-forked
#: daemon that escaped parentage, group and session still carries it, so the
#: close capture can find it even under the ``pgroup`` mechanism (the same
#: idea as Jenkins' ProcessTreeKiller cookie). Only processes born after the
#: session started, of our own uid, are ever looked at.
COOKIE_VAR = "TETHER_PTY_SESSION"

CAPTURE_TIME_CAP = 1.0
CAPTURE_MEM_CAP = 32 * 2**20


class _SessionCapture:
    """The capture of a :class:`tether.pty.PtySession`'s processes (see the
    module's docstring); ``PtySession`` is its only subclass."""

    # Set by PtySession.__init__ (tether.pty).
    token: str
    pid: int
    root: Identity | None
    born_after: int
    job: Job | None
    mechanism: str
    _capture: Callable[..., Capture]
    _capture_job: Callable[[], Capture]

    def capture(self) -> tuple[list[Identity], Capture]:
        """One bounded capture of the session's processes (the root
        excluded): see :meth:`close`. Read-only; safe to call any time.

        Where the session's job holds every process it started (a cgroup;
        a subreaper or PID-namespace keeper that is alive, to which every
        orphan of the job is re-parented), the job is read, not the machine:
        its cost follows the session, not the number of processes running.
        Elsewhere (``pgroup``, a dead keeper) the whole table is captured
        and walked by descent, session, group and cookie."""
        if self._job_holds_all():
            found_job, cap = self._from_job(self._capture_job())
            self._proven: tuple[frozenset[int], frozenset[int]] = (
                frozenset(), frozenset(i.pid for i in found_job) | {self.pid} | self._keeper_pids())
            return found_job, cap
        self._capture_last = proctree.last_pid()[0]  # before it: see _seed_job_close
        cap = self._capture(time_cap=CAPTURE_TIME_CAP, mem_cap=CAPTURE_MEM_CAP,
                            born_after=self.born_after)
        born = self.born_after
        root_pid = self.pid
        found: dict[int, Identity] = {}
        excluded = {root_pid}
        keepers = self._keeper_pids()
        excluded |= keepers
        needle = f"{COOKIE_VAR}={self.token}".encode()
        env_known: dict[tuple[int, int], bool] = {}

        def carries(i: Identity) -> bool:
            # each process's environment is read at most once per capture
            k = (i.pid, i.start)
            if k not in env_known:
                env_known[k] = bool(environ.environ_has(i.pid, needle))
            return env_known[k]

        def add(idents: Iterable[Identity]) -> list[Identity]:
            new = [i for i in idents if i.pid not in found and i.pid not in excluded]
            for i in new:
                found[i.pid] = i
            return new

        # Seeds. Still-parented descendants of the root, in any group or
        # session, and the root's own session and group (even if the root
        # has exited by itself: its session outlives it) - but only while the
        # root's pid is still the session's: once the root is reaped and its
        # session empty, a stranger may be handed that pid (even within the
        # same clock tick, when pid + start + boot match). So they are used
        # only if the root itself, or a member of its session or group,
        # carries the session's cookie.
        seeds = (cap.descendants([root_pid], born_after=born) + cap.by_session(root_pid, born)
                 + cap.by_pgid(root_pid, born))
        cur = cap.get(root_pid)
        live_root = (cur is not None and self.root is not None and cur.start == self.root.start
                     and cur.state not in ("Z", "X", "x"))
        proven_groups: set[int] = set()
        if (cur is not None and live_root and carries(cur)) or any(
                carries(i) for i in seeds if i.pid != root_pid and i.state not in ("Z", "X", "x")
                and (i.sid == root_pid or i.pgid == root_pid)):
            add(seeds)
            proven_groups.add(root_pid)
        # Escapees that left parentage, group and session (double fork +
        # setsid) but kept the environment: the cookie. An orphan is
        # re-parented to the nearest living subreaper among its ancestors, or
        # to init: the keeper, this process or one of its ancestors - so only
        # those orphans need their environment read (their own children are
        # found by the descendant walk below). Same uid only, born after the
        # session started, within the capture's own time budget.
        me_uid = os.geteuid()
        adopters = identity.own_ancestors() | keepers
        deadline = time.monotonic() + max(0.0, CAPTURE_TIME_CAP - cap.elapsed)
        for ident in cap.adopted(adopters):
            if ident.pid in found or ident.pid in excluded:
                continue
            if me_uid != 0 and ident.uid != me_uid:
                continue
            if time.monotonic() > deadline:
                cap.complete = False
                cap.reason = cap.reason or "time cap reached while reading environments"
                break
            if carries(ident):
                add([ident])
        # What the mechanism itself knows to be in the job (cgroup members,
        # subreaper orphans), read fresh. Not for pgroup: its member list is a
        # second full capture that finds nothing the walks above miss.
        if self.job is not None and not self.job.closed and self.mechanism != "pgroup":
            add(m for m in self._job_members(cap) if m.start >= born)
        # Closure: the descendants of everything found, and every session and
        # process group a found process is in. Those are the session's own: a
        # process enters a session only by inheritance and a group only within
        # its session, and a group's or session's id (its first leader's
        # pid) is not reused while it has members. Still bounded to processes
        # born after the session started.
        seen_ids: set[tuple[int, int]] = set()
        frontier = list(found.values())
        for _ in range(256):
            if not frontier:
                break
            new = add(cap.descendants([i.pid for i in frontier], born_after=born))
            for i in frontier:
                for kind, value in ((5, i.sid), (4, i.pgid)):
                    if value <= 1 or (kind, value) in seen_ids:
                        continue
                    seen_ids.add((kind, value))
                    walk = cap.by_session if kind == 5 else cap.by_pgid
                    new += add(walk(value, born))
            frontier = new
        safe = identity.own_ancestors() | {os.getpid()}
        out = [i for i in found.values() if i.pid not in safe]
        # Another user's process only under a root owner, and then only with
        # the cookie (a root session's `su` child is the session's).
        out = [i for i in out if i.uid == me_uid or (me_uid == 0 and carries(i))]
        proven_groups |= {v for i in out for v in (i.sid, i.pgid) if v > 1}
        self._proven = (frozenset(proven_groups),
                        frozenset(i.pid for i in out) | {root_pid} | keepers)
        return out, cap

    def _seed_job_close(self, cap: Capture) -> None:
        """pgroup: the job's own look at its members, made from this close's
        capture and handed to its keeper's close (which would otherwise
        capture the whole table again): one table scan per close."""
        job = self.job
        mech = getattr(getattr(job, "_backend", None), "mech", None)
        look_from = getattr(mech, "look_from", None)
        keeper = getattr(job._backend, "keeper_pid", None) if job is not None else None
        if job is None or job.closed or mech is None or look_from is None or not keeper:
            return
        seen = look_from(keeper, cap, getattr(self, "_capture_last", 0))
        if seen is not None:
            mech.close_seen = seen

    def _keeper_pids(self) -> set[int]:
        keeper = self.job.trace().get("keeper_pid") if self.job is not None else None
        return {keeper} if keeper else set()

    def _proof(self) -> gate.Proof:
        """What proves, at the signal, that a process is the session's: its
        cookie, its job's cgroup, or (from the last capture) a group or
        session it is a member of, or its parent (see
        :class:`tether.gate.Proof`)."""
        groups, parents = getattr(self, "_proven", (frozenset(), frozenset()))
        cg = None
        if self.job is not None and self.mechanism == "cgroup":
            try:
                cg = self.job.trace().get("cgroup_path")
            except (TetherError, OSError):
                cg = None
        return gate.Proof(f"{COOKIE_VAR}={self.token}".encode(), cg, groups=groups,
                          parents=parents | {self.pid} | self._keeper_pids())

    def _job_holds_all(self) -> bool:
        job = self.job
        if job is None or job.closed or self.mechanism not in ("cgroup", "subreaper", "pidns"):
            return False
        if self.mechanism == "cgroup":
            return True  # the kernel keeps every member listed, keeper or not
        alive = getattr(job._backend, "keeper_alive", None)
        return bool(alive is not None and alive())

    def _read_job(self) -> Capture:
        """The job's live members born since the session began, as a capture."""
        t0 = time.monotonic()
        born = self.born_after
        procs: dict[int, Identity] = {}
        try:
            pids = self.job.member_pids() if self.job is not None else []
        except (TetherError, OSError):
            pids = []
        for pid in pids:
            ident = identity.read(pid)
            if ident is not None and ident.start >= born and ident.state not in ("Z", "X"):
                procs[pid] = ident
        return Capture(procs, elapsed=time.monotonic() - t0, born_after=born)

    def _from_job(self, cap: Capture) -> tuple[list[Identity], Capture]:
        excluded = {self.pid} | identity.own_ancestors() | {os.getpid()}
        keeper = self.job.trace().get("keeper_pid") if self.job is not None else None
        if keeper:
            excluded.add(keeper)
        return [i for i in cap.procs.values() if i.pid > 2 and i.pid not in excluded], cap

    def _job_members(self, cap: Capture) -> list[Identity]:
        """The job's members as its mechanism lists them, identified from the
        capture where it has them (``Job.members()`` re-reads every one)."""
        job = self.job
        if job is None:
            return []
        try:
            lister = getattr(job, "member_pids", None) or job._backend.member_pids
            pids = lister()
        except (TetherError, OSError):
            return []
        out = []
        for pid in pids:
            ident = cap.procs.get(pid) or identity.read(pid)
            if ident is not None and ident.state not in ("Z", "X"):
                out.append(ident)
        return out
