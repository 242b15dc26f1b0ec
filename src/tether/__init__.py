"""tether: every process your program starts ends when your program ends.

    from tether import Job
    with Job(name="session-7") as job:
        p = job.popen(["node", "server.js"])

Imports are lazy so that `tether-shell` and other hot paths load only what
they use.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__version__ = "0.1.0"
__all__ = ["Job", "JobRefused", "JobClosed", "TetherError", "Guarantee", "probe_all", "choose",
           "Host", "__version__"]

_LAZY = {
    "Job": ("tether.job", "Job"),
    "JobRefused": ("tether.errors", "JobRefused"),
    "JobClosed": ("tether.errors", "JobClosed"),
    "TetherError": ("tether.errors", "TetherError"),
    "SignalRefused": ("tether.errors", "SignalRefused"),
    "Guarantee": ("tether.platform.base", "Guarantee"),
    "probe_all": ("tether.platform", "probe_all"),
    "choose": ("tether.platform", "choose"),
    "Host": ("tether.host", "Host"),
}


def __getattr__(name: str) -> Any:
    try:
        mod, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'tether' has no attribute {name!r}") from None
    import importlib

    value = getattr(importlib.import_module(mod), attr)
    globals()[name] = value
    return value
