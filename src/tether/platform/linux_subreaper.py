"""Subreaper keeper: the job's processes descend from a child subreaper.

``PR_SET_CHILD_SUBREAPER`` makes every orphan below the keeper re-parent to
the keeper instead of PID 1, so a double fork, ``setsid`` or a pid-hopper
cannot leave the keeper's subtree. Ending the job is this module's kill
loop: SIGKILL every descendant, then read our own children lists again
(the dying hand what they forked down to us) until ``waitpid`` says ECHILD.

Pitfalls: the guarantee rests on the keeper. If the keeper itself is
SIGKILLed before the owner dies, its subtree is re-parented to PID 1 and
survives; the audit log and ``tether reap`` clean that up afterwards.
``/proc/PID/task/*/children`` is not atomic: the loop rescans after each
round of reaping (not after each single reap, which is quadratic), and
never walks the dying again (that took the CPU their exits need).
Available to any user on Linux >= 3.4.
"""

import os
import sys
import time

from .. import identity
from .._prctl import set_subreaper
from .base import SUBREAPER, Availability, Guarantee, JobOptions, KeeperMechanism

MECHANISM = SUBREAPER
_SIGKILL = 9


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


def kill_found(pids: "list[int]", killed: "set[int]", parent: int) -> "list[tuple[int, bool]]":
    """SIGKILL those of ``pids``, children of ``parent``, not in ``killed``
    (and add those killed); each pid with whether its subtree is to be read
    now (it was killed just now). One not killed (``identity.signal_child``:
    gone, no longer a child of ``parent`` or of us, not pinned) is not
    remembered, and its subtree is not read: re-parented to a subreaper of
    the job's below us, it turns up again in that one's list; reused, its
    subtree is not the job's."""
    out = []
    for pid in pids:
        fresh = pid not in killed and identity.signal_child(pid, _SIGKILL, parent)
        if fresh:
            killed.add(pid)
        out.append((pid, fresh))
    return out


def reap_loop(timeout: float, on_reap=None) -> bool:
    """SIGKILL every descendant of this process, in rounds, until waitpid says
    ECHILD (True) or ``timeout`` passes (False).

    Works only in a subreaper (or a PID namespace's init): an orphan anywhere
    below is re-parented here. Each process is killed as soon as it is found,
    parents first. The dying are not read again: what one of them forked
    before the kill is re-parented here when it exits, so after the first
    round a round reads this process's own children and the subtrees of those
    not killed yet. Rounds are a millisecond apart: the CPU belongs to the
    dying, whose exits are the cost (walking them again and again slowed them
    down); for the same reason a round reads only each process's main
    thread's children. A process stuck dying hides what it forked until it
    exits, so the whole tree, every thread, is read again once 20 ms pass
    without a reap. The native
    keeper's kill_descendants is the same loop. ``on_reap(pid, status)`` is
    called for every child reaped.
    """
    me = os.getpid()
    deadline = time.monotonic() + timeout
    killed: set[int] = set()  # signalled, not yet reaped: their subtrees were read
    progress: float | None = None  # the last reap, or the last whole-tree read
    def reaped(pid: int, status: int) -> None:
        nonlocal progress
        killed.discard(pid)
        progress = time.monotonic()
        if on_reap is not None:
            on_reap(pid, status)

    while time.monotonic() < deadline:
        if not identity.reap_exited(reaped):
            return True
        stuck = progress is not None and time.monotonic() - progress >= 0.02
        whole = progress is None or stuck
        found = kill_found(identity.children(me, every_thread=stuck), killed, me)
        k = 0
        while k < len(found):
            pid, fresh = found[k]
            if fresh or (whole and pid in killed):
                found.extend(kill_found(identity.children(pid, every_thread=stuck), killed, pid))
            k += 1
        if whole:
            progress = time.monotonic()
        time.sleep(0.001)
    return False


class Mechanism(KeeperMechanism):
    name = SUBREAPER

    def keeper_setup(self, keeper) -> None:
        set_subreaper()

    def member_pids(self, keeper_pid: int) -> list[int]:
        return identity.descendant_pids(keeper_pid)

    def kill_all(self, keeper, timeout: float) -> None:
        reap_loop(timeout, keeper.reaped)
