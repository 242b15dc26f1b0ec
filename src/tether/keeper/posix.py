"""Owner side of the POSIX mechanisms: a job run by a keeper process.

``KeeperJob`` is the ``JobBackend`` for cgroup, subreaper, pidns and pgroup.
It starts the job's keeper (the native program, a fork of its own, or, for a
multi-threaded owner, a fork by its warden: ``_warden``) and talks to it over
a SOCK_STREAM pair; ``JobPopen`` (``posix_popen``) is a ``subprocess.Popen``
whose child the keeper started. The child is not the owner's own child, so
its exit status comes from the keeper; the owner holds a pidfd for it, which
makes ``poll``/``wait`` cheap and ``send_signal`` immune to PID reuse.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
import time

from .. import gate, identity
from ..ending import KILL_BOUND
from ..errors import JobClosed, JobRefused, SignalRefused
from ..platform import keeper_mechanism
from ..platform.base import PIDNS, Guarantee, JobBackend, JobOptions
from . import _proto, native
from ._keeper_socket import fork_keeper
from ._warden import warden
from .posix_popen import JobPopen

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs start-up time: hints only
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
                warden().create(self.mech, child)
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
