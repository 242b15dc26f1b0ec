"""The keeper: one small process per job that starts the job's processes.

Why a separate process: the owner may die at any moment (SIGKILL, OOM), and
something that outlives it must end the job. The keeper

* is forked, never exec'd: from the owner itself when the owner is
  single-threaded, otherwise from the owner's *warden*, a helper interpreter
  started once per owner (interpreter start-up costs 11-13 ms; a fork of a
  small single-threaded process costs well under 1 ms);
* lives in its own process group, ignores terminal hang-up and job-control
  signals (:data:`KEEPER_IGNORES`), and keeps the caller's session so the
  command keeps the terminal;
* is the parent of every process it spawns (and, per mechanism, their
  subreaper, their PID namespace's init, or the writer of ``cgroup.kill``);
* watches the owner through a pidfd (or, without one, polls its parent) and
  ends the whole job the moment the owner is gone.

One keeper, two drivers:

``serve(ctl)``
    for ``tether.Job``: requests on a SOCK_SEQPACKET socket (``_proto``):
    spawn with file descriptors, wait, poll, kill_all, close, step_aside.
``run_one(...)``
    for the one-command path (``oneshot``, what ``tether-shell`` runs on
    every command): start the one command the keeper inherited (fds, cwd,
    environment), report on a pipe, end what it leaves behind.

Both run the same mechanism classes (``_posix_base.KeeperMechanism``) and
the same signal rules. The keeper is single-threaded on purpose: it may
fork, move itself between cgroups and change its working directory around a
spawn without racing anything. Import-light: ``os``, ``sys``, ``select``,
``_signal`` (``signal`` would pull in ``enum``); the socket driver imports
``_proto`` when it starts.
"""

from __future__ import annotations

import _signal
import errno
import os
import select
import sys

from .. import identity
from .._prctl import name_process
from ..ending import KILL_BOUND

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket

# Signals a keeper must survive: the caller may kill the owner's process
# group or hang up the terminal; only the owner's death (or its request)
# ends a job.
KEEPER_IGNORES = tuple(getattr(_signal, n) for n in (
    "SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGPIPE")
    if hasattr(_signal, n))
# Python ignores these at start-up; subprocess (restore_signals=True) gives
# them back to the child as default, and so does every keeper spawn.
RESTORED = tuple(getattr(_signal, n) for n in ("SIGPIPE", "SIGXFSZ", "SIGXFZ") if hasattr(_signal, n))
ALL_SIGNALS = tuple(sorted(int(s) for s in _signal.valid_signals()
                           if s not in (_signal.SIGKILL, _signal.SIGSTOP)))
KEEPER_COMM = b"tether-keeper"


def close_other_fds(keep: set[int]) -> None:
    """Close every fd but ``keep``: a leaked pipe end would keep a lifeline open."""
    names = identity.open_fds("self")
    if names is None:
        top = 1024
        try:
            top = min(os.sysconf("SC_OPEN_MAX"), 65536)
        except (OSError, ValueError):
            pass
        names = list(range(3, top))
    for fd in names:
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def detach_signals() -> None:
    """Ignore what a keeper must survive (see :data:`KEEPER_IGNORES`)."""
    for sig in KEEPER_IGNORES:
        _signal.signal(sig, _signal.SIG_IGN)


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
        code = Keeper(mech, owner_pid, owner_pidfd).serve(ctl_child)
    except BaseException:  # noqa: BLE001 - a keeper must never fall back into the owner's code
        try:
            import traceback

            traceback.print_exc()
        except BaseException:  # noqa: BLE001 - printing may fail too; exit anyway
            pass
    finally:
        os._exit(code)


def _noop(*_args: object) -> None:
    pass


class Unplaced(Exception):
    """The job could not hold a child (its kernel object refused it): nothing ran."""


