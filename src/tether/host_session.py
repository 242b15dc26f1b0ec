"""A host's agent session: a job nested in the host job, its ledger, its stop.

:class:`Session` is what ``Host.session(key)`` returns: it starts the
agent's processes only inside its job (refusing when its key was taken over,
or when no safety net holds them and the app did not allow that), keeps the
ledger of the agent's tasks, and ends the whole tree on ``stop(reason)`` -
announced first, and reported in the app's words. ``_report`` is that
wording, shared with the host's resume rule (what a restart ended of a
crashed run's copy), so a live stop and a resume say the same things the
same way. ``_AppJob`` is the job every host opens: its records carry the app
name, and a session hooks its launches. It lives apart from
:mod:`tether.host` (which holds the keys, runs the resume rule and closes
the host); the host imports it, never the other way round but for type
hints.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from . import audit as _audit
from . import identity
from .errors import JobClosed, JobRefused, SessionHeld
from .host_session_lock import _LocalLock, _SessionLock
from .identity import Identity
from .job import Closed, Job
from .ledger import Ledger, Task, Work, live_work
from .platform import base as _base
from .stops import (
    SESSION_CLOSED,
    USER_REQUEST,
    WORK,
    EndedProcess,
    EndedTask,
    EndedWork,
    Resumed,
    argv_label,
    format_duration,
)

TYPE_CHECKING = False
if TYPE_CHECKING:  # hints only: asyncio loads when a coroutine asks for it; host imports us
    from .aio import Process
    from .host import Host

logger = logging.getLogger("tether.host")  # one logger for the whole host layer


def _runtime(ident: Identity) -> float:
    return max(0.0, (identity.now_ticks() - ident.start) / identity.clock_ticks())


def _key(i: Identity) -> tuple[int, int]:
    return (i.pid, i.start)


# ---------------------------------------------------------------------------
# Jobs that carry the app name into the audit


class _AppJob(Job):
    """A ``Job`` of a host: its records carry the app name, its log has the
    host's retention (or is off), and a session's job checks every launch
    (``gate``) and learns what the app started (``on_spawn``)."""

    def __init__(self, *args: Any, app: str, audit_opts: dict[str, Any] | None,
                 gate: Callable[[], None] | None = None,
                 on_spawn: Callable[[subprocess.Popen[Any], Any, str | None], None] | None = None,
                 **kwargs: Any) -> None:
        self.app = app
        self._audit_opts = audit_opts
        self._gate = gate
        self._on_spawn = on_spawn
        super().__init__(*args, **kwargs)

    def _audit_writer(self, state_dir: Any) -> Any:
        if self._audit_opts is None or state_dir is None:
            return None  # the host's audit is off
        try:
            return _audit.AuditWriter(state_dir, **self._audit_opts)
        except _audit.AuditDirError as exc:  # became unsafe since the host started
            logger.warning("tether host %r: job %r not audited: %s", self.app, self.name, exc)
            return None

    def _log(self, event: str, **fields: Any) -> None:
        fields.setdefault("app", self.app)
        super()._log(event, **fields)

    def close(self, *, known: Iterable[Identity] | None = None) -> Closed:
        ended = super().close(known=known)
        # Its job-close is its last record: its log's two fds go now, not when
        # the garbage collector breaks the session's reference cycles.
        if self._closed and self._audit is not None and not self._forked():
            self._audit.close()
        return ended

    def popen(self, args: Any, *, label: str | None = None, **kwargs: Any) -> subprocess.Popen[Any]:
        if self._gate is not None:
            self._gate()
        p = super().popen(args, label=label, **kwargs)
        if self._on_spawn is not None:
            self._on_spawn(p, args, label)
        return p


# ---------------------------------------------------------------------------
# Sessions


class Session:
    """One agent session: a job nested in the host job, its ledger, its stop.

    ``popen``/``run``/``create_subprocess_exec`` start processes only inside
    the session's job (the job refuses, with ``JobRefused``, rather than
    start anything outside it - and so does the host when the job has no
    safety net). ``stop(reason)`` ends the whole tree.
    """

    def __init__(self, host: Host, key: str, job: _AppJob, resumed: Resumed,
                 lock: _SessionLock | _LocalLock) -> None:
        self.host = host
        self.key = key
        self.job = job
        self.resumed = resumed
        self.started = time.time()
        self.ended: EndedWork | None = None
        self._roots: dict[tuple[int, int], tuple[Identity, str]] = {}
        self._held_since: float | None = None
        self._stop_lock = threading.Lock()
        self._lock = lock
        self.tasks = Ledger(self.members, on_change=self._tasks_changed)
        job._gate = self._gate
        job._on_spawn = self._spawned

    def __repr__(self) -> str:
        state = "stopped" if self.closed else "open"
        return f"<tether.Session {self.key!r} of {self.host.app!r} {state}>"

    # -- starting --------------------------------------------------------------------
    def popen(self, args: Any, *, label: str | None = None, **kwargs: Any) -> subprocess.Popen[Any]:
        """``subprocess.Popen`` inside the session's job. ``label`` names the
        process in stop reports and, after a crash, in ``session.resumed``
        (default: its command line, which stays in memory: only a label the
        app chose is written to the audit log)."""
        return self.job.popen(args, label=label, **kwargs)

    def run(self, args: Any, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """``subprocess.run`` inside the session's job."""
        return self.job.run(args, **kwargs)

    async def create_subprocess_exec(self, program: Any, *args: Any, **kwargs: Any) -> Process:
        """asyncio's ``create_subprocess_exec`` inside the session's job."""
        return await self.job.create_subprocess_exec(program, *args, **kwargs)

    def _gate(self) -> None:
        """Before every launch: the key is still ours, and the job holds what starts."""
        if self.job.closed:
            raise JobClosed(f"session {self.key!r} is stopped")
        if self._lock.lost():
            now = self._lock.holder() if isinstance(self._lock, _SessionLock) else {}
            pid = now.get("pid") if type(now.get("pid")) is int else None
            by = f" (pid {pid})" if pid is not None else ""
            raise SessionHeld(f"session {self.key!r} of {self.host.app!r} was taken over by "
                              f"another run{by}; nothing was started", session=self.key, pid=pid,
                              run=now.get("run") if isinstance(now.get("run"), str) else None,
                              start=now.get("start") if isinstance(now.get("start"), str)
                              else None)
        disabled = self.job.guarantee.disabled
        if disabled and not self.host.allow_unprotected:
            raise JobRefused("process-tree ownership could not be established before agent "
                             f"launch: {disabled}", reason=disabled, mechanism=self.job.mechanism)

    def _spawned(self, p: subprocess.Popen[Any], args: Any, label: str | None) -> None:
        ident = getattr(p, "tether_identity", None) or identity.read(p.pid)
        if ident is not None:  # None: it is already gone
            self._roots[_key(ident)] = (ident, label or argv_label(args))
            self.tasks.not_a_task(ident)  # the agent itself is no task's process

    def _tasks_changed(self, _task: Task) -> None:
        # The live tasks go to the audit as they change, so that a resume after
        # a crash can say what it ended in the app's words.
        if not self.job.closed:
            self.job._log("tasks", tasks=self.tasks.snapshot())

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

    def live_work(self, *, outlived_only: bool = False) -> list[Work]:
        """What the agent has running apart from itself, from the job's members
        alone (no adapter needed): one :class:`tether.ledger.Work` per process
        group it started, longest-running first, with its leader's command
        line, start time, member count, whether it ``outlived`` its tool call,
        and the ledger task that owns it. ``outlived_only``: only those whose
        tool call is over."""
        members = self.members()
        owners = {k: t for k, t in self.tasks.assign(members).items() if t.live}
        work = live_work(members, [i for i, _ in self._roots.values()], owner_of=owners)
        return [w for w in work if w.outlived] if outlived_only else work

    # -- stopping ---------------------------------------------------------------------
    def stop(self, reason: str = USER_REQUEST, *, optional: bool = False, wait: bool = False,
             cap: float | None = None, grace: float | None = None) -> EndedWork:
        """End the session's whole tree and say what that ended.

        ``optional=True`` (an idle release, a memory trim): while something
        holds it - a live task of ``tasks`` that is not ambient, or live work
        (``Host(work_holds=...)``) - the stop is skipped (``wait=False``; the
        report has ``skipped=True``; never capped: a skipped stop ends nothing)
        or waits for it (``wait=True``) up to ``cap`` seconds (default
        ``host.task_cap``) counted from the first wait that was held off; then
        it proceeds. Any other stop goes through at once. Every stop that
        will end something is announced before it ends it.
        """
        spent = False
        if optional and not self.closed:
            # Not under the stop lock: a person's stop must never queue behind
            # an idle release that is waiting for a task.
            cap = self.host.task_cap if cap is None else float(cap)
            held, spent = self._hold(reason, wait, cap)
            if held is not None:
                return held
        with self._stop_lock:
            if self.closed:
                return EndedWork(reason, self.key, optional=optional)
            if optional and not spent:
                holders = self._holders()
                if holders:  # it started between the check above and now
                    return self._skipped(reason, holders)
            plan = self._plan(reason, optional)
            self.host._announce(plan)
            report = self._end(plan, grace)
            self.ended = report
            self._lock.release()
            self.host._forget(self)
            return report

    def close(self) -> EndedWork:
        """Stop with reason ``session closed`` (announced like any stop). In a
        forked child of the host's process it ends nothing: it lets go of the
        child's copy (the session, its key and its processes stay the host's),
        as does the end of a ``with`` block the child inherited."""
        if self.job._forked():
            self.job.close()  # (a forked child's: lets go)
            return EndedWork(SESSION_CLOSED, self.key)
        return self.stop(SESSION_CLOSED)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _holders(self) -> list[tuple[str, float]]:
        """(label, runtime) of what holds an optional stop now, longest first."""
        held = [(t.label, t.runtime_s) for t in self.tasks.holding()]
        mode = self.host.work_holds
        if mode is not None:
            for w in self.live_work(outlived_only=mode == "outlived"):
                if w.task_id is None:  # else its task holds (or, ambient, never does)
                    held.append((w.label, w.runtime_s))
        return sorted(held, key=lambda h: -h[1])

    def _skipped(self, reason: str, holders: list[tuple[str, float]]) -> EndedWork:
        names = [h[0] for h in holders]
        note = (f"{reason} skipped: `{names[0]}` is live (running "
                f"{format_duration(holders[0][1])})")
        if len(names) > 1:
            note += f" and {len(names) - 1} more"
        return EndedWork(reason, self.key, optional=True, skipped=True, held_by=names, note=note)

    def _hold(self, reason: str, wait: bool, cap: float) -> tuple[EndedWork | None, bool]:
        """(a skipped report, or None to go ahead; whether a wait spent its cap)."""
        holders = self._holders()
        if not holders:
            return None, False
        if not wait:
            return self._skipped(reason, holders), False  # a skip is never capped
        now = time.monotonic()
        if self._held_since is None:
            self._held_since = now
        deadline = self._held_since + cap
        while holders and not self.closed and time.monotonic() < deadline:
            # Short slices: a stop by someone else ends the wait at once.
            self.tasks.wait_change(min(0.1, max(0.0, deadline - time.monotonic())))
            holders = self._holders()
        if self.closed:
            return EndedWork(reason, self.key, optional=True, skipped=True,
                             note=f"{reason} superseded: the session was stopped meanwhile"), False
        if not holders:
            self._held_since = None
            return None, False
        logger.info("%s of session %r proceeds: live work held it off for the %s cap",
                    reason, self.key, format_duration(cap))
        return None, True

    def _plan(self, reason: str, optional: bool) -> EndedWork:
        self.tasks.live()  # settles what the stream said finished
        members = self.members()
        roots = {k: label for k, (_i, label) in self._roots.items()}
        # A task that owns no process (a sub-agent) ends with the agent, if that is ending.
        agent_ends = any(_key(m) in roots for m in members)
        return _report(EndedWork, reason, self.key, members, roots,
                       [i for i, _ in self._roots.values()], self.tasks, identity.cmdline,
                       with_idle_tasks=agent_ends, optional=optional, planned=True)

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
                ended_tasks.append(EndedTask(t.task_id, t.label, t.runtime_s, t.status, gone,
                                             kind=t.kind, ambient=t.ambient))
        return EndedWork(plan.reason, self.key, tasks=ended_tasks, processes=ended_procs,
                         optional=plan.optional)


