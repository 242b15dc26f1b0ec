"""One command in its own job, with the least start-up: the path ``tether-shell-py`` takes.

The generic path (``tether.job.Job``) pays for generality on every command:
``subprocess``, ``threading``, ``socket``, and a keeper spoken to over a
socket. A wrapper that runs exactly one command needs none of it. The native
``tether-shell`` serves most commands itself (``_native/shell.c``); this is
the Python one's path for what it hands over (a log only the audit writer may
judge, a systemd unit not yet asked about) and where no native front end is
installed. It runs the
very keeper the native one forks: the native program's one-command driver
(``tether-keeper one``, ``_native/oneshot.c``), exec'd.
Before the fork it loads only ``os``, ``sys``, ``select``, ``_signal`` and
tether's process reader and cgroup files (``identity``, ``cgroupfs``).

How (Linux only; the caller must be single-threaded, as the wrapper is):

* The caller (the *owner*) forks the job's **keeper** directly. The keeper
  inherits the owner's file descriptors, working directory and environment:
  nothing is sent to it, so big environments and deleted working directories
  just work, and every inheritable fd reaches the command as under ``sh``.
* The fork decides where a cgroup job may go (``cgroupfs.base_dir``, with
  systemd's delegation rules) and execs ``tether-keeper one``, which goes
  into its own process group and ignores hang-up, interrupt, terminate and
  job-control signals (a caller killing the owner's group must not take it
  along). It opens the job - the cgroup ``<own cgroup>/tether-<owner
  pid>-<owner start ticks>/j<owner pid>-1``, or, for ``auto`` where no
  cgroup v2 is writable, a subreaper job - and starts the command in the
  owner's process group (the command keeps the terminal, and the caller's
  ``killpg`` reaches it), with the owner's ignored signals and blocked mask.
* It reports ``P <pid> <mechanism> <start> <cgroup>`` and, at the end,
  ``X <status> <leftovers>`` on a pipe; the owner waits on that pipe and on
  its own signals.
* The keeper watches the owner through a pidfd: the owner SIGKILLed (alone or
  with its process group) makes the keeper end the whole job at once. A
  ``s`` byte from the owner (it got SIGTERM/SIGHUP) makes the keeper end the
  job: SIGTERM to every member, ``grace`` seconds, then the mechanism's kill.
* When the command exits, whatever is left in the job is ended the same way
  before the keeper reports - so the owner exits only once nothing of the
  command is left.
* Scope ``caller`` (what a command leaves runs on until its caller ends) is
  the same driver's ``scope=caller``: one cgroup per caller, with each of its
  commands' below it, watched by a ``tether-scope`` process; or a subreaper
  keeper that stays until what the command left is gone.

Guarantee, as for the generic ``cgroup``/``subreaper`` mechanisms: guardian-
enforced and transparent; if the keeper itself is SIGKILLed first, a cgroup
job's members survive but stay listed in the stale cgroup (``tether reap``
ends them), a subreaper job's members survive.
"""

import _signal
import os
import select
import sys

# (cgroupfs: loaded here, before the fork, so the keeper's side does not
# fault the owner's pages in copying them for its import)
from .. import cgroupfs, gate, identity
from .._sigwatch import SignalWatch
from ..errors import JobRefused, Unavailable

__all__ = ["Result", "Unavailable", "available", "run", "watch_caller", "MECHANISMS", "SCOPES"]

MECHANISMS = ("auto", "cgroup", "subreaper")
COMMAND, CALLER = "command", "caller"
SCOPES = (COMMAND, CALLER)
COOKIE_VAR = identity.COOKIE_VAR
STOP_SIGNALS = (_signal.SIGTERM, _signal.SIGHUP)  # end the job now
DEFER_SIGNALS = (_signal.SIGINT, _signal.SIGQUIT)  # the command gets them from the terminal
# Python ignores these at start-up; the command gets them at their default,
# as subprocess gives them back (the driver resets them too: the
# interpreter in front makes whether our caller ignored them unknowable).
_RESTORED = tuple(getattr(_signal, n) for n in ("SIGPIPE", "SIGXFSZ", "SIGXFZ") if hasattr(_signal, n))


