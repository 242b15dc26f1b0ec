"""Hosts of long-lived agent sessions: one job per app, a job per session.

    from tether import Host
    with Host("my-agent-app") as host:
        s = host.session("chat-42")              # ends its own leftover copy first
        agent = s.popen(["claude", "-p", ...])   # starts only inside the session's job
        s.tasks.started("b1x", "npm run build")  # or feed StreamAdapter(s.tasks)
        print(s.stop("user request"))            # "Stopped (user request): ended ..."

What a host gives an app:

* **One host job per app instance**; every session's job is nested in it, so
  the app's death - crash, force-kill, OOM - ends every session's tree.
  ``host.guarantee`` says what protects them. If nothing can, one loud warning
  ``orphan-on-crash safety net DISABLED: <reason>`` (a :class:`SafetyNetWarning`)
  and sessions run unprotected - or, with ``require="kernel"``, refuse.
* **The reaper on start**: leftovers of the same app's earlier runs that the
  audit proves are theirs are ended; the report is ``host.reap_report``.
* **The resume rule**: ``host.session(key)`` first ends a copy of that session
  left alive by an earlier run (same app, same key, owner gone, identity
  matches), so one session never runs two agents on one working tree. What it
  ended is ``session.resumed``.
* **Stops that say what they ended**: ``session.stop(reason)`` returns an
  :class:`EndedWork`; every stop announces what it will end *before* ending it
  (``Host(announce=...)`` and the ``tether.host`` logger at INFO).
* **The live-task ledger** (``session.tasks``, see ``tether.ledger``): an
  optional stop (``optional=True``, e.g. an idle release) is skipped, or waits,
  while a task is live - up to ``task_cap`` seconds (default 30 minutes) from
  the first time it was held off; then it proceeds. A stop asked for by a
  person is never held.
* **Background jobs** that outlive the host on purpose, CPU-capped and at low
  priority, bounded by their own timeout, recorded so the reaper leaves them.
* **Detached launches** (an editor, a browser window) outside every job,
  recorded as detached, never reaped.

Linux priority of background jobs: the job's keeper - the process that
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
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import identity
from . import job as _job
from .ending import DEFAULT_GRACE, check_grace
from .errors import HostClosed, JobExpired, JobRefused, TetherError
from .identity import Identity
from .job import Job
from .ledger import Ledger, Task
from .platform import base as _base
from .stops import (
    APP_EXIT,
    RESUME,
    SESSION_CLOSED,
    USER_REQUEST,
    EndedProcess,
    EndedTask,
    EndedWork,
    argv_label,
    format_duration,
)

__all__ = ["Host", "Session", "BackgroundJob", "SafetyNetWarning"]

logger = logging.getLogger("tether.host")

DEFAULT_TASK_CAP = 30 * 60.0
_LINUX = sys.platform.startswith("linux")


class SafetyNetWarning(RuntimeWarning):
    """The host could not open a job: sessions run without the orphan-on-crash net."""


def _runtime(ident: Identity) -> float:
    return max(0.0, (identity.now_ticks() - ident.start) / identity.clock_ticks())


# ---------------------------------------------------------------------------
# Jobs that carry the app name into the audit


class _AppJob(Job):
    """A ``Job`` whose audit records carry the host's ``app`` name."""

    def __init__(self, *args: Any, app: str, **kwargs: Any) -> None:
        self.app = app
        super().__init__(*args, **kwargs)

    def _log(self, event: str, **fields: Any) -> None:
        fields.setdefault("app", self.app)
        super()._log(event, **fields)


# ---------------------------------------------------------------------------
# Sessions