class Keeper:
    """The keeper's state: its mechanism, its children, the owner it watches."""

    def __init__(self, mech, owner_pid: int, owner_pidfd: int | None) -> None:
        self.mech = mech
        self.owner_pid = owner_pid
        self.owner_pidfd = owner_pidfd
        self.ctl: socket.socket | None = None
        self.children: set[int] = set()  # direct children we spawned, not yet reaped
        self.spawned: set[int] = set()  # every child ever spawned (pgroup needs their groups)
        self.status: dict[int, int] = {}  # raw wait statuses, until collected
        self.wake_r = self.wake_w = -1

    # -- the core, both drivers ---------------------------------------------------------
    def setup(self) -> None:
        """Mechanism set-up (cgroup join, subreaper, namespace), then the wake-up."""
        self.mech.keeper_setup(self)
        self.setup_wakeup()

    def setup_wakeup(self) -> None:
        """The SIGCHLD wake-up pipe: a ``poll`` on it cannot miss a child's exit."""
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        _signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        _signal.signal(_signal.SIGCHLD, _noop)

    def drain_wakeups(self) -> None:
        try:
            os.read(self.wake_r, 4096)
        except OSError:
            pass

    def owner_alive(self) -> bool:
        if self.owner_pidfd is not None:
            r, _, _ = select.select([self.owner_pidfd], [], [], 0)
            return not r
        try:
            os.kill(self.owner_pid, 0)  # existence probe only (signal 0 sends nothing)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return os.getppid() != 1 or self.owner_pid == 1

    def reaped(self, pid: int, status: int) -> None:
        """A child was reaped (by :meth:`reap` or a mechanism's kill loop)."""
        if pid in self.children:
            self.children.discard(pid)
            self.on_exit(pid, status)

    def on_exit(self, pid: int, status: int) -> None:
        self.status[pid] = status

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            except InterruptedError:
                continue
            if pid == 0:
                return
            self.reaped(pid, status)

    def spawn(self, exe: bytes | str, argv: list, env, **kwargs) -> int:
        """``posix_spawn`` one child inside the job (the mechanism's spawn
        context and attributes apply); it is a member before its first
        instruction. Signals the keeper ignores are reset to default unless
        the caller ignores them too (``kwargs["keep_ignored"]``). Raises
        :class:`Unplaced` when the job cannot hold the child (nothing runs),
        else the ``OSError`` of a failed exec."""
        keep_ignored = set(kwargs.pop("keep_ignored", ()))
        # Only what this keeper ignores needs resetting: a handled signal is
        # reset by posix_spawn and execve anyway (one sigaction per signal less).
        kwargs["setsigdef"] = [s for s in own_ignored() if s not in keep_ignored]
        ctx = self.mech.spawn_context()
        try:
            ctx.__enter__()
        except OSError as exc:
            raise Unplaced(f"cannot place the child in the job: {exc.strerror or exc}") from exc
        try:
            pid = os.posix_spawn(exe, argv, env, **kwargs)
        finally:
            ctx.__exit__(None, None, None)
        self.children.add(pid)
        self.spawned.add(pid)
        return pid

    def end_for_dead_owner(self) -> int:
        if self.mech.exit_ends_job and not self.mech.options.background:
            os._exit(0)  # PID 1 of the job's namespace: the kernel kills the rest at once
        if self.mech.options.background:
            # Background jobs outlive the owner on purpose: keep reaping until empty.
            while True:
                try:
                    os.waitpid(-1, 0)
                except ChildProcessError:
                    break
                except InterruptedError:
                    continue
            self.mech.cleanup(self)
            return 0
        self.mech.end_for_dead_owner(self)
        return 0

    # -- driver 1: the socket, for tether.Job --------------------------------------------
    def serve(self, ctl: socket.socket) -> int:
        from . import _proto

        self.ctl = ctl
        self.on_exit = self.on_exit_socket  # exits are pushed to the owner at once
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

    def on_exit_socket(self, pid: int, status: int) -> None:
        # Pushed to the owner at once, so its wait() needs no round trip; kept
        # here instead if the owner is not reading (never block the keeper).
        import socket

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

    # -- driver 2: the pipe, for the one-command path ------------------------------------
    def run_one(self, executable: str, argv: list[str], *, pgid: int, ignored: set[int],
                grace: float, rep_w: int, ctl_r: int) -> int:
        """Start the one command (it inherits this keeper's fds, cwd and
        environment, which are the owner's), report ``P <pid> <mechanism>``
        on ``rep_w``, wait for it, end what it left behind (SIGTERM, ``grace``,
        the mechanism's kill) and report ``X <status> <leftovers>``. A byte on
        ``ctl_r`` (the owner got SIGTERM/SIGHUP) ends the job now; EOF on it,
        or the owner's pidfd, means the owner is gone: end everything, no
        grace, report nothing."""
        mech = self.mech

        def say(line: str) -> None:
            try:
                os.write(rep_w, line.encode() + b"\n")
            except OSError:  # the owner is gone; the owner-gone path ends the job
                pass

        if _readable(ctl_r):  # stopped (or the owner died) while we set up
            mech.cleanup(self)
            say("X -1 0")
            return 0
        born = identity.now_ticks()  # nothing of the command is older
        try:
            child = self.spawn(executable, argv, os.environ, setpgroup=pgid, keep_ignored=ignored)
        except Unplaced as exc:
            mech.cleanup(self)
            say(f"E job 0 {exc}")
            return 0
        except OSError as exc:
            mech.cleanup(self)
            say(f"E exec {exc.errno or 0}")
            return 0
        try:
            # Out of the job's cgroup at once, while the command runs: the
            # move's cost overlaps the command instead of following it.
            mech.step_aside()
        except OSError as exc:
            # Spawned, but we cannot step out: cgroup.kill would end us too.
            mech.kill_all(self, timeout=1.0)
            mech.cleanup(self)
            say(f"E job {exc.errno or 0} cannot leave the job's cgroup: {exc.strerror}")
            return 0
        say(f"P {child} {mech.name}")
        self._let_go({self.owner_pidfd, rep_w, ctl_r, self.wake_r, self.wake_w})
        poller = select.poll()
        poller.register(self.owner_pidfd, select.POLLIN)
        poller.register(ctl_r, select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        owner_gone = stop = False
        self.reap()
        while child not in self.status and not owner_gone and not stop:
            for fd, _ev in poller.poll():
                if fd == self.wake_r:
                    self.drain_wakeups()
                    self.reap()
                elif fd == self.owner_pidfd:
                    owner_gone = True
                elif fd == ctl_r:
                    if os.read(ctl_r, 64):
                        stop = True
                    else:  # the owner's end closed: it died
                        owner_gone = True
        if owner_gone:
            # Nobody to report to: end everything now, no grace.
            mech.kill_all(self, timeout=KILL_BOUND)
            mech.cleanup(self)
            return 0
        left = [p for p in mech.member_pids(os.getpid()) if _alive_pid(p)]
        leftovers = len([p for p in left if p != child])
        if left:
            from ..ending import end

            def members() -> list:
                return [i for i in map(identity.read, mech.member_pids(os.getpid()))
                        if i is not None]

            end(members, born_after=born, grace=grace, on_round=self.reap,
                cancel=lambda: not self.owner_alive(),
                kill=lambda: mech.kill_all(self, timeout=KILL_BOUND), kill_name=mech.name)
        self.reap()
        status = self.status.get(child)
        if status is None:
            try:
                _, status = os.waitpid(child, 0)  # dead: it was killed above
            except ChildProcessError:
                status = None
        say(f"X {-1 if status is None else status} {leftovers}")
        mech.cleanup(self)
        return 0

    def _let_go(self, keep: set) -> None:
        """Drop what the command inherited from the owner: fds, stdio, the cwd."""
        close_other_fds({fd for fd in keep if fd is not None})
        try:
            null = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
            for fd in (0, 1, 2):
                os.dup2(null, fd)  # a caller reading our stdout to EOF is not held by us
            os.close(null)
        except OSError:
            pass
        try:
            os.chdir("/")  # never pin a mount point
        except OSError:
            pass


def _readable(fd: int) -> bool:
    r, _, _ = select.select([fd], [], [], 0)
    return bool(r)


def _alive_pid(pid: int) -> bool:
    cur = identity.read(pid)
    return cur is not None and cur.state not in ("Z", "X", "x")


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


_OWN_IGNORED: tuple[int, tuple[int, ...]] = (0, ())


def own_ignored() -> tuple[int, ...]:
    """Signals this process ignores (read once per keeper: it never changes
    them after its set-up)."""
    global _OWN_IGNORED
    if _OWN_IGNORED[0] != os.getpid():
        try:
            sigs = tuple(s for s in identity.mask_signals(identity.self_status()[1])
                         if s in ALL_SIGNALS)
        except (OSError, ValueError):
            sigs = ALL_SIGNALS  # unknown: reset every one
        _OWN_IGNORED = (os.getpid(), sigs)
    return _OWN_IGNORED[1]


if sys.platform == "win32":  # pragma: no cover - the keeper is POSIX only
    raise ImportError("the POSIX keeper does not run on Windows")
