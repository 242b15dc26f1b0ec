"""The live-task ledger of one agent session, and the adapter that feeds it
from Claude Code's ``--output-format stream-json`` lines.

A *task* is a piece of work the agent started and may still be doing: a
background shell command (``npm run build``), a sub-agent. The host asks the
ledger before an *optional* stop (an idle release): while a task is live, the
stop waits or is skipped, up to a cap.

The ledger believes the job's real members over the event stream. Claude Code
can report a background command as finished *before* its process has exited,
and report it again later (claude-code #74982). So "finished" from the stream
(or from the app) only marks a task as *said finished*; the task stays live
while any process it owns is still running.

Which processes a task owns (when the caller does not name them):

1. a process whose parent a task owns belongs to that task;
2. otherwise, a process born while a task was open belongs to the most
   recently started such task - "open" running from ``claim_slack`` seconds
   before ``started()`` (the event reaches us a moment after the agent spawned
   the command) until the task was said finished;
3. a process born before every task (the agent, its MCP servers, its shell)
   belongs to no task, and neither does one the host started itself
   (``not_a_task``: the session's own ``popen`` marks the agent so).

This errs toward "live": a process that an MCP server happened to start
during a task's window is counted as the task's, and holds an optional stop
until it exits. A stop asked for by a person is never held. An *ambient*
task (the agent CLI's own housekeeping, such as a file watcher: Claude Code
marks it ``ambient``) never holds an optional stop, though it is listed and
its processes are named when a stop ends them.

Live work without any adapter
=============================

:func:`live_work` reads the job's real members and lists every process group
the agent started apart from its own: every agent CLI starts each tool call
in a session of its own (Claude Code's bash tool call is a session leader,
Codex calls ``setsid()``, Gemini, OpenCode and pi spawn with node's
``detached: true``). The agent's own groups are those of the processes the
host started (the agent and, in its group, its MCP servers). Each entry has
its leader's command line (read from ``/proc`` for this list only: the
audit never stores it), start time and member count, and says
whether it ``outlived`` its tool call (its leader exited, or no longer has a
parent on the agent's side) and which ledger task, if any, owns it.

Stream mapping (the one table; field names as Claude Code writes them)
======================================================================

Every line is one JSON object. Only ``"type": "system"`` lines with these
``subtype`` values are used; every other line is ignored (and counted).

===================  ======================================  ===================================
subtype              fields read                             ledger call
===================  ======================================  ===================================
task_started         task_id, description, task_type          ``started(task_id, description,
                     (``local_bash`` | ``local_agent``),       kind=task_type)``
                     tool_use_id, session_id
task_progress        task_id, description                     ``progress(task_id)``: keeps the
                                                              task open; opens it when its
                                                              ``task_started`` was missed
task_notification    task_id, status (``completed`` |         ``finished(task_id, status)``:
                     ``failed`` | ``stopped``), summary       *said* finished; may come early
                                                              and more than once
task_updated         task_id, patch.status, when terminal     ``finished(task_id, status)``;
                     (``completed`` | ``failed`` |            ``backgrounded(task_id)`` for
                     ``killed``), patch.is_backgrounded       ``is_backgrounded: true``
background_tasks_    tasks: [{task_id, task_type,             the whole live background set:
changed              description, ambient}]                   a listed task is opened if new,
                                                              marked backgrounded (and ambient
                                                              as listed); one last seen
                                                              backgrounded and not listed is
                                                              ``finished(task_id, "unlisted")``
===================  ======================================  ===================================

``task_started`` also carries ``is_backgrounded`` and ``ambient``, and
``task_notification`` ``ambient``: both are kept on the task. A task missing
from a ``background_tasks_changed`` list is only *said* finished - a
foreground task is never listed, so only tasks last seen backgrounded are
judged by the list; an unlisted id may be one step ahead of its
``task_started`` and is opened.

Sources for the shapes: DESIGN.md (tether/host.py); the typed messages of the
``claude-codes`` crate (meawoppl/rust-code-agent-sdks, ``TaskStartedMessage``,
``TaskNotificationMessage``, ``TaskUpdatedMessage``: "a background task's
terminal state can arrive only as a task_updated"); the Claude Agent SDK's
type declarations (``SDKBackgroundTasksChangedMessage``: ``tasks`` of
``{task_id, task_type, description, ambient?}``; ``SDKTaskStartedMessage``:
``is_backgrounded?``, ``ambient?``; ``SDKTaskUpdatedMessage``:
``patch.is_backgrounded?``, ``patch.status`` of ``pending | running |
completed | failed | killed | paused``); anthropics/claude-code #74982
(notifications before process exit, repeated). A notification for a
task id the ledger never saw is ignored: there is nothing to hold a stop for.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import IO, Any

from . import identity
from .identity import Identity

__all__ = ["Task", "Ledger", "StreamAdapter", "Work", "live_work", "STREAM_MAPPING",
           "TERMINAL_STATUSES"]

# Statuses that mean "the stream says this task is over".
TERMINAL_STATUSES = frozenset({"completed", "failed", "stopped", "killed"})

# The mapping table above, as data (tests and docs read it from here).
STREAM_MAPPING: dict[str, str] = {
    "task_started": "started(task_id, description, kind=task_type, ambient=ambient, "
                    "backgrounded=is_backgrounded)",
    "task_progress": "progress(task_id)",
    "task_notification": "finished(task_id, status)",
    "task_updated": "finished(task_id, patch.status) when patch.status is terminal; "
                    "backgrounded(task_id) when patch.is_backgrounded",
    "background_tasks_changed": "the live background set: listed tasks opened/marked, "
                                "backgrounded ones not listed said finished",
}
UNLISTED = "unlisted"  # the status of a background task missing from the live set

MAX_LABEL = 120  # a label is one line of a report: long prompts are cut


def _label(text: Any, fallback: str) -> str:
    s = " ".join(str(text).split()) if text else ""
    if not s:
        s = fallback
    return s if len(s) <= MAX_LABEL else s[: MAX_LABEL - 1] + "…"


@dataclass
class Task:
    """One task of a session, as the ledger sees it."""

    task_id: str
    label: str
    kind: str | None = None  # "local_bash", "local_agent", or what the app says
    started: float = field(default_factory=time.time)  # wall clock, for reports
    started_mono: float = field(default_factory=time.monotonic)
    started_ticks: int = 0  # identity clock: processes born after belong here
    said_finished: float | None = None  # monotonic time the stream/app said "done"
    said_finished_ticks: int | None = None
    status: str | None = None  # last status the stream/app gave
    notifications: int = 0  # how often it was said finished (#74982: more than once)
    finished: float | None = None  # monotonic time it was really over
    processes: dict[int, Identity] = field(default_factory=dict)  # owned, by pid
    explicit: bool = False  # the caller named its processes
    ambient: bool = False  # the agent's own housekeeping: never holds an optional stop
    backgrounded: bool = False  # the agent said it runs in the background

    @property
    def runtime_s(self) -> float:
        end = self.finished if self.finished is not None else time.monotonic()
        return max(0.0, end - self.started_mono)

    @property
    def live(self) -> bool:
        return self.finished is None

    def live_processes(self) -> list[Identity]:
        return [i for i in self.processes.values() if identity.is_alive(i)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "label": self.label,
            "kind": self.kind,
            "started": self.started,
            "runtime_s": round(self.runtime_s, 3),
            "status": self.status,
            "said_finished": self.said_finished is not None,
            "notifications": self.notifications,
            "live": self.live,
            "ambient": self.ambient,
            "backgrounded": self.backgrounded,
            "processes": sorted(self.processes),
        }

    def record(self) -> dict[str, Any]:
        """This task as one entry of a ``tasks`` audit record (see tether.audit)."""
        rec: dict[str, Any] = {"id": self.task_id, "label": self.label, "started": self.started,
                               "ticks": self.started_ticks,
                               "pids": [[i.pid, i.start] for i in self.processes.values()]}
        for k, v in (("kind", self.kind), ("said", self.said_finished_ticks),
                     ("ambient", self.ambient or None), ("bg", self.backgrounded or None)):
            if v is not None:
                rec[k] = v
        return rec


class Ledger:
    """Live tasks of one session.

    ``members``: a callable giving the identities of the session job's live
    members (``session.members``); without it the ledger trusts the event
    stream alone. ``on_change(task)`` is called after each change to a task;
    if it raises, the ledger goes on and the ``tether.ledger`` logger says so.
    Thread-safe: a stream adapter may feed it from a reader thread while the
    app asks ``live()``.
    """

    def __init__(
        self,
        members: Callable[[], Iterable[Identity]] | None = None,
        *,
        claim_slack: float = 0.25,
        on_change: Callable[[Task], Any] | None = None,
    ) -> None:
        self._members = members
        self._slack_ticks = int(claim_slack * identity.clock_ticks())
        self._on_change = on_change
        self._lock = threading.RLock()
        self._tasks: dict[str, Task] = {}
        self._untasked: dict[int, Identity] = {}
        self._changed = threading.Condition(self._lock)

    # -- what the agent (or the stream) says ----------------------------------------
    def started(self, task_id: str, label: str | None = None, *, kind: str | None = None,
                pids: Iterable[int] = (), ambient: bool | None = None,
                backgrounded: bool | None = None) -> Task:
        """A task started. ``pids``: its processes, when the caller knows them
        (their descendants are the task's too). ``ambient``: the agent's own
        housekeeping, never holding an optional stop. Starting a known id
        that is still open updates it (a ``task_started`` that follows the
        live set that opened it); starting one that was said finished
        reopens it (the same background command restarted)."""
        task_id = str(task_id)
        with self._lock:
            old = self._tasks.get(task_id)
            if old is not None and old.said_finished is None and old.finished is None:
                if label:
                    old.label = _label(label, task_id)
                old.kind = kind or old.kind
                old.ambient = old.ambient if ambient is None else bool(ambient)
                old.backgrounded = old.backgrounded or bool(backgrounded)
                self._add_pids(old, pids)
                self._notify(old)
                return old
            task = Task(task_id, _label(label, task_id), kind=kind,
                        started_ticks=identity.now_ticks(), ambient=bool(ambient),
                        backgrounded=bool(backgrounded))
            self._add_pids(task, pids)
            self._tasks[task_id] = task
            self._notify(task)
            return task

    @staticmethod
    def _add_pids(task: Task, pids: Iterable[int]) -> None:
        for pid in pids:
            ident = identity.read(int(pid))
            if ident is not None:
                task.processes[ident.pid] = ident
                task.explicit = True

    def backgrounded(self, task_id: str, ambient: bool | None = None) -> Task | None:
        """The agent moved the task to the background (or listed it so).
        Unknown ids are ignored (returns None)."""
        with self._lock:
            task = self._tasks.get(str(task_id))
            if task is None:
                return None
            changed = not task.backgrounded or (ambient is not None and task.ambient != ambient)
            task.backgrounded = True
            if ambient is not None:
                task.ambient = bool(ambient)
            if changed:
                self._notify(task)
            return task

    def set_ambient(self, task_id: str, ambient: bool) -> Task | None:
        """Mark a known task as the agent's own housekeeping (or not)."""
        with self._lock:
            task = self._tasks.get(str(task_id))
            if task is not None and task.ambient != bool(ambient):
                task.ambient = bool(ambient)
                self._notify(task)
            return task

    def background_set(self, listed: Iterable[tuple[str, str | None, str | None, bool]]
                       ) -> list[Task]:
        """The agent's whole live background set, as ``(task_id, label, kind,
        ambient)``: a listed task is opened if new and marked backgrounded; a
        task last seen backgrounded that is not listed is said finished
        (status ``unlisted``; still live while its processes run). Returns the
        tasks touched."""
        out: list[Task] = []
        with self._lock:
            seen: set[str] = set()
            for task_id, label, kind, ambient in listed:
                task_id = str(task_id)
                seen.add(task_id)
                task = self._tasks.get(task_id)
                if task is None or task.said_finished is not None or task.finished is not None:
                    task = self.started(task_id, label, kind=kind, ambient=ambient,
                                        backgrounded=True)
                else:
                    task = self.backgrounded(task_id, ambient) or task
                out.append(task)
            for task in list(self._tasks.values()):
                if (task.backgrounded and task.task_id not in seen
                        and task.said_finished is None and task.finished is None):
                    out.append(self.finished(task.task_id, UNLISTED) or task)
        return out

    def not_a_task(self, ident: Identity | None) -> None:
        """``ident`` (and so nothing but its own children) never joins a task by
        the time window: the agent process the host started, for one."""
        if ident is not None:
            with self._lock:
                self._untasked[ident.pid] = ident

    def progress(self, task_id: str, label: str | None = None) -> Task:
        """The task is still going; opens it when its start was missed."""
        task_id = str(task_id)
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None:
                return self.started(task_id, label)
            return task

    def finished(self, task_id: str, status: str = "completed") -> Task | None:
        """The agent says the task is over. It stays live while a process it
        owns still runs. Unknown ids are ignored (returns None)."""
        task_id = str(task_id)
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None:
                return None
            task.notifications += 1
            task.status = status
            if task.said_finished is None:
                # Claim what was born up to now before the window closes.
                self._claim()
                task.said_finished = time.monotonic()
                task.said_finished_ticks = identity.now_ticks()
            self._settle(task)
            self._notify(task)
            return task

    def stopped(self, reason: str = "stopped") -> list[Task]:
        """Every live task was ended by a stop: mark them over. Returns them."""
        with self._lock:
            out = []
            for task in self._tasks.values():
                if task.finished is None:
                    task.status = reason
                    task.finished = time.monotonic()
                    out.append(task)
                    self._notify(task)
            return out

    # -- what is true -------------------------------------------------------------
    def get(self, task_id: str) -> Task | None:
        with self._lock:
            return self._tasks.get(str(task_id))

    def tasks(self) -> list[Task]:
        """Every task seen, oldest first."""
        with self._lock:
            return sorted(self._tasks.values(), key=lambda t: t.started_mono)

    def live(self) -> list[Task]:
        """Tasks not over: not yet said finished, or said finished while a
        process they own still runs. Reads the job's members now."""
        with self._lock:
            self._claim()
            out = []
            for task in self._tasks.values():
                if task.finished is None:
                    self._settle(task)
                if task.finished is None:
                    out.append(task)
            return sorted(out, key=lambda t: t.started_mono)

    def holding(self) -> list[Task]:
        """Live tasks that hold an optional stop: every live one but ambient ones."""
        return [t for t in self.live() if not t.ambient]

    def idle(self) -> bool:
        return not self.live()

    def wait_change(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for any change of the ledger."""
        with self._changed:
            self._changed.wait(max(0.0, timeout))

    def snapshot(self) -> list[dict[str, Any]]:
        """The live tasks as the ``tasks`` field of an audit record."""
        with self._lock:
            return [t.record() for t in sorted(self._tasks.values(), key=lambda t: t.started_mono)
                    if t.finished is None]

    @classmethod
    def restore(cls, records: Iterable[Any], boot: str | None = None,
                claim_slack: float = 0.25) -> Ledger:
        """A ledger of the tasks one ``tasks`` audit record lists (an earlier
        run's, read back after a crash): to :meth:`assign` its leftovers."""
        boot = boot or identity.boot_id()
        led = cls(claim_slack=claim_slack)
        now_wall, now_mono = time.time(), time.monotonic()
        for r in records:
            if type(r) is not dict or not isinstance(r.get("id"), str):
                continue
            started = r.get("started")
            started = float(started) if isinstance(started, (int, float)) else now_wall
            ticks = r.get("ticks")
            said = r.get("said")
            task = Task(r["id"], _label(r.get("label"), r["id"]),
                        kind=r.get("kind") if isinstance(r.get("kind"), str) else None,
                        started=started, started_mono=now_mono - max(0.0, now_wall - started),
                        started_ticks=ticks if type(ticks) is int else 0,
                        said_finished_ticks=said if type(said) is int else None,
                        ambient=r.get("ambient") is True, backgrounded=r.get("bg") is True)
            if task.said_finished_ticks is not None:
                task.said_finished = now_mono
            for p in r.get("pids") or ():
                if type(p) is list and len(p) == 2 and type(p[0]) is int and type(p[1]) is int:
                    task.processes[p[0]] = Identity(p[0], p[1], boot)
            led._tasks[task.task_id] = task
        return led

    def assign(self, members: Iterable[Identity]) -> dict[tuple[int, int], Task]:
        """Which task owns each of ``members`` (by the rules above, as a live
        ledger claims): ``{(pid, start): task}`` for those a task owns."""
        with self._lock:
            self._claim(list(members))
            out: dict[tuple[int, int], Task] = {}
            for task in self._tasks.values():
                for i in task.processes.values():
                    out[(i.pid, i.start)] = task
            return out

    def wait_idle(self, timeout: float | None, poll: float = 0.05) -> bool:
        """Wait until no task is live; True if so, False at ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self.live():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                # Woken by any ledger change; polled for process exits.
                self._changed.wait(poll if left is None else min(poll, left))
            return True

    def __len__(self) -> int:
        return len(self.live())

    def __repr__(self) -> str:
        return f"<tether.Ledger {len(self._tasks)} tasks>"

    # -- internals -----------------------------------------------------------------
    def _notify(self, task: Task) -> None:
        self._changed.notify_all()
        if self._on_change is not None:
            try:
                self._on_change(task)
            except Exception:  # noqa: BLE001 - an app callback must not break the ledger
                # but its failure is said, as a Host's announce callback's is
                logging.getLogger("tether.ledger").exception(
                    "tether ledger: on_change callback failed for task %r", task.task_id)

    def _settle(self, task: Task) -> None:
        if task.finished is not None or task.said_finished is None:
            return
        alive = {pid: i for pid, i in task.processes.items() if identity.is_alive(i)}
        if not alive:
            task.finished = time.monotonic()
            self._changed.notify_all()

    def _claim(self, given: list[Identity] | None = None) -> None:
        """Give every unowned live member (or each of ``given``) to the task it
        belongs to (rules 1-2)."""
        if not self._tasks or (given is None and self._members is None):
            return
        try:
            found = given if given is not None else self._members() if self._members else ()
            members = sorted(found, key=lambda i: i.start)  # parents first
        except Exception:  # noqa: BLE001 - a closed job has no members to claim
            return
        gained: set[str] = set()
        owner: dict[int, Task] = {}
        for t in self._tasks.values():
            for pid in t.processes:
                owner[pid] = t
        for m in members:
            known = owner.get(m.pid)
            if known is not None and known.processes[m.pid].same_process(m):
                continue
            task = owner.get(m.ppid)
            if task is None or task.finished is not None:
                task = self._window_task(m)
            if task is not None:
                task.processes[m.pid] = m
                owner[m.pid] = task
                gained.add(task.task_id)
        for tid in gained:  # a claim changes what a snapshot would say
            self._notify(self._tasks[tid])

    def _window_task(self, m: Identity) -> Task | None:
        known = self._untasked.get(m.pid)
        if known is not None and known.same_process(m):
            return None
        best: Task | None = None
        for task in self._tasks.values():
            if task.finished is not None or task.explicit:
                continue
            if m.start < task.started_ticks - self._slack_ticks:
                continue
            if task.said_finished_ticks is not None and m.start > task.said_finished_ticks:
                continue
            if best is None or _started(task) > _started(best):
                best = task
        return best


def _started(task: Task) -> tuple[int, float]:
    """When a task started, to find the latest: ticks first, then the monotonic
    clock, finer (of two tasks started within one tick, a process born after
    both is the later one's)."""
    return task.started_ticks, task.started_mono


class StreamAdapter:
    """Feeds a :class:`Ledger` from Claude Code ``stream-json`` lines.

    ``feed(line)`` takes one line (str or bytes) and returns the task it
    touched, or None. ``follow(stream)`` reads a file object line by line
    until EOF (run it in a thread for a live agent). Counts what it ignored.
    """

    def __init__(self, ledger: Ledger, *, on_line: Callable[[dict[str, Any]], Any] | None = None):
        self.ledger = ledger
        self.on_line = on_line
        self.lines = 0
        self.used = 0
        self.ignored = 0
        self.malformed = 0
        self.sets = 0  # background_tasks_changed lines taken in
        self.session_id: str | None = None

    def feed(self, line: str | bytes) -> Task | None:
        self.lines += 1
        if isinstance(line, bytes):
            line = line.decode("utf-8", "replace")
        line = line.strip()
        if not line:
            self.ignored += 1
            return None
        try:
            msg = json.loads(line)
        except ValueError:
            self.malformed += 1
            return None
        if not isinstance(msg, dict):
            self.malformed += 1
            return None
        if self.on_line is not None:
            self.on_line(msg)
        task = self._apply(msg)
        if task is None:
            self.ignored += 1
        else:
            self.used += 1
        return task

    def _apply(self, msg: dict[str, Any]) -> Task | None:
        if msg.get("type") != "system":
            return None
        sub = msg.get("subtype")
        if sub == "background_tasks_changed":
            return self._background_set(msg)
        tid = msg.get("task_id")
        if sub not in STREAM_MAPPING or not isinstance(tid, (str, int)):
            return None
        if isinstance(msg.get("session_id"), str):
            self.session_id = msg["session_id"]
        ambient = msg.get("ambient") if isinstance(msg.get("ambient"), bool) else None
        if sub == "task_started":
            return self.ledger.started(str(tid), msg.get("description") or msg.get("tool_use_id"),
                                       kind=msg.get("task_type"), ambient=ambient,
                                       backgrounded=msg.get("is_backgrounded") is True)
        if sub == "task_progress":
            return self.ledger.progress(str(tid), msg.get("description"))
        if sub == "task_notification":
            status = msg.get("status")
            if ambient is not None:
                self.ledger.set_ambient(str(tid), ambient)
            return self.ledger.finished(str(tid), status if isinstance(status, str) else "completed")
        patch = msg.get("patch")
        if not isinstance(patch, dict):
            return None
        touched = None
        if patch.get("is_backgrounded") is True:
            touched = self.ledger.backgrounded(str(tid))
        status = patch.get("status")
        if status in TERMINAL_STATUSES:
            return self.ledger.finished(str(tid), status)
        return touched

    def _background_set(self, msg: dict[str, Any]) -> Task | None:
        tasks = msg.get("tasks")
        if not isinstance(tasks, list):
            return None
        if isinstance(msg.get("session_id"), str):
            self.session_id = msg["session_id"]
        listed = []
        for t in tasks:
            if isinstance(t, dict) and isinstance(t.get("task_id"), (str, int)):
                kind = t.get("task_type") if isinstance(t.get("task_type"), str) else None
                listed.append((str(t["task_id"]), t.get("description"), kind,
                               t.get("ambient") is True))
        touched = self.ledger.background_set(listed)
        self.sets += 1
        return touched[0] if touched else None

    def follow(self, stream: IO[Any]) -> None:
        """Feed every line of ``stream`` until EOF (or until it is closed)."""
        try:
            for line in stream:
                self.feed(line)
        except (OSError, ValueError):
            return  # closed under us: the agent is gone

    def follow_in_thread(self, stream: IO[Any], name: str = "tether-stream") -> threading.Thread:
        """``follow(stream)`` in a daemon thread; returns the started thread."""
        t = threading.Thread(target=self.follow, args=(stream,), name=name, daemon=True)
        t.start()
        return t


# ---------------------------------------------------------------------------
# Live work, from the job's members alone


@dataclass
class Work:
    """One process group the agent started apart from its own (see the module doc)."""

    pgid: int
    sid: int
    label: str  # its leader's command line (else its oldest member's), shortened
    started: float  # wall clock, when its oldest member started
    runtime_s: float
    processes: list[Identity] = field(default_factory=list)  # oldest first
    leader: Identity | None = None  # the group's leader, while it runs
    outlived: bool = True  # its tool call is over: the leader exited or was orphaned
    task_id: str | None = None  # the ledger task that owns it (an ambient one only if no other)
    ambient: bool = False  # only ambient tasks own it: it never holds an optional stop

    @property
    def members(self) -> int:
        return len(self.processes)

    def to_dict(self) -> dict[str, Any]:
        return {"pgid": self.pgid, "sid": self.sid, "label": self.label, "started": self.started,
                "runtime_s": round(self.runtime_s, 3), "members": self.members,
                "leader": self.leader.pid if self.leader is not None else None,
                "outlived": self.outlived, "task_id": self.task_id, "ambient": self.ambient,
                "processes": [i.pid for i in self.processes]}


def _cmd_label(text: str) -> str:
    """A /proc command line as a short label: the program's basename, its arguments."""
    if not text:
        return ""
    head, _, rest = text.partition(" ")
    text = (head.rsplit("/", 1)[-1] or head) + (" " + rest if rest else "")
    return text if len(text) <= 80 else text[:79] + "…"


def live_work(members: Iterable[Identity], agent: Iterable[Identity], *,
              owner_of: dict[tuple[int, int], Task] | None = None,
              cmdline: Callable[[int], str] | None = identity.cmdline) -> list[Work]:
    """Every process group among ``members`` apart from the agent's own, longest-running first.

    ``agent``: the processes the host started (their process groups, and every
    member in them, are the agent's side: its MCP servers, its shell).
    ``owner_of``: ``Ledger.assign(members)``, to say which task owns a group.
    ``cmdline``: how to read a command line (None: name groups by ``comm``).
    """
    members = [m for m in members if m.state not in ("Z", "X", "x")]
    agent = list(agent)
    keys = {(i.pid, i.start) for i in agent}
    pgids = {i.pgid for i in agent if i.pgid > 0}
    pgids |= {m.pgid for m in members if (m.pid, m.start) in keys and m.pgid > 0}
    agent_side = {m.pid for m in members if m.pgid in pgids or (m.pid, m.start) in keys}
    groups: dict[int, list[Identity]] = {}
    for m in members:
        if m.pid not in agent_side and m.pgid > 0:
            groups.setdefault(m.pgid, []).append(m)
    now, hz, wall = identity.now_ticks(), identity.clock_ticks(), time.time()
    out: list[Work] = []
    for pgid, procs in groups.items():
        procs.sort(key=lambda i: i.start)
        leader = next((p for p in procs if p.pid == pgid), None)
        head = leader or procs[0]
        label = _cmd_label(cmdline(head.pid) if cmdline is not None else "")
        runtime = max(0.0, (now - procs[0].start) / hz)
        owners = [t for t in (owner_of.get((p.pid, p.start)) for p in procs) if t is not None] \
            if owner_of else []
        task = max((t for t in owners if not t.ambient), key=_started, default=None)
        ambient = task is None and bool(owners)
        if ambient:
            task = max(owners, key=_started)
        out.append(Work(pgid, head.sid, label or head.comm or str(head.pid), wall - runtime,
                        runtime, procs, leader, leader is None or leader.ppid not in agent_side,
                        task.task_id if task is not None else None, ambient))
    out.sort(key=lambda w: -w.runtime_s)
    return out
