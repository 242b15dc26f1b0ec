"""Hosts of long-lived agent sessions: one job per app, a job per session.

    from tether import Host
    with Host("my-agent-app") as host:
        s = host.session("chat-42")              # ends its own leftover copy first
        agent = s.popen(["claude", "-p", ...])   # starts only inside the session's job
        s.tasks.started("b1x", "npm run build")  # or feed StreamAdapter(s.tasks)
        print(s.live_work())                     # what the agent runs in the background
        print(s.stop("user request"))            # "Stopped (user request): ended ..."

What a host promises an app's users:

* **Fail closed.** One host job per app instance; every session's job is
  nested in it, so the app's death - crash, force-kill, OOM - ends every
  session's tree. ``host.guarantee`` says what protects them. When nothing
  can, every agent launch (``session.popen``/``run``/``create_subprocess_exec``)
  raises ``JobRefused("process-tree ownership could not be established before
  agent launch: <reason>")`` and starts nothing; ``Host(allow_unprotected=True)``
  runs them as plain children instead, after one loud ``SafetyNetWarning``.
  ``require="kernel"`` refuses sessions unless a kernel-enforced mechanism
  holds them. What the app starts outside sessions (``host.job``, background
  jobs, detached launches) is not refused.
* **The reaper on start**: leftovers of the same app's earlier runs that the
  audit proves are theirs are ended; the report is ``host.reap_report``. The
  audit never loses that proof to rotation (``tether.audit``: records that
  still prove something are carried forward), within a hard size cap.
* **One copy per session key.** ``host.session(key)`` holds the key (a lock
  the kernel releases when this process dies, however it dies); a key held
  by another live run of the app raises :class:`SessionHeld` naming its pid
  and start, or with ``take_over=True`` that copy is ended (announced) and
  the key taken over. A copy left alive by an earlier run that is over is
  ended first (the resume rule: the reaper filtered to that key), and
  ``session.resumed`` says what it ended in the app's words: the labels the
  app gave, the ledger's live tasks, agent and work told apart.
* **Stops that say what they ended**: ``session.stop(reason)`` returns an
  :class:`EndedWork`; every stop announces what it will end *before* ending it
  (``Host(announce=...)`` and the ``tether.host`` logger at INFO).
* **Live work**: ``session.tasks`` (``tether.ledger``: the app's or the
  agent stream's tasks) and ``session.live_work()`` (from the job's members
  alone: each process group the agent started apart from its own). An
  optional stop (``optional=True``, e.g. an idle release) is *skipped* while
  either holds it - never capped: a skipped stop ends nothing - or, with
  ``wait=True``, *waits* up to ``task_cap`` seconds (default 30 minutes) from
  the first wait held off, then proceeds. Ambient tasks never hold. A stop
  asked for by a person is never held.
* **Background jobs** that outlive the host on purpose, CPU-capped and at low
  priority, bounded by their own timeout, recorded so the reaper leaves them.
* **Detached launches** (an editor, a browser window) outside every job,
  recorded as detached, never reaped.
* A state directory tether refuses (a symlink, another user's, writable by
  others) or cannot create starts the host with auditing off, one
  ``AuditWarning`` and ``host.audit_error`` set - unless ``audit="required"``.

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
import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from . import audit as _audit
from . import identity
from . import job as _job
from .ending import DEFAULT_GRACE, check_grace
from .errors import HostClosed, JobClosed, JobExpired, JobRefused, SessionHeld, TetherError
from .identity import Identity
from .job import Closed, Job
from .ledger import Ledger, Task, Work, live_work
from .platform import base as _base
from .stops import (
    APP_EXIT,
    RESUME,
    SESSION_CLOSED,
    TAKE_OVER,
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
if TYPE_CHECKING:  # a hint only: asyncio loads when a coroutine asks for it
    from .aio import Process

__all__ = ["Host", "Session", "BackgroundJob", "SafetyNetWarning", "AuditWarning"]

logger = logging.getLogger("tether.host")

DEFAULT_TASK_CAP = 30 * 60.0
WORK_HOLDS = ("all", "outlived", None)
_LINUX = sys.platform.startswith("linux")
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOINHERIT", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class SafetyNetWarning(RuntimeWarning):
    """The host could not open a job, and the app allowed unprotected sessions."""


class AuditWarning(RuntimeWarning):
    """The host runs with its audit log off (``host.audit_error`` says why)."""


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
# One copy per session key


def _flock(fd: int) -> bool:
    """A non-blocking exclusive lock on ``fd``; False when another holds it."""
    try:
        import fcntl
    except ImportError:  # Windows: a byte-range lock, released with the process
        import msvcrt

        try:
            os.lseek(fd, 1 << 20, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)  # type: ignore[attr-defined]  # msvcrt's stub is win32-only; mypy checks as Linux
            return True
        except OSError:
            return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _read_info(fd: int) -> dict[str, Any]:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        data = os.read(fd, 4096)
        info = json.loads(data) if data.strip() else {}
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


class _SessionLock:
    """One session key held by this process: an ``flock`` on a small file
    named after (app, key) that says who holds it. The kernel drops the lock
    when the holder dies, however it dies. A take-over unlinks the held file
    and locks a fresh one; the old holder sees its file gone (:meth:`lost`)
    at its next launch. Unlinks happen under a directory lock, and a lock
    taken on a file that was unlinked meanwhile is retried, so two holders
    never both believe they hold a key.
    """

    def __init__(self, directory: Path, app: str, key: str) -> None:
        digest = hashlib.sha256(f"{app}\0{key}".encode()).hexdigest()[:32]
        self.path = directory / f"{digest}.lock"
        self._dirlock = directory / ".lock"
        self.fd = -1
        self.ino: tuple[int, int] | None = None
        self.previous: dict[str, Any] = {}  # who held it last without releasing it (a crash)

    def acquire(self, me: dict[str, Any]) -> tuple[dict[str, Any], tuple[int, int]] | None:
        """None once held; else (what the holder wrote, the held file's inode)."""
        for _ in range(20):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | _O_CLOEXEC | _O_NOFOLLOW, 0o600)
            try:
                st = os.fstat(fd)
                if not _flock(fd):
                    return _read_info(fd), (st.st_dev, st.st_ino)
                try:
                    cur = os.stat(self.path, follow_symlinks=False)
                except FileNotFoundError:
                    cur = None
                if cur is None or (cur.st_dev, cur.st_ino) != (st.st_dev, st.st_ino):
                    continue  # released or taken over between open and lock: once more
                self.previous = _read_info(fd)
                data = json.dumps(me).encode()
                os.ftruncate(fd, 0)
                os.lseek(fd, 0, os.SEEK_SET)
                os.write(fd, data)
                self.fd, fd = fd, -1
                self.ino = (st.st_dev, st.st_ino)
                return None
            finally:
                if fd >= 0:
                    os.close(fd)
        raise OSError(f"session lock {self.path} kept changing")

    def holder(self) -> dict[str, Any]:
        """What the file now named says of its holder ({} if nothing)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | _O_CLOEXEC | _O_NOFOLLOW)
        except OSError:
            return {}
        try:
            return _read_info(fd)
        finally:
            os.close(fd)

    def lost(self) -> bool:
        """Whether the key was taken over (our file is no longer the one named)."""
        if self.fd < 0:
            return True
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except OSError:
            return True
        return (st.st_dev, st.st_ino) != self.ino

    @contextlib.contextmanager
    def _unlinking(self) -> Iterator[bool]:
        try:
            import fcntl
        except ImportError:
            yield False  # Windows: an open file cannot be unlinked; nothing is
            return
        fd = os.open(self._dirlock, os.O_RDWR | os.O_CREAT | _O_CLOEXEC | _O_NOFOLLOW, 0o600)
        try:
            for _ in range(200):  # held for a few system calls at a time; 1 s at most
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    time.sleep(0.005)
            else:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    def release(self) -> None:
        if self.fd < 0:
            return
        try:
            os.ftruncate(self.fd, 0)  # a clean release leaves no "previous holder"
        except OSError:
            pass
        with self._unlinking() as ok:
            if ok and not self.lost():
                with contextlib.suppress(OSError):
                    os.unlink(self.path)
            os.close(self.fd)
            self.fd = -1

    def break_(self, ino: tuple[int, int]) -> bool:
        """Unlink the held file if it is still the one seen held (``ino``)."""
        with self._unlinking() as ok:
            if not ok:
                return False
            try:
                st = os.stat(self.path, follow_symlinks=False)
            except FileNotFoundError:
                return True
            if (st.st_dev, st.st_ino) != ino:
                return True  # changed already: acquire() will see who holds it now
            os.unlink(self.path)
            return True


# The open sessions of this process by lock file: a key held by another Host of
# this very process (same pid, same run id) is taken over by stopping it.
_OPEN: weakref.WeakValueDictionary[str, Session] = weakref.WeakValueDictionary()


class _LocalLock:
    """The lock when no directory can hold session locks: this process only."""

    previous: dict[str, Any] = {}

    def lost(self) -> bool:
        return False

    def release(self) -> None:
        pass


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



# ---------------------------------------------------------------------------
# The host


class Host:
    """One application instance that runs agent sessions; see the module doc.

    ``app``: the application's name (reaping, the resume rule and session
    keys only ever concern the same app). ``state_dir``: where the audit log
    and the session locks live (default: the user's,
    ``tether.audit.default_state_dir()``); a relative one is resolved once,
    here.
    ``require="kernel"``: sessions refuse to start unless a kernel-enforced
    mechanism holds them. ``allow_unprotected``: when no job can be had, run
    agents as plain children (one ``SafetyNetWarning``) instead of refusing
    every launch. ``announce(plan)`` is called before every stop that will
    end something, with an :class:`EndedWork` whose ``announcement()`` is the
    line to show. ``audit``: ``"auto"`` (a directory tether refuses turns the
    log off, with one ``AuditWarning``), ``"required"`` (it raises
    ``AuditDirError``) or ``"off"``. ``audit_max_bytes``,
    ``audit_keep_files``, ``audit_keep_days``: the log's retention for every
    record this host writes (see ``tether.audit``; records that still prove
    something are carried forward whatever the retention). ``work_holds``:
    which live work holds optional stops - ``"all"`` (default: every process
    group the agent started), ``"outlived"`` (only those whose tool call is
    over) or ``None`` (only the ledger's tasks). ``read_log=False`` (with
    ``reap=False``; what ``tether run --session`` uses): the log is not read
    at start; a session's resume rule reads it only when the key's last
    holder died holding it (a clean release leaves nothing to resume).
    ``host_job=False`` (what ``tether run --session`` uses, with
    ``reap=False, read_log=False``): a host of one session, whose job is the
    host's job - no job of the host's own and no ``run-start``/``run-end``
    records (the session's records carry the app and key): a run costs the
    log what a plain job does. ``host.job`` is the session's, once opened; a
    second key raises ``ValueError``.
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
        allow_unprotected: bool = False,
        audit: str = "auto",
        audit_max_bytes: int = _audit.DEFAULT_MAX_BYTES,
        audit_keep_files: int = _audit.DEFAULT_KEEP_FILES,
        audit_keep_days: float | None = _audit.DEFAULT_KEEP_DAYS,
        work_holds: str | None = "all",
        read_log: bool = True,
        host_job: bool = True,
    ) -> None:
        if not isinstance(app, str) or not app.strip():
            raise ValueError(f"app must be a non-empty string, not {app!r}")
        if require not in (None, "kernel"):
            raise ValueError(f"require must be None or 'kernel', not {require!r}")
        if audit not in ("auto", "required", "off"):
            raise ValueError(f"audit must be 'auto', 'required' or 'off', not {audit!r}")
        if work_holds not in WORK_HOLDS:
            raise ValueError(f"work_holds must be one of {WORK_HOLDS}, not {work_holds!r}")
        self.app = app
        self.require = require
        self.mechanism = mechanism
        self.grace = check_grace(grace)
        self.task_cap = float(task_cap)
        self.announce = announce
        self.allow_unprotected = bool(allow_unprotected)
        self.work_holds = work_holds
        # resolved once, as a Job's: a relative one must not follow a later
        # chdir (the session locks and the log would split in two places)
        self.state_dir = (_audit.resolve_state_dir(state_dir) if state_dir is not None
                          else _audit.default_state_dir())
        self.run = _job.run_id()
        self.reap_report: Any = None
        self.reap_error: str | None = None
        self.audit_error: str | None = None
        self.safety_net_disabled: str | None = None
        self._sessions: dict[str, Session] = {}
        self._background: set[BackgroundJob] = set()
        self.detached: list[subprocess.Popen[Any]] = []
        self._closed = False
        self._lock = threading.RLock()
        # What the start-up reap ended, by session key (reported by the first
        # session(key)), and what was seen of it while it still ran.
        self._reaped: dict[str, list[Any]] = {}
        self._seen: dict[tuple[int, int], Identity] = {}
        self._cmdlines: dict[tuple[int, int], str] = {}
        opts = {"max_bytes": audit_max_bytes, "keep_files": audit_keep_files,
                "keep_days": audit_keep_days}
        self._audit_opts: dict[str, Any] | None = opts
        self._audit: _audit.AuditWriter | None = None
        if audit == "off":
            self._audit_opts = None
        else:
            self._open_audit(opts, required=audit == "required")
        # One read of the log (a long one costs seconds), shared by the reap
        # at start and the resume rule of every session opened later: both are
        # the reaper, the resume rule filtered to one session key. Read before
        # this host writes anything, so that nothing of it is pruned first.
        self._runs: dict[str, Any] | None = None
        self._read_stats = _audit.ReadStats()
        self._read_notes: list[str] = []  # what limited the reading (a size cap's loss, ...)
        self._resume_error: str | None = None
        self._lazy_log = not read_log and not reap
        # False: one session, whose job is the host's (opened by session(key))
        self._own_job = bool(host_job)
        if self._lazy_log and self._audit is not None:
            pass  # read by the resume rule, if ever needed
        elif self._audit is None:
            self._resume_error = self.reap_error = f"audit log off: {self.audit_error or 'asked'}"
        else:
            try:
                from .runs import read_runs

                self._runs = read_runs(self.state_dir, stats=self._read_stats,
                                       notes=self._read_notes)
                for note in self._read_notes:
                    logger.warning("tether host %r: audit log: %s", self.app, note)
            except (TetherError, OSError, ValueError) as exc:  # must not stop the app
                self._resume_error = self.reap_error = f"{type(exc).__name__}: {exc}"
                logger.warning("tether host %r: cannot read the audit log: %s", self.app,
                               self._resume_error)
        self._write("run-start")
        if reap and self._runs is not None:
            self._reap_earlier_runs()
        self._host_job: _AppJob | None = self._open_host_job() if host_job else None
        self._lock_dir = self._session_lock_dir()

    # -- plumbing ------------------------------------------------------------------
    def _open_audit(self, opts: dict[str, Any], *, required: bool) -> None:
        try:
            w = _audit.AuditWriter(self.state_dir, **opts)
        except _audit.AuditDirError as exc:
            if required:
                raise
            why = str(exc)
        else:
            if w.reason is None:
                self._audit = w
                return
            w.close()
            why = f"cannot create the audit directory: {w.reason}"
            if required:
                raise _audit.AuditDirError(why)
        self.audit_error = why
        self._audit_opts = None
        warnings.warn(f"tether host {self.app!r}: audit log OFF (no reaping of earlier runs, "
                      f"no resume across restarts): {why}", AuditWarning, stacklevel=3)

    def _write(self, event: str, **fields: Any) -> None:
        if self._audit is None or (not self._own_job and event in ("run-start", "run-end")):
            return  # (a host of one session: its session's records say it all)
        me = identity.own()
        fields.setdefault("run", self.run)
        fields.setdefault("owner", {"pid": os.getpid(), "start": me.token() if me else None})
        fields.setdefault("app", self.app)
        self._audit.write(event, **fields)

    def _job(self, name: str, **kwargs: Any) -> _AppJob:
        state_dir = self.state_dir if self._audit_opts is not None else None
        return _AppJob(name=name, app=self.app, audit_opts=self._audit_opts,
                       state_dir=state_dir, **kwargs)

    def _capture(self, plan: Any) -> None:
        """Before a reap signals anything: read what it will end while it still
        runs (process group, parent, command line: for the report only)."""
        for e in plan.ended:
            ticks, _, _boot = str(e.start or "").partition("@")
            cur = identity.read(int(e.pid))
            if cur is not None and str(cur.start) == ticks:
                self._seen[_key(cur)] = cur
                self._cmdlines[_key(cur)] = identity.cmdline(cur.pid)

    def _reap_earlier_runs(self) -> None:
        try:
            from .reaper import reap
        except ImportError as exc:  # the reaper is a separate room; say so, do not fail
            self.reap_error = f"reaper not available: {exc}"
            logger.warning("tether host %r: %s", self.app, self.reap_error)
            return

        def announce(plan: Any) -> None:
            self._capture(plan)
            by_key: dict[str, list[Any]] = {}
            for e in plan.ended:
                if e.session is not None:
                    by_key.setdefault(e.session, []).append(e)
            for key, ended in by_key.items():
                self._announce(self._resumed(RESUME, key, ended, planned=True))

        try:
            self.reap_report = reap(self.state_dir, app=self.app, grace=self.grace,
                                    exclude_runs={self.run}, runs=self._runs, announce=announce)
        except (TetherError, OSError, ValueError) as exc:  # a failed reap must not stop the app
            self.reap_error = f"{type(exc).__name__}: {exc}"
            logger.warning("tether host %r: reaping earlier runs failed: %s", self.app,
                           self.reap_error)
            return
        # The reap used the log as read above: say what that read saw.
        self.reap_report.log_stats = self._read_stats
        self.reap_report.notes[:0] = self._read_notes
        for e in self.reap_report.ended:
            if e.session is not None:
                self._reaped.setdefault(e.session, []).append(e)
        if self.reap_report.ended:
            logger.info("tether host %r: %s", self.app, str(self.reap_report).strip())

    def _open_host_job(self, name: str | None = None, grace: float | None = None,
                       **kwargs: Any) -> _AppJob:
        """The host's job (``host_job=False``: the session's, ``kwargs`` its own;
        refused under ``require="kernel"``: raised, nothing written)."""
        name = self.app if name is None else name
        grace = self.grace if grace is None else grace
        try:
            job = self._job(name, mechanism=self.mechanism, grace=grace,
                            require=self.require, **kwargs)
        except JobRefused as exc:
            self._disable(str(exc))
            if not self._own_job and self.require == "kernel":
                raise JobRefused(f"process-tree ownership could not be established: {exc}",
                                 reason=str(exc)) from exc
            return self._job(name, mechanism="none", reason=str(exc), grace=grace, **kwargs)
        if job.guarantee.disabled:
            self._disable(job.guarantee.disabled)
        return job

    def _disable(self, reason: str) -> None:
        self.safety_net_disabled = reason
        if not self.allow_unprotected:
            # Fail closed: every agent launch will say so, and start nothing.
            logger.warning("tether host %r: no process-tree ownership (%s): agent launches "
                           "will be refused (Host(allow_unprotected=True) runs them "
                           "unprotected)", self.app, reason)
            return
        # One warning, through the warnings system (logging.captureWarnings
        # routes it to logging); apps can escalate SafetyNetWarning to an error.
        warnings.warn(f"orphan-on-crash safety net DISABLED: {reason}", SafetyNetWarning,
                      stacklevel=4)

    def _session_lock_dir(self) -> Path | None:
        """Where session keys are held: ``<state_dir>/sessions``, else (auditing
        off) a private directory under the temporary directory, else under
        ``$XDG_RUNTIME_DIR/tether``, else under the default state directory.
        A directory that is not ours or that others may write
        (``$TMPDIR/tether-<uid>`` made first by another user) is refused,
        never shared: the next one is used."""
        if hasattr(os, "geteuid"):
            uid: Any = os.geteuid()
        else:
            import getpass

            uid = getpass.getuser()
        # (base, a directory that must be ours already: $XDG_RUNTIME_DIR itself)
        bases: list[tuple[Path, Path | None]] = []
        if self._audit is not None:
            bases.append((self.state_dir, None))
        bases.append((Path(tempfile.gettempdir()) / f"tether-{uid}", None))
        runtime = os.environ.get("XDG_RUNTIME_DIR", "")
        if os.path.isabs(runtime):
            bases.append((Path(runtime) / "tether", Path(runtime)))
        try:
            bases.append((_audit.default_state_dir(), None))
        except (TetherError, OSError, RuntimeError):
            pass  # no home to fall back on
        why = "no directory"
        for base, parent in bases:
            try:
                if parent is not None:
                    _audit.check_dir(parent, create=False)
                _audit.check_dir(base)
                return _audit.check_dir(base / "sessions")
            except (TetherError, OSError) as exc:
                (logger.warning if isinstance(exc, _audit.AuditDirError) else logger.info)(
                    "tether host %r: not holding session keys in %s: %s", self.app, base, exc)
                why = str(exc)
        logger.warning("tether host %r: session keys are held within this process only: %s",
                       self.app, why)
        return None

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
    def job(self) -> _AppJob:
        """The host job, inside which every session's job runs (``host_job=False``:
        the session's job; ``RuntimeError`` before it is opened)."""
        if self._host_job is None:
            raise RuntimeError(f"host {self.app!r} (host_job=False) has no session open yet")
        return self._host_job

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
        for m in self._host_job.members() if self._host_job is not None else ():
            seen[m.pid] = m
        for s in self.sessions.values():
            for m in s.members():
                seen[m.pid] = m
        return list(seen.values())

    def __repr__(self) -> str:
        mechanism = self._host_job.mechanism if self._host_job is not None else "-"
        return f"<tether.Host {self.app!r} {mechanism} sessions={len(self._sessions)}>"

    # -- sessions ---------------------------------------------------------------------
    def session(self, key: str, *, grace: float | None = None,
                take_over: bool = False, take_over_before: float | None = None) -> Session:
        """The session ``key``: a job inside the host job.

        Returns the open one if this host already has it. Otherwise it holds
        the key - one copy per key: a key a live run of this app holds raises
        :class:`SessionHeld` (its pid and start), or with ``take_over=True``
        that copy is ended (announced) and the key taken over - then ends a
        copy of ``key`` left alive by an earlier run that is over (the resume
        rule). What it ended is ``session.resumed`` (a :class:`Resumed`).
        Raises ``JobRefused`` (``process-tree ownership could not be
        established: ...``) when the host has no safety net and
        ``require="kernel"`` was asked for. ``take_over_before`` (a
        ``time.time()``, e.g. when the take-over was asked for): only a copy
        that took the key before then is taken over; one that took it later -
        a concurrent take-over that won - raises :class:`SessionHeld`, so of
        two take-overs at the same moment exactly one runs.
        """
        if not isinstance(key, str) or not key.strip():  # ("" would be one key for every caller)
            raise ValueError(f"session key must be a non-empty string, not {key!r}")
        with self._lock:
            if self._closed:
                raise HostClosed(f"host {self.app!r} is closed")
            existing = self._sessions.get(key)
            if existing is not None and not existing.closed:
                return existing
            if not self._own_job and self._host_job is not None:
                raise ValueError(f"host {self.app!r} (host_job=False) holds one session: "
                                 f"{self._host_job.session!r}, not {key!r}")
            if self.safety_net_disabled and self.require == "kernel":
                raise JobRefused("process-tree ownership could not be established: "
                                 f"{self.safety_net_disabled}", reason=self.safety_net_disabled)
            g = self.grace if grace is None else check_grace(grace)
            lock, taken = self._hold_key(key, take_over, take_over_before)
            try:
                resumed = self._resume(key, lock.previous, taken, take_over)
                name = f"{self.app}:{key}"
                if not self._own_job:
                    job = self._host_job = self._open_host_job(name, g, session=key)
                    if self.safety_net_disabled and self.require == "kernel":
                        job.close()  # opened, but with no safety net
                        raise JobRefused("process-tree ownership could not be established: "
                                         f"{self.safety_net_disabled}",
                                         reason=self.safety_net_disabled)
                elif self.job.mechanism == "none":
                    job = self._job(name, mechanism="none", grace=g,
                                    reason=self.safety_net_disabled, session=key)
                else:
                    job = self._job(name, mechanism=self.job.mechanism, grace=g,
                                    require=self.require, parent=self.job, session=key)
            except BaseException:
                lock.release()
                raise
            s = Session(self, key, job, resumed, lock)
            self._sessions[key] = s
            if isinstance(lock, _SessionLock):
                _OPEN[str(lock.path)] = s
            return s

    def _me(self, key: str) -> dict[str, Any]:
        me = identity.own()
        return {"app": self.app, "session": key, "run": self.run, "pid": os.getpid(),
                "start": me.token() if me is not None else None, "ts": time.time()}

    def _hold_key(self, key: str, take_over: bool, before: float | None = None
                  ) -> tuple[_SessionLock | _LocalLock, Resumed | None]:
        """Hold ``key`` for this host; (the lock, what a take-over ended)."""
        if self._lock_dir is None:
            return _LocalLock(), None
        lock = _SessionLock(self._lock_dir, self.app, key)
        try:
            held = lock.acquire(self._me(key))
        except OSError as exc:  # the directory went away (a cleaned /tmp): once more, then local
            try:
                _audit.check_dir(self._lock_dir)
                held = lock.acquire(self._me(key))
            except (TetherError, OSError):
                logger.warning("tether host %r: session %r held within this process only: %s",
                               self.app, key, exc)
                return _LocalLock(), None
        if held is None:
            return lock, None
        info, ino = held
        if not take_over:
            raise _held(self.app, key, info)
        since = info.get("ts")
        if before is not None and isinstance(since, (int, float)) and since > before:
            raise _held(self.app, key, info, "it took the key after this take-over was asked "
                        "for (a concurrent take-over won)")
        mine = _OPEN.get(str(lock.path)) if info.get("pid") == os.getpid() else None
        if mine is not None and not mine.closed:
            # Another Host of this process holds it: its run is ours, so no reap
            # can tell the two apart - stop that session itself (announced).
            ended = mine.stop(TAKE_OVER)
            taken = Resumed(TAKE_OVER, key, tasks=ended.tasks, processes=ended.processes,
                            holder=os.getpid())
        else:
            taken = self._take_over(key, info)
        if not lock.break_(ino) or lock.acquire(self._me(key)) is not None:
            raise _held(self.app, key, info, "it could not be taken over (held again at once)")
        return lock, taken

    def _take_over(self, key: str, info: dict[str, Any]) -> Resumed:
        """End the copy of ``key`` that the live run named by ``info`` holds
        (and what runs that are over left of it)."""
        if self._audit is None:
            raise _held(self.app, key, info, "with the audit log off its processes cannot be "
                        "proven, so it cannot be taken over")
        from .reaper import reap
        from .runs import read_runs

        # fresh: the holder may have started after this host; a lazy host reads
        # only the files written since the holder took the key (a minute's margin)
        since = info.get("ts") if self._lazy_log else None
        runs = read_runs(self.state_dir,
                         since=since - 60 if isinstance(since, (int, float)) else None)
        holder = info.get("pid") if type(info.get("pid")) is int else None
        run = info.get("run") if isinstance(info.get("run"), str) else None

        def announce(plan: Any) -> None:
            self._capture(plan)
            self._announce(self._resumed(TAKE_OVER, key, plan.ended, runs, planned=True,
                                         holder=holder))

        rep = reap(self.state_dir, app=self.app, session=key, grace=self.grace,
                   exclude_runs={self.run}, runs=runs, announce=announce, take_over=run)
        ended = list(self._reaped.pop(key, [])) + rep.ended
        out = self._resumed(TAKE_OVER, key, ended, runs, holder=holder)
        if rep.survived:
            out.note = "some of its processes could not be ended"
        logger.warning("tether host %r: %s", self.app, out or f"took over {key!r} from pid "
                       f"{holder}: nothing of its copy was running")
        return out

    def _resume(self, key: str, previous: dict[str, Any], taken: Resumed | None,
                take_over: bool = False) -> Resumed:
        """The resume rule: end what an earlier run that is over left of
        session ``key`` - the reaper, filtered to that key."""
        if taken is not None:
            return taken  # the take-over's reap was the resume rule too
        ended = list(self._reaped.pop(key, []))  # what the start-up reap ended of this key
        if self._lazy_log and not isinstance(previous.get("run"), str):
            # Its last holder released it (or none ever held it): no copy of it
            # can be left, and the log is not read at all.
            return self._resumed(RESUME, key, ended)
        runs = self._runs
        since = previous.get("ts")
        if self._lazy_log and isinstance(since, (int, float)):
            # Its last holder died holding it: what proves its copy was written
            # after it took the key - read only the files written since (a
            # minute's margin: its run began a moment before).
            with contextlib.suppress(TetherError, OSError, ValueError):
                from .runs import read_runs

                runs = read_runs(self.state_dir, since=since - 60)
        if self._resume_error is not None:
            report = self._resumed(RESUME, key, ended)
            report.note = f"resume check failed: {self._resume_error}"
            return report
        last = previous.get("run") if isinstance(previous.get("run"), str) else None
        if last is not None and runs is not None and last not in runs and last != self.run \
                and not self._lazy_log:  # (a lazy log was read just now)
            # The key's last holder died without releasing it, and started after
            # this host read the log: read it again, or its copy is missed.
            with contextlib.suppress(TetherError, OSError, ValueError):
                from .runs import read_runs

                runs = read_runs(self.state_dir)
        from .reaper import OWNER_ALIVE, reap

        def announce(plan: Any) -> None:
            self._capture(plan)
            self._announce(self._resumed(RESUME, key, plan.ended, runs, planned=True))

        try:
            rep = reap(self.state_dir, app=self.app, session=key, grace=self.grace,
                       exclude_runs={self.run}, runs=runs, announce=announce)
        except (TetherError, OSError, ValueError) as exc:  # must not stop the session
            report = self._resumed(RESUME, key, ended)
            report.note = f"resume check failed: {type(exc).__name__}: {exc}"
            return report
        report = self._resumed(RESUME, key, ended + rep.ended, runs)
        holders = sorted({s.run for s in rep.skipped if s.reason == OWNER_ALIVE})
        if holders and take_over:
            # A live run has processes of this key though it holds no lock (a
            # tether without session locks, or another lock directory): asked
            # to, take its copy over too.
            parts = [report] + [self._take_over(key, {"run": run, "pid": _run_pid(run)})
                                for run in holders]
            return Resumed(TAKE_OVER, key, tasks=[t for r in parts for t in r.tasks],
                           processes=[q for r in parts for q in r.processes],
                           holder=_run_pid(holders[0]))
        if holders:
            # A live run has processes of this key though it holds no lock (a
            # tether without session locks, or another lock directory).
            raise SessionHeld(
                f"session {key!r} of {self.app!r} has processes of a live run "
                f"({', '.join(holders)}) that holds no session lock; take_over=True ends them",
                session=key, run=holders[0], pid=_run_pid(holders[0]))
        return report

    def _resumed(self, reason: str, key: str, ended: list[Any],
                 runs: dict[str, Any] | None = None, *, planned: bool = False,
                 holder: int | None = None) -> Resumed:
        """The reaper's ``Ended`` list as a report in the app's words."""
        runs = self._runs if runs is None else runs
        boot = identity.boot_id()
        members: list[Identity] = []
        roots: dict[tuple[int, int], str] = {}
        snaps: list[dict[str, Any]] = []
        jobs: set[tuple[str, str | None]] = set()
        for e in ended:
            ticks, _, b = str(e.start or "").partition("@")
            if not ticks.isdigit():
                continue
            k = (int(e.pid), int(ticks))
            ident = self._seen.get(k) or Identity(k[0], k[1], b or boot, comm=e.comm or "")
            members.append(ident)
            if e.recorded:
                roots[k] = e.label or e.comm or str(e.pid)
            jobs.add((e.run, e.job))
        for run_id, job in sorted(jobs, key=str):
            run_info = runs.get(run_id) if runs else None
            info = run_info.jobs.get(job) if run_info is not None and job else None
            if info is not None and info.tasks:
                snaps.extend(info.tasks)
        ledger = Ledger.restore(snaps, boot)
        agent = [members[i] for i, m in enumerate(members) if _key(m) in roots]
        for a in agent:
            ledger.not_a_task(a)
        cmdlines = {p: c for (p, _t), c in self._cmdlines.items()}
        report = _report(Resumed, reason, key, members, roots, agent, ledger,
                         lambda pid: cmdlines.get(pid, ""),
                         with_idle_tasks=bool(roots), planned=planned, holder=holder)
        assert isinstance(report, Resumed)
        return report

    # -- background and detached ------------------------------------------------------------
    def background_job(self, name: str, cpu_percent: int | None = 25,
                       timeout: float | None = None, *, grace: float | None = None) -> BackgroundJob:
        """A job that is NOT ended with the host: CPU-capped, low priority,
        bounded by ``timeout`` seconds, recorded ``background`` (never reaped).
        Never refused for want of a safety net: it is meant to outlive the app."""
        if not name or not isinstance(name, str):
            raise ValueError(f"background job name must be a non-empty string, not {name!r}")
        if cpu_percent is not None and not 1 <= int(cpu_percent) <= 100:
            raise ValueError("cpu_percent must be between 1 and 100")
        if timeout is not None and timeout <= 0:
            raise ValueError("timeout must be > 0 seconds")
        # A background job is never nested in the host job (the host's death
        # would take it along) and never in a PID namespace (it outlives its
        # owner on purpose; the transparent mechanisms keep its PIDs real).
        mech = self.mechanism if self.mechanism in ("cgroup", "subreaper", "pgroup") else "auto"
        job = self._job(f"{self.app}:bg:{name}", mechanism=mech,
                        grace=self.grace if grace is None else check_grace(grace),
                        background=True, cpu_percent=cpu_percent)
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
                        stderr: Any = subprocess.DEVNULL) -> subprocess.Popen[Any]:
        """Start ``argv`` to outlive the app on purpose (an editor, a browser).

        Outside every job: a plain ``Popen`` in a new session, recorded as
        ``detached`` so no reaper ever touches it. (If the app itself runs
        inside a tether job, that outer job still holds it.) Never refused
        for want of a safety net: it is meant to outlive the app.
        """
        p = subprocess.Popen(list(argv), cwd=cwd, env=env, stdin=stdin, stdout=stdout,
                             stderr=stderr, start_new_session=True, close_fds=True)
        self._write("spawn", **_audit.spawn_fields(pid=p.pid, identity=identity.read(p.pid),
                                                   detached=True, in_job=False))
        self.detached.append(p)
        return p

    # -- ending ----------------------------------------------------------------------
    def close(self, reason: str = APP_EXIT) -> list[EndedWork]:
        """Stop every open session (announced), close the host job. Background
        jobs and detached launches are left running, on purpose. Idempotent.
        In a forked child of the host's process it ends nothing and releases
        no key: it lets go of the child's copies (see ``Session.close``)."""
        job = self._host_job  # (None: a host of one session that opened none)
        forked = job is not None and job._forked()
        with self._lock:
            if self._closed:
                return []
            self._closed = True
            sessions = list(self._sessions.values())
        if forked:
            for s in sessions:
                s.job.close()  # (lets go)
            if job is not None:
                job.close()
            return []
        reports = []
        try:
            for s in sessions:
                reports.append(s.stop(reason))
        finally:
            try:
                if job is not None:
                    job.close()
            finally:
                self._write("run-end")
                if self._audit is not None:
                    self._audit.close()
        return reports

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _run_pid(run: str) -> int | None:
    head = run.split("-", 1)[0]
    return int(head) if head.isdigit() else None


def _held(app: str, key: str, info: dict[str, Any], why: str = "") -> SessionHeld:
    """The SessionHeld for a key whose lock file says ``info``."""
    pid = info.get("pid") if type(info.get("pid")) is int else None
    start = info.get("start") if isinstance(info.get("start"), str) else None
    when = ""
    ticks = start.partition("@")[0] if start else ""
    if ticks.isdigit():
        age = max(0.0, (identity.now_ticks() - int(ticks)) / identity.clock_ticks())
        when = f", started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(time.time() - age))}"
    who = f"pid {pid}{when}" if pid is not None else "an unknown process"
    msg = (f"session {key!r} of {app!r} is held by a live run ({who}); "
           + (why or "host.session(key, take_over=True) ends that copy and takes the key over"))
    return SessionHeld(msg, session=key, run=info.get("run") if isinstance(info.get("run"), str)
                       else None, start=start, pid=pid)
