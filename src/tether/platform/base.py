"""The contract every platform mechanism fulfils.

A *job* is a bag of processes that the operating system keeps together: what
a member starts is a member, nothing in it can leave, and closing the job ends
every member. Each module in this package implements one mechanism behind the
two small interfaces below; ``tether.job.Job`` is written only against them.

Modules (the table that maps a name to its module is ``tether.platform``):
    linux_cgroup     cgroup v2 directory per job, ``cgroup.kill`` (transparent)
    linux_subreaper  a child-subreaper keeper, kill loop over /proc (transparent)
    posix_pgroup     process group + bounded capture (portable, weakest)
    linux_pidns      PID namespace per job, keeper is its init (strict)
    windows          Job Object with KILL_ON_JOB_CLOSE (transparent and strict)
    none             no safety net at all, only ever by name (opt-in)

Every mechanism module has ``probe() -> Availability`` and ``guarantee(options=None)
-> Guarantee`` (what a job of it guarantees; ``tether doctor`` prints it), and
either ``Mechanism`` (a ``KeeperMechanism``, below: the POSIX keeper
runs it) or ``Backend`` (a ``JobBackend`` of its own).

Rules for implementers:
  * ``probe()`` never raises and never leaves anything behind; it answers
    "available, or exactly why not".
  * A backend must never start a process outside its job when it was asked
    for one: if placement fails, the child is killed and ``JobRefused`` raised.
  * Processes are ended by ``tether.ending.end`` (which signals through
    ``tether.gate.send_signal``, identity-checked), never by a bare
    ``os.kill``; only the mechanism's own kernel kill (``cgroup.kill``, the
    subreaper's reap loop, ``TerminateJobObject``) is its own.
  * No module here imports ``tether.job``, ``tether.host`` or ``tether.cli``.
"""

import abc

TYPE_CHECKING = False
if TYPE_CHECKING:  # hints only: subprocess and typing cost start-up time
    import subprocess
    from collections.abc import Mapping
    from typing import Any, Literal, TypeVar

    _Env = TypeVar("_Env", bound="Mapping[Any, Any]")

# Mechanism names, identical in the API, the CLI and `tether doctor`.
AUTO = "auto"
STRICT = "strict"
CGROUP = "cgroup"
SUBREAPER = "subreaper"
PGROUP = "pgroup"
PIDNS = "pidns"
JOBOBJECT = "jobobject"
NONE = "none"
ALL_MECHANISMS = (CGROUP, SUBREAPER, PGROUP, PIDNS, JOBOBJECT, NONE)
MECHANISM_NAMES = (AUTO, STRICT) + ALL_MECHANISMS


class _Record:
    """A small immutable record: keyword fields with defaults, equality, repr.

    Written by hand, not with ``dataclasses`` (whose import pulls in
    ``inspect``, ~5 ms): the shell wrapper's keeper builds these.
    """

    __slots__: "tuple[str, ...]" = ()
    _defaults: "dict[str, Any]" = {}

    def __init__(self, *args: "Any", **kwargs: "Any") -> None:
        names = self.__slots__
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__}() takes {len(names)} arguments")
        values = dict(zip(names[: len(args)], args, strict=True))
        for k, v in kwargs.items():
            if k not in names:
                raise TypeError(f"{type(self).__name__}() got an unexpected argument {k!r}")
            if k in values:
                raise TypeError(f"{type(self).__name__}() got two values for {k!r}")
            values[k] = v
        for k in names:
            if k in values:
                v = values[k]
            elif k in self._defaults:
                v = self._defaults[k]
                v = v() if callable(v) else v
            else:
                raise TypeError(f"{type(self).__name__}() missing argument {k!r}")
            object.__setattr__(self, k, v)

    def __setattr__(self, name: str, value: "Any") -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, k) == getattr(other, k) for k in self.__slots__)

    def __hash__(self) -> int:
        return hash(tuple(_hashable(getattr(self, k)) for k in self.__slots__))

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__)
        return f"{type(self).__name__}({inner})"

    def replace(self, **changes: "Any") -> "Any":
        """A copy with ``changes`` applied."""
        values = {k: getattr(self, k) for k in self.__slots__}
        values.update(changes)
        return type(self)(**values)


