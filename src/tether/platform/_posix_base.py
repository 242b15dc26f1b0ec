"""The keeper-side contract of the POSIX mechanisms (cgroup, subreaper,
pgroup, pidns): what the one keeper (``_keeper``) asks of a mechanism.

An instance is built in the owner (where ``prepare`` may create kernel
objects such as a cgroup and so fail early, before anything runs) and
reaches the keeper by fork, or is rebuilt in the warden from ``params``.
The one-command path (``oneshot``) builds it in the keeper it forked.
"""

from __future__ import annotations

import sys

from ..ending import KILL_BOUND
from .base import Guarantee, JobOptions

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs start-up time: hints only
    from typing import Any


class _NoContext:
    __slots__ = ()

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: object) -> bool:
        return False


class KeeperMechanism:
    """One job's mechanism, as seen by its keeper and by the owner."""

    name = "?"
    keeper_inside = False  # the keeper lives in the job's kernel object (a cgroup)
    exit_ends_job = False  # True when the keeper's own exit makes the kernel end the job
    kernel_enforced = False
    transparent = True

    def __init__(self, options: JobOptions, owner_pid: int, owner_start: int, **params: Any):
        self.options = options
        self.owner_pid = owner_pid
        self.owner_start = owner_start
        self.params = params
        self.born_after = params.get("born_after", 0)

    # owner side ---------------------------------------------------------------
    def prepare(self) -> None:
        """Create what the job needs before the keeper starts; raise OSError to refuse."""

    def params_for_keeper(self) -> dict[str, Any]:
        return dict(self.params)

    def note_spawn(self, pid: int) -> None:
        """The owner learnt of a new direct child (pid as the owner sees it)."""

    def member_pids(self, keeper_pid: int) -> list[int]:
        raise NotImplementedError

    def guarantee(self) -> Guarantee:
        """What this job guarantees: its mechanism module's ``guarantee``."""
        return sys.modules[type(self).__module__].guarantee(self.options)

    def owner_cleanup(self) -> None:
        """Owner-side cleanup after the keeper is gone (best effort)."""

    # keeper side --------------------------------------------------------------
    def keeper_setup(self, keeper) -> None:
        pass

    def spawn_context(self):
        return _NoContext()

    def spawn_attrs(self, msg: dict) -> dict[str, Any]:
        return {}

    def kill_all(self, keeper, timeout: float) -> None:
        raise NotImplementedError

    def step_aside(self) -> None:
        """Keeper side of ``JobBackend.step_aside``."""

    def end_for_dead_owner(self, keeper) -> None:
        """The owner is gone: end every member at once, no grace."""
        try:
            self.kill_all(keeper, timeout=KILL_BOUND)
        finally:
            keeper.reap()
            self.cleanup(keeper)

    def cleanup(self, keeper) -> None:
        pass

    def trace(self) -> dict[str, Any]:
        return {}
