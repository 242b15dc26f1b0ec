"""Shared pieces of the POSIX mechanisms: the keeper-side strategy interface."""

from __future__ import annotations

import contextlib

from .base import Guarantee, JobOptions

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs start-up time: hints only
    from typing import Any


class KeeperMechanism:
    """One job's mechanism, as seen by its keeper and by the owner.

    An instance is built in the owner (where ``prepare`` may create kernel
    objects such as a cgroup and so fail early, before anything runs) and
    reaches the keeper by fork, or rebuilt in the warden from ``params()``.
    """

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
        """Create what the job needs before the keeper starts; raise to refuse."""

    def params_for_keeper(self) -> dict[str, Any]:
        return dict(self.params)

    def note_spawn(self, pid: int) -> None:
        """The owner learnt of a new direct child (pid as the owner sees it)."""

    def member_pids(self, keeper_pid: int) -> list[int]:
        raise NotImplementedError

    def guarantee(self) -> Guarantee:
        raise NotImplementedError

    def owner_cleanup(self) -> None:
        """Owner-side cleanup after the keeper is gone (best effort)."""

    # keeper side --------------------------------------------------------------
    def keeper_setup(self, keeper) -> None:
        pass

    def spawn_context(self):
        return contextlib.nullcontext()

    def spawn_attrs(self, msg: dict) -> dict[str, Any]:
        return {}

    def kill_all(self, keeper, timeout: float) -> None:
        raise NotImplementedError

    def step_aside(self) -> None:
        """Keeper side of ``JobBackend.step_aside``."""

    def end_for_dead_owner(self, keeper) -> None:
        """The owner is gone: end every member at once, no grace."""
        try:
            self.kill_all(keeper, timeout=5.0)
        finally:
            keeper.reap()
            self.cleanup(keeper)

    def cleanup(self, keeper) -> None:
        pass

    def trace(self) -> dict[str, Any]:
        return {}