class Result:
    """What happened to the one command.

    ``status``: its raw wait status (``os.waitstatus_to_exitcode`` turns it
    into a return code), or None (never started, or the keeper was lost).
    ``child``: its pid; ``child_start``: its start ticks. ``mechanism``:
    ``cgroup`` or ``subreaper``. ``leftovers``: processes still in the job
    when the command returned (ended, or in scope ``caller`` left running).
    ``stopped_by``: the stop signal the owner received, if any. ``error``:
    ``keeper-died`` when the keeper vanished without a report (the job was
    then ended from here), ``no-status`` when it could not tell the status.
    ``ended_by``: ``caller`` when the caller's death ended the job.

    The job's identity, for the audit: ``run`` and ``job`` (ids),
    ``owner_start`` (this process's start ticks), ``keeper`` and
    ``keeper_start``, ``cgroup`` (the job's cgroup, or None), ``cookie``
    (what every process of the job carries in its environment, first, as
    ``cookie_var=cookie``), ``scope`` and ``caller`` (``(pid, start)`` of
    the watched caller, or None).
    """

    __slots__ = ("status", "child", "mechanism", "leftovers", "stopped_by", "error", "ended_by",
                 "run", "job", "owner_start", "keeper", "keeper_start", "child_start", "cgroup",
                 "cookie", "cookie_var", "scope", "caller")

    def __init__(self) -> None:
        self.status: int | None = None
        self.child: int | None = None
        self.mechanism: str | None = None
        self.leftovers = 0
        self.stopped_by: int | None = None
        self.error: str | None = None
        self.ended_by: str | None = None
        self.run = self.job = self.cookie = ""
        self.cookie_var = COOKIE_VAR
        self.owner_start = self.keeper = self.keeper_start = self.child_start = 0
        self.cgroup: str | None = None
        self.scope = COMMAND
        self.caller: tuple[int, int] | None = None

    def __repr__(self) -> str:
        return "Result(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__) + ")"


def available() -> bool:
    """True where this path can run (Linux with pidfds); ``run`` may still raise
    ``Unavailable`` (e.g. in a multi-threaded caller)."""
    return sys.platform.startswith("linux") and hasattr(os, "pidfd_open")


# -- the caller --------------------------------------------------------------------

def watch_caller() -> "tuple[int, int, int] | None":
    """``(pid, start ticks, pidfd)`` of this process's caller (its parent),
    to be watched from the start; None when it is not watched:

    * PID 1 (or 0, a parent outside our PID namespace): init never exits
      while we run - and when a namespace's init dies the kernel ends every
      process in it, ours included - so watching it protects nothing;
    * an orphan adopted at start: our caller exited before we could look,
      and the process we now see as our parent (PID 1 or a sub-reaper such
      as ``systemd --user`` or ``tether run``) is not the one that started
      us: tying the job to it would end the job at a moment that has nothing
      to do with the caller. We can tell when we are not a session leader:
      our session was inherited from whoever forked us, so a parent in
      another session did not (a session leader, as agent CLIs make every
      tool call, cannot be told apart from a child: its parent is watched).
    """
    ppid = os.getppid()
    if ppid <= 1:
        return None
    try:
        fd = os.pidfd_open(ppid)
        sid = os.getsid(0)
        if sid != os.getpid() and os.getsid(ppid) != sid:
            os.close(fd)
            return None
    except OSError:  # gone already (ESRCH): we are an orphan now
        return None
    start = identity.start_ticks(ppid)
    if start is None or os.getppid() != ppid:
        os.close(fd)  # died while we looked: the pidfd may name a reuser of its pid
        return None
    return ppid, start, fd


# -- the owner's side --------------------------------------------------------------

def _start_ticks(pid: "int | str" = "self") -> int:
    return identity.start_ticks(pid) or 0


