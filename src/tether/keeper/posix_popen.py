"""The child of a keeper's job as a ``subprocess.Popen``: ``JobPopen``.

A job's child is started by the job's keeper, not by this process, so
``JobPopen`` overrides CPython's private hooks of ``subprocess.Popen``
(``_execute_child``, ``_internal_poll``, ``_wait``; their signatures are
pinned by tests/test_popen_internals.py) with a conversation with that
keeper: ``_execute_child`` turns Popen's arguments into one ``spawn``
request (argv, fds, environment, this process's state as of now) and maps
the keeper's refusals to the exceptions subprocess raises; the exit status
comes back from the keeper, the child's pidfd saying when. The conversation
itself is ``KeeperJob``'s (``posix``), which creates these (``KeeperJob.popen``);
``posix`` imports ``JobPopen`` back, so ``posix.JobPopen`` still names it.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import subprocess
import sys
import time

from .. import gate, identity
from ..errors import JobClosed, JobRefused, StatusLost
from ..platform.base import PIDNS, JobOptions, with_cookie
from ._keeper import child_ignores

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs start-up time: hints only
    import threading
    from collections.abc import Callable
    from typing import Any

    from .posix import KeeperJob


class JobPopen(subprocess.Popen):
    """A ``subprocess.Popen`` whose child the job's keeper started.

    Same attributes and methods as ``subprocess.Popen`` (pid, returncode,
    stdin/stdout/stderr, wait, poll, communicate, send_signal, terminate,
    kill). Differences, documented: ``preexec_fn`` is refused (it would have
    to run in another process), and ``user``/``group``/``extra_groups`` are
    not supported yet. ``pid`` is the PID as this process sees it.
    """

    if TYPE_CHECKING:  # CPython's own, not in typeshed (tests/test_popen_internals.py pins them)
        _waitpid_lock: threading.Lock
        _close_pipe_fds: Callable[..., None]

    def __init__(self, backend: KeeperJob, args: Any, *, ctty: bool = False, **kwargs: Any):
        self._tether_backend = backend
        # ctty=True: the child's stdin, a terminal, becomes its controlling
        # terminal (in a new session).
        self._tether_ctty = bool(ctty)
        if ctty:
            kwargs["start_new_session"] = True
        self._pidfd: int | None = None
        self._inner_pid = 0
        self.tether_identity: identity.Identity | None = None
        self.tether_status_lost = False
        super().__init__(args, **kwargs)

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env,
                       startupinfo, creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite,
                       errread, errwrite, restore_signals, gid, gids, uid, umask,
                       start_new_session, process_group=-1):
        # Popen.__init__ calls this by position: subprocess's checks and audit
        # event, then one spawn request to the keeper, whose reply is the child.
        args, executable = _argv(args, executable, shell)
        sys.audit("subprocess.Popen", executable, args, cwd, env)
        if gid is not None or gids is not None or uid is not None:
            raise ValueError("user=, group= and extra_groups= are not supported in a tether job yet")
        if cwd is not None and "\0" in os.fsdecode(cwd):
            raise ValueError("embedded null byte")  # as subprocess: never another directory
        sources, fdmap = _child_fds(p2cread, c2pwrite, errwrite, pass_fds, close_fds)
        env_b = _child_env(env, self._tether_backend.options)
        # (subprocess sets a process group only for one >= 0)
        pgroup = process_group if process_group is not None and process_group >= 0 else -1
        msg = self._spawn_request(args, executable, cwd, env, env_b, fdmap, pgroup,
                                  start_new_session, umask, restore_signals)
        try:
            reply, fds = self._send_spawn(msg, sources, env_b, cwd, umask, restore_signals)
        finally:
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)
        if not reply.get("ok"):
            for fd in fds:
                os.close(fd)
            raise self._refusal(reply, joins=pgroup < 0 and not start_new_session)
        self._adopt(reply, fds)
        self._child_created = True

    def _spawn_request(self, args: list, executable: Any, cwd: Any, env: Any, env_b: dict,
                       fdmap: dict[int, int], pgroup: int, start_new_session: bool, umask: int,
                       restore_signals: bool) -> dict[str, Any]:
        """The ``spawn`` request. The child gets this process's state as of
        now, as subprocess's child would, not the keeper's copy from when the
        job opened: the keeper reads our ignored signals, umask and limits
        while we wait for its reply (owner_state); the signal mask is this
        thread's, so it goes along."""
        exe_b = os.fsencode(executable)
        return {
            "op": "spawn",
            "argv": [os.fsencode(a) for a in args],
            "executable": exe_b,
            "cwd": os.fsdecode(os.path.abspath(cwd)) if cwd is not None else None,
            # searched only for a name without a slash (a dozen strings less
            # to encode per spawn otherwise)
            "path": _exec_path(env, env_b) if b"/" not in exe_b else [],
            "fdmap": fdmap,
            "pgroup": pgroup,
            "setsid": bool(start_new_session),
            "owner_pgid": os.getpgrp(),
            "umask": umask if umask >= 0 else -1,
            "owner_state": True,
            "restore_signals": bool(restore_signals),
            "sigmask": [int(x) for x in signal.pthread_sigmask(signal.SIG_BLOCK, [])],
            "ids": (os.getuid(), os.geteuid(), os.getgid(), os.getegid()),
            "ctty": self._tether_ctty,
            "ident": self._tether_backend.record_identity,
        }

    def _send_spawn(self, msg: dict[str, Any], sources: list[int], env_b: dict, cwd: Any,
                    umask: int, restore_signals: bool) -> tuple[dict[str, Any], list[int]]:
        """Send the request; the keeper's reply and the fds it came with. Where
        the keeper cannot read our state, read here and sent along."""
        backend = self._tether_backend
        cwd_fd = -1
        try:
            # cwd None: the keeper opens our working directory itself (owner_state)
            reply: dict[str, Any] = {"ok": False, "kind": "owner_state"}
            fds: list[int] = []
            # (the keeper reads the owner's /proc: a forked child sends its own state)
            if backend.owner_state and os.getpid() == backend.mech.owner_pid:
                reply, fds = backend.request(msg, sources, env=env_b)
            if not reply.get("ok") and reply.get("kind") == "owner_state":
                # The keeper cannot read our state (no /proc, or one it cannot
                # see): read it here and send it along, from now on.
                backend.owner_state = False
                ignored, owner_umask = _ignored_signals_and_umask()
                ignored = child_ignores(ignored, restore_signals)
                del msg["owner_state"]
                msg.update(umask=umask if umask >= 0 else owner_umask, ignored=ignored,
                           rlimits=_rlimits())
                if cwd is None:
                    # The child starts where we are, even if that directory was
                    # deleted: pass the directory itself, not its name.
                    cwd_fd = os.open(".", getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY
                                     | os.O_CLOEXEC)
                    msg["cwd_fd"] = len(sources)
                    sources = [*sources, cwd_fd]
                reply, fds = backend.request(msg, sources, env=env_b)
        finally:
            if cwd_fd != -1:
                os.close(cwd_fd)
        return reply, fds

    def _refusal(self, reply: dict[str, Any], joins: bool) -> Exception:
        """The exception for a keeper's refusal to spawn, as subprocess would
        raise it where it can. ``joins``: the child was to join this process's
        group (no new session, no group of its own)."""
        backend = self._tether_backend
        kind = reply.get("kind")
        if kind == "os":
            # No words from the native keeper for a bare errno: this
            # interpreter's (its libc, musl say, may word it otherwise).
            err = reply["errno"]
            if err == errno.EPERM and joins and backend.mech.joins_owner_group \
                    and os.getsid(0) != backend.session:
                # the keeper's setpgid: this process left the job's session
                why = (f"this process is now in session {os.getsid(0)}, not in the job's "
                       f"({backend.session}, since the job opened): its child cannot join "
                       "this process's group from there; pass start_new_session=True, or "
                       "open the job after setsid()")
                return JobRefused(f"spawn refused: {why}", reason=why, mechanism=backend.mechanism)
            return OSError(err, reply.get("strerror") or os.strerror(err), reply.get("filename"))
        if kind in ("ValueError", "TypeError"):  # a bad argument, as subprocess raises it
            return (ValueError if kind == "ValueError" else TypeError)(reply.get("strerror"))
        why = str(reply.get("strerror"))
        return JobRefused(f"spawn refused by the job's keeper: {why}", reason=why,
                          mechanism=backend.mechanism)

    def _adopt(self, reply: dict[str, Any], fds: list[int]) -> None:
        """Take the child the keeper started: its pid (as this process sees
        it), its identity, its pidfd (the first fd of the reply)."""
        backend = self._tether_backend
        self._inner_pid = reply["pid"]
        ident = reply.get("ident")
        self.tether_identity = identity.Identity(*ident) if ident else None
        if fds:
            self._pidfd = fds[0]
            for fd in fds[1:]:
                os.close(fd)
            outer = identity.pidfd_pid(self._pidfd) if backend.mechanism == PIDNS else None
            if outer is None and self.tether_identity is not None:
                outer = self.tether_identity.pid  # already reaped; the keeper saw it first
            self.pid = outer if outer and outer > 0 else reply["pid"]
        else:
            self.pid = reply["pid"]
        backend.mech.note_spawn(
            self.pid, self.tether_identity.start if self.tether_identity is not None else None)

    @property
    def pidfd(self) -> int | None:
        """A pidfd of the child (Linux), for polling alongside other fds; None once reaped."""
        return self._pidfd

    # -- exit status through the keeper --------------------------------------------
    def _exited(self, timeout: float | None) -> bool:
        if self._pidfd is None:
            return False
        ms = None if timeout is None else max(0, int(timeout * 1000))
        p = select.poll()
        p.register(self._pidfd, select.POLLIN)
        return bool(p.poll(ms))

    def _collect(self, block: bool) -> None:
        backend = self._tether_backend
        if self.tether_status_lost:
            raise self._lost()
        st = None
        if backend.keeper_alive() or backend.has_status(self._inner_pid):
            st = backend.wait_status(self._inner_pid, block)
        if st is None and not backend.keeper_alive() and not backend.closed_cleanly:
            # The keeper died (before or while we asked). If this process is a
            # child subreaper (tether run makes itself one), the child was
            # re-parented here: its status is ours to take. Otherwise it is
            # lost with the keeper.
            try:
                pid, st = os.waitpid(self.pid, 0 if block else os.WNOHANG)
            except ChildProcessError:
                pid, st = -1, None
            if pid == 0:
                return  # still running
            if pid != self.pid:
                st = None
        if st is None and not block:
            return
        if st is None:
            if not backend.keeper_alive() and not backend.closed_cleanly:
                #: True once the child's real exit status is known lost (its
                #: keeper died and nothing here could wait for it): wait()
                #: raises StatusLost, poll() and returncode say None.
                self.tether_status_lost = True
                if self._pidfd is not None:
                    os.close(self._pidfd)
                    self._pidfd = None
                raise self._lost()
            st = signal.SIGKILL  # reaped by the job's close, which killed it
        self.returncode = os.waitstatus_to_exitcode(st) if st >= 0 else st
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def _lost(self) -> StatusLost:
        backend = self._tether_backend
        why = (f"the exit status of pid {self.pid} was lost: the job's keeper (pid "
               f"{backend.keeper_pid}), its parent, died before handing it over")
        return StatusLost(why, reason=why, mechanism=backend.mechanism, pid=self.pid)

    def _internal_poll(self, _deadstate=None, **_ignored):
        if self.returncode is not None:
            return self.returncode
        if not self._waitpid_lock.acquire(False):
            return None
        try:
            if self.returncode is None:
                if self._pidfd is not None:
                    if self._exited(0):
                        self._collect(block=True)
                else:
                    self._collect(block=False)
        except JobClosed:
            if _deadstate is not None:
                self.returncode = _deadstate
        except StatusLost:
            # poll() says None, never a made-up status; wait() raises. (A
            # poll that raised would abort the loops that poll on their way,
            # tether's own ending rounds and PTY close among them.)
            pass
        finally:
            self._waitpid_lock.release()
        return self.returncode

    def _wait(self, timeout):
        if self.returncode is not None:
            return self.returncode
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            if self._pidfd is not None:
                if not self._exited(remaining):
                    continue
                with self._waitpid_lock:
                    if self.returncode is None:
                        self._collect(block=True)
            else:
                with self._waitpid_lock:
                    if self.returncode is None:
                        self._collect(block=False)
                if self.returncode is None:
                    time.sleep(0.005)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.poll()
        if self.returncode is not None:
            return
        if self._pidfd is not None:
            try:
                signal.pidfd_send_signal(self._pidfd, sig)
            except ProcessLookupError:
                pass
            return
        ident = identity.read(self.pid)
        if ident is not None:
            # No pidfd: the keeper's child (its parent) that carries the job's cookie.
            backend = self._tether_backend
            proof = backend.proof()
            proof.parents = frozenset({backend.keeper_pid} - {0, 1})
            gate.send_signal(ident, sig, member=True, proof=proof)

    def __del__(self, _maxsize=sys.maxsize):
        fd = getattr(self, "_pidfd", None)
        try:
            super().__del__()
        except OSError:
            # Out of file descriptors while collected (its last poll reads
            # /proc): no one to tell, and the keeper, the child's parent, reaps it.
            pass
        if fd is not None and self.returncode is not None:
            try:
                os.close(fd)
            except OSError:
                pass


