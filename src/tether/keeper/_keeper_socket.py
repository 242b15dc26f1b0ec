"""The socket driver of the keeper: what a ``tether.Job``'s keeper does.

The owner side is ``posix.KeeperJob``; this is the keeper side: requests on
a SOCK_STREAM socket (``_proto``: spawn with file descriptors, wait,
poll, kill_all, close, step_aside, ping), exit statuses pushed to the owner
as they happen, and the owner watched by pidfd. The keeper core it extends is
``_keeper.Keeper``.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import sys

from .. import gate, identity
from .._constants import KILL_BOUND
from .._prctl import name_process
from ..errors import SignalRefused
from ._keeper import KEEPER_COMM, Keeper, Unplaced, close_other_fds, detach_signals


def fork_keeper(mech, ctl_child: socket.socket, owner_pid: int, owner_pidfd: int | None,
                extra_keep: tuple[int, ...] = ()) -> int:
    """Fork a keeper for the socket driver from the current (single-threaded)
    process; return its pid. The child never returns: it serves ``ctl_child``
    and leaves with ``os._exit``. Only a mechanism the native program does
    not keep (pgroup): there is one keeper per mechanism."""
    from .native import MECHANISMS

    if mech.name in MECHANISMS:
        raise ValueError(f"the {mech.name} mechanism is kept by the native program, not here")
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

    ctl: socket.socket  # set by serve() before any request is read

    def serve(self, ctl: socket.socket) -> int:
        from . import _proto

        self.ctl = ctl
        self.chans: dict[int, socket.socket] = {}  # forked children's own channels, by fd
        self.kid_chan: dict[int, socket.socket | None] = {}  # a child spawned from one: its exit goes there
        self.sender: tuple[int, int, int] | None = None  # (pid, uid, gid) of the request served
        _pass_creds(ctl)  # before "ready": the owner sends nothing until it
        self.owner_proc = _open_proc(self.owner_pid)  # before a PID namespace hides it
        os.chdir("/")  # never pin a mount point; spawns chdir to the owner's cwd
        self.setup()
        poller = self.poller = select.poll()
        poller.register(ctl.fileno(), select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        if self.owner_pidfd is not None:
            poller.register(self.owner_pidfd, select.POLLIN)
        # The owner may have died before the watch was set up.
        if not self.owner_alive():
            return self.end_for_dead_owner()
        watch = "pidfd" if self.owner_pidfd is not None else "poll"  # (no beacon: native only)
        try:
            _proto.send(ctl, {"ready": True, "keeper": os.getpid(),
                              "trace": {**self.mech.trace(), "owner_watch": watch}})
        except (BrokenPipeError, ConnectionResetError):
            return self.end_for_dead_owner()  # gone before it heard we are ready
        period = None if self.owner_pidfd is not None else 200
        while True:
            for fd, _ev in poller.poll(period):
                if fd == self.wake_r:
                    self.drain_wakeups()
                    self.reap()
                elif fd == self.owner_pidfd:
                    return self.end_for_dead_owner()
                elif fd == ctl.fileno() or fd in self.chans:
                    sock = ctl if fd == ctl.fileno() else self.chans[fd]
                    done = self._serve_one(sock)
                    if done is None and sock is ctl:
                        # The owner closed its end (or a send to it failed):
                        # it is gone - or it called execve (its sockets are
                        # close-on-exec) and lives on, and the job with it,
                        # watched from now on by its pidfd (or polling).
                        if not self._owner_execd():
                            return self.end_for_dead_owner()
                        poller.unregister(ctl.fileno())
                        continue
                    if done is None:
                        self._drop_chan(sock)
                    elif done:
                        return 0
            if period is not None and not self.owner_alive():
                return self.end_for_dead_owner()

    def _owner_execd(self) -> bool:
        """After the owner's end of the socket closed: True when the owner
        lives on (an exec), False when it is dying or gone. Its exit closes
        its files after every thread is marked exiting, so a live owner none
        of whose threads is exiting has exec'd. Unknown (no /proc): gone."""
        if not self.owner_alive() or self.owner_proc is None:
            return False
        try:
            tasks = os.listdir(f"/proc/self/fd/{self.owner_proc}/task")
        except OSError:
            return False
        for tid in tasks:
            try:
                with open(f"/proc/self/fd/{self.owner_proc}/task/{tid}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue  # that thread is gone
            # field 9 the flags (PF_EXITING 0x4), 31 the pending signals:
            # SIGKILL's bit is set in every thread before its exit starts
            flags, pending = int(fields[6]), int(fields[28])
            if not flags & 0x4 and not pending & (1 << 8):
                return True
        return False

    def _serve_one(self, sock: socket.socket) -> bool | None:
        """One request from ``sock``, the owner's socket or a forked child's
        channel; the replies go back on it. True when the request closed the
        job, None when ``sock`` is closed (its process is gone) or a send on
        it failed; a malformed request is answered, and the keeper goes on
        (as the native one)."""
        from . import _proto

        main, self.ctl = self.ctl, sock
        self.serving_chan = sock is not main
        try:
            self.sender = _sender(sock)
            msg, fds = _proto.recv(sock)
            if msg is None:
                return None
            return self.handle(msg, fds)
        except _proto.Malformed as exc:
            try:
                _proto.send(sock, {"ok": False, "kind": "ValueError",
                                   "strerror": f"malformed request: {exc}"})
            except OSError:
                return None
            return False
        except OSError:
            return None
        finally:
            self.ctl = main
            self.serving_chan = False

    def _drop_chan(self, chan: socket.socket) -> None:
        """A forked child's channel closed: its children's exits are kept here."""
        self.poller.unregister(chan.fileno())
        del self.chans[chan.fileno()]
        for pid in [p for p, c in self.kid_chan.items() if c is chan]:
            self.kid_chan[pid] = None
        chan.close()

    def on_exit(self, pid: int, status: int) -> None:
        # Pushed at once to the channel that spawned it, so its wait() needs
        # no round trip; kept here instead if nobody there is reading (never
        # block the keeper).
        from . import _proto

        chan = self.kid_chan.pop(pid, self.ctl)
        try:
            if chan is None:
                raise OSError
            data = _proto.frame(_proto.encode({"exit": pid, "status": status}))
            n = chan.send(data, socket.MSG_DONTWAIT)
            if n < len(data):  # (never half a frame: the rest at once)
                chan.sendall(data[n:])
        except OSError:
            self.status[pid] = status

    def wait_one(self, pid: int) -> int | None:
        if pid in self.status:
            return self.status.pop(pid)
        if pid not in self.children:
            return None
        before = identity.now_ticks()
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            return None
        self.children.discard(pid)
        self.forget_spawned(pid, before)
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
                seed = getattr(self.mech, "seed", None)
                if seed is not None and msg.get("seen") is not None:
                    seed(msg["seen"])  # the owner's look (pgroup): the kill loop starts from it
                self.mech.kill_all(self, timeout=float(msg.get("timeout", KILL_BOUND)))
                self.reap()
                self.mech.cleanup(self)
                try:
                    _proto.send(self.ctl, {"ok": True, "status": dict(self.status)})
                except OSError:  # a dropped job's owner asked and closed its end: close anyway
                    pass
                return True
            elif op == "step_aside":  # a no-op (docs/protocol.md): no keeper lives in its job
                _proto.send(self.ctl, {"ok": True})
            elif op == "ping":
                _proto.send(self.ctl, {"ok": True, "keeper": os.getpid()})
            elif op == "channel":
                # A forked child of the owner asks for a channel of its own
                # (the socket it sends): its requests, replies and its
                # children's exits never cross its parent's. Answered there.
                try:
                    if not fds:
                        raise OSError
                    chan = socket.socket(fileno=fds[0])
                except OSError:
                    raise ValueError("channel: no stream socket") from None
                if chan.type != socket.SOCK_STREAM:
                    chan.detach()
                    raise ValueError("channel: no stream socket")
                fds.pop(0)
                chan.setblocking(True)
                _pass_creds(chan)  # before the answer, which the child waits for
                self.chans[chan.fileno()] = chan
                self.poller.register(chan.fileno(), select.POLLIN)
                _proto.send(chan, {"ok": True})
            else:
                _proto.send(self.ctl, {"ok": False, "kind": "ValueError",
                                       "strerror": f"unknown request {op!r}"})
        except Exception as exc:  # noqa: BLE001 - a malformed request must not end the job: say so, go on
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
        except OwnerStateUnread as exc:  # the owner sends its state itself
            _proto.send(self.ctl, {"ok": False, "kind": "owner_state", "strerror": str(exc)})
            return
        if self.serving_chan:
            self.kid_chan[pid] = self.ctl
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


# -- who sent a request ----------------------------------------------------------------
# A socket's SO_PEERCRED is its creator's, fixed at socketpair(): it cannot
# tell the owner from a forked worker that dropped privileges and writes on
# the inherited end. SCM_CREDENTIALS (Linux) are per message, filled in and
# checked by the kernel at each send. Elsewhere there is no such thing for a
# socketpair: docs/limits.md says what that leaves.
_PASSCRED = getattr(socket, "SO_PASSCRED", None)
_SCM_CREDS = getattr(socket, "SCM_CREDENTIALS", None)


def _pass_creds(sock: socket.socket) -> None:
    if _PASSCRED is not None:
        sock.setsockopt(socket.SOL_SOCKET, _PASSCRED, 1)


def _open_proc(pid: int) -> int | None:
    try:
        return os.open(f"/proc/{pid}", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except (OSError, AttributeError):  # gone, no /proc, or no O_PATH
        return None


def _sender(sock: socket.socket) -> tuple[int, int, int] | None:
    """(pid, uid, gid) of the next message's sender, as the kernel wrote
    them, or None (none attached, or no such thing here). Peeked, with no
    room for file descriptors: the message and its fds stay queued."""
    if _SCM_CREDS is None:
        return None
    try:
        _, anc, _, _ = sock.recvmsg(1, socket.CMSG_SPACE(12), socket.MSG_PEEK)
    except OSError:
        return None
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == _SCM_CREDS and len(data) >= 12:
            pid, uid, gid = (int.from_bytes(data[k:k + 4], sys.byteorder) for k in (0, 4, 8))
            return pid, uid, gid
    return None


def _check_sender(keeper: Keeper) -> None:
    """A child runs as this keeper (the owner, as of the job's opening):
    only a sender that runs as the same real uid and gid may start one,
    whatever its request claims (its ``ids``, checked before, must be the
    keeper's: so never other ids than the sender's). Raises
    :class:`Unplaced` with the reason (keeper.c's sender_may_spawn says the
    same)."""
    if _SCM_CREDS is None:
        return
    sender = getattr(keeper, "sender", None)
    if sender is None:
        raise Unplaced("the request came without its sender's credentials (SCM_CREDENTIALS): "
                       "the keeper starts nothing for a sender it cannot name")
    pid, uid, gid = sender
    if (uid, gid) != (os.getuid(), os.getgid()):
        raise Unplaced(f"the request's sender (pid {pid}) runs as uid {uid} gid {gid}, the "
                       f"job's keeper as uid {os.getuid()} gid {os.getgid()}: it would start "
                       "the child with more privilege than its sender has; open a job of "
                       "its own in the process that changed user")


def _fsname(name: object) -> str | None:
    if name is None:
        return None
    return os.fsdecode(name) if isinstance(name, (bytes, str)) else str(name)


# -- spawning a request's child ---------------------------------------------------------

def _candidates(executable: bytes, path: list[bytes]) -> list[bytes]:
    """Where subprocess would try to exec ``executable``: as is if it has a
    slash, else in each PATH entry in order (an empty name gives ``dir/``)."""
    if b"/" in executable:
        return [executable]
    # relative entries: we are in the child's cwd
    return [os.path.join(d, executable) for d in path]


def _spawn_first(spawn, candidates: list[bytes]) -> int:
    """subprocess's search (CPython's ``_posixsubprocess``, not execvp's):
    each candidate in order; a later one that runs wins, and a failure
    raises the first error other than ENOENT/ENOTDIR, else the last. A
    candidate ``stat`` finds missing is not tried (its exec fails the same
    way): one spawn, not one per PATH entry."""
    first: OSError | None = None
    last: OSError = FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT))
    for cand in candidates:
        try:
            os.stat(cand)
        except (FileNotFoundError, NotADirectoryError) as exc:
            last = exc
            continue
        except OSError:
            pass  # ELOOP, EACCES, ENAMETOOLONG...: the exec says which
        else:
            if cand.endswith(b"/"):
                # an empty name: "dir/" - a directory, which exec refuses
                # with EACCES (posix_spawn refuses an empty argv[0] itself)
                last = PermissionError(errno.EACCES, os.strerror(errno.EACCES))
                first = first or last
                continue
        try:
            return spawn(cand)
        except OSError as exc:
            last = exc
            if first is None and exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                first = exc
    raise first if first is not None else last