class Session:
    """One agent session: a job nested in the host job, its ledger, its stop.

    ``popen``/``run``/``create_subprocess_exec`` start processes only inside
    the session's job (the job refuses, with ``JobRefused``, rather than
    start anything outside it). ``stop(reason)`` ends the whole tree.
    """

    def __init__(self, host: Host, key: str, job: Job, resumed: EndedWork) -> None:
        self.host = host
        self.key = key
        self.job = job
        self.resumed = resumed
        self.started = time.time()
        self.tasks = Ledger(self.members)
        self.ended: EndedWork | None = None
        self._labels: dict[int, tuple[Identity, str]] = {}
        self._held_since: float | None = None
        self._stop_lock = threading.Lock()

    def __repr__(self) -> str:
        state = "stopped" if self.closed else "open"
        return f"<tether.Session {self.key!r} of {self.host.app!r} {state}>"

    # -- starting --------------------------------------------------------------------
    def popen(self, args: Any, *, label: str | None = None, **kwargs: Any) -> subprocess.Popen:
        """``subprocess.Popen`` inside the session's job. ``label`` names the
        process in stop reports (default: its command line)."""
        # Only a label the app chose goes to the audit log: the command line
        # is not metadata, and stays in memory unless the app opts in.
        p = self.job.popen(args, label=label, **kwargs)
        ident = getattr(p, "tether_identity", None) or identity.read(p.pid)
        if ident is not None:  # None: it is already gone
            self._labels[p.pid] = (ident, label or argv_label(args))
            self.tasks.not_a_task(ident)  # the agent itself is no task's process
        return p

    def run(self, args: Any, **kwargs: Any) -> subprocess.CompletedProcess:
        """``subprocess.run`` inside the session's job."""
        return self.job.run(args, **kwargs)

    async def create_subprocess_exec(self, program: Any, *args: Any, **kwargs: Any):
        """asyncio's ``create_subprocess_exec`` inside the session's job."""
        return await self.job.create_subprocess_exec(program, *args, **kwargs)

    # -- state ----------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self.job.closed

    @property
    def guarantee(self) -> _base.Guarantee:
        return self.job.guarantee

    def members(self) -> list[Identity]:
        """Every live process of the session, escapees included."""
        return self.job.members()

    def trace(self) -> dict[str, Any]:
        return self.job.trace()

    # -- stopping ---------------------------------------------------------------------
    def stop(self, reason: str = USER_REQUEST, *, optional: bool = False, wait: bool = False,
             cap: float | None = None, grace: float | None = None) -> EndedWork:
        """End the session's whole tree and say what that ended.

        ``optional=True`` (an idle release, a memory trim): while a task in
        ``tasks`` is live the stop is skipped (``wait=False``; the report has
        ``skipped=True``) or waits for it (``wait=True``) - up to ``cap``
        seconds (default ``host.task_cap``) counted from the first time this
        session's optional stops were held off; then it proceeds. Any other
        stop goes through at once. Every stop that will end something is
        announced before it ends it.
        """
        if optional and not self.closed:
            # Not under the stop lock: a person's stop must never queue behind
            # an idle release that is waiting for a task.
            cap = self.host.task_cap if cap is None else float(cap)
            held = self._hold(reason, wait, cap)
            if held is not None:
                return held
        with self._stop_lock:
            if self.closed:
                return EndedWork(reason, self.key, optional=optional)
            if optional and self._held_since is None and self.tasks.live():
                # A task started between the check above and now.
                held = self._hold(reason, False, self.host.task_cap if cap is None else cap)
                if held is not None:
                    return held
            plan = self._plan(reason, optional)
            self.host._announce(plan)
            report = self._end(plan, grace)
            self.ended = report
            self.host._forget(self)
            return report

    def close(self) -> EndedWork:
        """Stop with reason ``session closed`` (announced like any stop)."""
        return self.stop(SESSION_CLOSED)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _hold(self, reason: str, wait: bool, cap: float) -> EndedWork | None:
        live = self.tasks.live()
        if not live:
            self._held_since = None
            return None
        now = time.monotonic()
        if self._held_since is None:
            self._held_since = now
        deadline = self._held_since + cap
        while wait and live and not self.closed and time.monotonic() < deadline:
            # Short slices: a stop by someone else ends the wait at once.
            self.tasks.wait_idle(min(0.1, max(0.0, deadline - time.monotonic())))
            live = self.tasks.live()
        if self.closed:
            return EndedWork(reason, self.key, optional=True, skipped=True,
                             note=f"{reason} superseded: the session was stopped meanwhile")
        if not live:
            self._held_since = None
            return None
        if time.monotonic() >= deadline:
            logger.info("%s of session %r proceeds: live task(s) held it off for the %s cap",
                        reason, self.key, format_duration(cap))
            return None
        names = [t.label for t in live]
        note = (f"{reason} skipped: `{names[0]}` is live (running "
                f"{format_duration(live[0].runtime_s)})")
        if len(names) > 1:
            note += f" and {len(names) - 1} more"
        return EndedWork(reason, self.key, optional=True, skipped=True, held_by=names, note=note)

    def _label_of(self, m: Identity) -> tuple[str, bool]:
        """(label, started by the host itself) of a member."""
        known = self._labels.get(m.pid)
        if known is not None and known[0].same_process(m):
            return known[1], True
        return m.comm or str(m.pid), False

    def _plan(self, reason: str, optional: bool) -> EndedWork:
        live_tasks = self.tasks.live()
        members = self.members()
        by_task: dict[int, Task] = {}
        for t in live_tasks:
            for pid in t.processes:
                by_task[pid] = t
        tasks: dict[str, EndedTask] = {
            t.task_id: EndedTask(t.task_id, t.label, t.runtime_s, t.status) for t in live_tasks}
        procs: list[EndedProcess] = []
        for m in members:
            label, root = self._label_of(m)
            ep = EndedProcess(m.pid, label, _runtime(m), m, root)
            t = by_task.get(m.pid)
            if t is not None and t.processes[m.pid].same_process(m):
                tasks[t.task_id].processes.append(ep)
            else:
                procs.append(ep)
        return EndedWork(reason, self.key, tasks=list(tasks.values()), processes=procs,
                         optional=optional, planned=True)

    def _end(self, plan: EndedWork, grace: float | None) -> EndedWork:
        grace = self.job.grace if grace is None else grace
        try:
            self.job.terminate(grace)
        finally:
            self.job.close()
        self.tasks.stopped(plan.reason)
        self._held_since = None
        ended_procs = [p for p in plan.processes if p.identity is None
                       or not identity.is_alive(p.identity)]
        ended_tasks = []
        for t in plan.tasks:
            gone = [p for p in t.processes if p.identity is None or not identity.is_alive(p.identity)]
            if len(gone) == len(t.processes):
                ended_tasks.append(EndedTask(t.task_id, t.label, t.runtime_s, t.status, gone))
        return EndedWork(plan.reason, self.key, tasks=ended_tasks, processes=ended_procs,
                         optional=plan.optional)