def run(argv: list[str], *, executable: str, mechanism: str = "auto", grace: float = 0.5,
        on_start=None, stop_signals=STOP_SIGNALS, defer_signals=DEFER_SIGNALS,
        caller: "tuple[int, int, int] | None" = None, scope: str = COMMAND) -> "Result":
    """Run ``argv`` (``executable``, an absolute path) in a job of its own; wait.

    ``mechanism``: ``auto`` (cgroup v2 where writable, else a subreaper),
    ``cgroup`` or ``subreaper``. ``on_start(result)`` is called once the
    command runs (the job's identity filled in). A stop signal (SIGTERM,
    SIGHUP) received meanwhile ends the job (SIGTERM, ``grace``, SIGKILL) and
    is returned as ``stopped_by``; SIGINT/SIGQUIT are recorded and otherwise
    left to the command (it shares our process group), as a shell waiting for
    a foreground command does. Signal handlers are restored before returning.

    ``caller``: :func:`watch_caller`'s answer (its pidfd is closed here): the
    caller's death ends the job at once, as this process's own would.
    ``scope``: ``command`` (what the command leaves is ended when it
    returns) or ``caller`` (what it leaves runs on - in the command's cgroup
    below the caller's, ``tether-<caller pid>-<caller start>/shell-scope``,
    or, with the subreaper, under this command's keeper, which stays - and
    is ended when the caller ends; a command stopped or whose owner dies is
    still ended whole). ``caller`` scope needs a watched caller (else: ``command``).

    If the keeper dies while the command runs, one line says so on stderr
    (``tether: keeper died; the job is no longer guarded``), the job is
    ended from here (its cgroup's ``cgroup.kill``, or the processes that
    carry its cookie) and ``error`` is ``keeper-died``.

    Raises ``Unavailable`` (nothing started: use the generic ``Job``),
    ``JobRefused`` (the job could not be created: nothing ran) or the
    ``OSError`` of a failed exec (``filename`` = ``executable``).
    """
    if mechanism not in MECHANISMS:
        raise Unavailable(f"mechanism {mechanism!r} is not served by the one-command path")
    if not available():
        raise Unavailable("needs Linux with pidfd_open")
    try:  # first: no signal is lost while we set up
        sigs = SignalWatch(stop_signals, defer_signals, need_wakeup=True)
    except ValueError as e:
        raise Unavailable(str(e)) from None
    try:
        return _run(argv, executable, mechanism, float(grace), on_start, sigs, caller,
                    scope if caller is not None else COMMAND)
    finally:
        sigs.restore()
        if caller is not None:
            try:
                os.close(caller[2])
            except OSError:
                pass


class _Owner:
    """This process as its job's owner, read once before the fork."""

    __slots__ = ("pid", "start", "pgid", "fd", "ignores", "ignored", "blocked")

    def __init__(self) -> None:
        try:
            threads, ign, self.blocked = identity.self_status()
        except (OSError, ValueError):
            raise Unavailable("/proc/self/status is not readable") from None
        if threads != 1:
            raise Unavailable("the caller has several threads: a fork would not be safe")
        try:
            self.fd = os.pidfd_open(os.getpid())
        except OSError as exc:  # a kernel older than 5.3
            raise Unavailable(f"pidfd_open: {exc.strerror}") from None
        self.pid, self.start, self.pgid = os.getpid(), _start_ticks(), os.getpgrp()
        self.ignores = {s for s in range(1, 65) if ign & (1 << (s - 1))}
        self.ignored = self.ignores - set(_RESTORED)  # what the command is to ignore


class _Launch:
    """What the forked keeper is given: the command, the job's settings and
    names (``res``), the owner, the caller's watch, and its ends of the pipes
    (``inherited``: the owner's ends, which it closes)."""

    __slots__ = ("argv", "executable", "mechanism", "grace", "owner", "res", "caller",
                 "rep_w", "ctl_r", "inherited")

    def __init__(self, argv: "list[str]", executable: str, mechanism: str, grace: float,
                 owner: _Owner, res: "Result", caller: "tuple[int, int, int] | None",
                 rep_w: int, ctl_r: int, inherited: "tuple[int, ...]") -> None:
        self.argv, self.executable, self.mechanism, self.grace = argv, executable, mechanism, grace
        self.owner, self.res, self.caller = owner, res, caller
        self.rep_w, self.ctl_r, self.inherited = rep_w, ctl_r, inherited

    def say(self, line: str) -> None:
        try:
            os.write(self.rep_w, line.encode() + b"\n")
        except OSError:  # the owner is gone
            pass


def _named(owner: _Owner, scope: str, caller) -> "Result":
    """A Result with the job's names and cookie."""
    res = Result()
    res.owner_start = owner.start
    res.scope = scope
    if caller is not None:
        res.caller = (caller[0], caller[1])
    if scope == CALLER:
        # One run per caller: it is over when the caller is.
        res.run, res.job = f"{caller[0]}-{caller[1]}", f"s{owner.pid}-{owner.start}"
    else:
        res.run, res.job = f"{owner.pid}-{owner.start}", f"j{owner.pid}-1"
    # The job's cookie: random, so a stranger given a leftover's pid within the
    # same clock tick cannot carry it (os.urandom: `secrets` costs an import).
    res.cookie = f"{res.run}:{res.job}:{os.urandom(8).hex()}"
    return res


