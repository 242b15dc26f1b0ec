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

from .. import gate, identity, proctree
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


# A round reads a process's children before it kills it, except in a fan-out
# wider than this (a worker pool, a `cmd &` loop: nearly all leaves), whose
# members are killed unread; what one of them forked comes here when it
# exits. keeper.c's WIDE_FANOUT says why (the same rule, measured).
WIDE_FANOUT = 16


def kill_round(found: "list[int]", killed: "set[int]", me: int, whole: bool, stuck: bool) -> None:
    """One round over ``found`` (this process's children, just read) and the
    subtrees found on the way. A process not killed yet has its children read
    first (unless it is one of a wide fan-out), then is SIGKILLed
    (``gate.signal_child``: pinned, and still a child of its parent or of
    us); read after the kill, the list raced its exit, whose re-parenting
    emptied it. Its subtree is walked only if the kill was ours: one gone, no
    longer a child of either, or not pinned is not remembered (re-parented to
    a subreaper of the job's below us, it turns up again in that one's list;
    reused, its subtree is not the job's). One killed before is read again
    only in a ``whole`` round. ``stuck``: every thread's children, and every
    process's, wide or not. keeper.c's kill_round is the same walk."""
    fresh = sum(pid not in killed for pid in found)
    todo = [(pid, me, fresh > WIDE_FANOUT) for pid in found]
    k = 0
    while k < len(todo):
        pid, parent, wide = todo[k]
        k += 1
        before = pid in killed
        if before and not whole:
            continue
        kids = [] if wide and not stuck else proctree.children(pid, every_thread=stuck)
        if not before:
            if not gate.signal_child(pid, _SIGKILL, parent):
                continue  # what was read is not walked
            killed.add(pid)
        todo.extend((kid, pid, len(kids) > WIDE_FANOUT) for kid in kids)


def reap_loop(timeout: float, on_reap=None) -> bool:
    """SIGKILL every descendant of this process, in rounds, until waitpid says
    ECHILD (True) or ``timeout`` passes (False).

    Works only in a subreaper (or a PID namespace's init): an orphan anywhere
    below is re-parented here. Each process is killed as soon as it is found,
    parents first (:func:`kill_round`). The dying are not read again: what one
    of them forked before the kill is re-parented here when it exits, so after
    the first round a round reads this process's own children and the
    subtrees of those not killed yet. Rounds are a millisecond apart: the CPU
    belongs to the dying, whose exits are the cost (walking them again and
    again slowed them down); for the same reason a round reads only each
    process's main thread's children. A process stuck dying hides what it
    forked until it exits, so the whole tree, every thread, is read again once
    20 ms pass without a reap. The native keeper's kill_descendants is the
    same loop. ``on_reap(pid, status)`` is called for every child reaped.
    """
    me = os.getpid()
    deadline = time.monotonic() + timeout
    killed: set[int] = set()  # signalled, not yet reaped
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
        kill_round(proctree.children(me, every_thread=stuck), killed, me, whole, stuck)
        if whole:
            progress = time.monotonic()
        time.sleep(0.001)
    return False


class Mechanism(KeeperMechanism):
    name = SUBREAPER

    def keeper_setup(self, keeper) -> None:
        set_subreaper()

    def member_pids(self, keeper_pid: int) -> list[int]:
        return proctree.descendant_pids(keeper_pid)

    def kill_all(self, keeper, timeout: float) -> None:
        reap_loop(timeout, keeper.reaped)
