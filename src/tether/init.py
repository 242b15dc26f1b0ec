"""``tether init -- CMD``: a correct PID 1 for a container.

What tini and dumb-init do, plus the kill-all-on-exit they lack:

* **reaps every zombie**: orphans anywhere in the container are re-parented
  to PID 1; init waits for all of them, not only for CMD;
* **forwards signals**: every catchable signal except SIGCHLD (and the
  synchronous fault signals, and SIGTTIN/SIGTTOU, which init ignores) goes to
  CMD's process group: ``docker stop``'s SIGTERM, Ctrl+C's SIGINT, SIGHUP,
  SIGUSR1/2, SIGWINCH, SIGQUIT, SIGTSTP/SIGCONT ... A PID 1 that has no
  handler for a signal never gets it (the kernel drops it), which is why a
  plain ``sh -c`` or ``python app.py`` as PID 1 ignores ``docker stop``;
* **ends everything when CMD exits**: SIGTERM (and SIGCONT, so a stopped
  process sees it) to every process left in the container, up to ``--grace``
  seconds for them to exit, SIGKILL to the rest; then exits with CMD's status
  (128+N if CMD died of signal N; 127 command not found; 126 not
  executable; 125 tether's own failure). Without this, the leftovers of CMD
  (a background worker, a daemonized helper) get no SIGTERM at all: the
  kernel SIGKILLs the namespace when PID 1 exits, mid-write.

"Every process left" is always this init's own descendants, each ended by
identity (pid + kernel start time); never a signal broadcast to every
process it may signal. As PID 1 every orphan of the namespace is
re-parented to it, so its descendants are the whole namespace; elsewhere it
makes itself a child subreaper (Linux) so orphans re-parent to it. As PID 1
with the host's /proc mounted (its pids would not be ours), it signals
nothing and its exit lets the kernel end the namespace.

Start-up cost matters for a container's PID 1: this module imports only
``os`` and ``sys`` and the built-in ``_signal`` (not ``signal``, which pulls
in ``enum``), and the import-light process reader (``tether.identity``);
``ctypes`` only when not PID 1, the ending engine only once CMD has exited.

Signals are handled tini's way: all of them are blocked and taken
synchronously with ``sigtimedwait`` (Linux, FreeBSD; not macOS, where
``tether init`` refuses to start - containers are Linux).
"""

from __future__ import annotations

import os
import sys

try:  # the C module behind `signal`: same functions, ints instead of enums
    import _signal as S
except ImportError:  # pragma: no cover - other Pythons
    import signal as S  # type: ignore[no-redef]

__all__ = ["cli", "run_init", "EXIT_FAILURE"]

from ._constants import EXIT_INTERNAL as EXIT_FAILURE  # noqa: E402 - bad arguments, cannot fork

_DEFAULT_GRACE = 2.0

_USAGE = """usage: tether init [-g SECONDS] [-v] -- CMD [ARG...]

Run CMD as the child of a container's PID 1: reap every zombie, forward
signals to CMD's process group, and when CMD exits end everything still
running (SIGTERM, grace, SIGKILL), then exit with CMD's status.

  -g, --grace SECONDS  time between SIGTERM and SIGKILL for what CMD left
                       running (default 2)
  -v, --verbose        say on stderr what was forwarded and ended
  -h, --help           this text
"""


def _sig(name: str) -> int | None:
    return getattr(S, name, None)


# Never forwarded: SIGCHLD is init's own business; SIGKILL/SIGSTOP cannot be
# caught; the fault signals are synchronous (they concern init itself);
# SIGTTIN/SIGTTOU are ignored so init is never stopped by its terminal.
_NOT_FORWARDED = {
    _sig(n)
    for n in ("SIGCHLD", "SIGKILL", "SIGSTOP", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL",
              "SIGTRAP", "SIGSYS", "SIGABRT", "SIGTTIN", "SIGTTOU")
} - {None}


def _forwarded() -> set[int]:
    return {int(s) for s in S.valid_signals()} - _NOT_FORWARDED


def _name(sig: int) -> str:
    for n in dir(S):
        if n.startswith("SIG") and not n.startswith("SIG_") and getattr(S, n) == sig:
            return n
    return f"signal {sig}"


def _say(verbose: bool, msg: str) -> None:
    if verbose:
        try:
            os.write(2, f"tether init: {msg}\n".encode())
        except OSError:
            pass


