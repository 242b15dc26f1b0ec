"""The contract every platform mechanism fulfils.

A *job* is a bag of processes that the operating system keeps together: what
a member starts is a member, nothing in it can leave, and closing the job ends
every member. Each module in this package implements one mechanism behind the
two small interfaces below; ``tether.job.Job`` is written only against them.

Modules:
    linux_cgroup     cgroup v2 directory per job, ``cgroup.kill`` (transparent)
    linux_subreaper  a child-subreaper keeper, kill loop over /proc (transparent)
    posix_pgroup     process group + bounded capture (portable, weakest)
    linux_pidns      PID namespace per job, keeper is its init (strict)
    windows          Job Object with KILL_ON_JOB_CLOSE (transparent and strict)

Rules for implementers:
  * ``probe()`` never raises and never leaves anything behind; it answers
    "available, or exactly why not".
  * A backend must never start a process outside its job when it was asked
    for one: if placement fails, the child is killed and ``JobRefused`` raised.
  * Every signal to a process that is not a direct child goes through
    ``tether.identity.send_signal`` (identity-checked), never a bare
    ``os.kill``.
  * No module here imports ``tether.job``, ``tether.host`` or ``tether.cli``.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

TYPE_CHECKING = False
if TYPE_CHECKING:  # hints only: subprocess and typing cost start-up time
    import subprocess
    from typing import Any

# Mechanism names, identical in the API, the CLI and `tether doctor`.
AUTO = "auto"
STRICT = "strict"
CGROUP = "cgroup"
SUBREAPER = "subreaper"
PGROUP = "pgroup"
PIDNS = "pidns"
JOBOBJECT = "jobobject"
ALL_MECHANISMS = (CGROUP, SUBREAPER, PGROUP, PIDNS, JOBOBJECT)
MECHANISM_NAMES = (AUTO, STRICT) + ALL_MECHANISMS


@dataclass(frozen=True)
class Availability:
    """Answer of a mechanism's ``probe()``."""

    mechanism: str
    available: bool
    reason: str = ""  # why not (or a note when available), one line
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "mechanism": self.mechanism,
            "available": self.available,
            "reason": self.reason,
            "detail": dict(self.detail),
        }


@dataclass(frozen=True)
class Guarantee:
    """What protects a job, on the two axes of the design brief.

    * ``kernel_enforced``: the job ends even if tether's guardian is killed
      first (the kernel, not a process of ours, pulls the trigger).
    * ``transparent``: the job's processes see the same PIDs, users and /proc
      as without tether; ``visible`` lists what they would notice otherwise.
    * ``not_covered``: what this mechanism cannot catch, stated plainly.
    * ``disabled``: set when the safety net is OFF, with the reason (for
      instance a Win32 error code); such a job protects nothing.
    """

    mechanism: str
    kernel_enforced: bool
    transparent: bool
    ends_job: str  # who ends the job when the owner dies
    visible: tuple[str, ...] = ()
    not_covered: tuple[str, ...] = ()
    disabled: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "mechanism": self.mechanism,
            "kernel_enforced": self.kernel_enforced,
            "transparent": self.transparent,
            "ends_job": self.ends_job,
            "visible": list(self.visible),
            "not_covered": list(self.not_covered),
            "disabled": self.disabled,
        }

    def __str__(self) -> str:
        if self.disabled:
            return f"{self.mechanism}: kill-on-close DISABLED: {self.disabled}"
        kind = "kernel-enforced" if self.kernel_enforced else "guardian-enforced"
        seen = "transparent" if self.transparent else "visible: " + "; ".join(self.visible)
        text = f"{self.mechanism} ({kind}, {seen}); ended by {self.ends_job}"
        if self.not_covered:
            text += "; does not cover: " + "; ".join(self.not_covered)
        return text


@dataclass(frozen=True)
class JobOptions:
    """Everything a backend needs to open one job."""

    name: str
    job_id: str  # unique per owner run, safe in file names
    parent: JobBackend | None = None  # nested job: ends when the parent ends
    background: bool = False  # not ended with the owner (host background jobs)
    cpu_percent: int | None = None  # hard CPU cap for background jobs
    low_priority: bool = False


class JobBackend(abc.ABC):
    """One open job, seen from the owner's process.

    ``popen`` returns a real ``subprocess.Popen`` or a subclass of it, so
    pipes, ``communicate``, ``wait``, ``poll``, ``send_signal`` behave as
    users expect. The child is a member before it runs its first
    instruction.
    """

    mechanism: str
    options: JobOptions
    #: Set by an auditing Job: each child's identity is read at spawn, before
    #: anything can reap it, and kept as ``popen(...).tether_identity``.
    record_identity: bool = False

    @property
    @abc.abstractmethod
    def guarantee(self) -> Guarantee:
        """Which mechanism protects this job and what it does not cover."""

    @abc.abstractmethod
    def popen(self, args: Any, kwargs: dict[str, Any]) -> subprocess.Popen:
        """Start ``args`` inside the job with ``subprocess.Popen`` keywords.

        Raises ``JobRefused`` if the child could not be placed in the job
        (it is killed first), ``JobClosed`` if the job is closed, and the
        usual ``OSError``s (FileNotFoundError, PermissionError) of a failed
        exec, exactly as ``subprocess.Popen`` would.
        """

    @abc.abstractmethod
    def member_pids(self) -> list[int]:
        """PIDs (as seen by the owner) of every live member, escapees included."""

    @abc.abstractmethod
    def signal_all(self, sig: int) -> list[int]:
        """Send ``sig`` to every member (identity-checked); return the PIDs signalled."""

    @abc.abstractmethod
    def kill_all(self, timeout: float = 3.0) -> None:
        """End every member now and return once none is left (bounded)."""

    @abc.abstractmethod
    def close(self) -> None:
        """End every member and release the job. Idempotent."""

    def helper_pids(self) -> list[int]:
        """Processes of tether's own that live inside this job's kernel object
        (a cgroup job's keeper): not members, and a job this one is nested in
        must not count them or end them."""
        return []

    def step_aside(self) -> None:  # noqa: B027 - an optional hook: nothing to move by default
        """Move ``helper_pids`` out of the job's kernel object, because a job
        this one is nested in is about to end everything in it; they step back
        in when this job next starts a process."""

    def trace(self) -> dict[str, Any]:
        """Mechanism traces for the audit log and `tether ps` (cgroup path, keeper pid...)."""
        return {}
