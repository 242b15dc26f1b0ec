"""One command in its own job, with the least start-up: the path ``tether-shell`` takes.

The generic path (``tether.job.Job``) pays for generality on every command:
``subprocess``, ``threading``, ``socket``, ``dataclasses``, and a keeper
spoken to over a socket. A wrapper that runs exactly one command needs none
of it, and it runs on every shell command an agent issues, so it has this
path, which imports only ``os``, ``sys``, ``select`` and ``_signal`` (ctypes
only in the keeper, and only for a subreaper).

How (Linux only; the caller must be single-threaded, as the wrapper is):

* The caller (the *owner*) forks the job's **keeper** directly. The keeper
  inherits the owner's file descriptors, working directory and environment:
  nothing is sent to it, so big environments and deleted working directories
  just work, and every inheritable fd reaches the command as under ``sh``.
* The keeper names itself ``tether-keeper``, goes into its own process group
  and ignores hang-up, interrupt, terminate and job-control signals (a caller
  killing the owner's group must not take it along). It creates the job's
  cgroup ``<own cgroup>/tether-<owner pid>-<owner start ticks>/j<owner pid>-1``
  (the naming ``linux_cgroup`` uses; the reaper and ``tether ps`` rely on it)
  and steps into it around the spawn, or - ``auto`` when no cgroup v2 is
  writable - becomes a child subreaper. It ``posix_spawn``\\ s the command in
  the owner's process group (the command keeps the terminal, and the caller's
  ``killpg`` reaches it), with the owner's ignored signals and blocked mask.
* It reports ``P <pid> <mechanism>`` and, at the end, ``X <status> <leftovers>``
  on a pipe; the owner waits on that pipe and on its own signals.
* The keeper watches the owner through a pidfd: the owner SIGKILLed (alone or
  with its process group) makes the keeper end the whole job at once. A
  ``s`` byte from the owner (it got SIGTERM/SIGHUP) makes the keeper end the
  job: SIGTERM to every member, ``grace`` seconds, SIGKILL.
* When the command exits, whatever is left in the job gets SIGTERM, ``grace``
  seconds, then SIGKILL, before the keeper reports - so the owner exits only
  once nothing of the command is left.

Guarantee, as for the generic ``cgroup``/``subreaper`` mechanisms: guardian-
enforced and transparent; if the keeper itself is SIGKILLed first, a cgroup
job's members survive but stay listed in the stale cgroup (``tether reap``
ends them), a subreaper job's members survive.
"""

from __future__ import annotations

import _signal
import os
import select
import sys

from .._sigwatch import SignalWatch
from ..errors import JobRefused
from . import _linux_kill as lk

__all__ = ["Result", "Unavailable", "available", "run", "MECHANISMS"]

MECHANISMS = ("auto", "cgroup", "subreaper")
STOP_SIGNALS = (_signal.SIGTERM, _signal.SIGHUP)  # end the job now
DEFER_SIGNALS = (_signal.SIGINT, _signal.SIGQUIT)  # the command gets them from the terminal
# What a keeper ignores: the caller may kill the owner's group or hang up the
# terminal; only the owner's death (or its request) ends a job.
_KEEPER_IGNORES = tuple(getattr(_signal, n) for n in (
    "SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGPIPE"))
# Python ignores these at start-up; subprocess (restore_signals) and the
# generic keeper give them back to the child as default.
_RESTORED = (_signal.SIGPIPE, _signal.SIGXFSZ)
_KILL_TIMEOUT = 5.0


class Unavailable(Exception):
    """This path cannot run here (not Linux, no pidfd, several threads, another
    mechanism asked for); nothing was started: use ``tether.job.Job``."""


class Result:
    """What happened to the one command.

    ``status``: its raw wait status (``os.waitstatus_to_exitcode`` turns it
    into a return code), or None (never started, or the keeper was lost).
    ``child``: its pid. ``mechanism``: ``cgroup`` or ``subreaper``.
    ``leftovers``: processes still in the job when the command returned (they
    were ended). ``stopped_by``: the stop signal the owner received, if any.
    ``error``: ``keeper-gone`` when the keeper vanished without a report.
    """

    __slots__ = ("status", "child", "mechanism", "leftovers", "stopped_by", "error")

    def __init__(self) -> None:
        self.status: int | None = None
        self.child: int | None = None
        self.mechanism: str | None = None
        self.leftovers = 0
        self.stopped_by: int | None = None
        self.error: str | None = None

    def __repr__(self) -> str:
        return "Result(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__) + ")"


def available() -> bool:
    """True where this path can run (Linux with pidfds); ``run`` may still raise
    ``Unavailable`` (e.g. in a multi-threaded caller)."""
    return sys.platform.startswith("linux") and hasattr(os, "pidfd_open") \
        and hasattr(os, "posix_spawn")


