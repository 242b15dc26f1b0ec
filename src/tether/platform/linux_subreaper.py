"""Subreaper keeper: the job's processes descend from a child subreaper.

``PR_SET_CHILD_SUBREAPER`` makes every orphan below the keeper re-parent to
the keeper instead of PID 1, so a double fork, ``setsid`` or a pid-hopper
cannot leave the keeper's subtree. The keeper is the native program
(``_native/keeper.c``); ending the job is its kill loop (``kill_descendants``):
SIGKILL every descendant, then read its own children lists again (the dying
hand what they forked down to it) until ``waitpid`` says ECHILD. This module
is the owner's side: what the mechanism promises, and the members' list.

Pitfalls: the guarantee rests on the keeper. If the keeper itself is
SIGKILLed before the owner dies, its subtree is re-parented to PID 1 and
survives; the audit log and ``tether reap`` clean that up afterwards.
``/proc/PID/task/*/children`` is not atomic: the kill loop rescans after
each round of reaping (not after each single reap, which is quadratic), and
never walks the dying again (that took the CPU their exits need).
Available to any user on Linux >= 3.4.
"""

import os
import sys

from .. import identity, proctree
from .base import SUBREAPER, Availability, Guarantee, JobOptions, KeeperMechanism

MECHANISM = SUBREAPER


def probe() -> "Availability":
    if not sys.platform.startswith("linux"):
        return Availability(SUBREAPER, False, "not Linux (PR_SET_CHILD_SUBREAPER is Linux-only)")
    if not os.path.exists("/proc/self/task"):
        return Availability(SUBREAPER, False, "/proc is not mounted")
    if not identity.HAVE_PIDFD:
        return Availability(SUBREAPER, True, "no pidfd in this Python: the owner is watched by polling")
    return Availability(SUBREAPER, True, "any user; keeper-enforced")


def guarantee(options: "JobOptions | None" = None) -> "Guarantee":
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


class Mechanism(KeeperMechanism):
    name = SUBREAPER

    def member_pids(self, keeper_pid: int) -> list[int]:
        return proctree.descendant_pids(keeper_pid)
