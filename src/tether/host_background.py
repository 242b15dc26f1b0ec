"""A host's background jobs: work that outlives the app on purpose.

:class:`BackgroundJob` is what ``Host.background_job(name, ...)`` returns (a
long conversion, a scheduled build): its own job, never nested in the host
job, recorded ``background`` so no reaper ends it, CPU-capped and at low
priority, and bounded by its own ``timeout`` - enforced from inside the job
(``tether._bgwatch``) even after the host is gone. It lives apart from
:mod:`tether.host` because nothing in it concerns sessions or their keys;
the host imports it.

Linux priority of background jobs (``_lower_priority`` and ``_cpu_max``
below, applied by ``Host.background_job``): the job's keeper - the process that
starts every process of the job - is set to nice 19 and ``SCHED_IDLE``
right after the job opens, before anything is spawned. Every process it
starts inherits both from its first instruction, and so does everything
those start. Setting them on each pid after the spawn would race: the child
may fork (and its children keep the normal priority) before the call lands;
a ``nice``/``chrt`` wrapper would change the command's argv and need those
binaries. Where the job's cgroup has a ``cpu.max`` (a cgroup v2 with the cpu
controller), the CPU cap is written there as well. Windows: the Windows
backend applies ``cpu_percent`` (job CPU rate) and the below-normal class.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
from typing import Any

from .errors import JobExpired
from .identity import Identity
from .job import Job
from .platform import base as _base

TYPE_CHECKING = False
if TYPE_CHECKING:  # a hint only: host imports this module
    from .host import Host

logger = logging.getLogger("tether.host")  # one logger for the whole host layer
_LINUX = sys.platform.startswith("linux")


class BackgroundJob:
    """A job that outlives the host on purpose (a long conversion, a scheduled build).

    Not ended when the host ends or dies; recorded ``background`` so the
    reaper never touches it; CPU-capped and at low priority; bounded by
    ``timeout`` seconds from its creation, enforced from inside the job even
    after the host is gone. ``close()`` ends it now.
    """

    def __init__(self, host: Host, name: str, job: Job, cpu_percent: int | None,
                 timeout: float | None, limits: list[str]) -> None:
        self.host = host
        self.name = name
        self.job = job
        self.cpu_percent = cpu_percent
        self.timeout = timeout
        self.limits = limits  # what was applied: "nice 19", "SCHED_IDLE", "cpu.max 25%", ...
        self.created = time.monotonic()
        self.deadline = None if timeout is None else self.created + timeout
        self._watchdog: subprocess.Popen[Any] | None = None
        if timeout is not None and not _LINUX:
            # No /proc for the in-job watchdog: the timeout holds while the host
            # lives (a daemon timer); after the host is gone, it does not.
            self._timer = threading.Timer(timeout, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def _expire(self) -> None:
        with contextlib.suppress(Exception):
            logger.info("background job %r reached its %g s timeout", self.name, self.timeout)
            self.close()

    def __repr__(self) -> str:
        return f"<tether.BackgroundJob {self.name!r} {', '.join(self.limits) or 'no limits'}>"

    def _ensure_watchdog(self) -> None:
        if self.deadline is None or not _LINUX:
            return
        if self._watchdog is not None and self._watchdog.poll() is None:
            return
        left = self.deadline - time.monotonic()
        cg = self.job.trace().get("cgroup_path") or ""
        # The watchdog is tether's own module: let it import this very tether.
        src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        self._watchdog = self.job.popen(
            [sys.executable, "-m", "tether._bgwatch", f"{max(0.0, left):.3f}",
             f"{self.job.grace:.3f}", str(self.job.born), cg],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env)

    def popen(self, args: Any, **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``args`` in the background job (``subprocess.Popen`` keywords)."""
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise JobExpired(f"background job {self.name!r} is past its {self.timeout:g} s timeout")
        p = self.job.popen(args, **kwargs)
        self._ensure_watchdog()
        return p

    def run(self, args: Any, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """``subprocess.run`` in the background job (its timeout still applies)."""
        self._ensure_watchdog()
        if self.deadline is not None:
            left = max(0.0, self.deadline - time.monotonic())
            kwargs["timeout"] = min(kwargs.get("timeout") or left, left)
        return self.job.run(args, **kwargs)

    @property
    def guarantee(self) -> _base.Guarantee:
        return self.job.guarantee

    def members(self) -> list[Identity]:
        """Live processes of the job (its timeout watchdog left out)."""
        wd = self._watchdog.pid if self._watchdog is not None else None
        return [m for m in self.job.members() if m.pid != wd]

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the job has no process left; True if so within ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.members():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def trace(self) -> dict[str, Any]:
        return self.job.trace()

    def close(self) -> list[Identity]:
        """End every process of the job now (SIGTERM, grace, SIGKILL)."""
        ended = self.job.terminate()
        ended += self.job.close()
        self.host._background.discard(self)
        return ended


def _lower_priority(pid: int) -> list[str]:
    """nice 19 and SCHED_IDLE on ``pid`` (inherited by all it starts afterwards)."""
    done = []
    try:
        os.setpriority(os.PRIO_PROCESS, pid, 19)
        done.append("nice 19")
    except (OSError, AttributeError) as exc:
        done.append(f"nice not set ({getattr(exc, 'strerror', None) or exc})")
    try:
        os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
        done.append("SCHED_IDLE")
    except (OSError, AttributeError) as exc:
        done.append(f"SCHED_IDLE not set ({getattr(exc, 'strerror', None) or exc})")
    return done


def _cpu_max(cgroup_path: str | None, percent: int) -> str:
    """Write ``cpu.max`` for ``percent`` of the whole machine; say what happened."""
    if not cgroup_path:
        return "cpu.max not available (no cgroup for this job)"
    f = os.path.join(cgroup_path, "cpu.max")
    if not os.path.exists(f):
        return "cpu.max not available (the cpu controller is not enabled for this cgroup)"
    period = 100_000
    quota = max(1000, int(period * (os.cpu_count() or 1) * percent / 100))
    try:
        with open(f, "w") as fh:
            fh.write(f"{quota} {period}")
    except OSError as exc:
        return f"cpu.max not set ({exc.strerror or exc})"
    return f"cpu.max {percent}%"
