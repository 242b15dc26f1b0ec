"""The keeper: one small process per job that starts the job's processes.

Why a separate process: the owner may die at any moment (SIGKILL, OOM), and
something that outlives it must end the job. The keeper

* is forked, never exec'd: from the owner itself when the owner is
  single-threaded, otherwise from the owner's *warden*, a helper interpreter
  started once per owner (interpreter start-up costs 11-13 ms; a fork of a
  small single-threaded process costs well under 1 ms);
* lives in its own process group, ignores terminal hang-up and job-control
  signals, and keeps the caller's session so the command keeps the terminal;
* is the parent of every process it spawns (and, per mechanism, their
  subreaper, their PID namespace's init, or the writer of ``cgroup.kill``);
* watches the owner through a pidfd (kqueue, or polling the parent, where
  there is none) and ends the whole job the moment the owner is gone.

Requests arrive on a SOCK_SEQPACKET socket (see ``_proto``). The keeper is
single-threaded on purpose: it may fork, move itself between cgroups and
change its working directory around a spawn without racing anything.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import socket
import sys

from . import _proto
from ._linux_kill import (  # noqa: F401 - re-exported: they lived here first
    descendants,
    kill_descendants_loop,
    name_process,
    read_children,
)
from ._linux_kill import kill_pid as _kill_pid  # noqa: F401

# Signals a keeper must survive: the caller may kill the owner's process
# group or hang up the terminal; only the owner's death ends a job.
_IGNORED = ("SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGPIPE")
_ALL_SIGNALS = tuple(
    int(s) for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)
)

HAVE_PIDFD = hasattr(os, "pidfd_open") and sys.platform.startswith("linux")


def open_pidfd(pid: int) -> int | None:
    if not HAVE_PIDFD:
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def close_other_fds(keep: set[int]) -> None:
    """Close every fd but ``keep``: a leaked pipe end would keep a lifeline open."""
    try:
        names = os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else None
    except OSError:
        names = None
    if names is None:
        top = 1024
        try:
            top = min(os.sysconf("SC_OPEN_MAX"), 65536)
        except (OSError, ValueError):
            pass
        candidates = range(3, top)
    else:
        candidates = (int(n) for n in names)
    for fd in list(candidates):
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def detach_signals() -> None:
    for name in _IGNORED:
        sig = getattr(signal, name, None)
        if sig is not None:
            signal.signal(sig, signal.SIG_IGN)


def fork_keeper(mech, ctl_child: socket.socket, owner_pid: int, owner_pidfd: int | None,
                extra_keep: tuple[int, ...] = ()) -> int:
    """Fork a keeper from the current (single-threaded) process; return its pid.

    The child never returns: it runs the keeper loop and leaves with ``os._exit``.
    """
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
        name_process(b"tether-keeper")
        detach_signals()
        code = Keeper(mech, ctl_child, owner_pid, owner_pidfd).run()
    except BaseException:  # noqa: BLE001 - a keeper must never fall back into the owner's code
        try:
            import traceback

            traceback.print_exc()
        except BaseException:  # noqa: BLE001
            pass
    finally:
        os._exit(code)


class Keeper:
    def __init__(self, mech, ctl: socket.socket, owner_pid: int, owner_pidfd: int | None):
        self.mech = mech
        self.ctl = ctl
        self.owner_pid = owner_pid
        self.owner_pidfd = owner_pidfd
        self.children: set[int] = set()  # direct children we spawned, not yet reaped
        self.spawned: set[int] = set()  # every child ever spawned (pgroup needs their groups)
        self.status: dict[int, int] = {}  # their raw wait statuses, until collected
        self.closing = False

    # -- lifecycle ---------------------------------------------------------
    def run(self) -> int:
        os.chdir("/")  # never pin a mount point; spawns chdir to the owner's cwd
        self.mech.keeper_setup(self)
        rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        poller = select.poll()
        poller.register(self.ctl.fileno(), select.POLLIN)
        poller.register(rfd, select.POLLIN)
        owner_gone = self._owner_watch(poller)
        # The owner may have died before the watch was set up.
        if not self._owner_alive():
            return self._shutdown(reason="owner-gone")
        _proto.send(self.ctl, {"ready": True, "keeper": os.getpid(), "trace": self.mech.trace()})
        period = None if owner_gone is not None else 200
        while True:
            events = poller.poll(period)
            for fd, _ev in events:
                if fd == rfd:
                    try:
                        os.read(rfd, 4096)
                    except OSError:
                        pass
                    self.reap()
                elif fd == owner_gone:
                    return self._shutdown(reason="owner-gone")
                elif fd == self.ctl.fileno():
                    try:
                        msg, fds = _proto.recv(self.ctl)
                    except OSError:
                        msg, fds = None, []
                    if msg is None:
                        return self._shutdown(reason="owner-gone")
                    done = self.handle(msg, fds)
                    if done:
                        return 0
            if period is not None and not self._owner_alive():
                return self._shutdown(reason="owner-gone")

    def _owner_watch(self, poller) -> int | None:
        if self.owner_pidfd is not None:
            poller.register(self.owner_pidfd, select.POLLIN)
            return self.owner_pidfd
        return None

    def _owner_alive(self) -> bool:
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

    def _shutdown(self, reason: str) -> int:
        if reason == "owner-gone" and self.mech.exit_ends_job and not self.mech.options.background:
            os._exit(0)  # PID 1 of the job's namespace: the kernel kills the rest at once
        if self.mech.options.background and reason == "owner-gone":
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

    # -- children ----------------------------------------------------------
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
            if pid in self.children:
                self.children.discard(pid)
                self._report_exit(pid, status)

    def _report_exit(self, pid: int, status: int) -> None:
        # Pushed to the owner at once, so its wait() needs no round trip; kept
        # here instead if the owner is not reading (never block the keeper).
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

    # -- requests ----------------------------------------------------------
    def handle(self, msg: dict, fds: list[int]) -> bool:
        op = msg.get("op")
        try:
            if op == "spawn":
                self._spawn(msg, fds)
                return False
            if op == "wait":
                st = self.wait_one(msg["pid"])
                _proto.send(self.ctl, {"ok": True, "status": st})
            elif op == "poll":
                self.reap()
                _proto.send(self.ctl, {"ok": True, "status": self.status.pop(msg["pid"], None)})
            elif op == "kill_all":
                self.mech.kill_all(self, timeout=msg.get("timeout", 3.0))
                self.reap()
                _proto.send(self.ctl, {"ok": True})
            elif op == "close":
                self.mech.kill_all(self, timeout=msg.get("timeout", 3.0))
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
                _proto.send(self.ctl, {"ok": False, "error": f"unknown op {op!r}"})
        finally:
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
        return False

    def _spawn(self, msg: dict, fds: list[int]) -> None:
        try:
            pid = spawn(self.mech, msg, fds)
        except OSError as exc:
            _proto.send(self.ctl, {"ok": False, "errno": exc.errno or 0,
                                   "strerror": exc.strerror or str(exc),
                                   "filename": exc.filename, "kind": "os"})
            return
        except Exception as exc:  # noqa: BLE001 - reported to the owner, who raises it
            _proto.send(self.ctl, {"ok": False, "kind": type(exc).__name__, "strerror": str(exc)})
            return
        self.children.add(pid)
        self.spawned.add(pid)
        pidfd = open_pidfd(pid)
        reply: dict = {"ok": True, "pid": pid}
        if msg.get("ident"):
            # Read here, before this keeper can reap the child: by the time the
            # owner reads, a short command may be gone. The pidfd's fdinfo names
            # the pid as our /proc mount sees it (the outer pid under pidns).
            from .. import identity

            proc_pid = (identity.pidfd_pid(pidfd) if pidfd is not None else None) or pid
            ident = identity.read(proc_pid)
            if ident is not None:
                reply["ident"] = tuple(ident)
        _proto.send(self.ctl, reply, [pidfd] if pidfd is not None else [])
        if pidfd is not None:
            os.close(pidfd)


# -- spawning ----------------------------------------------------------------

def _resolve(executable: bytes, cwd: str, path: list[bytes]) -> bytes:
    """execvp semantics: a name with a slash is used as is, else searched in PATH."""
    if b"/" in executable:
        return executable
    denied = None
    for d in path:
        cand = os.path.join(d, executable)
        full = cand  # relative PATH entries: we are already in the child's cwd
        try:
            st = os.stat(full)
        except OSError:
            continue
        import stat as _stat

        if _stat.S_ISREG(st.st_mode):
            if os.access(full, os.X_OK):
                return cand
            denied = cand
    if denied is not None:
        return denied
    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), os.fsdecode(executable))


def spawn(mech, msg: dict, fds: list[int]) -> int:
    """Start one process for the owner; it is in the job before its first instruction.

    ``msg['fdmap']`` maps each child fd number to an index into ``fds``.
    ``msg['pgroup']``: -1 inherit the keeper's caller's group (``msg['owner_pgid']``),
    0 new group, >0 join that group; ``msg['setsid']`` for a new session.
    """
    argv = msg["argv"]
    executable = msg["executable"]
    env = msg["env"]
    cwd = msg["cwd"]
    # Lift the received fds above every target so dup2 never clobbers a source.
    targets = msg["fdmap"]
    base = max([3, *targets.keys()]) + 1
    lifted = [_dup_above(fd, base) for fd in fds]
    file_actions = []
    for target, idx in sorted(targets.items()):
        file_actions.append((os.POSIX_SPAWN_DUP2, lifted[idx], target))
    if msg.get("ctty") and 0 in targets:
        # posix_spawn runs setsid before the file actions, and on Linux a
        # session leader without a terminal acquires the first one it opens:
        # re-open the child's stdin terminal by path onto fd 0.
        file_actions.append((os.POSIX_SPAWN_OPEN, 0, os.ttyname(lifted[targets[0]]), os.O_RDWR, 0))
    kwargs: dict = {}
    pgroup = msg.get("pgroup", -1)
    if msg.get("setsid"):
        kwargs["setsid"] = True
    elif pgroup == -1:
        kwargs["setpgroup"] = msg["owner_pgid"]
    else:
        kwargs["setpgroup"] = pgroup
    kwargs.update(mech.spawn_attrs(msg))
    ignored = set(msg.get("ignored", ()))
    # Only what this keeper ignores needs resetting: a handled signal is reset
    # by posix_spawn and execve anyway (one sigaction fewer per signal).
    kwargs["setsigdef"] = [s for s in _own_ignored() if s not in ignored]
    kwargs["setsigmask"] = msg.get("sigmask", ())
    if file_actions:
        kwargs["file_actions"] = file_actions
    old_umask = None
    try:
        try:
            if cwd is None:
                os.fchdir(fds[msg["cwd_fd"]])
                cwd = "."
            else:
                os.chdir(cwd)
        except OSError as exc:
            raise type(exc)(exc.errno, exc.strerror, cwd) from None
        path = [os.fsencode(p) for p in msg["path"]]
        exe = _resolve(executable, cwd, path)
        if msg.get("umask", -1) >= 0:
            old_umask = os.umask(msg["umask"])
        with mech.spawn_context():
            try:
                pid = os.posix_spawn(exe, argv, env, **kwargs)
            except OSError as exc:
                if exc.filename is None:
                    exc.filename = os.fsdecode(executable)
                raise
        return pid
    finally:
        if old_umask is not None:
            os.umask(old_umask)
        try:
            os.chdir("/")
        except OSError:
            pass
        for fd in lifted:
            os.close(fd)


_OWN_IGNORED: tuple[int, tuple[int, ...]] = (0, ())


def _own_ignored() -> tuple[int, ...]:
    """Signals this process ignores (read once per keeper: it never changes them
    after its set-up)."""
    global _OWN_IGNORED
    if _OWN_IGNORED[0] != os.getpid():
        try:
            with open("/proc/self/status", "rb") as f:
                mask = next(int(line.split()[1], 16) for line in f if line.startswith(b"SigIgn:"))
            sigs = tuple(n for n in _ALL_SIGNALS if mask & (1 << (n - 1)))
        except (OSError, ValueError, StopIteration):
            sigs = _ALL_SIGNALS  # unknown: reset every one, as before
        _OWN_IGNORED = (os.getpid(), sigs)
    return _OWN_IGNORED[1]


def _dup_above(fd: int, base: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, base)


# -- ending processes ----------------------------------------------------------

def kill_descendants(keeper: Keeper, timeout: float, sig: int = signal.SIGKILL) -> bool:
    """Kill every descendant of this process, in rounds, until waitpid says ECHILD.

    Works because the keeper is a subreaper (or a PID namespace's init); the
    loop itself lives in ``_linux_kill`` (shared with the one-command path).
    Exit statuses of the keeper's own children are reported to the owner.
    """

    def on_reap(pid: int, status: int) -> None:
        if pid in keeper.children:
            keeper.children.discard(pid)
            keeper._report_exit(pid, status)

    return kill_descendants_loop(timeout, sig, on_reap)