def _run(argv, executable, mechanism, grace, on_start, sigs: "SignalWatch", caller,
         scope) -> "Result":
    from . import native

    native.required("cgroup" if mechanism == "cgroup" else "subreaper")  # or JobRefused
    owner = _Owner()
    res = _named(owner, scope, caller)
    rep_r, rep_w = os.pipe2(os.O_CLOEXEC)
    ctl_r, ctl_w = os.pipe2(os.O_CLOEXEC)
    early = sigs.first()
    if early is not None:
        # Stopped (SIGTERM, SIGHUP) before the command existed: run nothing.
        # SIGINT and SIGQUIT are the command's, even before it exists, as
        # for the native program: not a stop.
        for fd in (owner.fd, rep_r, rep_w, ctl_r, ctl_w):
            os.close(fd)
        res.stopped_by = early
        return res
    born = identity.now_ticks()  # nothing of the job is older
    # What the command leaves behind is never re-parented to PID 1 before the
    # job ends it: the keeper is its subreaper (cgroup, subreaper), and this
    # wrapper is where the keeper has died, as under the native wrapper and
    # `tether run`. Every wait here names its pid.
    from .._prctl import set_subreaper

    try:
        set_subreaper()
    except OSError:
        pass  # (the job still ends them; only their parent for those ms differs)
    launch = _Launch(argv=argv, executable=executable, mechanism=mechanism, grace=grace,
                     owner=owner, res=res, caller=caller, rep_w=rep_w, ctl_r=ctl_r,
                     inherited=(sigs.rfd, sigs.wfd, rep_r, ctl_w))
    keeper = _fork_keeper(launch)
    for fd in (owner.fd, rep_w, ctl_r):
        os.close(fd)
    res.keeper = keeper
    got = _Reports()
    try:
        got.read(res, keeper, rep_r, ctl_w, sigs, on_start)
    finally:
        os.close(rep_r)
        os.close(ctl_w)
        _after(res, keeper, born, got)
    if got.failure is not None:
        kind, err, text = got.failure
        if kind == b"exec":
            raise OSError(err, os.strerror(err), executable)
        raise JobRefused(text or os.strerror(err), mechanism=mechanism)
    return res


def _fork_keeper(launch: _Launch) -> int:
    """Fork the job's keeper, which execs the native driver. Its pid;
    JobRefused if it cannot fork."""
    try:
        keeper = os.fork()
    except OSError as exc:
        for fd in (launch.owner.fd, launch.rep_w, launch.ctl_r, *launch.inherited[2:]):
            os.close(fd)
        raise JobRefused(f"cannot start the job's keeper: {exc.strerror}",
                         reason=exc.strerror, mechanism=launch.mechanism) from None
    if keeper:
        return keeper
    code = 1
    try:
        _exec_native(launch)  # returns only when it could not exec
        code = 0
    except BaseException:  # noqa: BLE001 - a keeper bug: said on stderr, then gone
        try:
            import traceback

            traceback.print_exc()
        except BaseException:  # noqa: BLE001 - printing may fail too; exit anyway
            pass
    finally:
        os._exit(code)  # a keeper never falls back into the owner's code


class _Reports:
    """The keeper's report lines, as read: ``P`` (the command runs), then
    ``X`` (its status) or ``E`` (nothing ran: ``failure``)."""

    __slots__ = ("failure", "reported", "lingers")

    def __init__(self) -> None:
        self.failure: tuple[bytes, int, str] | None = None
        self.reported = self.lingers = False

    def read(self, res: "Result", keeper: int, rep_r: int, ctl_w: int, sigs: "SignalWatch",
             on_start) -> None:
        """Until the last report, or the keeper's EOF (``res.error``
        keeper-died); a stop signal meanwhile is passed on (``s``)."""
        poller = select.poll()
        poller.register(rep_r, select.POLLIN)
        poller.register(sigs.rfd, select.POLLIN)
        buf = b""
        while True:
            if res.stopped_by is None:
                stop = sigs.first()
                if stop is not None:
                    res.stopped_by = stop
                    try:
                        os.write(ctl_w, b"s")
                    except OSError:  # the keeper is gone: EOF follows
                        pass
            ready = [fd for fd, _ in poller.poll()]
            if sigs.rfd in ready:
                try:
                    os.read(sigs.rfd, 512)
                except OSError:
                    pass
            if rep_r not in ready:
                continue
            data = os.read(rep_r, 4096)
            if not data:
                # EOF without a report: the keeper died (its end of the pipe
                # was its alone), at once noticed. The job is unguarded now.
                res.error = "keeper-died"
                return
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if self._line(res, keeper, line, on_start):
                    return

    def _line(self, res: "Result", keeper: int, line: bytes, on_start) -> bool:
        """One report; whether it was the last."""
        word = line.split(b" ", 4)
        if word[0] == b"P":
            res.child = int(word[1])
            res.mechanism = word[2].decode()
            res.child_start = int(word[3])
            path = word[4].decode("utf-8", "surrogateescape")
            res.cgroup = None if path == "-" else path
            res.keeper_start = _start_ticks(keeper)  # our child: readable until reaped
            if on_start is not None:
                on_start(res)
            return False
        if word[0] == b"X":
            st = int(word[1])
            res.status = st if st >= 0 else None
            if st < 0:
                res.error = "no-status"
            res.leftovers = int(word[2])
            if len(word) > 3 and word[3] == b"caller":
                res.ended_by = CALLER
            self.lingers = len(word) > 3 and word[3] == b"linger"
            self.reported = True
            return True
        if word[0] == b"E":
            self.failure = (word[1], int(word[2]),
                            b" ".join(word[3:]).decode("utf-8", "replace"))
            return True
        return False


