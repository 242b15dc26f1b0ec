"""What a stop ended, in words a person reads: the reports every stop returns.

``EndedWork`` is what ``Session.stop`` returns and announces, and what
``str()`` turns into one line ("Stopped (user request): ended `npm run build`
after 14m 02s and 3 other processes"). ``Resumed`` (a kind of ``EndedWork``)
is what ``session.resumed`` holds after a restart: "Resumed chat-42: ended the
earlier copy's `npm run build` (running 14m 02s) and `claude` with 3 other
processes". ``EndedTask`` is one live task of the ledger - or one group of
live work the agent started (``kind="work"``) - with the processes it owned;
``EndedProcess`` one process, ``root`` when the app started it itself (the
agent), else work the agent started.

A leaf: imports only ``dataclasses`` and ``tether.identity`` (for types).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from .identity import Identity

__all__ = ["EndedProcess", "EndedTask", "EndedWork", "Resumed", "format_duration", "argv_label",
           "oneline",
           "USER_REQUEST", "IDLE_RELEASE", "APP_EXIT", "RESUME", "TAKE_OVER", "SESSION_CLOSED",
           "WORK"]

# Stop reasons the host itself uses; any string works.
USER_REQUEST = "user request"
IDLE_RELEASE = "idle release"
APP_EXIT = "app exit"
RESUME = "resume"
TAKE_OVER = "take over"
SESSION_CLOSED = "session closed"
WORK = "work"  # the kind of an EndedTask that is live work found in the job, not a ledger task


def format_duration(seconds: float | None) -> str:
    """``5s``, ``14m 02s``, ``3h 07m``, ``2d 05h`` - tether's one short human
    duration (stop reports, ``tether reap``, ``tether ps``); ``?`` for None."""
    if seconds is None:
        return "?"
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {(s % 3600) // 60:02d}m"
    return f"{s // 86400}d {(s % 86400) // 3600:02d}h"


# A command line may hold newlines, tabs, escape sequences: one line each, and
# nothing that drives the terminal.
_CONTROL = {c: " " for c in range(32)} | {127: " "} | {c: " " for c in range(0x80, 0xA0)}


def oneline(text: str) -> str:
    """``text`` (a process name, command line or path read from ``/proc``, a
    label) as one printable line: control characters (escape sequences,
    newlines, C1 controls) become spaces, runs of blanks one. The one cleaner
    for what tether prints of a process it did not name itself (``tether
    ps``, ``tether reap``, a host's stop and resume sentences)."""
    return " ".join(text.translate(_CONTROL).split())


def argv_label(args: Any) -> str:
    """A command line as a short label: the program's basename and its
    arguments, shell-quoted, at most 80 characters."""
    import shlex

    if isinstance(args, (str, bytes, os.PathLike)):
        text = os.fsdecode(args)
    else:
        parts = [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a) for a in args]
        if parts:
            parts[0] = os.path.basename(parts[0]) or parts[0]
        text = shlex.join(parts)
    return text if len(text) <= 80 else text[:79] + "…"


def _plural(n: int, word: str) -> str:
    if n == 1:
        return f"1 other {word}"
    return f"{n} other {'processes' if word == 'process' else word + 's'}"


@dataclass
class EndedProcess:
    """One process a stop ended (or will end, in an announcement)."""

    pid: int
    label: str
    runtime_s: float
    identity: Identity | None = None
    root: bool = False  # the host started it itself (the agent): first in a headline

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "label": self.label, "runtime_s": round(self.runtime_s, 3),
                "root": self.root}


@dataclass
class EndedTask:
    """One live task a stop ended, with the processes it owned."""

    task_id: str
    label: str
    runtime_s: float
    status: str | None = None  # what the agent last said about it
    processes: list[EndedProcess] = field(default_factory=list)
    kind: str | None = None  # the ledger's kind ("local_bash", ...), or WORK
    ambient: bool = False  # the agent's own housekeeping: never the headline

    def to_dict(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "label": self.label,
                "runtime_s": round(self.runtime_s, 3), "status": self.status,
                "kind": self.kind, "ambient": self.ambient,
                "processes": [p.to_dict() for p in self.processes]}