def _hashable(v: "Any") -> "Any":
    return tuple(sorted(v.items())) if isinstance(v, dict) else v


class Availability(_Record):
    """Answer of a mechanism's ``probe()``: ``available``, or exactly why not."""

    __slots__ = ("mechanism", "available", "reason", "detail")
    _defaults = {"reason": "", "detail": dict}
    mechanism: str
    available: bool
    reason: str  # why not (or a note when available), one line
    detail: "dict[str, Any]"

    def to_dict(self) -> "dict[str, Any]":
        return {
            "mechanism": self.mechanism,
            "available": self.available,
            "reason": self.reason,
            "detail": dict(self.detail),
        }


class Guarantee(_Record):
    """What protects a job, on the two axes of the design brief.

    * ``kernel_enforced``: the job ends even if tether's keeper is killed
      first (the kernel, not a process of ours, pulls the trigger).
    * ``transparent``: the job's processes see the same PIDs, users and /proc
      as without tether; ``visible`` lists what they would notice otherwise.
    * ``not_covered``: what this mechanism cannot catch, stated plainly.
    * ``disabled``: set when the safety net is OFF, with the reason (for
      instance a Win32 error code); such a job protects nothing.
    """

    __slots__ = ("mechanism", "kernel_enforced", "transparent", "ends_job", "visible",
                 "not_covered", "disabled")
    _defaults = {"visible": (), "not_covered": (), "disabled": None}
    mechanism: str
    kernel_enforced: bool
    transparent: bool
    ends_job: str  # who ends the job when the owner dies
    visible: tuple[str, ...]
    not_covered: tuple[str, ...]
    disabled: str | None

    def to_dict(self) -> "dict[str, Any]":
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
        kind = "kernel-enforced" if self.kernel_enforced else "keeper-enforced"
        seen = "transparent" if self.transparent else "visible: " + "; ".join(self.visible)
        text = f"{self.mechanism} ({kind}, {seen}); ended by {self.ends_job}"
        if self.not_covered:
            text += "; does not cover: " + "; ".join(self.not_covered)
        return text


class JobOptions(_Record):
    """Everything a backend needs to open one job."""

    __slots__ = ("name", "job_id", "parent", "background", "cpu_percent", "low_priority",
                 "reason", "cookie", "cookie_var")
    _defaults = {"parent": None, "background": False, "cpu_percent": None,
                 "low_priority": False, "reason": None, "cookie": None,
                 "cookie_var": "TETHER_JOB"}
    name: str
    job_id: str  # unique per owner run, safe in file names
    parent: "JobBackend | None"  # nested job: ends when the parent ends
    background: bool  # not ended with the owner (host background jobs)
    cpu_percent: int | None  # hard CPU cap for background jobs
    low_priority: bool
    reason: str | None  # mechanism "none": why the job has no safety net
    cookie: str | None  # put first in every spawned process's environment ...
    cookie_var: str  # ... as cookie_var=cookie (tether.identity.COOKIE_VAR by default)


def with_cookie(env: "_Env", options: "JobOptions") -> "_Env | dict[Any, Any]":
    """``env`` (str or bytes keys, as given) with the job's cookie entry first."""
    if not options.cookie:
        return env
    key: str | bytes
    value: str | bytes
    if env and isinstance(next(iter(env)), bytes):
        key, value = options.cookie_var.encode(), options.cookie.encode()
    else:
        key, value = options.cookie_var, options.cookie
    out = {key: value}
    out.update(env)  # at C speed; a cookie already in env lands in the first slot...
    out[key] = value  # ... and is ours again
    return out


