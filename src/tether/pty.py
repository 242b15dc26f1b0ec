"""Terminal sessions: a program on a real pseudo-terminal, inside a job, with a
safe immediate close.

    from tether.pty import PtySession
    with PtySession(["bash", "-i"]) as s:
        r = s.attach()
        s.write(b"sleep 120 &\\n")
        ...
    # leaving the block is close("immediate"): the shell and everything it
    # started in the background is gone, and nothing else was touched

For apps that relay a terminal (an agent's shell, a user's terminal tab) over
a connection. See docs/pty.md for the close lifecycle, the concurrency rules
and the measured numbers.

This module holds the session: its terminal, output pump, input and close
steps. Three parts live beside it, and their public names import from here
too: :mod:`tether.pty_reader` (``Reader``, the readers of the output, and
``OutputTimeout``/``OutputEnded``), :mod:`tether.pty_capture` (which
processes are the session's: the close's bounded capture, the proof its
signals carry, ``COOKIE_VAR``) and :mod:`tether.pty_close` (``CloseResult``,
``CloseOperation``).

How the program gets the terminal as its controlling terminal: the job's
keeper starts it in a new session (``setsid``) with the slave as
stdin/stdout/stderr, but a received fd does not become a controlling
terminal by being dup2'd - only an ``open()`` after ``setsid`` (Linux) or
``ioctl(TIOCSCTTY)`` does. So, unless the core can do it in the spawn itself
(``Job.supports_ctty``), a one-line ``/bin/sh`` shim re-opens the slave by
path and execs the program (about 0.5 ms; a Python shim costs 15-20 ms and
``setsid --ctty`` forks a second process when the child already leads a
process group, which the ``pgroup`` mechanism makes it do). Elsewhere than
Linux an open does not acquire a terminal, so a Python shim calls TIOCSCTTY.

Every signal sent here goes through :func:`tether.gate.send_signal`
(identity-checked; refuses PID <= 1, this process, its ancestors and other
users' processes). The session's own hang-up is the kernel's: closing the
master side of the terminal.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import select
import shutil
import signal
import struct
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from . import gate, identity, sparse_capture
from .capture import Capture
from .ending import DEFAULT_GRACE, check_grace, end
from .errors import SignalRefused, TetherError
from .identity import Identity
from .job import Job
from .pty_capture import CAPTURE_MEM_CAP as CAPTURE_MEM_CAP
from .pty_capture import CAPTURE_TIME_CAP as CAPTURE_TIME_CAP
from .pty_capture import COOKIE_VAR, _SessionCapture
from .pty_close import CloseOperation, CloseResult
from .pty_reader import OutputEnded, OutputTimeout, Reader

__all__ = [
    "PtySession",
    "Reader",
    "CloseResult",
    "CloseOperation",
    "SessionClosing",
    "SessionClosed",
    "OutputTimeout",
    "OutputEnded",
    "COOKIE_VAR",
]

OPEN, CLOSING, CLOSED = "open", "closing", "closed"


class SessionClosing(TetherError):
    """The session is being closed (or is closed): no new attachment, no input."""


class SessionClosed(SessionClosing):
    """The session is closed. A subclass of :class:`SessionClosing`, so code
    that catches the latter also refuses attachments to a finished session."""


# --------------------------------------------------------------------------
# Controlling-terminal shims


# Linux: a session leader without a controlling terminal acquires the first
# terminal it open()s without O_NOCTTY; sh's `<>` opens O_RDWR|O_CREAT.
_SH_SHIM = 'exec "$@" <>"$0" >&0 2>&0'
# Elsewhere (BSD, macOS) only TIOCSCTTY does it.
_PY_SHIM = (
    "import fcntl,os,sys,termios;fcntl.ioctl(0,termios.TIOCSCTTY,0);"
    "os.execvp(sys.argv[1],sys.argv[1:])"
)


def _shim_argv(slave_path: str, argv: list[str]) -> list[str]:
    if sys.platform.startswith("linux") and os.path.exists("/bin/sh"):
        return ["/bin/sh", "-c", _SH_SHIM, slave_path, *argv]
    return [sys.executable, "-S", "-c", _PY_SHIM, *argv]


def _set_winsize(fd: int, rows: int, cols: int) -> None:
    for what, n in (("rows", rows), ("cols", cols)):
        if not isinstance(n, int) or isinstance(n, bool):
            raise TypeError(f"{what} must be a whole number, not {type(n).__name__}")
        if not 0 <= n <= 0xFFFF:  # the kernel's struct winsize: unsigned short
            raise ValueError(f"{what} must be from 0 to 65535, not {n}")
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _get_winsize(fd: int) -> tuple[int, int]:
    rows, cols, _, _ = struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
    return rows, cols


# --------------------------------------------------------------------------
# The session


def _check_runnable(exe: str, cwd: str | os.PathLike[str] | None, env: dict[str, str]) -> None:
    """Raise, before a shim runs it, the error subprocess would for ``exe``
    it cannot start: ENOENT for a name not found or a missing path, EACCES
    for a directory or a file that is not executable."""
    if "/" not in exe:
        if exe and shutil.which(exe, path=env.get("PATH", os.defpath)) is not None:
            return
        err = errno.EACCES if not exe else errno.ENOENT  # ("": each PATH entry is a directory)
    else:
        path = os.path.join(os.fspath(cwd or "."), exe)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return
        err = errno.EACCES if os.path.exists(path) else errno.ENOENT
    raise OSError(err, os.strerror(err), exe)


class PtySession(_SessionCapture):
    """A program on a real pseudo-terminal, inside its own tether ``Job``.

    ``argv``: the program (searched in ``PATH`` of ``env``). ``env``: its
    environment (default: this process's, with ``TERM`` defaulted to
    ``xterm-256color``); the session adds ``TETHER_PTY_SESSION`` (see
    :data:`COOKIE_VAR`). ``mechanism``: the job's mechanism (``"pgroup"``
    forces the weakest one, where the close's own capture does the work).
    ``grace``: seconds between the polite signals of a close and SIGKILL.

    Output is read by a pump thread and handed to every attached
    :class:`Reader` (``attach()``); :meth:`read` reads from a primary reader
    attached from the start, so no early output is lost.
    """

    def __init__(
        self,
        argv: Sequence[str],
        env: dict[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        rows: int = 24,
        cols: int = 80,
        mechanism: str = "auto",
        *,
        grace: float = DEFAULT_GRACE,
        name: str | None = None,
        parent: Job | None = None,
        scrollback: int = 64 * 1024,
        max_buffer: int = 1 << 20,
    ) -> None:
        argv = [os.fsdecode(a) for a in argv]
        if not argv:
            raise ValueError("argv must not be empty")
        self.grace = check_grace(grace)
        self.token = f"{os.getpid()}-{secrets.token_hex(8)}"
        base_env = dict(os.environ) if env is None else dict(env)
        if env is None:
            base_env.setdefault("TERM", "xterm-256color")
        base_env.pop(COOKIE_VAR, None)
        # The cookie first, so it sits at the start of the child's environ.
        self.env = {COOKIE_VAR: self.token, **base_env}
        if not getattr(Job, "supports_ctty", False):
            # The shim's failed exec would be an exit status only; a job's
            # own spawn raises what subprocess raises.
            _check_runnable(argv[0], cwd, self.env)
        self.argv = argv

        self._lock = threading.Lock()  # state, readers, the close operation
        self._io_lock = threading.Lock()  # one delivered chunk vs one attach (consistent replay)
        self._state = OPEN
        self._op: CloseOperation | None = None
        self._readers: list[Reader] = []
        self._scrollback = bytearray()
        self._scrollback_max = int(scrollback)
        self._max_buffer = int(max_buffer)
        self._write_lock = threading.Lock()
        self._record: dict[str, Any] | None = None
        # Test seams (fault injection around the real calls; see tests/test_pty.py).
        self._send: Callable[..., bool] = gate.send_signal
        # (sparse: a close reads what its walks reach, not the whole table)
        self._capture: Callable[..., Capture] = sparse_capture.capture
        self._capture_job: Callable[[], Capture] = self._read_job

        self._master, slave = os.openpty()
        self.job: Job | None = None
        try:
            self.slave_path = os.ttyname(slave)
            _set_winsize(slave, rows, cols)
            os.set_blocking(self._master, False)
            # Every process of the session is born at or after this tick:
            # the bound of every process-table walk the close makes.
            self.born_after = identity.now_ticks()
            self.job = Job(name=name or f"pty-{self.token}", mechanism=mechanism, grace=grace,
                           parent=parent)
            self.mechanism = self.job.mechanism
            if getattr(Job, "supports_ctty", False):
                self._proc = self.job.popen(argv, stdin=slave, stdout=slave, stderr=slave,
                                            env=self.env, cwd=cwd, ctty=True)
            else:
                self._proc = self.job.popen(_shim_argv(self.slave_path, argv), stdin=slave,
                                            stdout=slave, stderr=slave, env=self.env, cwd=cwd,
                                            start_new_session=True)
        except BaseException:
            os.close(self._master)
            if self.job is not None:
                self.job.close()
            raise
        finally:
            # The owner must not hold the slave: the master sees EIO (end of
            # output) only when no process holds it any more.
            os.close(slave)
        self.pid = self._proc.pid
        # The root's identity: the shim execs the program in place, so the
        # pid (and start) is the program's.
        root = identity.read(self.pid)
        # None if it has already exited and been reaped (the pid could then
        # name someone else: the start tick tells).
        self.root = root if root is not None and root.start >= self.born_after else None
        self._record = {"token": self.token, "owner": os.getpid(), "root": self.root,
                        "job": self.job.id, "mechanism": self.mechanism, "captured": [],
                        "pending": []}
        self._primary = Reader(self, self._max_buffer)
        self._readers.append(self._primary)
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._pump_thread = threading.Thread(target=self._pump, name=f"tether-pty-{self.pid}",
                                             daemon=True)
        self._pump_thread.start()

    # -- state --------------------------------------------------------------
    @property
    def state(self) -> str:
        """``"open"``, ``"closing"`` or ``"closed"``."""
        return self._state

    @property
    def returncode(self) -> int | None:
        """The program's exit status once it has exited (negative: killed by
        that signal), else None."""
        return self._proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the program (the root) to exit; its exit status."""
        return self._proc.wait(timeout)

    @property
    def owner_record(self) -> dict[str, Any] | None:
        """The session's owner record (token, owner pid, root and captured
        identities), kept until every process a close captured has exited;
        None after that."""
        with self._lock:
            rec = self._record
            if rec is not None and self._state == CLOSED and not self._alive(rec["pending"]):
                self._record = rec = None  # the last captured process has exited since
            return None if rec is None else dict(rec)

    @property
    def guarantee(self):  # noqa: ANN201 - tether.platform.base.Guarantee
        return self.job.guarantee if self.job is not None else None

    def __repr__(self) -> str:
        return f"<tether.pty.PtySession pid={self.pid} {self.mechanism} {self._state}>"

    # -- output ---------------------------------------------------------------
    def _pump(self) -> None:
        master, stop = self._master, self._stop_r
        poller = select.poll()
        poller.register(master, select.POLLIN)
        poller.register(stop, select.POLLIN)
        try:
            while True:
                events = poller.poll()
                if any(fd == stop for fd, _ in events):
                    return
                try:
                    data = os.read(master, 65536)
                except BlockingIOError:
                    continue
                except OSError:  # EIO: nothing holds the slave any more
                    return
                if not data:
                    return
                with self._io_lock:
                    self._scrollback += data
                    over = len(self._scrollback) - self._scrollback_max
                    if over > 0:
                        del self._scrollback[:over]
                    with self._lock:
                        readers = list(self._readers)
                    for r in readers:
                        r._feed(data)
        finally:
            with self._lock:
                readers = list(self._readers)
                closing = self._state != OPEN
            for r in readers:
                r._end()
            if closing:
                self._close_master()

    def attach(self, replay: bool = False, max_buffer: int | None = None) -> Reader:
        """A new reader of the output from now on (``replay=True``: starting
        with the scrollback). Raises :class:`SessionClosing` while a close is
        pending and :class:`SessionClosed` after it - never an attachment to
        a dying session, even when this call had to wait behind the output
        pump while the close went on."""
        with self._io_lock:
            # The state is read only after waiting for the pump: a close may
            # have begun, or finished, while this call waited.
            with self._lock:
                if self._state == CLOSING:
                    raise SessionClosing("the session is closing")
                if self._state == CLOSED:
                    raise SessionClosed("the session is closed")
                r = Reader(self, self._max_buffer if max_buffer is None else max_buffer)
                if replay and self._scrollback:
                    r._feed(bytes(self._scrollback))
                if not self._pump_thread.is_alive():
                    r._end()  # the output already ended: scrollback only
                self._readers.append(r)
                return r

    def _remove_reader(self, r: Reader) -> None:
        with self._lock:
            if r in self._readers:
                self._readers.remove(r)

    def read(self, timeout: float | None = None) -> bytes:
        """Read from the primary reader (see :meth:`Reader.read`)."""
        return self._primary.read(timeout)

    def read_until(self, needle: bytes, timeout: float) -> bytes:
        """Read from the primary reader until ``needle`` (see :meth:`Reader.read_until`)."""
        return self._primary.read_until(needle, timeout)

    @property
    def primary(self) -> Reader:
        """The reader attached at start; :meth:`read` uses it. Detach it if
        you do not read it (it otherwise keeps up to ``max_buffer`` bytes)."""
        return self._primary

    # -- input ----------------------------------------------------------------
    def _check_open(self) -> None:
        if self._state == CLOSING:
            raise SessionClosing("the session is closing")
        if self._state == CLOSED:
            raise SessionClosed("the session is closed")

    def write(self, data: bytes | str, timeout: float | None = 10.0) -> int:
        """Send input to the program, as typed on its terminal; all of it.

        ``SessionClosing`` while a close is pending. ``TimeoutError`` when the
        terminal's input buffer stays full (the program is not reading) for
        ``timeout`` seconds; its ``written`` is how many bytes the terminal
        took before that (the rest was not sent).
        """
        if isinstance(data, str):
            data = data.encode()
        view = memoryview(data)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._write_lock:
            self._check_open()
            while view:
                try:
                    n = os.write(self._master, view)
                    view = view[n:]
                    continue
                except BlockingIOError:
                    pass
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    taken = len(data) - len(view)
                    exc = TimeoutError(f"the terminal did not take input within {timeout} s "
                                       f"({taken} of {len(data)} bytes taken)")
                    exc.written = taken  # type: ignore[attr-defined]
                    raise exc
                select.select([], [self._master], [], 0.05 if left is None else min(left, 0.05))
                self._check_open()
        return len(data)

    def resize(self, rows: int, cols: int) -> None:
        """Set the terminal's size; the kernel sends SIGWINCH to its
        foreground process group."""
        with self._write_lock:
            self._check_open()
            _set_winsize(self._master, rows, cols)

    @property
    def size(self) -> tuple[int, int]:
        """``(rows, cols)`` of the terminal."""
        with self._write_lock:
            if self._master < 0:
                raise SessionClosed("the session is closed")
            return _get_winsize(self._master)

    # -- close ------------------------------------------------------------------
    def close(self, mode: str = "immediate", *, wait: bool = True,
              timeout: float | None = None) -> CloseResult | CloseOperation:
        """Close the session; returns its :class:`CloseResult`.

        ``immediate``: (1) one bounded capture (:meth:`capture`) finds every
        process of the session: the members of its job where the job holds
        every process it started; elsewhere (``pgroup``, a dead keeper) a
        capture of the process table (1 s, 32 MiB) walked for still-parented
        descendants of the program in any process group or session, the
        members of its session and of every group and session they lead, and
        processes carrying the session's environment cookie; (2) the terminal
        is hung up and the program is sent SIGHUP, SIGTERM and SIGCONT;
        (3) the captured processes are sent SIGTERM (and SIGCONT, those seen
        stopped); (4) after at
        most ``grace`` seconds, what still matches its captured identity is
        SIGKILLed; (5) the session's job is ended by its mechanism; (6) the
        close returns once every captured process has exited, and only then
        drops the owner record.

        ``graceful``: what closing a terminal window does. The terminal is
        hung up; the program gets ``grace`` seconds to exit by itself, then
        SIGTERM, then SIGKILL. Background jobs get their normal hang-up
        handling (bash and zsh pass SIGHUP on to their jobs; ``nohup``,
        ``disown`` and ``setsid`` ones survive it): they are not signalled by
        the close, stay in the session's job (``result.left_running``), and
        end with the job - when this process exits, or on ``session.job.close()``.

        A ``close()`` while another is pending joins it and returns the same
        result object. An ``immediate`` close that joins a pending
        ``graceful`` one escalates it: the pending close stops waiting for
        the program and goes on as an immediate close (capture, end, grace,
        recheck; its result says ``mode='immediate'``), for every caller
        joined to it. A ``graceful`` close that joins a pending immediate
        one gets the immediate result. ``wait=False`` returns the
        :class:`CloseOperation` at once.
        """
        if mode not in ("immediate", "graceful"):
            raise ValueError(f"mode must be 'immediate' or 'graceful', not {mode!r}")
        with self._lock:
            op = self._op
            starter = op is None
            if op is None:
                op = self._op = CloseOperation(mode)
                self._state = CLOSING
            elif mode == "immediate" and op.mode == "graceful" and not op._sealed:
                op.mode = "immediate"
                op._escalate.set()
        if starter:
            t = threading.Thread(target=self._run_close, args=(op,), name=f"tether-pty-close-{self.pid}",
                                 daemon=True)
            t.start()
        assert op is not None  # the pending close, or the one started above
        if not wait:
            return op
        return op.result(timeout)

    def _run_close(self, op: CloseOperation) -> None:
        t0 = time.monotonic()
        res = CloseResult(mode=op.mode, root=self.root)
        try:
            if op.mode == "immediate":
                self._close_immediate(res)
            else:
                self._close_graceful(res, op._escalate)
                with self._lock:
                    op._sealed = True  # from here on, an immediate close joins as it is
                    escalated = op._escalate.is_set()
                if escalated:
                    res.mode = "immediate"
                    res.left_running = []
                    self._close_immediate(res)
        except BaseException as exc:  # noqa: BLE001 - reported in the result; the job still ends
            res.error = exc
            with self._lock:
                op._sealed = True
            try:
                self._hangup()
                if op.mode == "immediate":
                    self._end_job(res)
                    res.survivors = self._alive(res.captured)
            except BaseException:  # noqa: BLE001 - the first error is the one reported
                pass
        finally:
            res.returncode = self._proc.poll()
            res.elapsed = time.monotonic() - t0
            with self._lock:
                self._state = CLOSED
                if not res.survivors:
                    self._record = None
                elif self._record is not None:
                    self._record["pending"] = list(res.survivors)
                readers = list(self._readers)
            for r in readers:
                r._end()
            if not self._pump_thread.is_alive():
                for fd in (self._stop_r, self._stop_w):
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            op._finish(res)

    # steps (capture and _proof: tether.pty_capture) ---------------------------
    def _sender(self, res: CloseResult) -> Callable[..., bool]:
        """The close's signal function for ``tether.ending``: one identity-checked
        signal (``self._send``), retried on a transient failure; a refusal by
        the identity layer is final. Both are recorded in ``res``."""
        def send(ident: Identity, sig: int, member: bool = False, **kw: Any) -> bool:
            last = ""
            for attempt in range(3):
                try:
                    return self._send(ident, sig, member=member, **kw)
                except SignalRefused as exc:
                    res.refused.append((ident, str(exc)))
                    raise
                except OSError as exc:
                    last = f"{type(exc).__name__}: {exc}"
                    time.sleep(0.002 * (attempt + 1))
            res.failed.append((ident, int(sig), last))
            raise OSError(last)

        return send

    def _signal(self, ident: Identity, sig: int, res: CloseResult, *,
                member: bool = False, proof: gate.Proof | None = None) -> bool:
        """One signal through :meth:`_sender`; False if it did not land."""
        try:
            return self._sender(res)(ident, sig, member=member, proof=proof)
        except (SignalRefused, OSError):
            return False

    def _hangup(self) -> None:
        """Hang up the terminal: stop the pump and close the master. The
        kernel then sends SIGHUP (and SIGCONT) to the session leader and the
        foreground process group, and reads of the slave return EOF/EIO."""
        try:
            os.write(self._stop_w, b"x")
        except OSError:
            pass
        self._pump_thread.join(0.5)
        if not self._pump_thread.is_alive():
            self._close_master()
        # else: the pump is held up delivering output; it closes the master
        # itself when it stops (the state is no longer open).

    def _close_master(self) -> None:
        # Only once the pump no longer polls it: closing an fd another thread
        # waits on could let a new file take its number under that thread.
        with self._write_lock:
            if self._master >= 0:
                os.close(self._master)
                self._master = -1

    def _alive(self, idents: Iterable[Identity]) -> list[Identity]:
        return [i for i in idents if identity.is_alive(i)]

    def _end_job(self, res: CloseResult, known: list[Identity] | None = None) -> None:
        # ``known``: what this close captured, handed to the job's close (what
        # of it is still alive: its members now) so it does not read its
        # members again (under pgroup, a whole-table capture).
        if self.job is not None and not self.job.closed:
            try:
                self.job.close(known=None if known is None else self._alive(known))
                res.job_ended = True
            except TetherError as exc:
                res.failed.append((self.root, int(signal.SIGKILL), f"job close: {exc}"))

    def _close_immediate(self, res: CloseResult) -> None:
        # (1) capture, before anything is signalled: a hang-up makes processes
        # exit and reparent, which would hide their descendants.
        captured, cap = self.capture()
        if self.mechanism == "pgroup":
            self._seed_job_close(cap)
        res.captured = captured
        res.capture_complete, res.capture_reason = cap.complete, cap.reason
        res.capture_ms = cap.elapsed * 1e3
        with self._lock:
            if self._record is not None:
                self._record["captured"] = list(captured)
        root = self.root
        # (2) hang up the terminal; the root hears it from us too.
        self._hangup()
        if root is not None:
            self._signal(root, signal.SIGHUP, res, member=True, proof=self._proof())
        everyone = captured + ([root] if root is not None else [])
        proof = self._proof()
        # (3)-(6) tether.ending: SIGTERM and SIGCONT to all (a stopped process
        # acts on SIGTERM only once continued), the grace, one identity
        # recheck and SIGKILL to what still matches, then the whole job ended
        # by its mechanism (anything the capture could not see, e.g. born
        # after it), until every captured process is gone.
        ending = end(targets=everyone, born_after=self.born_after, grace=self.grace,
                     member=lambda i: root is not None and i.same_process(root),
                     proof=lambda _i: proof, send=self._sender(res), on_round=self._proc.poll,
                     kill=lambda: self._end_job(res, everyone), kill_name="job end",
                     kill_covers=lambda i: False)
        res.terminated = [i for i, how in ending.ended if how in ("SIGTERM", "exit")]
        res.killed = [i for i, how in ending.ended if how == "SIGKILL"]
        self._end_job(res, everyone)
        # The owner record stays until every captured process is gone.
        res.survivors = self._alive(ending.survivors)
        self._proc.poll()

    def _close_graceful(self, res: CloseResult, escalate: threading.Event) -> None:
        """The graceful steps; they stop where they are once ``escalate`` is
        set (an immediate close joined: the caller goes on with it)."""
        root = self.root
        self._hangup()
        left = [root] if root is not None else []
        deadline = time.monotonic() + self.grace
        while left and time.monotonic() < deadline:  # the hang-up is the polite step
            if escalate.wait(0.005):
                return
            self._proc.poll()  # lets the keeper reap the root
            left = self._alive(left)
        if escalate.is_set():
            return
        if left:
            ending = end(targets=left, born_after=self.born_after, grace=self.grace, member=True,
                         send=self._sender(res), on_round=self._proc.poll,
                         cancel=escalate.is_set, proof=lambda _i: self._proof())
            res.killed = [i for i, how in ending.ended if how == "SIGKILL"]
            left = self._alive(ending.survivors)
        if root is not None and not left:
            res.terminated.append(root)
        res.survivors = left
        if escalate.is_set():
            return
        # Report, without touching them, what the hang-up left running.
        captured, cap = self.capture()
        res.capture_complete, res.capture_reason = cap.complete, cap.reason
        res.capture_ms = cap.elapsed * 1e3
        res.left_running = self._alive(captured)
        self._proc.poll()

    # -- context manager ----------------------------------------------------------
    def __enter__(self) -> PtySession:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close("immediate")