@dataclass
class EndedWork:
    """What one stop ended: live tasks (with their processes), other processes.

    ``str()`` is one human line, or ``""`` when the stop ended nothing (or was
    skipped). ``planned`` marks an announcement made *before* ending; its
    line is :meth:`announcement`. ``skipped``: an optional stop held off by a
    live task (``held_by`` names them).
    """

    reason: str
    session: str | None = None
    tasks: list[EndedTask] = field(default_factory=list)
    processes: list[EndedProcess] = field(default_factory=list)
    optional: bool = False
    skipped: bool = False
    planned: bool = False
    held_by: list[str] = field(default_factory=list)
    note: str = ""

    def __bool__(self) -> bool:
        return not self.skipped and bool(self.tasks or self.processes)

    @property
    def process_count(self) -> int:
        return len(self.processes) + sum(len(t.processes) for t in self.tasks)

    def _headline(self) -> tuple[str, float, str]:
        """(label, runtime, rest-of-sentence) of the biggest thing ended."""
        if any(not t.ambient for t in self.tasks) or (self.tasks and not self.processes):
            # The agent's own housekeeping (ambient) heads a report only if nothing else can.
            top = max(self.tasks, key=lambda t: (not t.ambient, t.runtime_s))
            other_tasks = len(self.tasks) - 1
            other_procs = len(self.processes)
            label, runtime = top.label, top.runtime_s
        elif self.tasks:
            top_p = max(self.processes, key=lambda p: (p.root, p.runtime_s))
            other_tasks = len(self.tasks)
            other_procs = len(self.processes) - 1
            label, runtime = top_p.label, top_p.runtime_s
        else:
            top_p = max(self.processes, key=lambda p: (p.root, p.runtime_s))
            other_tasks = 0
            other_procs = len(self.processes) - 1
            label, runtime = top_p.label, top_p.runtime_s
        extras = []
        if other_tasks:
            extras.append(_plural(other_tasks, "task"))
        if other_procs:
            extras.append(_plural(other_procs, "process"))
        rest = (" and " + " and ".join(extras)) if extras else ""
        return oneline(label), runtime, rest

    def __str__(self) -> str:
        if not self:
            return ""
        label, runtime, rest = self._headline()
        return f"Stopped ({self.reason}): ended `{label}` after {format_duration(runtime)}{rest}"

    def announcement(self) -> str:
        """The line said before a stop ends anything ("" when it will end nothing)."""
        if not self:
            return ""
        label, runtime, rest = self._headline()
        return (f"Stopping ({self.reason}): ending `{label}` (running "
                f"{format_duration(runtime)}){rest}")

    @property
    def all_processes(self) -> list[EndedProcess]:
        """Every process: the tasks' ones (work the agent started included), then the rest."""
        return [p for t in self.tasks for p in t.processes] + list(self.processes)

    @property
    def agent(self) -> list[EndedProcess]:
        """The processes the app started itself (the agent)."""
        return [p for p in self.processes if p.root]

    @property
    def work(self) -> list[EndedProcess]:
        """Every other process: what the agent started (tasks' processes included)."""
        return [p for p in self.processes if not p.root] + [
            p for t in self.tasks for p in t.processes]

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "session": self.session, "optional": self.optional,
                "skipped": self.skipped, "planned": self.planned, "held_by": list(self.held_by),
                "note": self.note, "text": str(self) if self.planned is False else
                self.announcement(), "kind": type(self).__name__,
                "tasks": [t.to_dict() for t in self.tasks],
                "processes": [p.to_dict() for p in self.processes]}


@dataclass
class Resumed(EndedWork):
    """What ``host.session(key)`` ended of an earlier copy of the session -
    left by a run that is over (reason ``resume``), or held by a live run it
    took over (reason ``take over``, ``holder`` its owner's pid). Reads like a
    stop report: the tasks first, then the agent, then a count::

        Resumed chat-42: ended the earlier copy's `npm run build` (running
        14m 02s) and `claude` with 3 other processes
    """

    holder: int | None = None

    def _sentence(self, planned: bool) -> str:
        if not self:
            return ""
        tasks = sorted(self.tasks, key=lambda t: (not t.ambient, t.runtime_s), reverse=True)
        roots = sorted(self.agent, key=lambda p: p.runtime_s, reverse=True)
        rest = [p for p in self.processes if not p.root]
        parts: list[str] = []
        if tasks:
            parts.append(f"`{oneline(tasks[0].label)}` (running "
                         f"{format_duration(tasks[0].runtime_s)})")
            if len(tasks) > 1:
                parts.append(_plural(len(tasks) - 1, "task"))
        if roots:
            shown = roots[0] if tasks else None
            if shown is None:
                parts.append(f"`{oneline(roots[0].label)}` (running "
                             f"{format_duration(roots[0].runtime_s)})")
            else:
                parts.append(f"`{oneline(roots[0].label)}`")
            rest += roots[1:]
        elif not tasks:
            top = max(rest, key=lambda p: p.runtime_s)
            parts.append(f"`{oneline(top.label)}` (running {format_duration(top.runtime_s)})")
            rest = [p for p in rest if p is not top]
        text = " and ".join(parts) if len(parts) < 3 else (
            ", ".join(parts[:-1]) + " and " + parts[-1])
        if rest:
            n = len(rest)
            text += f" with {n} other {'process' if n == 1 else 'processes'}"
        if self.reason == TAKE_OVER:
            who = f" from pid {self.holder}" if self.holder is not None else ""
            verb = "Taking over" if planned else "Took over"
            return f"{verb} {self.session}{who}: {'ending' if planned else 'ended'} its copy's {text}"
        verb = "Resuming" if planned else "Resumed"
        return (f"{verb} {self.session}: {'ending' if planned else 'ended'} the earlier copy's "
                f"{text}")

    def __str__(self) -> str:
        return self._sentence(False)

    def announcement(self) -> str:
        return self._sentence(True)