class JobBackend(abc.ABC):
    """One open job, seen from the owner's process.

    ``popen`` returns a real ``subprocess.Popen`` or a subclass of it, so
    pipes, ``communicate``, ``wait``, ``poll``, ``send_signal`` behave as
    users expect. The child is a member before it runs its first
    instruction.
    """

    mechanism: str
    options: "JobOptions"
    #: Set by an auditing Job: each child's identity is read at spawn, before
    #: anything can reap it, and kept as ``popen(...).tether_identity``.
    record_identity: bool = False

    @property
    @abc.abstractmethod
    def guarantee(self) -> "Guarantee":
        """Which mechanism protects this job and what it does not cover."""

    @abc.abstractmethod
    def popen(self, args: "Any", kwargs: "dict[str, Any]") -> "subprocess.Popen":
        """Start ``args`` inside the job with ``subprocess.Popen`` keywords.

        The child's environment (``env=``, or this process's) gets
        ``options.cookie_var=options.cookie`` as its first entry, replacing any
        earlier value (:func:`with_cookie`): every process of the job, and what
        it starts, carries the job's cookie unless it clears its environment.

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
    def kill_all(self, timeout: float | None = None) -> None:
        """End every member now, the mechanism's own way (``cgroup.kill``, a
        kill loop, ``TerminateJobObject``), and return once none is left
        (bounded by ``timeout``; None: ``tether.ending.KILL_BOUND``)."""

    @abc.abstractmethod
    def close(self) -> None:
        """End every member and release the job. Idempotent."""

    def let_go(self) -> None:  # noqa: B027 - a backend with nothing per process has nothing to drop
        """In a forked child of the owner: drop this process's copy of the job
        (its end of the keeper's socket), ending nothing - the job is its
        owner's, which may still use it."""

    def trace(self) -> "dict[str, Any]":
        """Mechanism traces for the audit log and `tether ps` (cgroup path, keeper pid...)."""
        return {}


# -- the POSIX keeper's side of the contract ------------------------------------------
#
# A ``KeeperMechanism`` is built in the owner, where ``prepare`` may create
# kernel objects such as a cgroup and so fail early, before anything runs.
# On Linux the keeper of cgroup, subreaper and pidns jobs is the native
# program, which gets what it needs on its command line (``keeper.native``);
# the owner side is all these classes do there. The Python keeper
# (``keeper._keeper``) keeps pgroup, the mechanism of macOS and the BSDs: its
# class reaches the keeper by fork, or is rebuilt in the warden from
# ``params``, and runs the keeper side below.


class _NoContext:
    __slots__ = ()

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: object) -> "Literal[False]":
        return False


class KeeperMechanism:
    """One job's mechanism, as seen by its keeper and by the owner."""

    name = "?"
    kernel_keeps_members = False  # members stay listed by the kernel when the keeper dies
    kernel_enforced = False
    transparent = True
    # the keeper keeps every child it ever spawned (Keeper.spawned): only a
    # mechanism that ends the job by their process groups needs that list,
    # which grows with every spawn for the job's whole life
    keeps_spawned = False
    # a spawn that asks for no group of its own joins the owner's process
    # group (False: it leads its own)
    joins_owner_group = True

    def __init__(self, options: "JobOptions", owner_pid: int, owner_start: int, **params: "Any"):
        self.options = options
        self.owner_pid = owner_pid
        self.owner_start = owner_start
        self.params = params
        self.born_after = params.get("born_after", 0)

    # owner side ---------------------------------------------------------------
    def prepare(self) -> None:
        """Create what the job needs before the keeper starts; raise OSError to refuse."""

    def params_for_keeper(self) -> "dict[str, Any]":
        return dict(self.params)

    def note_spawn(self, pid: int, start: "int | None" = None) -> None:
        """The owner learnt of a new direct child (pid as the owner sees it;
        ``start``: its start ticks, as its keeper read them)."""

    def member_pids(self, keeper_pid: int) -> list[int]:
        raise NotImplementedError

    def guarantee(self) -> "Guarantee":
        """What this job guarantees: its mechanism module's ``guarantee``."""
        import sys

        return sys.modules[type(self).__module__].guarantee(self.options)

    def owner_cleanup(self) -> None:
        """Owner-side cleanup after the keeper is gone (best effort)."""

    # keeper side --------------------------------------------------------------
    def keeper_setup(self, keeper) -> None:
        pass

    def spawn_context(self):
        return _NoContext()

    def spawn_attrs(self, msg: dict) -> "dict[str, Any]":
        return {}

    def kill_all(self, keeper, timeout: float) -> None:
        raise NotImplementedError

    def end_for_dead_owner(self, keeper) -> None:
        """The owner is gone: end every member at once, no grace."""
        from ..ending import KILL_BOUND

        try:
            self.kill_all(keeper, timeout=KILL_BOUND)
        finally:
            keeper.reap()
            self.cleanup(keeper)

    def cleanup(self, keeper) -> None:
        pass

    def trace(self) -> "dict[str, Any]":
        return {}
