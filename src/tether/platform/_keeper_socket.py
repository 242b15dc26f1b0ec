"""The socket driver of the keeper: what a ``tether.Job``'s keeper does.

The owner side is ``posix.KeeperJob``; this is the keeper side: requests on
a SOCK_SEQPACKET socket (``_proto``: spawn with file descriptors, wait,
poll, kill_all, close, step_aside, ping), exit statuses pushed to the owner
as they happen, and the owner watched by pidfd. The keeper core it extends is
``_keeper.Keeper``, which the one-command path (``oneshot``) drives too.
"""

from __future__ import annotations

import errno
import os
import select
import socket

from .. import identity
from .._prctl import name_process
from ._keeper import KEEPER_COMM, KILL_BOUND, Keeper, Unplaced, close_other_fds, detach_signals


def fork_keeper(mech, ctl_child: socket.socket, owner_pid: int, owner_pidfd: int | None,
                extra_keep: tuple[int, ...] = ()) -> int:
    """Fork a keeper for the socket driver from the current (single-threaded)
    process; return its pid. The child never returns: it serves ``ctl_child``
    and leaves with ``os._exit``."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        keep = {ctl_child.fileno(), *extra_keep}
        if owner_pidfd is not None:
            keep.add(owner_pidfd)
        close_other_fds(keep)
        try:
            os.setpgid(0, 0)
        except OSError:
            pass
        name_process(KEEPER_COMM)
        detach_signals()
        code = SocketKeeper(mech, owner_pid, owner_pidfd).serve(ctl_child)
    except BaseException:  # noqa: BLE001 - a keeper must never fall back into the owner's code
        try:
            import traceback

            traceback.print_exc()
        except BaseException:  # noqa: BLE001 - printing may fail too; exit anyway
            pass
    finally:
        os._exit(code)


class SocketKeeper(Keeper):
    """The keeper of a ``tether.Job``: serves its owner's requests."""

    def serve(self, ctl: socket.socket) -> int:
        from . import _proto

        self.ctl = ctl
        os.chdir("/")  # never pin a mount point; spawns chdir to the owner's cwd
        self.setup()
        poller = select.poll()
        poller.register(ctl.fileno(), select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        if self.owner_pidfd is not None:
            poller.register(self.owner_pidfd, select.POLLIN)
        # The owner may have died before the watch was set up.
        if not self.owner_alive():
            return self.end_for_dead_owner()
        _proto.send(ctl, {"ready": True, "keeper": os.getpid(), "trace": self.mech.trace()})
        period = None if self.owner_pidfd is not None else 200
        while True:
            for fd, _ev in poller.poll(period):
                if fd == self.wake_r:
                    self.drain_wakeups()
                    self.reap()
                elif fd == self.owner_pidfd:
                    return self.end_for_dead_owner()
                elif fd == ctl.fileno():
                    try:
                        msg, fds = _proto.recv(ctl)
                    except (OSError, ValueError, EOFError, TypeError):
                        msg, fds = None, []  # a torn or foreign message: the owner is broken
                    if msg is None:
                        return self.end_for_dead_owner()
                    if self.handle(msg, fds):
                        return 0
            if period is not None and not self.owner_alive():
                return self.end_for_dead_owner()

    def on_exit(self, pid: int, status: int) -> None:
        # Pushed to the owner at once, so its wait() needs no round trip; kept
        # here instead if the owner is not reading (never block the keeper).
        from . import _proto

        try:
            self.ctl.send(_proto.encode({"exit": pid, "status": status}), socket.MSG_DONTWAIT)
        except OSError:
            self.status[pid] = status

    def wait_one(self, pid: int) -> int | None:
        if pid in self.status:
            return self.status.pop(pid)
        if pid not in self.children:
            return None
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            return None
        self.children.discard(pid)
        return status

    def handle(self, msg: dict, fds: list[int]) -> bool:
        """One request; True when the job is closed and the keeper leaves."""
        from . import _proto

        op = msg.get("op") if isinstance(msg, dict) else None
        try:
            if op == "spawn":
                self._spawn_request(msg, fds)
                return False
            if op == "wait":
                _proto.send(self.ctl, {"ok": True, "status": self.wait_one(msg["pid"])})
            elif op == "poll":
                self.reap()
                _proto.send(self.ctl, {"ok": True, "status": self.status.pop(msg["pid"], None)})
            elif op == "kill_all":
                self.mech.kill_all(self, timeout=float(msg.get("timeout", KILL_BOUND)))
                self.reap()
                _proto.send(self.ctl, {"ok": True})
            elif op == "close":
                self.mech.kill_all(self, timeout=float(msg.get("timeout", KILL_BOUND)))
                self.reap()
                self.mech.cleanup(self)
                _proto.send(self.ctl, {"ok": True, "status": dict(self.status)})
                return True
            elif op == "step_aside":
                self.mech.step_aside()
                _proto.send(self.ctl, {"ok": True})
            elif op == "ping":
                _proto.send(self.ctl, {"ok": True, "keeper": os.getpid()})
            else:
                _proto.send(self.ctl, {"ok": False, "kind": "ValueError",
                                       "strerror": f"unknown request {op!r}"})
        except (KeyError, TypeError, ValueError) as exc:  # a malformed request: say so, go on
            _proto.send(self.ctl, {"ok": False, "kind": "ValueError",
                                   "strerror": f"malformed {op!r} request: {exc}"})
        finally:
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
        return False

    def _spawn_request(self, msg: dict, fds: list[int]) -> None:
        from . import _proto

        try:
            pid = spawn_from_request(self, msg, fds)
        except OSError as exc:
            _proto.send(self.ctl, {"ok": False, "errno": exc.errno or 0,
                                   "strerror": exc.strerror or str(exc),
                                   "filename": _fsname(exc.filename), "kind": "os"})
            return
        except (ValueError, TypeError) as exc:  # a bad argument: raised as itself in the owner
            _proto.send(self.ctl, {"ok": False, "kind": type(exc).__name__, "strerror": str(exc)})
            return
        except Unplaced as exc:  # the job could not hold it: the owner raises JobRefused
            _proto.send(self.ctl, {"ok": False, "kind": "refused", "strerror": str(exc)})
            return
        pidfd = identity.open_pidfd(pid)
        reply: dict = {"ok": True, "pid": pid}
        if msg.get("ident"):
            # Read here, before this keeper can reap the child: by the time the
            # owner reads, a short command may be gone. The pidfd's fdinfo names
            # the pid as our /proc mount sees it (the outer pid under pidns).
            proc_pid = (identity.pidfd_pid(pidfd) if pidfd is not None else None) or pid
            ident = identity.read(proc_pid)
            if ident is not None:
                reply["ident"] = tuple(ident)
        _proto.send(self.ctl, reply, [pidfd] if pidfd is not None else [])
        if pidfd is not None:
            os.close(pidfd)


def _fsname(name: object) -> str | None:
    if name is None:
        return None
    return os.fsdecode(name) if isinstance(name, (bytes, str)) else str(name)


# -- spawning a request's child ---------------------------------------------------------

def _resolve(executable: bytes, path: list[bytes]) -> bytes:
    """execvp semantics: a name with a slash is used as is, else searched in PATH."""
    if b"/" in executable:
        return executable
    denied = None
    for d in path:
        cand = os.path.join(d, executable)  # relative entries: we are in the child's cwd
        try:
            st = os.stat(cand)
        except OSError:
            continue
        if (st.st_mode & 0o170000) == 0o100000:
            if os.access(cand, os.X_OK):
                return cand
            denied = cand
    if denied is not None:
        return denied
    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), os.fsdecode(executable))