class OwnerStateUnread(Exception):
    """``owner_state``: the owner's state could not be read from its /proc."""


def _owner_state(keeper: Keeper, msg: dict, fds: list[int]) -> dict:
    """``msg`` with the owner's ignored signals, umask (unless it asked for
    one) and resource limits, read from its /proc entries while it waits for
    the reply (``owner_state``: three reads fewer in the owner per spawn; as
    the native keeper's read_owner_state), and its working directory (the
    directory itself, deleted or not) when it gave none, added to ``fds``."""
    from ._keeper import child_ignores

    if "ignored" in msg or "rlimits" in msg:
        raise ValueError("malformed spawn request: owner_state, and the owner's state in it")
    pid = keeper.owner_pid
    try:
        if keeper.mech.params.get("no_owner_state"):  # native.NO_OWNER_STATE, a test knob
            raise PermissionError("turned off for a test")
        f = identity.status_fields(pid, b"SigIgn", b"Umask")
        ignored = child_ignores(identity.mask_signals(int(f[b"SigIgn"], 16)),
                                bool(msg.get("restore_signals")))
        out = {**msg, "ignored": ignored, "rlimits": identity.rlimits(pid)}
        if msg.get("umask", -1) < 0:
            out["umask"] = int(f[b"Umask"], 8)
        if msg.get("cwd") is None and "cwd_fd" not in msg:
            fds.append(os.open(f"/proc/{pid}/cwd", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
            out["cwd_fd"] = len(fds) - 1
        return out
    except (OSError, KeyError, ValueError) as exc:
        raise OwnerStateUnread(f"cannot read the owner's signals, umask and limits from "
                               f"/proc/{pid}: {exc}") from None


def spawn_from_request(keeper: Keeper, msg: dict, fds: list[int]) -> int:
    """Start the child a ``spawn`` request describes.

    ``msg['fdmap']`` maps each child fd number to an index into ``fds``.
    ``msg['pgroup']``: -1 inherit the owner's group (``msg['owner_pgid']``),
    0 new group, >0 join that group; ``msg['setsid']`` for a new session.
    ``msg['umask']``, ``msg['ignored']``, ``msg['sigmask']``, ``msg['rlimits']``:
    the owner's, as of its ``popen()`` call (this keeper's own date from when
    the job opened); with ``msg['owner_state']`` the keeper reads the owner's
    ignored signals (less SIGPIPE and SIGXFSZ with ``restore_signals``), umask
    (where ``umask`` is -1) and limits itself. ``msg['env_same']``: the
    environment of the last request that carried one (``env``). ``msg['ids']``:
    the owner's (uid, euid, gid, egid); a keeper that is not who the owner is
    now starts nothing.
    """
    ids = msg.get("ids")
    if ids is not None and tuple(ids) != (os.getuid(), os.geteuid(), os.getgid(), os.getegid()):
        raise Unplaced(f"this process now runs as uid/euid/gid/egid {'/'.join(map(str, ids))}, "
                       f"not as the job's keeper ({os.getuid()}/{os.geteuid()}/{os.getgid()}/"
                       f"{os.getegid()}, since the job opened): it would start the child as "
                       "the wrong user; open the job after changing user")
    _check_sender(keeper)  # (after that check: an owner that changed user is told so)
    if msg.get("owner_state"):
        msg = _owner_state(keeper, msg, fds)  # fds: handle() closes what it adds
    argv = msg["argv"]
    executable = msg["executable"]
    if msg.get("env_same"):  # the environment of the last request that carried one
        env = getattr(keeper, "saved_env", None)
        if env is None or "env" in msg:
            raise ValueError("malformed spawn request: env_same, but no environment was sent "
                             "before" if env is None else "malformed spawn request")
    else:
        env = msg["env"]
        if not isinstance(env, dict):
            raise ValueError("malformed spawn request")
        if not keeper.serving_chan:  # (a forked child's channel always sends its own)
            keeper.saved_env = env
    cwd = msg["cwd"]
    # Lift the received fds above every target so dup2 never clobbers a source.
    targets = msg["fdmap"]
    base = max([3, *targets.keys()]) + 1
    lifted: list[int] = []
    try:
        import fcntl

        for fd in fds:
            lifted.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, base))
        file_actions: list[tuple[int, ...] | tuple[int, int, str, int, int]] = [(os.POSIX_SPAWN_DUP2, lifted[idx], target)
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
            candidates = _candidates(executable, [os.fsencode(p) for p in msg.get("path") or ()])
            if msg.get("umask", -1) >= 0:
                old_umask = os.umask(msg["umask"])
            limits = _Limits(msg.get("rlimits") or ())
            ignored = msg.get("ignored", ())
            was = _ignore(ignored)
            try:
                limits.apply()
                pid = _spawn_first(lambda exe: keeper.spawn(exe, argv, env, keep_ignored=ignored,
                                                            **kwargs), candidates)
            except OSError as exc:
                exc.filename = os.fsdecode(executable)  # subprocess names what it was given
                raise
            finally:
                limits.restore()
                _unignore(was)
            limits.give(pid, keeper)
            return pid
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


def _ignore(signals) -> list[tuple[int, object]]:
    """Ignore, for one spawn, what the owner ignores and this keeper does not
    (posix_spawn keeps an ignored signal ignored; it cannot set one): the
    child then inherits SIG_IGN as subprocess's would. Never SIGCHLD: an
    ignored SIGCHLD would make the kernel reap this keeper's children
    (subprocess's child keeps it; a job's child gets the default)."""
    import _signal

    was = []
    for sig in signals:
        if sig in (_signal.SIGCHLD, _signal.SIGKILL, _signal.SIGSTOP):
            continue
        try:
            old = _signal.getsignal(sig)
            if old is not None and old != _signal.SIG_IGN:
                _signal.signal(sig, _signal.SIG_IGN)
                was.append((sig, old))
        except (ValueError, OSError):  # not a signal Python may set here
            continue
    return was


def _unignore(was: list[tuple[int, object]]) -> None:
    import _signal

    for sig, old in was:
        _signal.signal(sig, old)


class _Limits:
    """The owner's resource limits, for one spawn.

    posix_spawn has no rlimit attribute, and a limit must hold from the
    child's first instruction (``RLIMIT_STACK`` shapes the new image; a
    program reads ``RLIMIT_NOFILE`` at start-up), so this keeper takes the
    owner's limits itself around the spawn and gives its own back after (an
    unprivileged keeper cannot raise a hard limit it lowered: it keeps the
    owner's lower one, which the owner cannot raise either). Two kinds it
    could not survive are handled apart: CPU time (SIGXCPU is blocked for the
    moment and a pending one dropped; a hard limit below what the keeper has
    used, which the kernel would answer with SIGKILL, goes the other way) and
    address space or data size smaller than the keeper itself (the spawn's
    own stack mapping would fail). Those are set on the child right after its
    spawn (``prlimit``): a few microseconds late, which docs/limits.md states.
    """

    __slots__ = ("now", "later", "saved", "xcpu")

    def __init__(self, wanted) -> None:
        self.now: list[tuple[int, tuple[int, int]]] = []
        self.later: list[tuple[int, tuple[int, int]]] = []
        self.saved: list[tuple[int, tuple[int, int]]] = []
        self.xcpu = False
        if not wanted:
            return
        import resource

        inf = resource.RLIM_INFINITY
        size = None
        for res, soft, hard in wanted:
            if resource.getrlimit(res) == (soft, hard):
                continue
            ok = True
            if res == resource.RLIMIT_CPU:
                used = sum(os.times()[:2])
                ok = hard == inf or hard > used + 1
                self.xcpu = self.xcpu or ok
            elif res in (resource.RLIMIT_AS, resource.RLIMIT_DATA) and soft != inf:
                if size is None:
                    f = identity.status_fields("self", b"VmSize", b"VmData")
                    size = {k: int(v.split()[0]) * 1024 for k, v in f.items()}
                mine = size.get(b"VmSize" if res == resource.RLIMIT_AS else b"VmData")
                ok = mine is not None and soft > mine + (64 << 20)
            (self.now if ok else self.later).append((res, (soft, hard)))

    def apply(self) -> None:
        if not self.now:
            return
        import resource

        if self.xcpu:
            import _signal

            _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGXCPU})
        for res, lim in self.now:
            cur = resource.getrlimit(res)
            try:
                resource.setrlimit(res, lim)
            except (ValueError, OSError) as exc:
                self.restore()
                raise PermissionError(errno.EPERM, f"cannot give the child this process's "
                                      f"{_rlimit_name(res)} {lim}: the job's keeper may not "
                                      f"raise its own {cur} ({exc})") from None
            self.saved.append((res, cur))

    def restore(self) -> None:
        import resource

        inf = resource.RLIM_INFINITY
        while self.saved:
            res, (soft, hard) = self.saved.pop()
            try:
                resource.setrlimit(res, (soft, hard))
            except (ValueError, OSError):  # a lowered hard limit stays lowered
                now_hard = resource.getrlimit(res)[1]
                fits = now_hard == inf or (soft != inf and soft <= now_hard)
                try:
                    resource.setrlimit(res, (soft if fits else now_hard, now_hard))
                except (ValueError, OSError):
                    pass
        if self.xcpu:
            import _signal

            self.xcpu = False
            if _signal.SIGXCPU in _signal.sigpending():  # meant for the child's limit, not us
                _signal.sigtimedwait({_signal.SIGXCPU}, 0)
            _signal.pthread_sigmask(_signal.SIG_UNBLOCK, {_signal.SIGXCPU})

    def give(self, pid: int, keeper: Keeper) -> None:
        """The limits set on the child after its spawn; if one cannot be set,
        the child is ended (it never ran with the limits asked for) and the
        spawn fails with the reason."""
        if not self.later:
            return
        import resource

        for res, lim in self.later:
            try:
                resource.prlimit(pid, res, lim)
            except ProcessLookupError:
                return  # already gone: it ran within the limits anyway
            except (ValueError, OSError) as exc:
                import _signal

                # Our own child, not yet reaped; through the one signal gate.
                child = identity.read(pid)
                if child is not None:
                    try:
                        gate.send_signal(child, _signal.SIGKILL, member=True,
                                         proof=gate.Proof.own_child())
                    except SignalRefused:
                        pass
                keeper.reap()
                raise PermissionError(errno.EPERM, f"cannot give the child this process's "
                                      f"{_rlimit_name(res)} {lim}: {exc}") from None


def _rlimit_name(res: int) -> str:
    import resource

    for n in dir(resource):
        if n.startswith("RLIMIT_") and getattr(resource, n) == res:
            return n
    return f"resource limit {res}"