# -- the owner's side --------------------------------------------------------------

def _status_fields() -> tuple[int, int]:
    """(threads, ignored-signal mask) of this process, from one /proc read."""
    threads, ign = 0, 0
    with open("/proc/self/status", "rb") as f:
        for line in f:
            if line.startswith(b"Threads:"):
                threads = int(line.split()[1])
            elif line.startswith(b"SigIgn:"):
                ign = int(line.split()[1], 16)
    return threads, ign


def _start_ticks() -> int:
    with open("/proc/self/stat", "rb") as f:
        data = f.read()
    return int(data[data.rindex(b")") + 2:].split()[19])  # field 22: starttime


def run(argv: list[str], *, executable: str, mechanism: str = "auto", grace: float = 0.5,
        on_start=None, stop_signals=STOP_SIGNALS, defer_signals=DEFER_SIGNALS) -> Result:
    """Run ``argv`` (``executable``, an absolute path) in a job of its own; wait.

    ``mechanism``: ``auto`` (cgroup v2 where writable, else a subreaper),
    ``cgroup`` or ``subreaper``. ``on_start(pid, mechanism)`` is called once
    the command runs. A stop signal (SIGTERM, SIGHUP) received meanwhile ends
    the job (SIGTERM, ``grace``, SIGKILL) and is returned as ``stopped_by``;
    SIGINT/SIGQUIT are recorded and otherwise left to the command (it shares
    our process group), as a shell waiting for a foreground command does.
    Signal handlers are restored before returning.

    Raises ``Unavailable`` (nothing started: use the generic ``Job``),
    ``JobRefused`` (the job could not be created: nothing ran) or the
    ``OSError`` of a failed exec (``filename`` = ``executable``).
    """
    if mechanism not in MECHANISMS:
        raise Unavailable(f"mechanism {mechanism!r} is not served by the one-command path")
    if not available():
        raise Unavailable("needs Linux with pidfd_open and posix_spawn")
    try:  # first: no signal is lost while we set up
        sigs = SignalWatch(stop_signals, defer_signals, need_wakeup=True)
    except ValueError as e:
        raise Unavailable(str(e)) from None
    try:
        return _run(argv, executable, mechanism, float(grace), on_start, sigs)
    finally:
        sigs.restore()


def _run(argv, executable, mechanism, grace, on_start, sigs: SignalWatch) -> Result:
    res = Result()
    try:
        threads, ign = _status_fields()
    except (OSError, ValueError, IndexError):
        raise Unavailable("/proc/self/status is not readable") from None
    if threads != 1:
        raise Unavailable("the caller has several threads: a fork would not be safe")
    try:
        owner_fd = os.pidfd_open(os.getpid())
    except OSError as exc:  # a kernel older than 5.3
        raise Unavailable(f"pidfd_open: {exc.strerror}") from None
    owner = os.getpid()
    owner_start = _start_ticks()
    pgid = os.getpgrp()
    ignored = {s for s in range(1, 65) if ign & (1 << (s - 1))} - set(_RESTORED)
    rep_r, rep_w = os.pipe2(os.O_CLOEXEC)
    ctl_r, ctl_w = os.pipe2(os.O_CLOEXEC)
    early = sigs.first(any_kind=True)
    if early is not None:
        # Interrupted before the command existed: run nothing.
        for fd in (owner_fd, rep_r, rep_w, ctl_r, ctl_w):
            os.close(fd)
        res.stopped_by = early
        return res
    try:
        keeper = os.fork()
    except OSError as exc:
        for fd in (owner_fd, rep_r, rep_w, ctl_r, ctl_w):
            os.close(fd)
        raise JobRefused(f"cannot start the job's keeper: {exc.strerror}") from None
    if keeper == 0:
        code = 1
        try:
            code = _Keeper(argv, executable, mechanism, grace, owner, owner_start, pgid, ignored,
                           owner_fd, rep_w, ctl_r, (sigs.rfd, sigs.wfd, rep_r, ctl_w)).main()
        finally:
            os._exit(code)  # a keeper never falls back into the owner's code
    os.close(owner_fd)
    os.close(rep_w)
    os.close(ctl_r)
    failure = None
    try:
        poller = select.poll()
        poller.register(rep_r, select.POLLIN)
        poller.register(sigs.rfd, select.POLLIN)
        buf = b""
        done = False
        while not done:
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
                res.error = "keeper-gone"
                break
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                word = line.split(b" ", 3)
                if word[0] == b"P":
                    res.child = int(word[1])
                    res.mechanism = word[2].decode()
                    if on_start is not None:
                        on_start(res.child, res.mechanism)
                elif word[0] == b"X":
                    st = int(word[1])
                    res.status = st if st >= 0 else None
                    res.leftovers = int(word[2])
                    done = True
                elif word[0] == b"E":
                    failure = (word[1], int(word[2]), word[3].decode("utf-8", "replace")
                               if len(word) > 3 else "")
                    done = True
    finally:
        os.close(rep_r)
        os.close(ctl_w)
        while True:
            try:
                os.waitpid(keeper, 0)
                break
            except ChildProcessError:
                break
            except InterruptedError:  # pragma: no cover - PEP 475 retries
                continue
    if failure is not None:
        kind, err, text = failure
        if kind == b"exec":
            raise OSError(err, os.strerror(err), executable)
        raise JobRefused(text or os.strerror(err))
    return res