def _report(cls: type[EndedWork], reason: str, key: str | None, members: list[Identity],
            roots: dict[tuple[int, int], str], agent: list[Identity], ledger: Ledger,
            cmdline: Callable[[int], str] | None, *, with_idle_tasks: bool,
            **fields: Any) -> EndedWork:
    """What ending ``members`` ends, in the app's words: the ledger's live tasks
    (with the processes they own), each group of live work the agent started
    (``kind="work"``), and the rest - the agent (``root``) and its own side.

    One grouping for a live stop and for a resume after a crash (``ledger``
    then restored from the audit's last ``tasks`` record). ``with_idle_tasks``:
    also list open tasks that own no process (a sub-agent runs inside the
    agent: ending the agent ends it) - asked for when the agent is among
    ``members``.
    """
    owners = {k: t for k, t in ledger.assign(members).items() if t.live}
    tasks: dict[str, EndedTask] = {}

    def item(t: Task) -> EndedTask:
        et = tasks.get(t.task_id)
        if et is None:
            et = tasks[t.task_id] = EndedTask(t.task_id, t.label, t.runtime_s, t.status,
                                              kind=t.kind, ambient=t.ambient)
        return et

    if with_idle_tasks:
        for t in ledger.tasks():
            if t.live and t.said_finished is None:
                item(t)
    placed: set[tuple[int, int]] = set()
    for w in live_work(members, agent, owner_of=owners, cmdline=cmdline):
        task = ledger.get(w.task_id) if w.task_id is not None else None
        if task is not None:  # (a task the ledger forgot meanwhile: its work, by group)
            et = item(task)
        else:
            et = tasks[f"pg{w.pgid}"] = EndedTask(f"pg{w.pgid}", w.label, w.runtime_s, None,
                                                  kind=WORK, ambient=w.ambient)
        for m in w.processes:
            et.processes.append(EndedProcess(m.pid, m.comm or str(m.pid), _runtime(m), m))
            placed.add(_key(m))
    procs: list[EndedProcess] = []
    for m in members:
        k = _key(m)
        if k in placed:
            continue
        owner = owners.get(k)
        if owner is not None:  # the app named it a task's (pids=), even one it started itself
            item(owner).processes.append(EndedProcess(m.pid, m.comm or str(m.pid), _runtime(m), m))
        elif k in roots:
            procs.append(EndedProcess(m.pid, roots[k], _runtime(m), m, root=True))
        else:
            procs.append(EndedProcess(m.pid, m.comm or str(m.pid), _runtime(m), m))
    return cls(reason, key, tasks=list(tasks.values()), processes=procs, **fields)
