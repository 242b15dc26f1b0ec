"""Subreaper keeper: the job's processes descend from a child subreaper.

``PR_SET_CHILD_SUBREAPER`` makes every orphan below the keeper re-parent to
the keeper instead of PID 1, so a double fork, ``setsid`` or a pid-hopper
cannot leave the keeper's subtree. Ending the job is a kill loop over
``/proc/*/task/*/children`` until ``waitpid`` says ECHILD.

Pitfall: the guarantee rests on the keeper. If the keeper itself is
SIGKILLed before the owner dies, its subtree is re-parented to PID 1 and
survives; the audit log and ``tether reap`` clean that up afterwards.
Available to any user on Linux >= 3.4.
"""

from __future__ import annotations

import os
import sys

from ._linux_kill import PR_SET_CHILD_SUBREAPER, set_subreaper  # noqa: F401 - re-exported
from ._posix_base import KeeperMechanism
from .base import SUBREAPER, Availability, Guarantee


def probe() -> Availability:
    if not sys.platform.startswith("linux"):
        return Availability(SUBREAPER, False, "not Linux (PR_SET_CHILD_SUBREAPER is Linux-only)")
    if not os.path.exists("/proc/self/task"):
        return Availability(SUBREAPER, False, "/proc is not mounted")
    if not hasattr(os, "pidfd_open"):
        return Availability(SUBREAPER, True, "no pidfd in this Python: the owner is watched by polling")
    return Availability(SUBREAPER, True, "any user; guardian-enforced")


class SubreaperMechanism(KeeperMechanism):
    name = SUBREAPER

    def keeper_setup(self, keeper) -> None:
        set_subreaper()

    def member_pids(self, keeper_pid: int) -> list[int]:
        from ._keeper import descendants

        return descendants(keeper_pid)

    def kill_all(self, keeper, timeout: float) -> None:
        from ._keeper import kill_descendants

        kill_descendants(keeper, timeout)

    def guarantee(self) -> Guarantee:
        return Guarantee(
            mechanism=SUBREAPER,
            kernel_enforced=False,
            transparent=True,
            ends_job="tether's keeper (a child subreaper watching the owner by pidfd)",
            not_covered=(
                "if the keeper is SIGKILLed before the owner, the job's processes survive "
                "(tether reap ends them later from the audit log)",
                "a process that ptrace-reparents or is moved out by another privileged process",
            ),
        )