# ---------------------------------------------------------------------------
# Background jobs

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
        self._watchdog: subprocess.Popen | None = None
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

    def popen(self, args: Any, **kwargs: Any) -> subprocess.Popen:
        """Start ``args`` in the background job (``subprocess.Popen`` keywords)."""
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise JobExpired(f"background job {self.name!r} is past its {self.timeout:g} s timeout")
        p = self.job.popen(args, **kwargs)
        self._ensure_watchdog()
        return p

    def run(self, args: Any, **kwargs: Any) -> subprocess.CompletedProcess:
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


# ---------------------------------------------------------------------------
# The host


class Host:
    """One application instance that runs agent sessions; see the module doc.

    ``app``: the application's name (reaping and the resume rule only ever
    look at records of the same app). ``state_dir``: where the audit log
    lives (default: the user's, ``tether.audit.default_state_dir()``).
    ``require="kernel"``: sessions refuse to start unless a kernel-enforced
    mechanism holds them. ``announce(plan)`` is called before every stop
    that will end something, with an :class:`EndedWork` whose
    ``announcement()`` is the line to show.
    """

    def __init__(
        self,
        app: str,
        state_dir: str | os.PathLike[str] | None = None,
        require: str | None = None,
        *,
        mechanism: str = "auto",
        grace: float = DEFAULT_GRACE,
        task_cap: float = DEFAULT_TASK_CAP,
        announce: Callable[[EndedWork], Any] | None = None,
        reap: bool = True,
    ) -> None:
        if not app or not isinstance(app, str):
            raise ValueError("app must be a non-empty string")
        if require not in (None, "kernel"):
            raise ValueError(f"require must be None or 'kernel', not {require!r}")
        from . import audit

        self.app = app
        self.require = require
        self.mechanism = mechanism
        self.grace = check_grace(grace)
        self.task_cap = float(task_cap)
        self.announce = announce
        self.state_dir = Path(state_dir) if state_dir is not None else audit.default_state_dir()
        self.run = _job.run_id()
        self.reap_report: Any = None
        self.reap_error: str | None = None
        self.safety_net_disabled: str | None = None
        self._sessions: dict[str, Session] = {}
        self._background: set[BackgroundJob] = set()
        self.detached: list[subprocess.Popen] = []
        self._closed = False
        self._lock = threading.RLock()
        self._audit = audit.AuditWriter(self.state_dir)
        self._write("run-start")
        # One read of the log (a long one costs seconds), shared by the reap
        # at start and the resume rule of every session opened later: both are
        # the reaper, the resume rule filtered to one session key.
        self._runs: dict[str, Any] | None = None
        self._resume_error: str | None = None
        try:
            from .runs import read_runs

            self._runs = read_runs(self.state_dir)
        except (TetherError, OSError, ValueError) as exc:  # an unreadable log must not stop the app
            self._resume_error = self.reap_error = f"{type(exc).__name__}: {exc}"
            logger.warning("tether host %r: cannot read the audit log: %s", self.app,
                           self._resume_error)
        if reap and self._runs is not None:
            self._reap_earlier_runs()
        self.job: Job = self._open_host_job()

    # -- plumbing ------------------------------------------------------------------
    def _write(self, event: str, **fields: Any) -> None:
        me = identity.read(os.getpid())
        fields.setdefault("run", self.run)
        fields.setdefault("owner", {"pid": os.getpid(), "start": me.token() if me else None})
        fields.setdefault("app", self.app)
        self._audit.write(event, **fields)

    def _reap_earlier_runs(self) -> None:
        try:
            from .reaper import reap
        except ImportError as exc:  # the reaper is a separate room; say so, do not fail
            self.reap_error = f"reaper not available: {exc}"
            logger.warning("tether host %r: %s", self.app, self.reap_error)
            return
        try:
            self.reap_report = reap(self.state_dir, app=self.app, grace=self.grace,
                                    exclude_runs={self.run}, runs=self._runs)
        except (TetherError, OSError, ValueError) as exc:  # a failed reap must not stop the app
            self.reap_error = f"{type(exc).__name__}: {exc}"
            logger.warning("tether host %r: reaping earlier runs failed: %s", self.app,
                           self.reap_error)
            return
        text = str(self.reap_report).strip()
        if getattr(self.reap_report, "ended", None):
            logger.info("tether host %r: %s", self.app, text)

    def _open_host_job(self) -> Job:
        try:
            job: Job = _AppJob(name=self.app, mechanism=self.mechanism, grace=self.grace,
                               require=self.require, state_dir=self.state_dir, app=self.app)
        except JobRefused as exc:
            self._disable(str(exc))
            return _AppJob(name=self.app, mechanism="none", reason=str(exc), grace=self.grace,
                           state_dir=self.state_dir, app=self.app)
        if job.guarantee.disabled:
            self._disable(job.guarantee.disabled)
        return job

    def _disable(self, reason: str) -> None:
        self.safety_net_disabled = reason
        # One warning, through the warnings system (logging.captureWarnings
        # routes it to logging); apps can escalate SafetyNetWarning to an error.
        warnings.warn(f"orphan-on-crash safety net DISABLED: {reason}", SafetyNetWarning,
                      stacklevel=4)

    def _announce(self, plan: EndedWork) -> None:
        if not plan:
            return
        logger.info("%s", plan.announcement())
        if self.announce is not None:
            try:
                self.announce(plan)
            except Exception:  # noqa: BLE001 - an app's callback must not block a stop
                logger.exception("tether host %r: announce callback failed", self.app)

    def _forget(self, session: Session) -> None:
        with self._lock:
            if self._sessions.get(session.key) is session:
                del self._sessions[session.key]

    # -- state ------------------------------------------------------------------------
    @property
    def guarantee(self) -> _base.Guarantee:
        """What protects every session's processes (``disabled`` says when nothing does)."""
        return self.job.guarantee

    @property
    def sessions(self) -> dict[str, Session]:
        """Open sessions by key."""
        with self._lock:
            return dict(self._sessions)

    @property
    def background_jobs(self) -> list[BackgroundJob]:
        return list(self._background)

    def members(self) -> list[Identity]:
        """Every live process of every session (background and detached left out)."""
        seen: dict[int, Identity] = {}
        for m in self.job.members():
            seen[m.pid] = m
        for s in self.sessions.values():
            for m in s.members():
                seen[m.pid] = m
        return list(seen.values())

    def __repr__(self) -> str:
        return f"<tether.Host {self.app!r} {self.job.mechanism} sessions={len(self._sessions)}>"

    # -- sessions ---------------------------------------------------------------------
    def session(self, key: str, *, grace: float | None = None) -> Session:
        """The session ``key``: a job inside the host job.

        Returns the open one if this host already has it. Otherwise, first
        ends a copy of ``key`` left alive by an earlier run of this app (see
        the resume rule) and reports it as ``session.resumed``.
        Raises ``JobRefused`` (``process-tree ownership could not be
        established: ...``) when the host runs without a safety net and
        ``require="kernel"`` was asked for.
        """
        key = str(key)
        with self._lock:
            if self._closed:
                raise HostClosed(f"host {self.app!r} is closed")
            existing = self._sessions.get(key)
            if existing is not None and not existing.closed:
                return existing
            if self.safety_net_disabled and self.require == "kernel":
                raise JobRefused("process-tree ownership could not be established: "
                                 f"{self.safety_net_disabled}")
            resumed = self._takeover(key)
            g = self.grace if grace is None else check_grace(grace)
            name = f"{self.app}:{key}"
            if self.job.mechanism == "none":
                job: Job = _AppJob(name=name, mechanism="none", grace=g,
                                   reason=self.safety_net_disabled, state_dir=self.state_dir,
                                   session=key, app=self.app)
            else:
                job = _AppJob(name=name, mechanism=self.job.mechanism, grace=g,
                              require=self.require, state_dir=self.state_dir, parent=self.job,
                              session=key, app=self.app)
            s = Session(self, key, job, resumed)
            self._sessions[key] = s
            return s

    def _takeover(self, key: str) -> EndedWork:
        """The resume rule: end what an earlier run left of session ``key`` -
        the reaper, filtered to that key, on the log read at start."""
        report = EndedWork(RESUME, key)
        # What the start-up reap already ended of this key belongs in its report.
        for e in getattr(self.reap_report, "ended", None) or []:
            if e.session == key:
                report.processes.append(_ended_process(e))
        if self._resume_error is not None:
            report.note = f"resume check failed: {self._resume_error}"
            return report
        from .reaper import OWNER_ALIVE, reap

        def announce(plan: Any) -> None:
            self._announce(EndedWork(RESUME, key, processes=[_ended_process(e) for e in plan.ended],
                                     planned=True))

        try:
            rep = reap(self.state_dir, app=self.app, session=key, grace=self.grace,
                       exclude_runs={self.run}, runs=self._runs, announce=announce)
        except (TetherError, OSError, ValueError) as exc:  # must not stop the session
            report.note = f"resume check failed: {type(exc).__name__}: {exc}"
            return report
        report.processes.extend(_ended_process(e) for e in rep.ended)
        holders = sorted({s.run.split("-")[0] for s in rep.skipped if s.reason == OWNER_ALIVE})
        if holders:
            report.held_by = holders
            report.note = (f"session {key!r} is also open in a live run of {self.app!r} "
                           f"(owner pid {', '.join(holders)}); left alone")
            logger.warning("tether host %r: %s", self.app, report.note)
        return report

    # -- background and detached ------------------------------------------------------------
    def background_job(self, name: str, cpu_percent: int | None = 25,
                       timeout: float | None = None, *, grace: float | None = None) -> BackgroundJob:
        """A job that is NOT ended with the host: CPU-capped, low priority,
        bounded by ``timeout`` seconds, recorded ``background`` (never reaped)."""
        if cpu_percent is not None and not 1 <= int(cpu_percent) <= 100:
            raise ValueError("cpu_percent must be between 1 and 100")
        if timeout is not None and timeout <= 0:
            raise ValueError("timeout must be > 0 seconds")
        # A background job is never nested in the host job (the host's death
        # would take it along) and never in a PID namespace (it outlives its
        # owner on purpose; the transparent mechanisms keep its PIDs real).
        mech = self.mechanism if self.mechanism in ("cgroup", "subreaper", "pgroup") else "auto"
        job = _AppJob(name=f"{self.app}:bg:{name}", mechanism=mech,
                      grace=self.grace if grace is None else check_grace(grace),
                      state_dir=self.state_dir, background=True,
                      cpu_percent=cpu_percent, app=self.app)
        limits: list[str] = []
        if _LINUX:
            keeper = job.trace().get("keeper_pid")
            if keeper:
                limits += _lower_priority(int(keeper))
            if cpu_percent is not None:
                limits.append(_cpu_max(job.trace().get("cgroup_path"), int(cpu_percent)))
        elif cpu_percent is not None:
            limits.append(f"cpu {cpu_percent}% (by the platform backend)")
        bg = BackgroundJob(self, name, job, cpu_percent, timeout, limits)
        self._background.add(bg)
        return bg

    def launch_detached(self, argv: Sequence[Any], *, cwd: Any = None,
                        env: dict[str, str] | None = None, stdin: Any = subprocess.DEVNULL,
                        stdout: Any = subprocess.DEVNULL,
                        stderr: Any = subprocess.DEVNULL) -> subprocess.Popen:
        """Start ``argv`` to outlive the app on purpose (an editor, a browser).

        Outside every job: a plain ``Popen`` in a new session, recorded as
        ``detached`` so no reaper ever touches it. (If the app itself runs
        inside a tether job, that outer job still holds it.)
        """
        p = subprocess.Popen(list(argv), cwd=cwd, env=env, stdin=stdin, stdout=stdout,
                             stderr=stderr, start_new_session=True, close_fds=True)
        from .audit import spawn_fields

        self._write("spawn", **spawn_fields(pid=p.pid, identity=identity.read(p.pid),
                                            detached=True, in_job=False))
        self.detached.append(p)
        return p

    # -- ending ----------------------------------------------------------------------
    def close(self, reason: str = APP_EXIT) -> list[EndedWork]:
        """Stop every open session (announced), close the host job. Background
        jobs and detached launches are left running, on purpose. Idempotent."""
        with self._lock:
            if self._closed:
                return []
            self._closed = True
            sessions = list(self._sessions.values())
        reports = []
        try:
            for s in sessions:
                reports.append(s.stop(reason))
        finally:
            try:
                self.job.close()
            finally:
                self._write("run-end")
                self._audit.close()
        return reports

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _ended_process(e: Any) -> EndedProcess:
    """A reaper's ``Ended`` as a stop report's process: the app's label when
    the record has one, and ``root`` for what the app started itself."""
    ticks, _, boot = str(e.start or "").partition("@")
    ident = Identity(int(e.pid), int(ticks), boot) if ticks.isdigit() and boot else None
    return EndedProcess(int(e.pid), e.label or e.comm or str(e.pid), float(e.runtime_s or 0.0),
                        ident, root=bool(e.recorded))
