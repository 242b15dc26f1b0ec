"""tether: every process your program starts ends when your program ends.

    from tether import Job
    with Job(name="session-7") as job:
        p = job.popen(["node", "server.js"])

    import tether
    tether.run(["make", "test"], timeout=600)   # subprocess.run; nothing it starts outlives it

The rooms, and which way data flows (callers on the left, leaves on the
right; nothing on the right imports anything to its left)::

    cli, shell, host, pty, runner  ->  job  ->  platform (one module per mechanism)
                                         \\          \\
                                          ->  identity  (the one process reader; the signal gate)
                                              cgroupfs  (cgroup v2 files and tether's names)
                                              ending    (the one way to end processes)
                                              audit, runs (the log, and the one reader to runs)
    reaper, ps  ->  runs, identity, cgroupfs, ending

Imports are lazy so that ``tether-shell`` and other hot paths load only
what they use; type checkers see every public name through the
``TYPE_CHECKING`` block below.
"""

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .dropin import Popen, run
    from .errors import (
        HostClosed,
        JobClosed,
        JobExpired,
        JobRefused,
        SessionHeld,
        ShellNotFound,
        SignalRefused,
        TetherError,
        Unavailable,
        UsageError,
    )
    from .host import Host, Session
    from .identity import Identity
    from .job import Job
    from .platform import choose, probe_all
    from .platform.base import Guarantee
    from .pty import PtySession
    from .reaper import ReapReport, reap
    from .stops import EndedWork

__version__ = "0.2.0"  # the one version: pyproject.toml and setup.py read it here
__all__ = [
    "Job", "run", "Popen", "Host", "Session", "PtySession", "reap", "ReapReport", "EndedWork", "Identity",
    "Guarantee", "probe_all", "choose", "TetherError", "JobRefused", "JobClosed",
    "HostClosed", "SessionHeld", "JobExpired", "SignalRefused", "UsageError", "ShellNotFound",
    "Unavailable", "__version__",
]

_LAZY = {
    "Job": ("tether.job", "Job"),
    "run": ("tether.dropin", "run"),
    "Popen": ("tether.dropin", "Popen"),
    "Host": ("tether.host", "Host"),
    "Session": ("tether.host", "Session"),
    "PtySession": ("tether.pty", "PtySession"),
    "reap": ("tether.reaper", "reap"),
    "ReapReport": ("tether.reaper", "ReapReport"),
    "EndedWork": ("tether.stops", "EndedWork"),
    "Identity": ("tether.identity", "Identity"),
    "Guarantee": ("tether.platform.base", "Guarantee"),
    "probe_all": ("tether.platform", "probe_all"),
    "choose": ("tether.platform", "choose"),
    **{name: ("tether.errors", name) for name in (
        "TetherError", "JobRefused", "JobClosed", "HostClosed", "SessionHeld", "JobExpired",
        "SignalRefused", "UsageError", "ShellNotFound", "Unavailable")},
}


def __getattr__(name: str) -> "Any":
    try:
        mod, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'tether' has no attribute {name!r}") from None
    import importlib

    value = getattr(importlib.import_module(mod), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