# -- the keeper's side ---------------------------------------------------------------

def _noop(*_args) -> None:
    pass


class _CgroupJob:
    name = "cgroup"

    def __init__(self, owner: int, owner_start: int) -> None:
        mount = lk.cgroup2_mount()
        own = lk.own_cgroup()
        if mount is None or own is None:
            raise FileNotFoundError(2, "no cgroup v2 hierarchy (or no membership in one)")
        self.home = mount if own == "/" else os.path.join(mount, own.lstrip("/"))
        self.mount = mount
        self.run_dir = os.path.join(self.home, f"{lk.RUN_PREFIX}{owner}-{owner_start}")
        self.path = os.path.join(self.run_dir, f"j{owner}-1")
        made_run = False
        try:
            os.mkdir(self.run_dir)
            made_run = True
        except FileExistsError:
            pass
        try:
            os.mkdir(self.path)
            # Joining is the real permission test (a delegated subtree needs
            # write access to the common ancestor's cgroup.procs).
            lk._write(os.path.join(self.path, "cgroup.procs"), "0")
        except OSError:
            try:
                os.rmdir(self.path)
            except OSError:
                pass
            if made_run:
                try:
                    os.rmdir(self.run_dir)
                except OSError:
                    pass
            raise

    def leave(self) -> None:
        """Step back to our own cgroup after the spawn (else cgroup.kill ends us too)."""
        lk._write(os.path.join(self.home, "cgroup.procs"), "0")

    def members(self) -> list[int]:
        return lk._procs(self.path)

    def signal(self, sig: int) -> None:
        rel = b"::" + self.path[len(self.mount):].encode()  # as /proc/PID/cgroup shows it
        for pid in self.members():
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue
            try:
                # Pinned by the pidfd; still a member of our job? Then it is ours.
                with open(f"/proc/{pid}/cgroup", "rb") as f:
                    if rel in f.read():
                        _signal.pidfd_send_signal(fd, sig)
            except OSError:
                pass
            finally:
                os.close(fd)

    def kill_all(self, reap) -> None:
        lk.kill_cgroup(self.path, _KILL_TIMEOUT, reap=reap)

    def cleanup(self) -> None:
        lk.remove_tree(self.path)
        try:
            os.rmdir(self.run_dir)
        except OSError:
            pass


class _SubreaperJob:
    name = "subreaper"

    def __init__(self) -> None:
        lk.set_subreaper()
        self.me = os.getpid()

    def leave(self) -> None:
        pass

    def members(self) -> list[int]:
        out = []
        for pid in lk.descendants(self.me):
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    data = f.read()
            except OSError:
                continue
            if data[data.rindex(b")") + 2:][:1] not in (b"Z", b"X"):  # a zombie is dead
                out.append(pid)
        return out

    def signal(self, sig: int) -> None:
        for pid in lk.descendants(self.me):
            lk.kill_pid(pid, sig)

    def kill_all(self, reap) -> None:
        lk.kill_descendants_loop(_KILL_TIMEOUT, lk.SIGKILL, reap)

    def cleanup(self) -> None:
        pass


