"""What a terminal session's close returns: :class:`CloseResult`, and the
:class:`CloseOperation` that every ``close()`` during a pending close joins.

``PtySession.close`` (in :mod:`tether.pty`, with the close's steps) starts one
operation per close; a ``close()`` while it is pending gets the same one (an
immediate close that joins a graceful one escalates it, through
``_escalate``, until the operation is ``_sealed``), and every caller gets the
same result. The result's lists hold identities (pid + start + boot), so a
PID the kernel reuses later is never taken for a process the close dealt with.
Plain data and an event: nothing here signals or reads a process.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from .identity import Identity

__all__ = ["CloseResult", "CloseOperation"]


@dataclass
class CloseResult:
    """What a close did. Every list holds identities (pid + start + boot), so
    a PID that the kernel reuses later is never confused with these.

    ``captured``: the session's processes found by the close's bounded
    capture (the root excluded). ``terminated``: captured processes (and the
    root) that were gone before the grace ended. ``killed``: those SIGKILLed
    after the grace and the identity recheck. ``refused``: (identity, reason)
    pairs the identity layer would not signal. ``failed``: (identity, signal,
    error) for signals that failed after their retries (identity None: the
    job's close failed and the root was never read). ``survivors``:
    captured processes still running when the close gave up waiting (empty
    when all went well; the session then keeps its owner record).
    ``left_running`` (graceful only): processes the hang-up left alive, which
    stay in the session's job.
    """

    mode: str
    root: Identity | None = None
    captured: list[Identity] = field(default_factory=list)
    terminated: list[Identity] = field(default_factory=list)
    killed: list[Identity] = field(default_factory=list)
    refused: list[tuple[Identity, str]] = field(default_factory=list)
    failed: list[tuple[Identity | None, int, str]] = field(default_factory=list)
    survivors: list[Identity] = field(default_factory=list)
    left_running: list[Identity] = field(default_factory=list)
    capture_complete: bool = True
    capture_reason: str = ""
    capture_ms: float = 0.0
    job_ended: bool = False
    returncode: int | None = None
    elapsed: float = 0.0
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        """No error, and nothing captured is left running."""
        return self.error is None and not self.survivors


class CloseOperation:
    """A pending or finished close; every ``close()`` call during it joins it."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self._done = threading.Event()
        self._result: CloseResult | None = None
        # A graceful close that an immediate one joined: it turns immediate.
        self._escalate = threading.Event()
        self._sealed = False  # past the last point where it could still turn

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> CloseResult:
        """The close's result, waiting for it; ``TimeoutError`` if not in time."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"close not finished within {timeout} s")
        assert self._result is not None
        return self._result

    def _finish(self, result: CloseResult) -> None:
        self._result = result
        self._done.set()
