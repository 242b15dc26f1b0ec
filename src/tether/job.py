"""The public ``Job``: a bag of processes that ends with its owner.

Platform-neutral: everything that differs per operating system or mechanism
lives behind ``tether.platform.base.JobBackend``.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence

from . import gate, identity
from .ending import DEFAULT_GRACE, check_grace, end
from .errors import JobClosed
from .identity import Identity
from .platform import base as _base
from .platform import choose, open_job

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs start-up time: hints only
    from collections.abc import Callable
    from typing import Any, Literal, overload

    from ._typing import CMD, PopenKwargs, Unpack
    from .aio import Process

_counter = itertools.count(1)
_run_lock = threading.Lock()
_run_id: tuple[int, str] | None = None  # (pid, run id): a forked child has a new pid


def run_id() -> str:
    """Id of this owner's run: pid + kernel start ticks, unique on this boot."""
    global _run_id
    pid = os.getpid()
    with _run_lock:
        if _run_id is None or _run_id[0] != pid:
            _run_id = (pid, f"{pid}-{identity.start_ticks(pid) or 0}")
        return _run_id[1]


class Closed(list[Identity]):
    """What ``Job.close()`` returns: the identities of the members it ended
    (a list, as before), and ``left``: the members it could not end (a
    process in a frozen cgroup, or in uninterruptible sleep, outlives even
    SIGKILL until it wakes), each also named in a ``RuntimeWarning``."""

    def __init__(self, ended: Sequence[Identity] = (), left: Sequence[Identity] = ()) -> None:
        super().__init__(ended)
        self.left: list[Identity] = list(left)


