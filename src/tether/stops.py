"""What a stop ended, in words a person reads: the reports every stop returns.

``EndedWork`` is what ``Session.stop`` returns and announces, what
``session.resumed`` holds after a restart, and what ``str()`` turns into one
line ("Stopped (user request): ended `npm run build` after 14m 02s and 3
other processes"). ``EndedTask`` is one live task of the ledger with the
processes it owned; ``EndedProcess`` one process, ``root`` when the app
started it itself (the agent), else work the agent started.

A leaf: imports only ``dataclasses`` and ``tether.identity`` (for types).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from .identity import Identity

__all__ = ["EndedProcess", "EndedTask", "EndedWork", "format_duration", "argv_label",
           "USER_REQUEST", "IDLE_RELEASE", "APP_EXIT", "RESUME", "SESSION_CLOSED"]

# Stop reasons the host itself uses; any string works.
USER_REQUEST = "user request"
IDLE_RELEASE = "idle release"
APP_EXIT = "app exit"
RESUME = "resume"
SESSION_CLOSED = "session closed"


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

    def to_dict(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "label": self.label,
                "runtime_s": round(self.runtime_s, 3), "status": self.status,
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
        if self.tasks:
            top = max(self.tasks, key=lambda t: t.runtime_s)
            other_tasks = len(self.tasks) - 1
            other_procs = len(self.processes)
            label, runtime = top.label, top.runtime_s
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
        return label, runtime, rest

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

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "session": self.session, "optional": self.optional,
                "skipped": self.skipped, "planned": self.planned, "held_by": list(self.held_by),
                "note": self.note, "text": str(self),
                "tasks": [t.to_dict() for t in self.tasks],
                "processes": [p.to_dict() for p in self.processes]}
