"""Owner side of the POSIX mechanisms: a job run by a keeper process.

``KeeperJob`` is the ``JobBackend`` for cgroup, subreaper, pidns and pgroup.
It forks the job's keeper (see ``_keeper``) and talks to it over a
SOCK_STREAM pair; ``JobPopen`` is a ``subprocess.Popen`` whose child the
keeper started. The child is not the owner's own child, so its exit status
comes from the keeper; the owner holds a pidfd for it, which makes
``poll``/``wait`` cheap and ``send_signal`` immune to PID reuse.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

from .. import gate, identity
from ..ending import KILL_BOUND
from ..errors import JobClosed, JobRefused, SignalRefused, StatusLost
from . import _proto, keeper_mechanism, native
from ._keeper import child_ignores
from ._keeper_socket import fork_keeper
from .base import PIDNS, Guarantee, JobBackend, JobOptions, KeeperMechanism, with_cookie

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs start-up time: hints only
    from collections.abc import Callable
    from typing import Any

_START_TIMEOUT = 10.0


def single_threaded() -> bool:
    """True when forking this process is safe: one OS thread only."""
    if threading.active_count() != 1:
        return False
    try:
        return identity.self_status()[0] == 1
    except (OSError, ValueError):
        return True  # no /proc: Python's own count is all there is


class KeeperJob(JobBackend):
    def __init__(self, mechanism: str, options: JobOptions):
        self.mechanism = mechanism
        self.options = options
        # On Linux the native program keeps every mechanism but pgroup (the
        # Python keeper is macOS's and the BSDs'): no program, no job.
        self.native = native.required(mechanism)
        me = identity.own()
        self.owner = me
        # the keeper's session: the only one its children can join a group in
        self.session = os.getsid(0)
        cls = keeper_mechanism(mechanism)
        self.born_after = identity.now_ticks()
        self.mech = cls(options, os.getpid(), me.start if me else 0, born_after=self.born_after)
        try:
            self.mech.prepare()
        except OSError as exc:
            why = exc.strerror or str(exc)
            raise JobRefused(f"{mechanism}: cannot create the job: {why}", reason=why,
                             mechanism=mechanism) from exc
        self._lock = threading.Lock()
        self._closed = False
        self._final_status: dict[int, int] = {}
        # The keeper answered close(): every status it had is in _final_status
        # (a child missing there was ended by that close). Not so when the
        # keeper died: a status it never handed over is lost.
        self.closed_cleanly = False
        self._exits: dict[int, int] = {}  # exit statuses the keeper pushed
        self._env_sent: dict | None = None  # the environment the keeper holds (env_same)
        # Whether to let the keeper read our state from our /proc (owner_state):
        # where there is one, until the keeper says it cannot (then we send it).
        self.owner_state = sys.platform.startswith("linux")
        self._reap: list[int] = []
        self._sock, child = _proto.socketpair()
        self._sock_pid = os.getpid()  # the process this socket's conversation is with
        if os.environ.get(native.NO_OWNER_STATE) == "1":  # tests: see native.NO_OWNER_STATE
            self.mech.params["no_owner_state"] = True
        if self.native:
            self.mech.keeper_inside = False  # it clones each child into the job instead
        try:
            if self.native:
                owner_fd = identity.open_pidfd(os.getpid())
                try:
                    self._reap.append(native.start(self.mech, child.fileno(), os.getpid(),
                                                   owner_fd))
                except OSError as exc:
                    self._sock.close()
                    self.mech.owner_cleanup()
                    why = f"cannot start the native keeper: {exc.strerror or exc}"
                    raise JobRefused(f"{mechanism}: {why}", reason=why,
                                     mechanism=mechanism) from exc
                finally:
                    if owner_fd is not None:
                        os.close(owner_fd)
            elif single_threaded():
                owner_fd = identity.open_pidfd(os.getpid())
                try:
                    pid = fork_keeper(self.mech, child, os.getpid(), owner_fd)
                finally:
                    if owner_fd is not None:
                        os.close(owner_fd)
                self._reap.append(pid)
            else:
                _warden().create(self.mech, child)
        finally:
            child.close()
        self._sock.settimeout(_START_TIMEOUT)
        self.keeper_pid = 0
        try:
            # A PID-namespace keeper's intermediate reports the init's outer pid;
            # that message and the init's "ready" may arrive in either order.
            msg = self._recv()
            if mechanism == PIDNS and msg.get("ready", True) is not False:
                first = msg
                msg = self._recv()
                if "outer" in msg:
                    first, msg = msg, first
                if "outer" not in first:
                    raise JobClosed(f"unexpected keeper message {first!r}")
                self.keeper_pid = first["outer"]
        except (JobClosed, OSError) as exc:
            self._abandon()
            raise JobRefused(f"{mechanism}: the job's keeper failed to start: {exc}",
                             reason=str(exc), mechanism=mechanism) from exc
        if not msg.get("ready"):
            self._abandon()
            why = str(msg.get("error", "unknown"))
            raise JobRefused(f"{mechanism}: the job's keeper refused: {why}", reason=why,
                             mechanism=mechanism)
        if not self.keeper_pid:
            self.keeper_pid = msg["keeper"]
        # what the keeper says of itself (the native one: how it watches us)
        trace = msg.get("trace")
        self._keeper_trace: dict[str, Any] = trace if isinstance(trace, dict) else {}
        self.keeper = identity.read(self.keeper_pid)
        # A pidfd of the keeper, for noticing its death at once (keeper_pidfd).
        self._keeper_fd = identity.open_pidfd(self.keeper_pid)
        if self._keeper_fd is not None and (self.keeper is None or not identity.is_alive(
                self.keeper)):
            os.close(self._keeper_fd)
            self._keeper_fd = None
        self._sock.settimeout(None)
        self._reap_children(block=False)

    # -- plumbing ----------------------------------------------------------------
    def _recv(self) -> dict:
        msg, fds = _proto.recv(self._sock)
        for fd in fds:
            os.close(fd)
        if msg is None:
            raise JobClosed("the job's keeper is gone")
        return msg

    def _own_channel(self) -> None:
        """In a forked child of the owner (caller holds the lock): a channel
        of its own to the keeper, so that its requests, replies and its
        children's exits never cross its parent's on the socket they share.
        Asked for in one datagram on that socket, which the keeper answers on
        the new one; the child then drops its copy of the shared one."""
        if self._sock_pid == os.getpid():
            return
        mine, theirs = _proto.socketpair()
        try:
            _proto.send(self._sock, {"op": "channel"}, [theirs.fileno()])
            reply, rfds = _proto.recv(mine)
        except OSError as exc:
            mine.close()
            raise JobClosed(f"the job's keeper is gone: {exc}") from exc
        finally:
            theirs.close()
        for fd in rfds:
            os.close(fd)
        if not reply or not reply.get("ok"):
            mine.close()
            raise JobClosed(f"the job's keeper gave no channel: {reply!r}")
        self._sock.close()  # this process's copy of the parent's
        self._sock = mine
        self._sock_pid = os.getpid()
        self._exits = {}  # the parent's children's, as of the fork
        self._env_sent = None

    def request(self, msg: dict, fds: list[int] | tuple[int, ...] = (), env: dict | None = None
                ) -> tuple[dict, list[int]]:
        """One request and its reply. ``env``, for a spawn: sent only when it is
        not the one the keeper has from the last spawn (``env_same``), decided
        under the lock, as the keeper sees the requests, in order."""
        with self._lock:
            if self._closed:
                raise JobClosed(f"job {self.options.name!r} is closed")
            self._own_channel()
            if env is not None:
                msg.pop("env", None)
                msg.pop("env_same", None)
                if env == self._env_sent and os.getpid() == self.mech.owner_pid:
                    # (the keeper keeps the owner's last one only: a forked
                    # child's channel sends its own every time)
                    msg["env_same"] = True
                else:
                    msg["env"] = env
                self._env_sent = None  # until the keeper took it (a reply says so)
            try:
                _proto.send(self._sock, msg, fds)
                while True:
                    reply, rfds = _proto.recv(self._sock)
                    if reply is None or "exit" not in reply:
                        break
                    self._exits[reply["exit"]] = reply["status"]  # pushed exit status
            except OSError as exc:
                raise JobClosed(f"the job's keeper is gone: {exc}") from exc
            if reply is None:
                raise JobClosed("the job's keeper is gone")
            if env is not None and reply.get("ok"):
                self._env_sent = env  # the keeper holds it now
            return reply, rfds

    def _drain_exits(self) -> bool:
        """Read pushed exit statuses without blocking (caller holds the lock);
        False once the keeper's end is closed."""
        while True:
            try:
                msg, fds = _proto.recv(self._sock, _proto.DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:  # (Malformed among them: the stream is no longer to be trusted)
                return False
            for fd in fds:
                os.close(fd)
            if msg is None:
                return False
            if "exit" in msg:
                self._exits[msg["exit"]] = msg["status"]

    def _reap_children(self, block: bool) -> None:
        deadline = time.monotonic() + (1.0 if block else 0)
        for pid in list(self._reap):
            while True:
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done = pid
                if done or time.monotonic() >= deadline:
                    break
                time.sleep(0.001)
            if done:
                self._reap.remove(pid)

    def _abandon(self) -> None:
        self._closed = True
        self._ask_close()
        self._sock.close()
        self._reap_children(block=True)

    # -- contract ----------------------------------------------------------------
    @property
    def guarantee(self) -> Guarantee:
        return self.mech.guarantee()

    def trace(self) -> dict[str, Any]:
        out = {"keeper_pid": self.keeper_pid, "keeper": "native" if self.native else "python"}
        out.update(self.mech.trace())
        out["owner_watch"] = self._keeper_trace.get("owner_watch", "pidfd")
        return out

    def popen(self, args: Any, kwargs: dict[str, Any]) -> subprocess.Popen:
        if self._closed:
            raise JobClosed(f"job {self.options.name!r} is closed")
        if kwargs.get("preexec_fn") is not None:
            raise ValueError(
                "preexec_fn cannot run in a contained spawn: the child is started by the job's "
                "keeper, not by this process (use start_new_session=, process_group=, umask=, "
                "cwd=, env= or a wrapper command)")
        return JobPopen(self, args, **kwargs)

    # -- the keeper's death ----------------------------------------------------------
    def keeper_pidfd(self) -> int | None:
        """A pidfd of the job's keeper (readable once it is gone), or None."""
        return self._keeper_fd

    def keeper_alive(self) -> bool:
        if self._keeper_fd is not None:
            r, _, _ = select.select([self._keeper_fd], [], [], 0)
            return not r
        return self.keeper is not None and identity.is_alive(self.keeper)

    def _orphans(self) -> list[identity.Identity]:
        """The job's members once its keeper is gone, found from here: what
        the job's cgroup holds, else every process of ours born since the job
        opened that carries its cookie (and what those started)."""
        if self.mech.kernel_keeps_members:  # a cgroup: the kernel still holds every member
            return [i for i in map(identity.read, self.mech.member_pids(-1)) if i is not None]
        o = self.options
        if not o.cookie:
            return []
        from .. import environ  # only here: a keeper gone is rare

        return environ.carriers(f"{o.cookie_var}={o.cookie}".encode(), born_after=self.born_after)

    def member_pids(self) -> list[int]:
        if self._closed:
            return []
        if not self.mech.kernel_keeps_members and not self.keeper_alive():
            return [i.pid for i in self._orphans()]
        return self.mech.member_pids(self.keeper_pid)

    def proof(self) -> gate.Proof:
        """What proves a process is this job's: its cookie, its cgroup (where
        the job has one); :meth:`gate.Proof.tracking` adds its tree."""
        o = self.options
        entry = f"{o.cookie_var}={o.cookie}".encode() if o.cookie else None
        return gate.Proof(entry, (self.mech.trace() or {}).get("cgroup_path"))

    def signal_all(self, sig: int) -> list[int]:
        sent = []
        pids = self.member_pids()
        proof = self.proof()
        # A member's parent is the keeper (its subreaper) or another member.
        proof.parents = frozenset(p for p in [*pids, self.keeper_pid] if p > 1)
        for pid in pids:
            ident = identity.read(pid)
            if ident is None or ident.state == "Z":
                continue
            try:
                if gate.send_signal(ident, sig, member=True, proof=proof):
                    sent.append(pid)
            except SignalRefused:  # one refusal must not stop the rest
                continue
        return sent

    def _kill_members_from_outside(self, timeout: float) -> None:
        """SIGKILL every member by identity until none is left (pidns: from
        inside the namespace the keeper cannot name its members)."""
        from ..ending import end

        proof = self.proof()
        find = proof.tracking(
            lambda: [i for i in map(identity.read, self.member_pids()) if i is not None],
            roots=[self.keeper_pid])
        end(find, born_after=self.born_after, grace=0, bound=timeout, proof=lambda _i: proof)

    def helper_pids(self) -> list[int]:
        return [self.keeper_pid] if self.mech.keeper_inside and not self._closed else []

    def step_aside(self) -> None:
        if self.mech.keeper_inside and not self._closed:
            self.request({"op": "step_aside"})

    def _end_from_here(self, timeout: float) -> None:
        """The keeper is gone: end the job from the owner - ``cgroup.kill`` of
        its cgroup, or the members found by the job's cookie."""
        from .. import cgroupfs
        from ..ending import end

        path = (self.mech.trace() or {}).get("cgroup_path")
        if path:
            cgroupfs.kill(path, timeout)
        proof = self.proof()  # the keeper is gone: its cookie, its cgroup, its tree
        end(proof.tracking(self._orphans), born_after=self.born_after, grace=0, bound=timeout,
            on_round=lambda: self._reap_children(block=False), proof=lambda _i: proof)

    def kill_all(self, timeout: float | None = None) -> None:
        timeout = KILL_BOUND if timeout is None else timeout
        if self.mechanism == PIDNS:
            self._kill_members_from_outside(timeout)
        if not self.keeper_alive():
            self._end_from_here(timeout)
            return
        try:
            reply, fds = self.request({"op": "kill_all", "timeout": timeout})
        except JobClosed:  # it died while we asked
            self._end_from_here(timeout)
            return
        for fd in fds:
            os.close(fd)

    def let_go(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._sock.close()  # this process's copy: the keeper still has its owner's
                if self._keeper_fd is not None:
                    os.close(self._keeper_fd)
                    self._keeper_fd = None

    def close(self, timeout: float = KILL_BOUND) -> None:
        if self.mechanism == PIDNS and not self._closed:
            self._kill_members_from_outside(timeout)
        if not self._closed and not self.keeper_alive():
            self._end_from_here(timeout)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                msg: dict = {"op": "close", "timeout": timeout}
                seen = self.mech.__dict__.pop("close_seen", None)  # pgroup: the owner's look
                if seen is not None:
                    msg["seen"] = seen
                _proto.send(self._sock, msg)
                self._sock.settimeout(timeout + 5.0)
                while True:
                    reply, fds = _proto.recv(self._sock)
                    for fd in fds:
                        os.close(fd)
                    if reply is None or "exit" not in reply:
                        break
                    self._exits[reply["exit"]] = reply["status"]
                self._final_status.update(self._exits)
                if reply:
                    self._final_status.update(reply.get("status", {}))
                    self.closed_cleanly = True
            except OSError:
                pass
            finally:
                self._sock.close()
                if self._keeper_fd is not None:
                    os.close(self._keeper_fd)
                    self._keeper_fd = None
        self._reap_children(block=True)
        self.mech.owner_cleanup()

    def _ask_close(self) -> None:
        """Tell the keeper to end the job, without waiting for its answer.
        The socket's closing alone does not say so: an exec of the owner
        closes it too, and a job lives on across its owner's exec."""
        try:
            if self._sock_pid == os.getpid() == self.mech.owner_pid:
                # one small frame: all of it fits, or (a full buffer) none of it
                self._sock.send(_proto.frame(_proto.encode({"op": "close", "timeout": KILL_BOUND})),
                                _proto.DONTWAIT)
        except (AttributeError, OSError):  # half-built, or the keeper is gone
            pass

    def __del__(self) -> None:
        # Dropped without close() (the owner's own copy, not a forked child's).
        if not getattr(self, "_closed", True):
            self._ask_close()

    def has_status(self, inner_pid: int) -> bool:
        """Whether the keeper already handed over this child's exit status."""
        if inner_pid in self._final_status or inner_pid in self._exits:
            return True
        if not self._closed:
            with self._lock:
                try:
                    self._own_channel()
                except JobClosed:
                    return False
                self._drain_exits()
        return inner_pid in self._exits

    def wait_status(self, inner_pid: int, block: bool) -> int | None:
        """Raw wait status of a direct child: pushed by the keeper, or asked for."""
        if inner_pid in self._final_status:
            return self._final_status.pop(inner_pid)
        if not self._closed:
            with self._lock:
                try:
                    self._own_channel()
                except JobClosed:
                    return self._final_status.pop(inner_pid, None)
                open_ = inner_pid in self._exits or self._drain_exits()
                # block: the child's pidfd said it exited, so its status is on
                # its way (the keeper pushes it as it reaps): wait for that
                # push a moment rather than ask (a round trip per wait()).
                deadline = time.monotonic() + 0.05
                while block and open_ and inner_pid not in self._exits:
                    left = deadline - time.monotonic()
                    if left <= 0 or not select.select([self._sock], [], [], left)[0]:
                        break
                    open_ = self._drain_exits()
                if inner_pid in self._exits:
                    return self._exits.pop(inner_pid)
        try:
            reply, fds = self.request({"op": "wait" if block else "poll", "pid": inner_pid})
        except JobClosed:
            st = self._exits.pop(inner_pid, None)
            return st if st is not None else self._final_status.pop(inner_pid, None)
        st = reply.get("status")
        if st is None:
            st = self._exits.pop(inner_pid, None)
        return st


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
        sys.audit("subprocess.Popen", executable, args, cwd, env)
        if gid is not None or gids is not None or uid is not None:
            raise ValueError("user=, group= and extra_groups= are not supported in a tether job yet")
        if cwd is not None and "\0" in os.fsdecode(cwd):
            raise ValueError("embedded null byte")  # as subprocess: never another directory
        # Which owner fds the child gets, by child fd number. One the caller
        # named (stdin=FD, pass_fds) must be open, as subprocess's child
        # needs it: EBADF, not a child that silently goes without.
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
        env_b = with_cookie(env_b, self._tether_backend.options)
        # The child gets this process's state as of now, as subprocess's child
        # would, not the keeper's copy from when the job opened: the keeper
        # reads our ignored signals, umask and limits while we wait for its
        # reply (owner_state); the signal mask is this thread's, so it goes along.
        exe_b = os.fsencode(executable)
        msg = {
            "op": "spawn",
            "argv": [os.fsencode(a) for a in args],
            "executable": exe_b,
            "cwd": os.fsdecode(os.path.abspath(cwd)) if cwd is not None else None,
            # searched only for a name without a slash (a dozen strings less
            # to encode per spawn otherwise)
            "path": _exec_path(env, env_b) if b"/" not in exe_b else [],
            "fdmap": fdmap,
            # (subprocess sets a process group only for one >= 0)
            "pgroup": process_group if process_group is not None and process_group >= 0 else -1,
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
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)
        if not reply.get("ok"):
            for fd in fds:
                os.close(fd)
            kind = reply.get("kind")
            if kind == "os":
                # No words from the native keeper for a bare errno: this
                # interpreter's (its libc, musl say, may word it otherwise).
                err = reply["errno"]
                joins = (process_group is None or process_group < 0) and not start_new_session
                if err == errno.EPERM and joins and backend.mech.joins_owner_group \
                        and os.getsid(0) != backend.session:
                    # the keeper's setpgid: this process left the job's session
                    why = (f"this process is now in session {os.getsid(0)}, not in the job's "
                           f"({backend.session}, since the job opened): its child cannot join "
                           "this process's group from there; pass start_new_session=True, or "
                           "open the job after setsid()")
                    raise JobRefused(f"spawn refused: {why}", reason=why, mechanism=backend.mechanism)
                raise OSError(err, reply.get("strerror") or os.strerror(err), reply.get("filename"))
            if kind in ("ValueError", "TypeError"):  # a bad argument, as subprocess raises it
                raise (ValueError if kind == "ValueError" else TypeError)(reply.get("strerror"))
            why = str(reply.get("strerror"))
            raise JobRefused(f"spawn refused by the job's keeper: {why}", reason=why,
                             mechanism=backend.mechanism)
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
        self._child_created = True

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


# -- the warden: a fork server for keepers, for multi-threaded owners ------------------

class _Warden:
    """One helper interpreter per owner, started on first need, that forks keepers.

    A multi-threaded owner must not fork (locks held by other threads stay
    locked in the child). The warden is single-threaded, so it can.
    """

    def __init__(self) -> None:
        mine, theirs = _proto.socketpair()
        src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        code = (f"import sys; sys.path.insert(0, {src!r}); "
                "from tether.platform._warden import main; main()")
        env = dict(os.environ)
        env["TETHER_WARDEN_FD"] = str(theirs.fileno())
        env["TETHER_OWNER_PID"] = str(os.getpid())
        self.proc = subprocess.Popen([sys.executable, "-S", "-c", code], pass_fds=(theirs.fileno(),),
                                     env=env, stdin=subprocess.DEVNULL)
        theirs.close()
        self.sock = mine
        self.lock = threading.Lock()
        self.pid = os.getpid()

    def create(self, mech: KeeperMechanism, child: socket.socket) -> None:
        o = mech.options
        msg = {"op": "create", "mech": mech.name, "name": o.name, "job_id": o.job_id,
               "background": o.background, "cookie": o.cookie, "cookie_var": o.cookie_var,
               "owner_pid": mech.owner_pid,
               "owner_start": mech.owner_start, "params": mech.params_for_keeper()}
        with self.lock:
            _proto.send(self.sock, msg, [child.fileno()])


_warden_lock = threading.Lock()
_the_warden: _Warden | None = None


def helper_pids() -> frozenset[int]:
    """This process's warden, while it runs: a helper of this process's that
    ends with it (it watches us by pidfd), neither a job's member nor a leak."""
    w = _the_warden
    if w is None or w.pid != os.getpid() or w.proc.poll() is not None:
        return frozenset()
    return frozenset({w.proc.pid})


def _warden() -> _Warden:
    global _the_warden
    with _warden_lock:
        if _the_warden is None or _the_warden.pid != os.getpid() or _the_warden.proc.poll() is not None:
            _the_warden = _Warden()
        return _the_warden