def _ignored_signals_and_umask() -> tuple[list[int], int]:
    """Signals this process ignores now (children inherit SIG_IGN across exec),
    and its umask, from one read of its status (Linux >= 4.7 has ``Umask``)."""
    f = identity.status_fields("self", b"SigIgn", b"Umask")
    try:
        mask = int(f[b"Umask"], 8)
    except (KeyError, ValueError):
        mask = os.umask(0o22)  # no thread-safe read here: set and put back at once
        os.umask(mask)
    try:
        # One read of the kernel's mask; signal.getsignal per signal costs ~1 ms.
        return identity.mask_signals(int(f[b"SigIgn"], 16)), mask
    except (KeyError, ValueError):
        pass
    out = []
    for s in signal.valid_signals():
        try:
            if signal.getsignal(s) == signal.SIG_IGN:
                out.append(int(s))
        except (ValueError, OSError):
            continue
    return out, mask


_PATH_SEEN: tuple[object, list[str]] = (None, [])


def _exec_path(env, env_b: dict) -> list[str]:
    """``os.get_exec_path(env)`` as str, remembered for the last PATH seen
    (it rarely changes; each spawn asked for it anew). ``env_b``: the child's
    environment as bytes; with ``env`` None, its PATH is ours (a bytes key:
    no os.environ lookup, which encodes and decodes)."""
    global _PATH_SEEN
    if env is None:
        key: object = env_b.get(b"PATH")
    else:
        key = (env.get("PATH"), env.get(b"PATH")) if hasattr(env, "get") else object()
    if key is None or key != _PATH_SEEN[0]:
        _PATH_SEEN = (key, [os.fsdecode(p) for p in os.get_exec_path(env)])
    return list(_PATH_SEEN[1])


