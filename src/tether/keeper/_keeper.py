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

``_keeper_socket.SocketKeeper.serve(ctl)``
    for ``tether.Job``: requests on a SOCK_STREAM socket (``_proto``):
    spawn with file descriptors, wait, poll, kill_all, close, step_aside.
``Keeper.run_one(...)`` (here)
    for the one-command path (``oneshot``, what ``tether-shell`` runs on
    every command): start the one command the keeper inherited (fds, cwd,
    environment), report on a pipe, end what it leaves behind.

Both run the same core (this class) and the same mechanism classes
(``base.KeeperMechanism``) and signal rules. The keeper is single-threaded
on purpose: it may fork, move itself between cgroups and change its working
directory around a spawn without racing anything. Import-light: ``os``,
``sys``, ``select``, ``_signal`` (``signal`` would pull in ``enum``); the
socket driver lives in its own module so the one-command path never loads it.
"""

import _signal
import os
import select
import sys

from .. import environ, gate, identity

TYPE_CHECKING = False
if TYPE_CHECKING:  # a hint only
    import socket

# (from _constants, which imports nothing, not from tether.ending: the
# one-command keeper starts its command before it loads anything it may not
# need, the engine included)
from .._constants import KILL_BOUND  # noqa: E402

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
        # What this keeper ignores, where its driver knows without a look at
        # /proc (the one-command path: the owner's mask and KEEPER_IGNORES).
        self.ignoring: tuple[int, ...] | None = None

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
        ignoring = self.ignoring if self.ignoring is not None else own_ignored()
        kwargs["setsigdef"] = [s for s in ignoring if s not in keep_ignored]
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

    # -- driver 2: the pipe, for tether-shell's scope caller -----------------------------
    def run_one(self, executable: str, argv: list[str], *, pgid: int, ignored: set[int],
                grace: float, rep_w: int, ctl_r: int, env=None,
                caller_fd: int | None = None) -> int:
        """Start the one command of tether-shell's scope ``caller`` (it
        inherits this keeper's fds, cwd and environment, which are the
        owner's; ``env``: that environment with the job's cookie first),
        report ``P <pid> <mechanism> <start ticks> <cgroup or ->`` on
        ``rep_w``, wait for it and report ``X <status> <leftovers>``. What the
        command leaves is not ended when it returns but lives until the caller
        ends: the job is the caller's cgroup (shared by its commands: only
        this command's processes, by its cookie, are ended when the command is
        stopped or its owner dies), or this subreaper, which then stays,
        watching the caller, until its last descendant is gone (``X ...
        linger``). A byte on ``ctl_r`` (the owner got SIGTERM/SIGHUP) ends
        the command's processes now (SIGTERM, ``grace``, the kill); EOF on it,
        or the owner's pidfd, means the owner is gone: end them, no grace,
        report nothing. ``caller_fd`` (a pidfd of the owner's caller) readable:
        the caller is gone - end everything at once, report ``X <status>
        <leftovers> caller``.

        Scope ``command`` is not served here: that is the native keeper's
        one-command driver (``_native/oneshot.c``), which ends what the
        command leaves the moment it returns.
        """
        mech = self.mech
        env = os.environ if env is None else env

        def say(line: str) -> None:
            try:
                os.write(rep_w, line.encode() + b"\n")
            except OSError:  # the owner is gone; the owner-gone path ends the job
                pass

        def done() -> None:
            mech.step_aside()  # the caller's cgroup stays: its scope keeper removes it

        if _readable(ctl_r) or (caller_fd is not None and _readable(caller_fd)):
            done()  # stopped (or the owner or its caller died) while we set up
            say("X -1 0")
            return 0
        born = identity.now_ticks()  # nothing of the command is older
        try:
            child = self.spawn(executable, argv, env, setpgroup=pgid, keep_ignored=ignored)
        except Unplaced as exc:
            done()
            say(f"E job 0 {exc}")
            return 0
        except OSError as exc:
            done()
            say(f"E exec {exc.errno or 0}")
            return 0
        child_start = identity.start_ticks(child) or 0
        try:
            # Out of the job's cgroup at once, while the command runs: the
            # move's cost overlaps the command instead of following it.
            mech.step_aside()
        except OSError as exc:
            # Spawned, but we cannot step out: cgroup.kill would end us too.
            mech.kill_all(self, timeout=1.0)
            done()
            say(f"E job {exc.errno or 0} cannot leave the job's cgroup: {exc.strerror}")
            return 0
        say(f"P {child} {mech.name} {child_start} {mech.trace().get('cgroup_path') or '-'}")
        self._let_go({self.owner_pidfd, rep_w, ctl_r, self.wake_r, self.wake_w, caller_fd})
        owner_gone, stop, caller_gone = self._wait_one(child, ctl_r, caller_fd)
        if caller_gone:
            # The caller (an agent CLI) is gone: its commands go with it, at
            # once - in scope caller everything it kept, too.
            mech.kill_all(self, timeout=KILL_BOUND)
            self.reap()
            status = self.status.get(child)
            say(f"X {-1 if status is None else status} 0 caller")
            mech.cleanup(self)
            return 0
        members, kill = self._scope_of(child)
        if owner_gone:
            # Nobody to report to: end everything now, no grace.
            if kill is not None:
                kill()
            else:
                self._end(members, born, 0, None)
            done()
            return 0
        left = [i.pid for i in members() if i.state not in ("Z", "X", "x")]
        leftovers = len([p for p in left if p != child])
        if left and stop:
            self._end(members, born, grace, kill)
        self.reap()
        status = self.status.get(child)
        if status is None:
            try:
                before = identity.now_ticks()
                _, status = os.waitpid(child, 0)  # dead: it was killed above
                self.forget_spawned(child, before)
            except ChildProcessError:
                status = None
        linger = not stop and leftovers and not mech.keeper_inside and caller_fd is not None
        # "linger": the owner must not wait for this keeper, which stays.
        say(f"X {-1 if status is None else status} {leftovers}" + (" linger" if linger else ""))
        if linger and caller_fd is not None:
            self._linger(caller_fd, {rep_w, ctl_r, self.owner_pidfd})
        done()
        return 0

    def _wait_one(self, child: int, ctl_r: int, caller_fd: "int | None") -> "tuple[bool, bool, bool]":
        """Reap until ``child`` is gone, or the owner is (``owner_gone``), or
        asked to stop (a byte on ``ctl_r``: ``stop``), or the caller is gone
        (``caller_gone``)."""
        poller = select.poll()
        for fd in (self.owner_pidfd, ctl_r, self.wake_r, caller_fd):
            if fd is not None:
                poller.register(fd, select.POLLIN)
        owner_gone = stop = caller_gone = False
        self.reap()
        while child not in self.status and not owner_gone and not stop and not caller_gone:
            for fd, _ev in poller.poll():
                if fd == self.wake_r:
                    self.drain_wakeups()
                    self.reap()
                elif fd == caller_fd:
                    caller_gone = True
                elif fd == self.owner_pidfd:
                    owner_gone = True
                elif fd == ctl_r:
                    if os.read(ctl_r, 64):
                        stop = True
                    else:  # the owner's end closed: it died
                        owner_gone = True
        return owner_gone, stop, caller_gone

    def _scope_of(self, child: int):
        """This command's processes (``members``) and how to kill them all at
        once (``kill``; None: only one by one). In the caller's shared cgroup
        they are those that carry its cookie (and the shell itself); a
        subreaper's are its whole tree."""
        mech = self.mech
        cookie = f"{mech.options.cookie_var}={mech.options.cookie}".encode()
        if mech.keeper_inside:
            def members() -> list:
                return [i for i in map(identity.read, mech.member_pids(os.getpid()))
                        if i is not None and (i.pid == child or environ.environ_has(i.pid, cookie))]

            return members, None

        def whole() -> list:
            return [i for i in map(identity.read, mech.member_pids(os.getpid())) if i is not None]

        def kill() -> None:
            mech.kill_all(self, timeout=KILL_BOUND)

        return whole, kill

    def _end(self, members, born: int, grace: float, kill) -> None:
        from ..ending import end

        # Proven by the job's cookie or cgroup, or as this keeper's tree (it
        # is the members' parent or subreaper); pgroup's look proves more
        # (its groups and sessions): its proof, when it made one.
        o = self.mech.options
        mine = gate.Proof(f"{o.cookie_var}={o.cookie}".encode() if o.cookie else None,
                          (self.mech.trace() or {}).get("cgroup_path"))
        find = mine.tracking(members, roots=[os.getpid()])

        def proof(_i):
            return getattr(self.mech, "proof", None) or mine

        end(find, born_after=born, grace=grace, on_round=self.reap,
            cancel=lambda: not self.owner_alive(), kill=kill, kill_name=self.mech.name,
            proof=proof)

    def _linger(self, caller_fd: int, drop: set) -> None:
        """Scope caller, subreaper: the command returned and left processes,
        which are ours (this keeper is their subreaper) until the caller
        ends. Stay, watching only the caller now, until the last of them is
        gone (reaped) or the caller dies (then end them all)."""
        for fd in drop:
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.owner_pidfd = None  # the owner exits now: no longer a reason to end anything
        poller = select.poll()
        poller.register(caller_fd, select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        while self.reap():  # every orphan below us is our child: none left, none below
            for fd, _ev in poller.poll():
                if fd == caller_fd:
                    self.mech.kill_all(self, timeout=KILL_BOUND)
                    return
                self.drain_wakeups()

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


SCOPE_COMM = b"tether-scope"


def ensure_scope_keeper(path: str, caller_fd: int) -> None:
    """Make sure one process watches the caller of the shared cgroup
    ``path`` (tether-shell's scope ``caller``) and ends it, with everything
    in it, when the caller dies.

    The watcher holds an exclusive ``flock`` on the cgroup's directory for
    its whole life, so "is anyone watching" is one non-blocking lock try,
    answered by the kernel: the lock goes with its holder, however it dies
    (and the next command of the same caller starts a new watcher). The
    watcher is forked from here, before the keeper joins the cgroup, so it
    lives outside it; it is named ``tether-scope``, leads a session of its
    own, holds only the caller's pidfd and the lock, and ignores what a
    keeper ignores (only the caller's death ends it)."""
    import fcntl

    try:
        lock = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held: the caller is watched already
        os.close(lock)
        return
    try:
        pid = os.fork()
    except OSError:
        os.close(lock)  # no watcher: the commands' own keepers still watch while they run
        return
    if pid:
        os.close(lock)  # the watcher's copy holds it now
        return
    try:
        _scope_keeper(path, caller_fd, lock)
    finally:
        os._exit(0)


def _scope_keeper(path: str, caller_fd: int, lock: int) -> None:
    from .. import cgroupfs
    from .._prctl import name_process

    try:
        os.setsid()
    except OSError:
        pass
    name_process(SCOPE_COMM)
    _signal.set_wakeup_fd(-1)
    close_other_fds({caller_fd, lock})
    try:
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
    except OSError:
        pass
    try:
        os.chdir("/")
    except OSError:
        pass
    poller = select.poll()
    poller.register(caller_fd, select.POLLIN)
    while not poller.poll():
        pass
    cgroupfs.kill(path, KILL_BOUND)
    cgroupfs.remove_tree(path)
    try:
        os.rmdir(os.path.dirname(path))  # the caller's run directory, when nothing else is in it
    except OSError:
        pass


def _readable(fd: int) -> bool:
    r, _, _ = select.select([fd], [], [], 0)
    return bool(r)


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
