"""Process group + keeper + bounded capture: the portable POSIX mechanism.

Each spawned child leads a new process group; the keeper watches the owner
and, when it dies, kills those groups and every still-parented descendant
found by one bounded capture of the process table (born after the job
started). It needs nothing but POSIX, so it is what macOS and the BSDs get.

A process that double-forks (or ``setsid`` + fork) and whose parent exits
is re-parented to PID 1 and leaves its group: parentage, pgid and sid no
longer link it to the job. Its environment still does: every process the
job starts carries the job's cookie (``TETHER_JOB=...``), so after the group
and session sweep the keeper also ends every process born after the job
opened, of the same user, that carries the cookie (read from /proc, or with
psutil where there is none), the newest pids first (a pid-hopper lives
about a millisecond at each pid, less than a scan of the table takes). What
it still cannot catch, stated by ``guarantee``: a daemon that also clears its
environment, not always a fast pid-hopper, and anything if the keeper itself
is killed first.
"""

from __future__ import annotations

import os

from .. import identity
from .base import PGROUP, Availability, Guarantee, JobOptions, KeeperMechanism

MECHANISM = PGROUP


def probe() -> Availability:
    if os.name != "posix":
        return Availability(PGROUP, False, "not POSIX")
    return Availability(PGROUP, True, "portable; keeper-enforced; escapees found by the job's "
                        "cookie (not those that clear their environment)")


def guarantee(options: JobOptions | None = None) -> Guarantee:
    return Guarantee(
        mechanism=PGROUP,
        kernel_enforced=False,
        transparent=False,
        ends_job="tether's keeper (process groups + a bounded process-table capture)",
        visible=("each spawned command leads its own process group (a terminal's Ctrl+C "
                 "reaches it only when tether hands it the foreground)",),
        not_covered=(
            "a double-forked daemon that also clears its environment (outside every group "
            "and session of the job, and without the job's cookie)",
            "a pid-hopper that changes pid every millisecond or so: the keeper's look at the "
            "newest pids catches it most of the time, not always",
            "anything, if the keeper is SIGKILLed before the owner",
        ) + (() if os.path.isdir("/proc/self/task") else (
            "an exec() of the owner: without /proc the keeper cannot tell it from the "
            "owner's exit, and ends the job then",)),
    )


class Mechanism(KeeperMechanism):
    name = PGROUP
    keeps_spawned = True  # each child leads a group that may outlive it
    joins_owner_group = False

    def note_spawn(self, pid: int) -> None:
        self.params.setdefault("groups", []).append(pid)

    def spawn_attrs(self, msg: dict) -> dict:
        if msg.get("setsid"):
            return {}
        return {"setpgroup": 0} if msg.get("pgroup", -1) == -1 else {}

    def _related(self, keeper_pid: int, groups=(), sessions=()) -> list[identity.Identity]:
        cookie = self._cookie()
        uid = os.geteuid()

        def carries(i: identity.Identity) -> bool:
            return (i.pid > 2 and (i.uid == uid or uid == 0) and i.state not in "ZX"
                    and cookie is not None and bool(identity.environ_has(i.pid, cookie)))

        # First the newest pids, at once: a pid-hopper lives about a
        # millisecond at each pid, less than a scan of the table takes.
        hot = []
        if cookie is not None:
            for pid in identity.newest_pids():
                i = identity.read(pid)
                if i is not None and i.start >= self.born_after and carries(i):
                    hot.append(i)
        cap = identity.capture(born_after=self.born_after)
        found = {i.pid: i for i in cap.descendants([keeper_pid], born_after=self.born_after)}
        for g in groups:
            found.update((i.pid, i) for i in cap.by_pgid(g, self.born_after))
        for s in sessions:
            found.update((i.pid, i) for i in cap.by_session(s, self.born_after))
        for g in groups:  # descendants of group members that changed group
            found.update((i.pid, i) for i in cap.descendants([g], born_after=self.born_after))
        # Escapees that left parentage, group and session kept the cookie:
        # every process of ours born since the job opened is asked.
        if cookie is not None:
            for i in hot:
                found.setdefault(i.pid, i)
            for i in cap.procs.values():
                if i.pid not in found and carries(i):
                    found[i.pid] = i
            found.update((d.pid, d) for d in cap.descendants(
                [p for p in found if p != keeper_pid], born_after=self.born_after))
        found.pop(keeper_pid, None)
        # A zombie is dead (PID 1 here reaps orphans only every ~2 s).
        return sorted((i for i in found.values() if i.state not in "ZX"), key=lambda i: i.pid)

    def _cookie(self) -> bytes | None:
        o = self.options
        return f"{o.cookie_var}={o.cookie}".encode() if o.cookie else None

    def member_pids(self, keeper_pid: int) -> list[int]:
        groups = self.params.get("groups", ())
        return [i.pid for i in self._related(keeper_pid, groups, groups)]

    def kill_all(self, keeper, timeout: float) -> None:
        from ..ending import end

        me = os.getpid()
        groups = set(keeper.spawned)
        # Frozen first, and found again a while after the last find: a
        # pid-hopper forks its successor between a look and a kill, and only
        # the cookie (no parentage, group or session) links that one to us.
        end(lambda: self._related(me, groups, groups), born_after=self.born_after, grace=0,
            freeze=True, quiet=0.05, on_round=keeper.reap, bound=timeout)
