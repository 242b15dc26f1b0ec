"""The signals a one-command wrapper waits on, caught and turned into a wake-up.

Used by ``tether-shell`` and its lean one-command path. Pitfalls it handles:

* A signal the caller left ignored (``nohup``, a shell's background job)
  stays ignored: installing a handler would undo what the caller asked for.
* The handler only records the signal; the wake-up comes through
  ``signal.set_wakeup_fd`` on a non-blocking self-pipe, so a ``poll`` on it and
  on the child cannot miss a signal that lands just before it sleeps.
* The pipe is set up before the handlers, so a signal arriving while they are
  being installed still wakes the poll.
* Only the main thread may do either; elsewhere there is no pipe (``rfd`` is
  -1) unless ``need_wakeup`` makes that an error.

Imports only ``os`` and ``_signal`` (``signal`` pulls in ``enum``): this is on
the wrapper's start-up path.
"""

import _signal
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable


class SignalWatch:
    """Record ``stops`` and ``defers`` (signal numbers) as they arrive."""

    def __init__(self, stops: "Iterable[int]", defers: "Iterable[int]", *,
                 need_wakeup: bool = False) -> None:
        self.got: list[int] = []
        self.stops: set[int] = set()
        self.old: dict[int, object] = {}
        self.rfd = self.wfd = -1
        self.old_wakeup = -1
        if hasattr(os, "pipe2"):  # POSIX; Windows would need a socket here
            self.rfd, self.wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                self.old_wakeup = _signal.set_wakeup_fd(self.wfd, warn_on_full_buffer=False)
            except (ValueError, OSError):  # not the main thread
                self._close_pipe()
        if need_wakeup and self.rfd < 0:
            raise ValueError("signals can be waited for only from the main thread")
        stops = tuple(stops)
        for sig in (*stops, *defers):
            try:
                prev = _signal.getsignal(sig)
                if prev == _signal.SIG_IGN:
                    continue
                _signal.signal(sig, self._on_signal)
            except (OSError, ValueError):
                continue
            self.old[sig] = prev
            if sig in stops:
                self.stops.add(sig)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.got.append(signum)

    def first(self) -> int | None:
        """The first stop signal received, or None."""
        for s in self.got:
            if s in self.stops:
                return s
        return None

    def drain(self) -> None:
        """Empty the wake-up pipe after a poll saw it readable."""
        try:
            os.read(self.rfd, 512)
        except OSError:
            pass

    def _close_pipe(self) -> None:
        os.close(self.rfd)
        os.close(self.wfd)
        self.rfd = self.wfd = -1

    def restore(self) -> None:
        """Put back the handlers and wake-up fd that were there before."""
        for sig, prev in self.old.items():
            try:
                _signal.signal(sig, prev)
            except (OSError, ValueError, TypeError):
                pass
        self.old.clear()
        if self.wfd >= 0:
            try:
                _signal.set_wakeup_fd(self.old_wakeup)
            except (ValueError, OSError):
                pass
            self._close_pipe()


#: SIGINTs taken by :func:`interrupt`. Python raises the KeyboardInterrupt
#: where the interpreter is; inside a callback whose exceptions it only
#: prints ("Exception ignored in: ...", e.g. an import lock's weakref
#: callback, or a ``__del__``) the interrupt is lost, and the program goes
#: on. ``tether run`` reads this list where it starts waiting, so a Ctrl+C
#: lost that way still stops its command.
INTERRUPTS: "list[int]" = []


def interrupt(sig: int, _frame: object) -> None:
    """Python's default SIGINT handler, which also remembers the signal."""
    INTERRUPTS.append(sig)
    raise KeyboardInterrupt


def catch_interrupts() -> "object":
    """Take SIGINT with :func:`interrupt` where Python's default handler has it
    (not where the caller ignores it, or a program set its own). Returns the
    handler it replaced, for :func:`release_interrupts`."""
    before = _signal.getsignal(_signal.SIGINT)
    if before is _signal.default_int_handler:
        _signal.signal(_signal.SIGINT, interrupt)
    return before


def release_interrupts(before: "object") -> None:
    """Give SIGINT back to ``before`` (:func:`catch_interrupts`' answer), if it
    is still :func:`interrupt`'s, and forget what was remembered: an app that
    called ``tether.cli.main`` gets its process back as it was."""
    if _signal.getsignal(_signal.SIGINT) is interrupt and before is not None:
        _signal.signal(_signal.SIGINT, before)
    INTERRUPTS.clear()
