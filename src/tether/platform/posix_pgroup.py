"""Process group + keeper + bounded capture: the portable POSIX mechanism.

Each spawned child leads a new process group; the keeper watches the owner
and, when it dies, kills those groups and every still-parented descendant
found by one bounded capture of the process table (born after the job
started). It needs nothing but POSIX, so it is what macOS and the BSDs get.

What it cannot catch, stated by ``guarantee``: a process that double-forks
(or ``setsid`` + fork) and whose parent exits is re-parented to PID 1 and
leaves its group: it is no longer linked to the job by parentage, pgid or
sid. Also the keeper itself: if it is killed first, nothing ends the job.
"""

from __future__ import annotations

import os

from .. import identity
from .base import PGROUP, Availability, Guarantee, JobOptions, KeeperMechanism

MECHANISM = PGROUP


def probe() -> Availability:
    if os.name != "posix":
        return Availability(PGROUP, False, "not POSIX")
    return Availability(PGROUP, True, "portable; keeper-enforced; misses double-forked escapees")


def guarantee(options: JobOptions | None = None) -> Guarantee:
    return Guarantee(
        mechanism=PGROUP,
        kernel_enforced=False,
        transparent=False,
        ends_job="tether's keeper (process groups + a bounded process-table capture)",
        visible=("each spawned command leads its own process group (a terminal's Ctrl+C "
                 "reaches it only when tether hands it the foreground)",),
        not_covered=(
            "a double-forked daemon whose parent has exited (re-parented to PID 1, "
            "outside every group and session of the job)",
            "anything, if the keeper is SIGKILLed before the owner",
        ),
    )


class Mechanism(KeeperMechanism):
    name = PGROUP

    def note_spawn(self, pid: int) -> None:
        self.params.setdefault("groups", []).append(pid)

    def spawn_attrs(self, msg: dict) -> dict:
        if msg.get("setsid"):
            return {}
        return {"setpgroup": 0} if msg.get("pgroup", -1) == -1 else {}

    def _related(self, keeper_pid: int, groups=(), sessions=()) -> list[identity.Identity]:
        cap = identity.capture(born_after=self.born_after)
        found = {i.pid: i for i in cap.descendants([keeper_pid], born_after=self.born_after)}
        for g in groups:
            found.update((i.pid, i) for i in cap.by_pgid(g, self.born_after))
        for s in sessions:
            found.update((i.pid, i) for i in cap.by_session(s, self.born_after))
        for g in groups:  # descendants of group members that changed group
            found.update((i.pid, i) for i in cap.descendants([g], born_after=self.born_after))
        found.pop(keeper_pid, None)
        # A zombie is dead (PID 1 here reaps orphans only every ~2 s).
        return sorted((i for i in found.values() if i.state not in "ZX"), key=lambda i: i.pid)

    def member_pids(self, keeper_pid: int) -> list[int]:
        groups = self.params.get("groups", ())
        return [i.pid for i in self._related(keeper_pid, groups, groups)]

    def kill_all(self, keeper, timeout: float) -> None:
        from ..ending import end

        me = os.getpid()
        groups = set(keeper.spawned)
        end(lambda: self._related(me, groups, groups), born_after=self.born_after, grace=0,
            on_round=keeper.reap, bound=timeout)