class Job:
    """A job: every process started through it, and everything those start.

    Leaving the ``with`` block (or ``close()``) ends every member; so does
    this process dying in any way - normal exit, exception, SIGKILL, OOM.

    ``mechanism``: ``auto`` (strongest transparent one here), ``strict``
    (kernel-enforced), or one of ``cgroup``, ``subreaper``, ``pgroup``,
    ``pidns``, ``jobobject`` - or ``none``, no safety net at all, only ever
    by name (``reason`` then says why; ``guarantee.disabled`` shows it).
    ``require="kernel"`` refuses (``JobRefused``) where nothing
    kernel-enforced is available. ``grace``: seconds between SIGTERM and
    SIGKILL in ``terminate()`` and at the end of a ``with`` block (finite,
    0 to ``tether.ending.MAX_GRACE``). ``state_dir`` (or
    ``$TETHER_STATE_DIR``) turns the spawn audit log on.
    """

    #: ``popen(..., ctty=True)`` makes the child's stdin (a terminal) its
    #: controlling terminal, in a new session, with no extra exec.
    supports_ctty = sys.platform.startswith("linux")

    def __init__(
        self,
        name: str | None = None,
        mechanism: str = "auto",
        grace: float = DEFAULT_GRACE,
        require: str | None = None,
        *,
        state_dir: str | os.PathLike[str] | None = None,
        parent: Job | None = None,
        background: bool = False,
        cpu_percent: int | None = None,
        session: str | None = None,
        reason: str | None = None,
        cookie_var: str = identity.COOKIE_VAR,
    ) -> None:
        grace = check_grace(grace)
        if parent is not None and not isinstance(parent, Job):
            raise TypeError(f"parent must be a tether.Job, not {type(parent).__name__}")
        if parent is not None and parent.closed:
            raise JobClosed(f"parent job {parent.name!r} is closed")
        if not cookie_var or "=" in cookie_var or "\0" in cookie_var:
            raise ValueError(f"cookie_var must be an environment variable name, not {cookie_var!r}")
        n = next(_counter)
        self.name: str = name or f"job-{n}"
        self.id = f"j{os.getpid()}-{n}"
        self.grace = float(grace)
        if session is not None and (not isinstance(session, str) or not session.strip()):
            raise ValueError(f"session must be a non-empty key, not {session!r}")
        self.session = session
        self.background = background
        self.mechanism = choose(mechanism, require)
        self._parent = parent
        self._lock = threading.Lock()
        self._closed = False
        self.started = time.time()
        self._opener = os.getpid()  # a forked child's close() ends nothing (see close)
        self.born = identity.now_ticks()  # no member is older: the bound of every walk
        import secrets

        #: Put first in the environment of every process the job starts, as
        #: ``cookie_var=cookie``: what proves a process is this job's when its
        #: pid and start ticks alone cannot (see ``tether.gate.Proof``).
        self.cookie = f"{run_id()}:{self.id}:{secrets.token_hex(8)}"
        self.cookie_var = cookie_var
        opts = _base.JobOptions(
            name=self.name,
            job_id=self.id,
            parent=parent._backend if parent is not None else None,
            background=background,
            cpu_percent=cpu_percent,
            low_priority=background,
            reason=reason,
            cookie=self.cookie,
            cookie_var=cookie_var,
        )
        self._audit = self._audit_writer(state_dir)
        self._backend: _base.JobBackend = open_job(self.mechanism, opts)
        self._backend.record_identity = self._audit is not None
        if parent is not None:
            parent._children.append(self)
        self._children: list[Job] = []
        self._log("job-open")

    # -- audit ----------------------------------------------------------------------
    def _audit_writer(self, state_dir: Any) -> Any:
        # A subclass (tether.Host's jobs) may choose the log's retention or turn it off.
        return _open_audit(state_dir)

    def _log(self, event: str, **fields: Any) -> None:
        if self._audit is None:
            return
        me = identity.own()
        fields.setdefault("run", run_id())
        fields.setdefault("owner", {"pid": os.getpid(), "start": me.token() if me else None})
        fields.setdefault("job", self.id)
        fields.setdefault("mechanism", self.mechanism)
        if self.session is not None:
            fields.setdefault("session", self.session)
        if self.background:
            fields.setdefault("background", True)
        if self.mechanism == _base.NONE:
            fields.setdefault("in_job", False)  # nothing holds these processes together
        tr = self._backend.trace() if hasattr(self, "_backend") else {}
        if tr.get("cgroup_path"):
            fields.setdefault("cgroup", tr["cgroup_path"])
        if event == "job-open":
            fields.setdefault("name", self.name)
            fields.setdefault("cookie", self.cookie)
            fields.setdefault("cookie_var", self.cookie_var)
            kp = tr.get("keeper_pid")
            ki = identity.read(kp) if kp else None
            if ki is not None:
                fields.setdefault("keeper", {"pid": kp, "start": ki.token()})
        self._audit.write(event, **fields)

    def _log_spawn(self, pid: int, argv: Sequence[Any] | None = None,
                   ident: identity.Identity | None = None, label: str | None = None) -> None:
        if self._audit is None:
            return
        from .audit import spawn_fields

        if ident is None or ident.pid != pid:
            ident = identity.read(pid)
        if argv is not None:
            argv = [a if isinstance(a, (str, bytes)) else str(a) for a in argv]
        self._log("spawn", **spawn_fields(pid=pid, identity=ident,
                                          in_job=self.mechanism != _base.NONE,
                                          record_argv=argv, label=label))

    # -- state ------------------------------------------------------------------
    @property
    def guarantee(self) -> _base.Guarantee:
        """Which mechanism protects this job, and what it does not cover."""
        return self._backend.guarantee

    @property
    def closed(self) -> bool:
        return self._closed

    def trace(self) -> dict[str, Any]:
        """Mechanism traces: keeper pid, cgroup path... (for `tether ps` and the audit)."""
        return self._backend.trace()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<tether.Job {self.name!r} {self.mechanism} {state}>"

    # -- starting processes -----------------------------------------------------
    # The overloads mirror typeshed's subprocess.Popen: text=, encoding=,
    # errors= or universal_newlines= give Popen[str], none of them
    # Popen[bytes]; every other keyword is checked against PopenKwargs.
    if TYPE_CHECKING:  # overloads for checkers; the definition below runs
        @overload
        def popen(self, args: CMD, *, text: Literal[True], encoding: str | None = None,
                  errors: str | None = None, universal_newlines: bool | None = None,
                  record_argv: bool = False, label: str | None = None,
                  **kwargs: Unpack[PopenKwargs]) -> subprocess.Popen[str]: ...
        @overload
        def popen(self, args: CMD, *, encoding: str, errors: str | None = None,
                  text: bool | None = None, universal_newlines: bool | None = None,
                  record_argv: bool = False, label: str | None = None,
                  **kwargs: Unpack[PopenKwargs]) -> subprocess.Popen[str]: ...
        @overload
        def popen(self, args: CMD, *, errors: str, encoding: str | None = None,
                  text: bool | None = None, universal_newlines: bool | None = None,
                  record_argv: bool = False, label: str | None = None,
                  **kwargs: Unpack[PopenKwargs]) -> subprocess.Popen[str]: ...
        @overload
        def popen(self, args: CMD, *, universal_newlines: Literal[True],
                  text: bool | None = None, encoding: str | None = None, errors: str | None = None,
                  record_argv: bool = False, label: str | None = None,
                  **kwargs: Unpack[PopenKwargs]) -> subprocess.Popen[str]: ...
        @overload
        def popen(self, args: CMD, *, text: Literal[False] | None = None, encoding: None = None,
                  errors: None = None, universal_newlines: Literal[False] | None = None,
                  record_argv: bool = False, label: str | None = None,
                  **kwargs: Unpack[PopenKwargs]) -> subprocess.Popen[bytes]: ...
        @overload
        def popen(self, args: CMD, *, text: bool | None = None, encoding: str | None = None,
                  errors: str | None = None, universal_newlines: bool | None = None,
                  record_argv: bool = False, label: str | None = None,
                  **kwargs: Unpack[PopenKwargs]) -> subprocess.Popen[Any]: ...

    def popen(self, args: Any, *, record_argv: bool = False, label: str | None = None,
              **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``args`` in the job; ``subprocess.Popen`` keywords; returns a Popen.

        ``record_argv=True`` opts this one spawn in to having its arguments in
        the audit log (metadata only otherwise). ``label``: the caller's name
        for this process (``"claude"``, ``"npm run build"``), recorded with
        the spawn so that a report after a crash can say what it ended.
        """
        if self._closed:
            raise JobClosed(f"job {self.name!r} is closed")
        p = self._backend.popen(args, kwargs)
        if self._audit is not None:
            argv = None
            if record_argv:
                argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
            self._log_spawn(p.pid, argv, getattr(p, "tether_identity", None), label)
        return p

    if TYPE_CHECKING:  # overloads for checkers; the definition below runs
        @overload
        def run(self, args: CMD, *, text: Literal[True], input: str | None = None,
                capture_output: bool = False, timeout: float | None = None, check: bool = False,
                encoding: str | None = None, errors: str | None = None,
                universal_newlines: bool | None = None,
                **kwargs: Unpack[PopenKwargs]) -> subprocess.CompletedProcess[str]: ...
        @overload
        def run(self, args: CMD, *, encoding: str, input: str | None = None,
                capture_output: bool = False, timeout: float | None = None, check: bool = False,
                text: bool | None = None, errors: str | None = None,
                universal_newlines: bool | None = None,
                **kwargs: Unpack[PopenKwargs]) -> subprocess.CompletedProcess[str]: ...
        @overload
        def run(self, args: CMD, *, errors: str, input: str | None = None,
                capture_output: bool = False, timeout: float | None = None, check: bool = False,
                text: bool | None = None, encoding: str | None = None,
                universal_newlines: bool | None = None,
                **kwargs: Unpack[PopenKwargs]) -> subprocess.CompletedProcess[str]: ...
        @overload
        def run(self, args: CMD, *, universal_newlines: Literal[True], input: str | None = None,
                capture_output: bool = False, timeout: float | None = None, check: bool = False,
                text: bool | None = None, encoding: str | None = None, errors: str | None = None,
                **kwargs: Unpack[PopenKwargs]) -> subprocess.CompletedProcess[str]: ...
        @overload
        def run(self, args: CMD, *, text: Literal[False] | None = None, input: bytes | None = None,
                capture_output: bool = False, timeout: float | None = None, check: bool = False,
                encoding: None = None, errors: None = None,
                universal_newlines: Literal[False] | None = None,
                **kwargs: Unpack[PopenKwargs]) -> subprocess.CompletedProcess[bytes]: ...
        @overload
        def run(self, args: CMD, *, input: Any = None, capture_output: bool = False,
                timeout: float | None = None, check: bool = False, text: bool | None = None,
                encoding: str | None = None, errors: str | None = None,
                universal_newlines: bool | None = None,
                **kwargs: Unpack[PopenKwargs]) -> subprocess.CompletedProcess[Any]: ...

    def run(self, args: Any, *, input: Any = None, capture_output: bool = False,
            timeout: float | None = None, check: bool = False,
            **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """Like ``subprocess.run``, inside the job.

        Exactly as ``subprocess.run``, a ``timeout`` (or an exception, or
        Ctrl+C) kills only the command itself: whatever it started keeps
        running in the job until the job ends (``terminate()``, ``close()``,
        the end of its ``with`` block, or this process dying). To end the
        whole tree on timeout, error or return, use ``tether.run``: one job
        per call.
        """
        return self._run(args, input, capture_output, timeout, check, kwargs)

    def _run(self, args: Any, input: Any, capture_output: bool, timeout: float | None,
             check: bool, kwargs: dict[str, Any],
             end: Callable[[subprocess.Popen[Any]], object] | None = None,
             leftovers: Callable[[], object] | None = None,
             ) -> subprocess.CompletedProcess[Any]:
        """``subprocess.run``'s body; ``end(process)`` ends what a timeout, an
        error or Ctrl+C should end (default: the process, as subprocess does).
        ``leftovers()``, if given, is called once the command has exited while
        its pipes are still open (something it started holds them), so that
        the output can end instead of waiting for that process."""
        if input is not None:
            if kwargs.get("stdin") is not None:
                raise ValueError("stdin and input arguments may not both be used.")
            kwargs["stdin"] = subprocess.PIPE
        if capture_output:
            if kwargs.get("stdout") is not None or kwargs.get("stderr") is not None:
                raise ValueError("stdout and stderr arguments may not be used with capture_output.")
            kwargs["stdout"] = subprocess.PIPE
            kwargs["stderr"] = subprocess.PIPE
        if end is None:
            def end(process: subprocess.Popen[Any]) -> None:
                process.kill()
        with self.popen(args, **kwargs) as process:
            try:
                if leftovers is None:
                    stdout, stderr = process.communicate(input, timeout=timeout)
                else:
                    stdout, stderr = _communicate(process, input, timeout, leftovers)
            except subprocess.TimeoutExpired as exc:
                end(process)
                if sys.platform == "win32":  # as subprocess: its reader threads must finish
                    exc.stdout, exc.stderr = process.communicate()
                else:
                    # Not communicate(): what the command started may hold its
                    # pipes open long after it was killed (the output read so
                    # far is in exc, as subprocess leaves it).
                    process.wait()
                raise
            except BaseException:  # Ctrl+C too: communicate gave the child its chance
                end(process)
                raise
            retcode = process.poll()
            assert retcode is not None  # communicate() waited for it
            if check and retcode:
                raise subprocess.CalledProcessError(retcode, process.args, output=stdout,
                                                    stderr=stderr)
        return subprocess.CompletedProcess(process.args, retcode, stdout, stderr)

    async def create_subprocess_exec(self, program: Any, *args: Any, stdin: Any = None,
                                     stdout: Any = None, stderr: Any = None,
                                     limit: int = 2**16, **kwargs: Any) -> Process:
        """asyncio's ``create_subprocess_exec``, inside the job.

        Returns a ``tether.aio.Process`` with the attributes and coroutines of
        ``asyncio.subprocess.Process`` (pid, returncode, stdin/stdout/stderr
        streams, wait, communicate, send_signal, terminate, kill).
        """
        from .aio import create

        popen = self.popen([program, *args], stdin=stdin, stdout=stdout, stderr=stderr,
                           bufsize=0, **kwargs)
        return await create(popen, limit)

    async def create_subprocess_shell(self, cmd: str | bytes, *, stdin: Any = None,
                                      stdout: Any = None, stderr: Any = None,
                                      limit: int = 2**16, **kwargs: Any) -> Process:
        """asyncio's ``create_subprocess_shell``, inside the job: ``cmd`` runs
        in ``/bin/sh`` (``cmd.exe`` on Windows); returns a ``tether.aio.Process``."""
        from .aio import create

        popen = self.popen(cmd, shell=True, stdin=stdin, stdout=stdout, stderr=stderr,
                           bufsize=0, **kwargs)
        return await create(popen, limit)

    # -- members and ending ----------------------------------------------------
    def _pids(self) -> list[int]:
        return self._backend.member_pids()

    def member_pids(self) -> list[int]:
        """PIDs of the job's members (cheaper than ``members()``; may include zombies)."""
        return [] if self._closed else self._pids()

    def members(self) -> list[Identity]:
        """Identities of every live process in the job, escapees included."""
        if self._closed:
            return []
        out = []
        for pid in self._pids():
            ident = identity.read(pid)
            if ident is not None and ident.state not in ("Z", "X"):
                out.append(ident)
        return out

    def terminate(self, grace: float | None = None) -> list[Identity]:
        """SIGTERM every member, wait up to ``grace``, then end the rest the
        mechanism's own way (``cgroup.kill``, the keeper's kill loop,
        ``TerminateJobObject``) - through ``tether.ending.end``.

        Returns the identities of the processes that were members and are gone.
        The job stays open: more processes may be started in it afterwards.
        """
        grace = self.grace if grace is None else check_grace(grace)
        if self._closed:
            return []
        backend = self._backend

        # Proven by the job's cookie, its cgroup, or as the tree below its
        # keeper (or, with no keeper, below this process) as last looked at.
        tr = backend.trace() or {}
        proof = gate.Proof(f"{self.cookie_var}={self.cookie}".encode(), tr.get("cgroup_path"))
        find = proof.tracking(self.members,
                              roots=[getattr(backend, "keeper_pid", 0) or os.getpid()])
        # (a nested job stays open: its keeper lives outside this job)
        ending = end(find, born_after=self.born, grace=grace, kill=backend.kill_all,
                     kill_name=self.mechanism, polite=getattr(backend, "polite", None),
                     proof=lambda _i: proof)
        return ending.identities()

    def close(self, *, known: Iterable[Identity] | None = None) -> Closed:
        """End every member now (no grace) and release the job. Idempotent.

        Returns the members it ended (a list of identities); a member it
        could not end within the bound (frozen, or in uninterruptible sleep)
        is in the result's ``left`` and named in a ``RuntimeWarning``.

        ``known``: the members as the caller has just read them (a PTY
        close's capture): reported and checked instead of reading them again
        (under ``pgroup`` that read is a capture of the whole process table).
        The mechanism still ends every member, known or not.

        In a forked child of the process that opened the job it ends nothing:
        it lets go of the child's copy (the job stays its owner's), as does
        the end of a ``with`` block the child inherited (say, on ``sys.exit``)."""
        if self._forked():
            return Closed(self._let_go())
        with self._lock:
            if self._closed:
                return Closed()
            for child in list(self._children):
                child.close()
            before = self.members() if known is None else list(known)
            self._closed = True
            try:
                self._backend.close()
            finally:
                self._log("job-close", ended=len(before))
                if self._parent is not None and self in self._parent._children:
                    self._parent._children.remove(self)
        left = [i for i in before if identity.is_alive(i)]
        if left:
            import warnings

            names = ", ".join(f"pid {i.pid} ({i.comm or '?'}, state {i.state or '?'})"
                              for i in left[:10]) + (" ..." if len(left) > 10 else "")
            warnings.warn(f"tether: job {self.name!r} closed, but {len(left)} of its members "
                          f"could not be ended (frozen, or in uninterruptible sleep?): {names}",
                          RuntimeWarning, stacklevel=2)
        return Closed([i for i in before if i not in left], left)

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._forked():
            self._let_go()
            return
        try:
            if not self._closed:
                self.terminate(self.grace)
        finally:
            self.close()

    def _forked(self) -> bool:
        return os.getpid() != self._opener

    def _let_go(self) -> list[Identity]:
        with self._lock:
            if not self._closed:
                self._closed = True
                for child in list(self._children):
                    child._let_go()
                self._backend.let_go()
        return []

    def __del__(self) -> None:
        # A job dropped without close(): its backend asks the keeper to end
        # the members (posix.KeeperJob.__del__); nothing to do here but not
        # to raise.
        pass


def _communicate(process: subprocess.Popen[Any], input: Any, timeout: float | None,
                 leftovers: Callable[[], object]) -> tuple[Any, Any]:
    """``process.communicate(input, timeout)``, calling ``leftovers()`` once if
    the process exits while its pipes stay open. Looks every 0.1 s only while
    the output has not ended; a command whose output ends never waits."""
    deadline = None if timeout is None else time.monotonic() + timeout
    called = False
    while True:
        step = 0.1
        if deadline is not None:
            step = max(0.0, min(step, deadline - time.monotonic()))
        try:
            return process.communicate(input, timeout=step if not called else
                                       (None if deadline is None
                                        else max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired as exc:
            if deadline is not None and time.monotonic() >= deadline:
                exc.timeout = timeout if timeout is not None else exc.timeout
                raise
            input = None  # sent (or being sent) already: communicate keeps it
            if not called and process.poll() is not None:
                called = True
                leftovers()


def _open_audit(state_dir: Any) -> Any:
    """The job's audit writer, or None. A state directory tether refuses to use
    (a symlink, another user's, writable by others) never stops the job: it
    runs with the log off, and one line on stderr says so."""
    from .audit import AuditDirError, AuditWriter, resolve_state_dir, state_dir_arg

    if state_dir is None:
        env = os.environ.get("TETHER_STATE_DIR")
        if not env:
            return None
        state_dir = state_dir_arg(env, "TETHER_STATE_DIR")  # relative: a UsageError
    else:
        state_dir = resolve_state_dir(state_dir)  # resolved once, here

    try:
        return AuditWriter(state_dir)
    except AuditDirError as e:
        try:
            sys.stderr.write(f"tether: audit log disabled: {e}\n")
            sys.stderr.flush()
        except (OSError, ValueError):  # no stderr to say it on
            pass
        return None
