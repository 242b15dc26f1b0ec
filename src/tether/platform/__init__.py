"""Platform mechanisms behind one contract (see ``base``).

``probe_all()`` says which mechanisms this machine offers and why not;
``choose()`` turns ``mechanism=`` and ``require=`` into one mechanism name or
a ``JobRefused`` naming the reason; ``open_job()`` opens a backend.
"""

from __future__ import annotations

import sys

from ..errors import JobRefused

# Names only: importing .base (dataclasses -> inspect, ~5 ms) here would make
# every submodule, including tether-shell's one-command path, pay for it.
AUTO, STRICT = "auto", "strict"
CGROUP, SUBREAPER, PGROUP, PIDNS, JOBOBJECT = "cgroup", "subreaper", "pgroup", "pidns", "jobobject"
MECHANISM_NAMES = (AUTO, STRICT, CGROUP, SUBREAPER, PGROUP, PIDNS, JOBOBJECT)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .base import Availability, JobBackend, JobOptions


def __getattr__(name: str):
    # `from tether.platform import Availability` keeps working, loaded on use.
    if name in ("Availability", "JobBackend", "JobOptions"):
        from . import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

IS_WINDOWS = sys.platform == "win32"
IS_LINUX = sys.platform.startswith("linux")

# Strongest transparent first; `auto` takes the first available.
AUTO_ORDER = (JOBOBJECT,) if IS_WINDOWS else (CGROUP, SUBREAPER, PGROUP)
STRICT_ORDER = (JOBOBJECT,) if IS_WINDOWS else (PIDNS,)
KERNEL_ENFORCED = {PIDNS, JOBOBJECT}

_cache: dict[str, Availability] = {}


def probe(name: str) -> Availability:
    if name in _cache:
        return _cache[name]
    from .base import Availability
    if name == JOBOBJECT:
        if not IS_WINDOWS:
            av = Availability(JOBOBJECT, False, "not Windows")
        else:
            from .windows import probe as p

            av = p()
    elif IS_WINDOWS:
        av = Availability(name, False, "not available on Windows (Job Objects are used there)")
    elif name == CGROUP:
        from .linux_cgroup import probe as p

        av = p()
    elif name == SUBREAPER:
        from .linux_subreaper import probe as p

        av = p()
    elif name == PIDNS:
        from .linux_pidns import probe as p

        av = p()
    elif name == PGROUP:
        from .posix_pgroup import probe as p

        av = p()
    else:
        raise ValueError(f"unknown mechanism {name!r}; choose one of {', '.join(MECHANISM_NAMES)}")
    _cache[name] = av
    return av


def probe_all() -> list[Availability]:
    return [probe(n) for n in (CGROUP, SUBREAPER, PGROUP, PIDNS, JOBOBJECT)]


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
        raise JobRefused(f"{what} is available here ({'; '.join(reasons)})")
    av = probe(mechanism)
    if not av.available:
        raise JobRefused(f"mechanism {mechanism!r} is not available: {av.reason}")
    if require == "kernel" and mechanism not in KERNEL_ENFORCED:
        raise JobRefused(f"require='kernel' but mechanism {mechanism!r} is guardian-enforced, "
                         "not kernel-enforced")
    return mechanism


def open_job(mechanism: str, options: JobOptions) -> JobBackend:
    if mechanism == JOBOBJECT:
        from .windows import WindowsJob

        return WindowsJob(options)
    from .posix import KeeperJob

    return KeeperJob(mechanism, options)