def _parse(argv: list[str]) -> tuple[float, bool, list[str]] | int:
    grace, verbose = _DEFAULT_GRACE, False
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            i += 1
            break
        if a in ("-h", "--help"):
            sys.stdout.write(_USAGE)
            return 0
        if a in ("-v", "--verbose"):
            verbose = True
        elif a in ("-g", "--grace") or a.startswith("--grace="):
            if "=" in a:
                val = a.split("=", 1)[1]
            else:
                i += 1
                if i >= len(argv):
                    return _usage_error(f"{a} needs a value")
                val = argv[i]
            try:
                grace = float(val)
            except ValueError:
                return _usage_error(f"not a number of seconds: {val!r}")
            from .ending import check_grace

            try:
                grace = check_grace(grace)
            except ValueError as e:
                return _usage_error(str(e))
        elif a.startswith("-") and a != "-":
            return _usage_error(f"unknown option {a}")
        else:
            break  # CMD without a leading --
        i += 1
    cmd = argv[i:]
    if not cmd:
        return _usage_error("missing command")
    return grace, verbose, cmd


def _usage_error(msg: str) -> int:
    sys.stderr.write(f"tether init: {msg}\n{_USAGE}")
    return EXIT_FAILURE


def cli(argv: list[str]) -> int:
    """``tether init [-g S] [-v] -- CMD [ARG...]``; returns the exit status."""
    parsed = _parse(argv)
    if isinstance(parsed, int):
        return parsed
    grace, verbose, cmd = parsed
    return run_init(cmd, grace=grace, verbose=verbose)


# ---------------------------------------------------------------------------


def _spawn(cmd: list[str], sigs: set[int]) -> int:
    """Fork and exec CMD as the leader of a new process group (the terminal's
    foreground group if init has one). Returns its pid, or raises OSError
    carrying the exec's errno."""
    r, w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # child: never returns
        try:
            os.close(r)
            os.setpgid(0, 0)
            try:
                if os.isatty(0):
                    # We are a background group until this call: keep it from
                    # stopping us with SIGTTOU.
                    S.signal(S.SIGTTOU, S.SIG_IGN)
                    os.tcsetpgrp(0, os.getpgrp())
            except OSError:
                pass  # not our controlling terminal: nothing to hand over
            # Python ignores SIGPIPE/SIGXFSZ and catches SIGINT; init ignores
            # SIGTTIN/SIGTTOU: CMD gets the defaults, and nothing blocked.
            for name in ("SIGPIPE", "SIGXFSZ", "SIGINT", "SIGTTIN", "SIGTTOU"):
                s = _sig(name)
                if s is not None:
                    S.signal(s, S.SIG_DFL)
            S.pthread_sigmask(S.SIG_SETMASK, [])
            os.execvp(cmd[0], cmd)
        except OSError as e:
            try:
                os.write(w, str(e.errno or 0).encode())
            except OSError:
                pass
        except BaseException:  # noqa: BLE001 - never fall back into init's code
            pass
        os._exit(127)
    os.close(w)
    try:
        data = b""
        while True:
            chunk = os.read(r, 64)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(r)
    if data:
        os.waitpid(pid, 0)
        err = int(data or b"0")
        raise OSError(err, os.strerror(err), cmd[0])
    return pid


def _set_subreaper() -> str:
    """prctl(PR_SET_CHILD_SUBREAPER); "" or why not."""
    from ._prctl import set_subreaper

    try:
        set_subreaper()
    except OSError as e:
        return e.strerror or str(e)
    return ""


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


