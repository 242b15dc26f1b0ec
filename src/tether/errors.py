"""Exceptions tether raises. A leaf: imports nothing from tether.

Every exception tether raises on purpose derives from :class:`TetherError`
and carries, besides its message, the fields a program may want to act on:
``reason`` (one line, without the message's framing), ``mechanism`` (the
job's mechanism, where one is involved) and ``pid`` (the process concerned,
where there is one). Bad arguments are not tether errors: they raise what
``subprocess`` raises for them (``ValueError``, ``TypeError``, an ``OSError``
whose ``filename`` is a ``str``).

The tree::

    TetherError
    ├── JobRefused       the job could not hold this process; nothing was started
    ├── JobClosed        the job is closed (or its keeper is gone)
    ├── HostClosed       the host is closed: no new session or launch
    ├── SessionHeld      a live run of the same app holds this session key
    ├── JobExpired       a background job is past its timeout
    ├── SignalRefused    the identity gate would not signal this process
    ├── UsageError       a bad invocation or TETHER_* value (exit status 2)
    ├── ShellNotFound    no real shell to run (exit status 127)
    └── Unavailable      the one-command path cannot run here (nothing started)
"""

TYPE_CHECKING = False
if TYPE_CHECKING:  # a hint only: no typing import at start-up
    from typing import Any

__all__ = ["TetherError", "JobRefused", "JobClosed", "HostClosed", "SessionHeld", "JobExpired",
           "SignalRefused", "UsageError", "ShellNotFound", "Unavailable"]


class TetherError(Exception):
    """Base class of every error tether raises on purpose.

    ``reason``: the cause in one line (defaults to the message);
    ``mechanism``: the mechanism involved, or None; ``pid``: the process
    concerned, or None.
    """

    def __init__(self, message: str = "", *, reason: str | None = None,
                 mechanism: str | None = None, pid: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason if reason is not None else message
        self.mechanism = mechanism
        self.pid = pid


class JobRefused(TetherError):
    """The job could not hold this process, so nothing was started.

    Raised when ``require="kernel"`` cannot be met, when the asked-for
    mechanism is not available, when the job's kernel object could not be
    created, or when a child could not be placed in the job (the job gate:
    it is killed before it runs). Never for a bad argument.
    """


class JobClosed(TetherError):
    """The job was closed (or its keeper is gone); nothing more can start in it."""


class HostClosed(TetherError):
    """The host was closed: it starts no new session, job or launch."""


class SessionHeld(TetherError):
    """Another live run of the same app holds this session key: nothing was
    started. ``pid`` and ``start`` (``"ticks@bootid"``) name the holder's
    process, ``run`` its run id, ``session`` the key. ``host.session(key,
    take_over=True)`` ends the holder's copy and takes the key over.
    """

    def __init__(self, message: str = "", *, session: str | None = None,
                 run: str | None = None, start: str | None = None, **fields: "Any") -> None:
        super().__init__(message, **fields)
        self.session = session
        self.run = run
        self.start = start


class JobExpired(TetherError):
    """A background job is past its timeout: it starts nothing more."""


class SignalRefused(TetherError):
    """The identity gate refused: the target is not provably the process meant
    (or it is PID <= 1, this process, an ancestor, another user's)."""


class UsageError(TetherError):
    """A bad invocation or ``TETHER_*`` value: exit ``code`` (2) with
    ``str(self)`` as the one-line message; nothing was run."""

    code = 2


class ShellNotFound(TetherError):
    """No real shell could be found to run the command: exit ``code`` (127)."""

    code = 127


class Unavailable(TetherError):
    """The one-command path cannot run here (not Linux, no pidfd, several
    threads, another mechanism asked for); nothing was started."""
