"""The readers of a terminal session's output, and what ``read_until`` raises.

A :class:`tether.pty.PtySession` reads its terminal in one pump thread and
hands every chunk to each attached :class:`Reader` (``session.attach()``;
``session.read`` reads the primary one, attached from the start). Each reader
has its own bounded buffer: a slow consumer loses its own oldest bytes
(counted in ``dropped``) instead of stalling the program or the other
readers. :class:`OutputTimeout` and :class:`OutputEnded` are what
``read_until`` raises when its needle does not come; both carry what was read.

Nothing here touches the terminal or a process: the session feeds its readers
(``_feed``, ``_end``), and a reader calls the session only to detach. It
lives apart from :mod:`tether.pty` (which imports it back: ``tether.pty.Reader``)
and does not import it at run time.
"""

from __future__ import annotations

import threading
import time
from typing import Any

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .pty import PtySession

__all__ = ["Reader", "OutputTimeout", "OutputEnded"]


class Reader:
    """One attached consumer of the session's output.

    Each reader has its own buffer of at most ``max_buffer`` bytes; when a
    slow reader falls that far behind, its oldest bytes are dropped (counted
    in ``dropped``) so that it never stalls the program or the other readers.
    """

    def __init__(self, session: PtySession | None, max_buffer: int) -> None:
        self._session = session
        self._max = max(1, int(max_buffer))
        self._cond = threading.Condition()
        self._buf = bytearray()
        self._eof = False
        self._detached = False
        self.dropped = 0

    # fed by the session's pump thread
    def _feed(self, data: bytes) -> None:
        with self._cond:
            if self._detached:
                return
            self._buf += data
            over = len(self._buf) - self._max
            if over > 0:
                del self._buf[:over]
                self.dropped += over
            self._cond.notify_all()

    def _end(self) -> None:
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    @property
    def eof(self) -> bool:
        """True once the output has ended (or the reader was detached) and
        everything buffered has been read."""
        with self._cond:
            return (self._eof or self._detached) and not self._buf

    @property
    def attached(self) -> bool:
        return not self._detached

    def read(self, timeout: float | None = None) -> bytes:
        """Whatever output is buffered (at least one byte), waiting for some.

        Returns ``b""`` at the end of the output (the session closed, the
        program and everything holding the terminal exited, or this reader
        was detached). Raises ``TimeoutError`` when ``timeout`` seconds pass
        with nothing to read.
        """
        with self._cond:
            ok = self._cond.wait_for(lambda: self._buf or self._eof or self._detached, timeout)
            if not ok:
                raise TimeoutError(f"no output within {timeout} s")
            data = bytes(self._buf)
            self._buf.clear()
            return data

    def read_until(self, needle: bytes, timeout: float) -> bytes:
        """Read until ``needle`` has appeared; return everything read (the
        bytes after the needle stay buffered). :class:`OutputTimeout` (a
        ``TimeoutError``) if it does not appear in time, :class:`OutputEnded`
        (an ``EOFError``) if the output ends first; either carries what was
        read so far (``.data``, also ``.args[1]``)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                i = self._buf.find(needle)
                if i >= 0:
                    end = i + len(needle)
                    data = bytes(self._buf[:end])
                    del self._buf[:end]
                    return data
                if self._eof or self._detached:
                    data = bytes(self._buf)
                    self._buf.clear()
                    raise OutputEnded(f"output ended before {needle!r}", data)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise OutputTimeout(f"{needle!r} not seen within {timeout} s", bytes(self._buf))
                self._cond.wait(left)

    def detach(self) -> None:
        """Stop receiving output. Idempotent. A blocked ``read`` returns what
        is buffered, then ``b""``."""
        with self._cond:
            self._detached = True
            self._cond.notify_all()
        s = self._session
        if s is not None:
            s._remove_reader(self)

    close = detach

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.detach()


class _CarriesData(Exception):
    """Reads as its message, and carries what was read (``.data``, also
    ``.args[1]``): given both as arguments, an OSError such as TimeoutError
    printed ``[Errno <message>] <data>``, an EOFError a tuple."""

    def __init__(self, message: str, data: bytes) -> None:
        super().__init__(message)
        self.args = (message, data)
        self.data = data

    def __str__(self) -> str:
        return str(self.args[0])


class OutputTimeout(_CarriesData, TimeoutError):
    """``Reader.read_until``: the needle did not appear in time."""


class OutputEnded(_CarriesData, EOFError):
    """``Reader.read_until``: the output ended before the needle."""