class _Init:
    def __init__(self, grace: float, verbose: bool) -> None:
        self.grace = grace
        self.verbose = verbose
        self.pid1 = os.getpid() == 1
        self.child = 0
        self.status: int | None = None
        self.reaped = 0
        from .identity import now_ticks

        self.born = now_ticks()  # everything init ends is born after this

    def reap(self) -> bool:
        """Reap every exited child; False once there are no children left."""
        from .identity import reap_exited

        return reap_exited(self._reaped)

    def _reaped(self, pid: int, st: int) -> None:
        if pid == self.child and self.status is None:
            self.status = st
        else:
            self.reaped += 1

    def forward(self, sig: int) -> None:
        child = self.child
        if child <= 1 or self.status is not None:
            return  # never a group or pid that is not CMD's (PID <= 1 means more)
        try:
            os.killpg(child, sig)  # CMD leads this group: we made it so
        except ProcessLookupError:
            try:  # CMD moved itself to another group: at least CMD
                os.kill(child, sig)
            except ProcessLookupError:
                pass
        except PermissionError:
            pass

    # -- ending what is left --------------------------------------------------
    def _descendants(self) -> list:
        from . import proctree

        return proctree.descendants([os.getpid()], born_after=self.born)

    def end_rest(self, sigs: set[int]) -> None:
        """End what CMD left running, through ``tether.ending``: SIGTERM and
        SIGCONT, the grace (cut short by SIGTERM/SIGINT/SIGQUIT/SIGHUP sent to
        init), SIGKILL, each by identity; then, as PID 1, our exit lets the
        kernel SIGKILL whatever could not be named."""
        if not self.reap():
            return  # nothing left
        from . import gate, proctree

        if self.pid1 and not proctree.proc_is_ours():
            # PID 1 with the host's /proc: its pids are not ours to name, so
            # signal nothing; our exit makes the kernel end the namespace.
            return
        from .ending import end

        hurry = {s for s in (_sig("SIGTERM"), _sig("SIGINT"), _sig("SIGQUIT"), _sig("SIGHUP"))
                 if s is not None}

        def hurried() -> bool:
            info = S.sigtimedwait(sigs, 0)
            if info is not None and info.si_signo in hurry:
                _say(self.verbose, f"{_name(info.si_signo)} during the grace: SIGKILL now")
                return True
            return False

        # Proven as our tree: a child of ours (the subreaper every orphan comes
        # to) or of what the last look found. As PID 1 (with our own /proc,
        # checked above) every process we can name is in our namespace, so
        # ours: nothing more to prove (and a parent 1 proves nothing).
        proof = gate.Proof()
        ending = end(proof.tracking(self._descendants, roots=[os.getpid()]), born_after=self.born,
                     grace=self.grace, cancel=hurried, on_round=self.reap,
                     proof=None if self.pid1 else (lambda _i: proof))
        if self.verbose:
            left = {how for _i, how in ending.ended}
            if not ending.ended:
                _say(True, "nothing left running")
            else:
                _say(True, f"ended {len(ending.ended)} process(es) CMD left running "
                     f"(grace {self.grace:g} s; by {', '.join(sorted(left))})")
        # As PID 1, exiting now makes the kernel SIGKILL whatever is left.


def run_init(cmd: list[str], *, grace: float = _DEFAULT_GRACE, verbose: bool = False) -> int:
    """Run ``cmd`` under init duties (see the module docstring); its exit status."""
    if not hasattr(S, "sigtimedwait"):
        sys.stderr.write("tether init: this platform has no sigtimedwait (Linux is needed)\n")
        return EXIT_FAILURE
    init = _Init(grace, verbose)
    if not init.pid1 and sys.platform.startswith("linux"):
        err = _set_subreaper()  # orphans come to us, not to the real PID 1
        if err:
            _say(True, f"cannot become a child subreaper ({err}); orphans will not be reaped")
    fwd = _forwarded()
    sigs = fwd | {S.SIGCHLD}
    S.pthread_sigmask(S.SIG_BLOCK, sigs)
    for name in ("SIGTTIN", "SIGTTOU"):
        s = _sig(name)
        if s is not None:
            S.signal(s, S.SIG_IGN)
    try:
        init.child = _spawn(cmd, sigs)
    except OSError as e:
        import errno

        code = 127 if e.errno == errno.ENOENT else 126
        sys.stderr.write(f"tether init: {cmd[0]}: {e.strerror}\n")
        return code
    _say(verbose, f"started {cmd[0]} as pid {init.child}")
    while init.status is None:
        info = S.sigtimedwait(sigs, 1.0)  # the timeout is a safety net only
        if info is not None and info.si_signo != S.SIGCHLD:
            if verbose:
                _say(verbose, f"{_name(info.si_signo)} -> process group {init.child}")
            init.forward(info.si_signo)
        if not init.reap() and init.status is None:
            break  # no children at all: cannot happen while CMD runs
    code = _exit_code(init.status) if init.status is not None else EXIT_FAILURE
    _say(verbose, f"{cmd[0]} exited with status {code}")
    init.end_rest(sigs)
    if init.reaped:
        _say(verbose, f"reaped {init.reaped} other process(es)")
    return code


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
