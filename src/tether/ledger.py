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
until it exits or the cap is reached. A stop asked for by a person is never
held.

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
task_updated         task_id, patch.status, when terminal     ``finished(task_id, status)``
                     (``completed`` | ``failed`` |
                     ``killed``)
===================  ======================================  ===================================

Sources for the shapes: DESIGN.md (tether/host.py); the typed messages of the
``claude-codes`` crate (meawoppl/rust-code-agent-sdks, ``TaskStartedMessage``,
``TaskNotificationMessage``, ``TaskUpdatedMessage``: "a background task's
terminal state can arrive only as a task_updated"); anthropics/claude-code
#74982 (notifications before process exit, repeated). A notification for a
task id the ledger never saw is ignored: there is nothing to hold a stop for.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import IO, Any

from . import identity
from .identity import Identity

__all__ = ["Task", "Ledger", "StreamAdapter", "STREAM_MAPPING", "TERMINAL_STATUSES"]

# Statuses that mean "the stream says this task is over".
TERMINAL_STATUSES = frozenset({"completed", "failed", "stopped", "killed"})

# The mapping table above, as data (tests and docs read it from here).
STREAM_MAPPING: dict[str, str] = {
    "task_started": "started(task_id, description, kind=task_type)",
    "task_progress": "progress(task_id)",
    "task_notification": "finished(task_id, status)",
    "task_updated": "finished(task_id, patch.status) when patch.status is terminal",
}

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
            "processes": sorted(self.processes),
        }


class Ledger:
    """Live tasks of one session.

    ``members``: a callable giving the identities of the session job's live
    members (``session.members``); without it the ledger trusts the event
    stream alone. Thread-safe: a stream adapter may feed it from a reader
    thread while the app asks ``live()``.
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
                pids: Iterable[int] = ()) -> Task:
        """A task started. ``pids``: its processes, when the caller knows them
        (their descendants are the task's too). Starting a known id again
        reopens it (the same background command restarted)."""
        task_id = str(task_id)
        with self._lock:
            task = Task(task_id, _label(label, task_id), kind=kind,
                        started_ticks=identity.now_ticks())
            for pid in pids:
                ident = identity.read(int(pid))
                if ident is not None:
                    task.processes[ident.pid] = ident
                    task.explicit = True
            self._tasks[task_id] = task
            self._notify(task)
            return task

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

    def idle(self) -> bool:
        return not self.live()

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
                pass

    def _settle(self, task: Task) -> None:
        if task.finished is not None or task.said_finished is None:
            return
        alive = {pid: i for pid, i in task.processes.items() if identity.is_alive(i)}
        if not alive:
            task.finished = time.monotonic()
            self._changed.notify_all()

    def _claim(self) -> None:
        """Give every unowned live member to the task it belongs to (rules 1-2)."""
        if self._members is None or not self._tasks:
            return
        try:
            members = sorted(self._members(), key=lambda i: i.start)  # parents first
        except Exception:  # noqa: BLE001 - a closed job has no members to claim
            return
        owner: dict[int, Task] = {}
        for task in self._tasks.values():
            for pid in task.processes:
                owner[pid] = task
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
            if best is None or task.started_ticks > best.started_ticks:
                best = task
        return best


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
        tid = msg.get("task_id")
        if sub not in STREAM_MAPPING or not isinstance(tid, (str, int)):
            return None
        if isinstance(msg.get("session_id"), str):
            self.session_id = msg["session_id"]
        if sub == "task_started":
            return self.ledger.started(str(tid), msg.get("description") or msg.get("tool_use_id"),
                                       kind=msg.get("task_type"))
        if sub == "task_progress":
            return self.ledger.progress(str(tid), msg.get("description"))
        if sub == "task_notification":
            status = msg.get("status")
            return self.ledger.finished(str(tid), status if isinstance(status, str) else "completed")
        patch = msg.get("patch")
        status = patch.get("status") if isinstance(patch, dict) else None
        if status in TERMINAL_STATUSES:
            return self.ledger.finished(str(tid), status)
        return None

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