def _rlimits() -> list[tuple[int, int, int]]:
    """This process's resource limits, ``(resource, soft, hard)`` each."""
    import resource

    return [(r, *resource.getrlimit(r)) for r in identity.rlimit_resources()]


def _inheritable(fd: int) -> bool:
    try:
        return os.get_inheritable(fd)
    except OSError:
        return False  # closed


def _list_fds() -> list[int]:
    fds = identity.open_fds("self")
    return fds if fds is not None else list(range(0, 256))


def _argv(args: Any, executable: Any, shell: bool) -> tuple[list, Any]:
    """The child's argv and the program to run, as subprocess makes them."""
    if isinstance(args, (str, bytes)):
        args = [args]
    elif isinstance(args, os.PathLike):
        if shell:
            raise TypeError("path-like args is not allowed when shell is true")
        args = [args]
    else:
        args = list(args)
    if shell:
        args = ["/bin/sh", "-c"] + args
        if executable:
            args[0] = executable
    if executable is None:
        executable = args[0]
    return args, executable


def _child_fds(p2cread: int, c2pwrite: int, errwrite: int, pass_fds: Any, close_fds: bool
               ) -> tuple[list[int], dict[int, int]]:
    """Which owner fds the child gets: the fds to send (``sources``) and, by
    child fd number, the index of each among them (``fdmap``). One the caller
    named (stdin=FD, pass_fds) must be open, as subprocess's child needs it:
    EBADF, not a child that silently goes without."""
    wanted: dict[int, int] = {}
    named: set[int] = set()  # the targets the caller named
    if any(not isinstance(fd, int) or fd < 0 for fd in pass_fds):
        raise ValueError("bad value(s) in fds_to_keep")
    for target, src in ((0, p2cread), (1, c2pwrite), (2, errwrite)):
        if src != -1:
            wanted[target] = src
            named.add(target)
        elif _inheritable(target):
            # Left as it is, as subprocess's child would find it: an fd
            # that is close-on-exec (say, a socket of ours that took a
            # closed stdin's number) is closed in the child.
            wanted[target] = target
    for fd in pass_fds:
        wanted[int(fd)] = int(fd)
        named.add(int(fd))
    if not close_fds:
        for name in _list_fds():
            if name > 2 and name not in wanted:
                try:
                    if os.get_inheritable(name):
                        wanted[name] = name
                except OSError:
                    pass
    sources: list[int] = []
    fdmap: dict[int, int] = {}
    for target, src in wanted.items():
        try:
            os.fstat(src)
        except OSError:
            if target in named:
                raise OSError(errno.EBADF, os.strerror(errno.EBADF)) from None
            continue  # closed in the owner: closed in the child too
        if src not in sources:
            sources.append(src)
        fdmap[target] = sources.index(src)
    return sources, fdmap


def _child_env(env: Any, options: JobOptions) -> dict[bytes, bytes]:
    """The child's environment as bytes (``env`` None: ours), with the job's cookie."""
    if env is None:
        # os.environb's own bytes dict, copied at C speed (a copy through
        # the mapping decodes and checks ~50 entries: ~50 µs per spawn)
        data = getattr(os.environb, "_data", None)
        env_b = dict(data) if isinstance(data, dict) else dict(os.environb)
    else:
        env_b = {}
        for k, v in env.items():
            k = os.fsencode(k)
            if b"=" in k:
                raise ValueError("illegal environment variable name")
            env_b[k] = os.fsencode(v)
    return with_cookie(env_b, options)
