"""Platform mechanisms behind one contract (see ``base``), and the one table
from a mechanism's name to its module.

``probe(name)``/``probe_all()`` say which mechanisms this machine offers and
why not; ``guarantee(name)`` is what a job of it guarantees (``tether
doctor`` prints it); ``choose()`` turns ``mechanism=`` and ``require=`` into
one name or a ``JobRefused`` naming the reason; ``open_job()`` opens a
backend; ``keeper_mechanism()`` is the class the POSIX keeper runs.

Import-light: names only here (the shell wrapper's one-command path imports
this package); each mechanism module is imported on first use.
"""

import sys

from ..errors import JobRefused

AUTO, STRICT = "auto", "strict"
CGROUP, SUBREAPER, PGROUP, PIDNS, JOBOBJECT, NONE = (
    "cgroup", "subreaper", "pgroup", "pidns", "jobobject", "none")
MECHANISM_NAMES = (AUTO, STRICT, CGROUP, SUBREAPER, PGROUP, PIDNS, JOBOBJECT, NONE)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType

    from .base import Availability, Guarantee, JobBackend, JobOptions, KeeperMechanism


def __getattr__(name: str):
    # `from tether.platform import Availability` keeps working, loaded on use.
    if name in ("Availability", "Guarantee", "JobBackend", "JobOptions"):
        from . import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


IS_WINDOWS = sys.platform == "win32"
IS_LINUX = sys.platform.startswith("linux")

#: The one table: mechanism name -> (module, what the module provides: a
#: ``Mechanism`` class the POSIX keeper runs, or a ``Backend`` of its own).
TABLE: dict[str, tuple[str, str]] = {
    CGROUP: ("linux_cgroup", "keeper"),
    SUBREAPER: ("linux_subreaper", "keeper"),
    PGROUP: ("posix_pgroup", "keeper"),
    PIDNS: ("linux_pidns", "keeper"),
    JOBOBJECT: ("windows", "backend"),
    NONE: ("none", "backend"),
}
#: What ``probe_all`` and ``tether doctor`` list (``none`` is never offered).
LISTED = (CGROUP, SUBREAPER, PGROUP, PIDNS, JOBOBJECT)
# Strongest transparent first; `auto` takes the first available.
AUTO_ORDER = (JOBOBJECT,) if IS_WINDOWS else (CGROUP, SUBREAPER, PGROUP)
STRICT_ORDER = (JOBOBJECT,) if IS_WINDOWS else (PIDNS,)
KERNEL_ENFORCED = frozenset({PIDNS, JOBOBJECT})

_cache: "dict[str, Availability]" = {}


def _check(name: str) -> None:
    if name not in TABLE:
        raise ValueError(f"unknown mechanism {name!r}; choose one of {', '.join(MECHANISM_NAMES)}")


def module(name: str) -> "ModuleType":
    """The module that implements mechanism ``name`` (imported now)."""
    _check(name)
    full = f"{__name__}.{TABLE[name][0]}"
    # __import__, not importlib: the package `importlib` (and `warnings`) cost
    # ~0.5 ms to load, and the shell wrapper's keeper asks for one mechanism.
    __import__(full)
    return sys.modules[full]


def probe(name: str) -> "Availability":
    """Whether mechanism ``name`` is available here, and why not (cached)."""
    _check(name)
    av = _cache.get(name)
    if av is None:
        if IS_WINDOWS and name not in (JOBOBJECT, NONE):
            from .base import Availability

            av = Availability(name, False, "not available on Windows (Job Objects are used there)")
        else:
            av = module(name).probe()
        _cache[name] = av
    return av


def probe_all() -> "list[Availability]":
    return [probe(n) for n in LISTED]


def guarantee(name: str, options: "JobOptions | None" = None) -> "Guarantee":
    """What a job of mechanism ``name`` guarantees (``options`` for one job)."""
    return module(name).guarantee(options)


def keeper_mechanism(name: str) -> "type[KeeperMechanism]":
    """The ``KeeperMechanism`` class of a POSIX keeper mechanism."""
    _check(name)
    if TABLE[name][1] != "keeper":
        raise ValueError(f"mechanism {name!r} is not run by the POSIX keeper")
    return module(name).Mechanism


def choose(mechanism: str = AUTO, require: str | None = None) -> str:
    """The mechanism a job gets, or JobRefused with the reason."""
    if mechanism not in MECHANISM_NAMES:
        raise ValueError(f"unknown mechanism {mechanism!r}; choose one of {', '.join(MECHANISM_NAMES)}")
    if require not in (None, "kernel"):
        raise ValueError(f"require must be None or 'kernel', not {require!r}")
    if mechanism in (AUTO, STRICT):
        order = STRICT_ORDER if (mechanism == STRICT or require == "kernel") else AUTO_ORDER
        reasons = []
        for name in order:
            av = probe(name)
            if av.available:
                return name
            reasons.append(f"{name}: {av.reason}")
        what = "no kernel-enforced mechanism" if order is STRICT_ORDER else "no mechanism"
        raise JobRefused(f"{what} is available here ({'; '.join(reasons)})",
                         reason="; ".join(reasons), mechanism=mechanism)
    av = probe(mechanism)
    if not av.available:
        raise JobRefused(f"mechanism {mechanism!r} is not available: {av.reason}",
                         reason=av.reason, mechanism=mechanism)
    if require == "kernel" and mechanism not in KERNEL_ENFORCED:
        raise JobRefused(f"require='kernel' but mechanism {mechanism!r} is keeper-enforced, "
                         "not kernel-enforced", reason="not kernel-enforced", mechanism=mechanism)
    return mechanism


def own_helpers() -> frozenset[int]:
    """Pids of tether's helpers for this process that end with it (a POSIX
    owner's warden, which forks Python keepers for a multi-threaded owner):
    a leak check does not count them. Empty where none was started."""
    warden = sys.modules.get(__name__.rpartition(".")[0] + ".keeper._warden")
    return warden.helper_pids() if warden is not None else frozenset()


def open_job(mechanism: str, options: "JobOptions") -> "JobBackend":
    """Open one job of ``mechanism`` (a name ``choose`` returned)."""
    _check(mechanism)
    if TABLE[mechanism][1] == "keeper":
        from ..keeper.posix import KeeperJob

        return KeeperJob(mechanism, options)
    return module(mechanism).Backend(options)