def _after(res: "Result", keeper: int, born: int, got: _Reports) -> None:
    """The keeper died with the command running: say so and end the job from
    here. Then wait for the keeper, unless it stays (scope caller, subreaper:
    it keeps what the command left until the caller ends; once we exit it is
    re-parented and reaped by its new parent)."""
    if res.error == "keeper-died" and res.child is not None and not got.reported:
        from ..runner import KEEPER_DIED  # the same words as `tether run`'s

        try:
            os.write(2, (KEEPER_DIED + "\n").encode())
        except OSError:
            pass
        _end_from_here(res, born)
    while not got.lingers:
        try:
            os.waitpid(keeper, 0)
            break
        except ChildProcessError:
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries
            continue


def _end_from_here(res: "Result", born: int) -> None:
    """The keeper is gone while the command runs: end the job from the owner -
    the job's cgroup (``cgroup.kill``; in scope ``caller`` too, the command's
    own below the caller's), and every process that carries the job's cookie
    (what a subreaper job's members were re-parented away with)."""
    from .. import environ
    from ..ending import KILL_BOUND, end

    if res.cgroup:
        cgroupfs.kill(res.cgroup, KILL_BOUND)
    entry = f"{res.cookie_var}={res.cookie}".encode()
    proof = gate.Proof(entry)  # found by the cookie: each must still carry it
    end(lambda: environ.carriers(entry, born_after=born), born_after=born, grace=0,
        member=False, bound=KILL_BOUND, proof=lambda _i: proof)


# -- the keeper's side ---------------------------------------------------------------

def _exec_native(launch: _Launch) -> None:
    """In the forked keeper: become the native keeper's one-command driver
    (``tether-keeper one``, ``_native/oneshot.c``), the one that the native
    tether-shell forks. Decided here, as the native front end decides it:
    where the job's cgroup may go (``cgroupfs.base_dir``, systemd's
    delegation rules included); none, for ``auto``, is a subreaper job.
    Returns only when it cannot exec (the error is reported)."""
    from . import native

    o, res, caller, mechanism = launch.owner, launch.res, launch.caller, launch.mechanism
    _signal.set_wakeup_fd(-1)
    for fd in launch.inherited:  # the owner's ends
        os.close(fd)
    place: list[str] = []
    if mechanism in ("auto", "cgroup"):
        loc = cgroupfs.where()
        base, why = cgroupfs.base_dir(loc)
        if base is not None and loc is not None:
            place = [f"base={base}", f"mount={loc[0]}"]
        elif mechanism == "cgroup":
            launch.say(f"E job 0 cannot create the job (cgroup): {why}")
            return
    watch: list[str] = []
    if caller is not None:
        watch = [f"caller={caller[2]}:{caller[0]}:{caller[1]}", f"scope={res.scope}"]
        os.set_inheritable(caller[2], True)
    for fd in (launch.rep_w, launch.ctl_r, o.fd):
        os.set_inheritable(fd, True)
    ign = sum(1 << (s - 1) for s in o.ignored if 0 < s < 65)
    args = [native.HELPER, "one", str(launch.rep_w), str(launch.ctl_r), str(o.fd), str(o.pid),
            str(o.start), str(o.pgid), mechanism, str(round(launch.grace * 1000)), *place, *watch,
            f"ign={ign:x}", f"mask={o.blocked:x}", "--", launch.executable, *launch.argv]
    env = {res.cookie_var.encode(): res.cookie.encode()}
    env.update((k, v) for k, v in os.environb.items() if k != res.cookie_var.encode())
    try:
        os.execve(native.HELPER, args, env)
    except OSError as exc:
        launch.say(f"E job {exc.errno or 0} cannot start the native keeper: "
                   f"{exc.strerror or exc}")
