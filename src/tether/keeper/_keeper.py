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

This is the keeper of the ``pgroup`` mechanism, the one of macOS and the
BSDs, where no native keeper exists; on Linux every other mechanism's keeper
is the native program (``_native/keeper.c``, both drivers). Its driver is
``_keeper_socket.SocketKeeper.serve(ctl)``: requests on a SOCK_STREAM socket
(``_proto``, the protocol the native keeper speaks too): spawn with file
descriptors, wait, poll, kill_all, close, step_aside. It runs this core and
the mechanism class (``base.KeeperMechanism``) and signal rules. The keeper
is single-threaded on purpose: it may fork and change its working directory
around a spawn without racing anything. Import-light: ``os``, ``sys``,
``select``, ``_signal`` (``signal`` would pull in ``enum``).
"""

import _signal
import os
import select
import sys

from .. import identity

TYPE_CHECKING = False
if TYPE_CHECKING:  # a hint only
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


def child_ignores(owner_ignores, restore_signals: bool) -> list[int]:
    """What a child gets as SIG_IGN: what its owner ignores, less RESTORED
    when the spawn restores them (``subprocess``'s ``restore_signals``).
    keeper.c's read_owner_state keeps the same rule."""
    return [s for s in owner_ignores if not (restore_signals and s in RESTORED)]
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


def _noop(*_args: object) -> None:
    pass


class Unplaced(Exception):
    """The job could not hold a child (its kernel object refused it): nothing ran."""


class Keeper:
    """The keeper's state: its mechanism, its children, the owner it watches."""

    # serving a request from a forked child's channel (SocketKeeper), not the owner's
    serving_chan = False
    # the last spawn's environment, for env_same (SocketKeeper; unset until then)
    saved_env: "dict[bytes, bytes]"

    def __init__(self, mech, owner_pid: int, owner_pidfd: int | None) -> None:
        self.mech = mech
        self.owner_pid = owner_pid
        self.owner_pidfd = owner_pidfd
        self.ctl: socket.socket | None = None  # the socket driver's control socket (a pidns keeper reports on it)
        self.children: set[int] = set()  # direct children we spawned, not yet reaped
        # pid -> start ticks of each child spawned, if mech.keeps_spawned (pgroup:
        # the group it leads); forgotten once reaped with its group empty, or
        # when the mechanism can no longer prove the group is the job's
        self.spawned: dict[int, int] = {}
        # a spawned child reaped while its group lived on: the tick it was reaped
        self.spawn_reaped: dict[int, int] = {}
        self.status: dict[int, int] = {}  # raw wait statuses, until collected
        self.wake_r = self.wake_w = -1

    def setup(self) -> None:
        """The mechanism's set-up, then the wake-up."""
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
        self.forget_spawned(pid)

    def forget_spawned(self, pid: int, before: int | None = None) -> None:
        """A spawned child was reaped (by any path): forget its group if it
        is empty - its pid, free now, may lead a stranger's group next - else
        note when it was reaped (see posix_pgroup). ``before``: the clock
        tick read before the ``waitpid`` that reaped it. The tick read now
        would be too late: once the reap freed the pid, a stranger may lead a
        group of that number (the group probe below then sees it) and have
        children, all born before *now*, which would read as the job's."""
        if pid in self.spawned:
            if identity.group_has_members(pid):
                self.spawn_reaped[pid] = before if before is not None else self._reap_tick
            else:
                del self.spawned[pid]

    def on_exit(self, pid: int, status: int) -> None:
        self.status[pid] = status

    #: The clock tick read before the latest reap (forget_spawned's ``before``).
    _reap_tick = 0

    def reap(self) -> bool:
        """Reap every exited child; False once there are no children left."""
        self._reap_tick = identity.now_ticks()
        return identity.reap_exited(self.reaped)

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
        if self.mech.keeps_spawned:
            # read before we reap it: until then the pid is surely this child's
            self.spawned[pid] = identity.start_ticks(pid) or 0
        return pid

    def end_for_dead_owner(self) -> int:
        if self.mech.options.background:
            # Background jobs outlive the owner on purpose: keep reaping until empty.
            identity.reap_exited(wait=True)
            self.mech.cleanup(self)
            return 0
        self.mech.end_for_dead_owner(self)
        return 0


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