class _Keeper:
    def __init__(self, argv, executable, mechanism, grace, owner, owner_start, pgid, ignored,
                 owner_fd, rep_w, ctl_r, inherited) -> None:
        self.argv, self.executable, self.mechanism = argv, executable, mechanism
        self.grace, self.owner, self.owner_start = grace, owner, owner_start
        self.pgid, self.ignored = pgid, ignored
        self.owner_fd, self.rep_w, self.ctl_r = owner_fd, rep_w, ctl_r
        self.inherited = inherited
        self.child = 0
        self.status: int | None = None
        self.job = None
        self.owner_gone = False
        self.stop = False
        self.wake_w = -1

    def say(self, line: str) -> None:
        try:
            os.write(self.rep_w, line.encode() + b"\n")
        except OSError:  # the owner is gone; the owner-gone path ends the job
            pass

    def main(self) -> int:
        _signal.set_wakeup_fd(-1)
        for sig in _KEEPER_IGNORES:
            _signal.signal(sig, _signal.SIG_IGN)
        for fd in self.inherited:  # the owner's ends
            os.close(fd)
        try:
            os.setpgid(0, 0)
        except OSError:
            pass
        lk.name_process(b"tether-keeper")
        wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        _signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        _signal.signal(_signal.SIGCHLD, _noop)
        try:
            self.job = self._make_job()
        except OSError as exc:
            self.say(f"E job {exc.errno or 0} cannot create the job ({self.mechanism}): "
                     f"{exc.strerror or exc}")
            return 0
        except Exception as exc:  # noqa: BLE001 - reported; the owner raises JobRefused
            self.say(f"E job 0 cannot create the job ({self.mechanism}): {exc}")
            return 0
        try:
            return self._run(wake_r)
        except BaseException:
            # Never leave the job running on a keeper bug: end it, then say so.
            try:
                self.job.kill_all(self.reap)
            finally:
                self.job.cleanup()
                self.say("X -1 0")
            raise

    def _make_job(self):
        if self.mechanism in ("auto", "cgroup"):
            try:
                return _CgroupJob(self.owner, self.owner_start)
            except OSError:
                if self.mechanism == "cgroup":
                    raise
            # auto: no writable cgroup v2 here (EACCES, EROFS, none mounted)
        return _SubreaperJob()

    def reap(self, pid: int | None = None, status: int | None = None) -> None:
        if pid is not None:  # reaped by a kill loop
            if pid == self.child:
                self.status = status
            return
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.child:
                self.status = st

    def _run(self, wake_r: int) -> int:
        job = self.job
        if _readable(self.ctl_r):  # stopped (or the owner died) while we set up
            job.leave()
            job.cleanup()
            self.say("X -1 0")
            return 0
        setsigdef = [s for s in _signal.valid_signals()
                     if s not in (_signal.SIGKILL, _signal.SIGSTOP) and s not in self.ignored]
        try:
            try:
                self.child = os.posix_spawn(self.executable, self.argv, os.environ,
                                            setpgroup=self.pgid, setsigdef=setsigdef)
            finally:
                job.leave()
        except OSError as exc:
            if self.child:  # spawned, but we could not step out of its cgroup
                os.kill(self.child, lk.SIGKILL)  # our own direct child, not yet reaped
                os.waitpid(self.child, 0)
                job.cleanup()
                self.say(f"E job {exc.errno or 0} cannot leave the job's cgroup: {exc.strerror}")
                return 0
            job.cleanup()
            self.say(f"E exec {exc.errno or 0}")
            return 0
        self.say(f"P {self.child} {job.name}")
        self._let_go({self.owner_fd, self.rep_w, self.ctl_r, wake_r, self.wake_w})
        poller = select.poll()
        poller.register(self.owner_fd, select.POLLIN)
        poller.register(self.ctl_r, select.POLLIN)
        poller.register(wake_r, select.POLLIN)
        self.reap()
        while self.status is None and not self.owner_gone and not self.stop:
            for fd, _ev in poller.poll():
                if fd == wake_r:
                    try:
                        os.read(wake_r, 512)
                    except OSError:
                        pass
                    self.reap()
                elif fd == self.owner_fd:
                    self.owner_gone = True
                elif fd == self.ctl_r:
                    if os.read(self.ctl_r, 64):
                        self.stop = True
                    else:  # the owner's end closed: it died
                        self.owner_gone = True
        if self.owner_gone:
            # Nobody to report to: end everything now, no grace.
            job.kill_all(self.reap)
            job.cleanup()
            return 0
        left = job.members()
        leftovers = len([p for p in left if p != self.child])
        if left:
            if self.grace > 0:
                job.signal(_signal.SIGTERM)
                self._wait_gone()
            job.kill_all(self.reap)
        self.reap()
        if self.status is None and self.child:
            try:
                _, self.status = os.waitpid(self.child, 0)  # dead: it was killed above
            except ChildProcessError:
                pass
        self.say(f"X {-1 if self.status is None else self.status} {leftovers}")
        job.cleanup()
        return 0

    def _let_go(self, keep: set[int]) -> None:
        """Drop what the command inherited from the owner: fds, stdio, the cwd."""
        try:
            names = os.listdir("/proc/self/fd")
        except OSError:
            names = []
        for name in names:
            fd = int(name)
            if fd > 2 and fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass
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

    def _wait_gone(self) -> None:
        """Up to ``grace`` seconds for the job to empty; cut short if the owner dies."""
        import time

        deadline = time.monotonic() + self.grace
        poller = select.poll()
        poller.register(self.owner_fd, select.POLLIN)
        delay = 1
        while True:
            self.reap()
            if not self.job.members():
                return
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if poller.poll(min(delay, max(1, int(left * 1000)))):
                return  # the owner died: kill now
            delay = min(delay * 2, 50)


def _readable(fd: int) -> bool:
    r, _, _ = select.select([fd], [], [], 0)
    return bool(r)