def spawn_from_request(keeper: Keeper, msg: dict, fds: list[int]) -> int:
    """Start the child a ``spawn`` request describes.

    ``msg['fdmap']`` maps each child fd number to an index into ``fds``.
    ``msg['pgroup']``: -1 inherit the owner's group (``msg['owner_pgid']``),
    0 new group, >0 join that group; ``msg['setsid']`` for a new session.
    ``msg['umask']``, ``msg['ignored']``, ``msg['sigmask']``: the owner's, as
    of its ``popen()`` call.
    """
    argv = msg["argv"]
    executable = msg["executable"]
    env = msg["env"]
    cwd = msg["cwd"]
    # Lift the received fds above every target so dup2 never clobbers a source.
    targets = msg["fdmap"]
    base = max([3, *targets.keys()]) + 1
    lifted: list[int] = []
    try:
        import fcntl

        for fd in fds:
            lifted.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, base))
        file_actions = [(os.POSIX_SPAWN_DUP2, lifted[idx], target)
                        for target, idx in sorted(targets.items())]
        if msg.get("ctty") and 0 in targets:
            # posix_spawn runs setsid before the file actions, and on Linux a
            # session leader without a terminal acquires the first one it opens:
            # re-open the child's stdin terminal by path onto fd 0.
            file_actions.append((os.POSIX_SPAWN_OPEN, 0, os.ttyname(lifted[targets[0]]),
                                 os.O_RDWR, 0))
        kwargs: dict = {}
        pgroup = msg.get("pgroup", -1)
        if msg.get("setsid"):
            kwargs["setsid"] = True
        elif pgroup == -1:
            kwargs["setpgroup"] = msg["owner_pgid"]
        else:
            kwargs["setpgroup"] = pgroup
        kwargs.update(keeper.mech.spawn_attrs(msg))
        kwargs["setsigmask"] = msg.get("sigmask", ())
        if file_actions:
            kwargs["file_actions"] = file_actions
        old_umask = None
        try:
            try:
                if cwd is None:
                    os.fchdir(fds[msg["cwd_fd"]])
                else:
                    os.chdir(cwd)
            except OSError as exc:
                raise type(exc)(exc.errno, exc.strerror, cwd) from None
            exe = _resolve(executable, [os.fsencode(p) for p in msg["path"]])
            if msg.get("umask", -1) >= 0:
                old_umask = os.umask(msg["umask"])
            try:
                return keeper.spawn(exe, argv, env, keep_ignored=msg.get("ignored", ()),
                                    **kwargs)
            except OSError as exc:
                if exc.filename is None:
                    exc.filename = os.fsdecode(executable)
                raise
        finally:
            if old_umask is not None:
                os.umask(old_umask)
            try:
                os.chdir("/")
            except OSError:
                pass
    finally:
        for fd in lifted:
            os.close(fd)
