"""``tether-shell``: a SHELL / COMSPEC drop-in that runs every command in its own job.

Agent CLIs run each command as ``$SHELL -c CMD`` (or ``%COMSPEC% /c CMD``).
With ``SHELL=/path/to/tether-shell`` (Windows: ``COMSPEC`` or ``SHELL`` set to
pip's ``Scripts\\tether-cmd.exe``) each command runs in the real shell,
inside a tether job: when the command returns, whatever it left behind
(``sleep 60 &``, ``nohup ... &``, a double-forked daemon) is ended within a
short grace; when the wrapper is killed - alone or with its whole process
group, even by SIGKILL - the job's keeper ends the command's whole tree.

Transparent: the command sees the same PIDs, user, ``/proc``, environment,
file descriptors, terminal and process group as under the real shell (the
job mechanism is ``auto``, which never picks a PID namespace: cgroup or
subreaper on Linux, a Job Object on Windows; on macOS/BSD the process-group
mechanism, under which the command leads its own process group). The exit
status comes back; a command killed by signal N kills the wrapper with N.

Environment (all optional; a bad value is a usage error: exit 2, one line,
nothing run)::

    TETHER_SHELL            absolute path of the real shell (else: the real shell
                            of the installed name - DIR/bash runs the bash on PATH
                            after DIR -, the login shell, bash on PATH, /bin/sh;
                            Windows: pwsh >= 7)
    TETHER_SHELL_GRACE      seconds leftovers get between SIGTERM and SIGKILL (0.5;
                            tether.ending.check_grace's rules)
    TETHER_SHELL_MECHANISM  auto (default), cgroup, subreaper or pgroup
    TETHER_SHELL_SCOPE      command (default: what a command leaves ends with it)
                            or caller (it runs on until the caller ends)
    TETHER_SHELL_WITH_CALLER  1 (default: the caller's death ends the job) or 0
    TETHER_SHELL_LOG        on (default) or off (also 1/0, yes/no, true/false)
    TETHER_SHELL_LOG_DAYS   days the audit log's rotated copies are kept (14)
    TETHER_SHELL_LOG_MAX_BYTES  the audit log's rotation size (5 MiB)
    TETHER_STATE_DIR        state directory (the log's; the reaper reads it)

Modes: ``-c CMD`` (SHELL), ``/c CMD`` (COMSPEC, Windows) and interactive (no
arguments, ``-i``, ``-l``, ``--login``: the real shell runs interactively with
the same arguments, on the same terminal, in a job).

Exit statuses: the command's; 2 bad invocation or bad ``TETHER_*`` value
(one line on stderr, nothing run); 123 the job's keeper died while the
command ran (one line on stderr; the job was ended from here) or the
command's status was lost with it; 125 tether could not create the job; 126
the shell could not be executed; 127 no shell found.

Start-up is measured by ``bench/shell.py``. On Linux each command takes the
one-command path, ``tether.keeper.oneshot`` (a keeper forked from here;
imports only ``os``, ``sys``, ``select``, ``_signal``). The generic
``tether.job.Job`` is used for ``TETHER_SHELL_MECHANISM=pgroup``, where the
one-command path is unavailable (no pidfd, a multi-threaded caller of
``cli``), on other POSIX systems and on Windows.
"""

import os
import sys

__all__ = ["main", "cli", "ShellLog", "DEFAULT_GRACE", "log_dir"]

from ._constants import (  # noqa: E402
    EXIT_INTERNAL,
    EXIT_NOEXEC,
    EXIT_NOT_FOUND,
    EXIT_USAGE,
)
from ._constants import SHELL_GRACE as DEFAULT_GRACE  # noqa: E402

# The audit records (on the hot path: logging is on by default).
from .shell_log import _PROG, ShellLog, _bool_env, _ident, _usage, log_dir  # noqa: E402

_HANDED_ARGV0 = "_TETHER_SHELL_ARGV0"  # = shell.c's ARGV0_VAR
_MECHANISMS = ("auto", "cgroup", "subreaper", "pgroup", "jobobject")
_SCOPES = ("command", "caller")
_STOP_SIGNALS = ("SIGTERM", "SIGHUP")  # end the job now, then die by the same signal
_DEFER_SIGNALS = ("SIGINT", "SIGQUIT")  # the command gets them from the terminal itself

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._sigwatch import SignalWatch


def _signal_numbers(names: tuple[str, ...]) -> list[int]:
    import _signal

    return [getattr(_signal, n) for n in names if hasattr(_signal, n)]  # Windows: no SIGHUP


def _say(msg: str) -> None:
    # One line, straight to fd 2: no buffered sys.stderr to flush before os._exit.
    try:
        os.write(2, f"{_PROG}: {msg}\n".encode("utf-8", "replace"))
    except OSError:
        pass


def _grace_env(env) -> float:
    v = env.get("TETHER_SHELL_GRACE")
    if not v:
        return DEFAULT_GRACE
    from .ending import check_grace  # only when set: the engine is not on the hot path

    try:
        return check_grace(float(v), "TETHER_SHELL_GRACE")
    except ValueError as exc:
        if "finite" in str(exc):
            raise _usage(str(exc)) from None
        raise _usage(f"TETHER_SHELL_GRACE must be a number of seconds, not {v!r}") from None


def _choice_env(env, name: str, choices: "tuple[str, ...]", default: str, why: str = "") -> str:
    v = env.get(name) or default
    if v not in choices:
        raise _usage(f"{name} must be one of {', '.join(choices)}{why}, not {v!r}")
    return v


def _why(exc: OSError) -> str:
    """Why a start failed, in words; on Windows with the error's number, as
    Python prints it (``[WinError 1359]``): the words alone can be vague
    ("Internal error.")."""
    why = exc.strerror or str(exc)
    winerror = getattr(exc, "winerror", None)
    return f"{why} [WinError {winerror}]" if winerror else why


def _errcode(exc: "BaseException") -> str:
    if isinstance(exc, OSError) and exc.errno:
        import errno

        return errno.errorcode.get(exc.errno, f"E{exc.errno}")
    return type(exc).__name__


# -- running one command -------------------------------------------------------------

def _self_paths() -> list[str]:
    paths: list[str] = []
    a0 = sys.argv[0] if sys.argv else ""
    if a0 and a0 not in ("-c", "-m"):
        try:
            full = os.path.abspath(a0)
        except OSError:  # a relative argv[0] in a deleted working directory
            return paths
        paths.append(full)
        if sys.platform == "win32":  # pip's launcher strips ".exe" from argv[0]
            paths.append(full + ".exe")
    return paths


def _windows_command(parsed, argv: list[str], comspec: str) -> str:
    """COMSPEC mode on Windows: cmd.exe gets the caller's raw flags and command text."""
    import ctypes

    get = ctypes.windll.kernel32.GetCommandLineW  # type: ignore[attr-defined]  # Windows-only; mypy checks as Linux
    get.restype = ctypes.c_wchar_p
    cmdline = get() or ""
    from ._shellargs import comspec_tail

    tail = comspec_tail(cmdline, argv)
    if tail is None:
        tail = " ".join(parsed.flags) + " " + parsed.command
    return f'"{comspec}" {tail}'


def cli(argv: list[str], *, login: bool = False) -> int:
    """Run ``tether-shell ARGS``; return the exit status (``tether shell ARGS`` calls this).
    ``login``: started as a login shell by name (``argv[0]`` ``-tether-shell``,
    as login(1), sshd, ``su -`` and tmux start one): the real shell is too.

    A command killed by signal N makes this process die by N, as a shell's
    caller expects; if that does not end it, 128+N is returned. On Windows
    the command's 32-bit exit code comes back as the signed int of the same
    bits, which ``os._exit`` and ``sys.exit`` pass on whole (0xC000013A, a
    command ended by Ctrl+C, is -1073741510 here and 3221225786 to the caller).
    """
    from . import _shellargs as sa
    from ._prctl import hold_std_fds

    hold_std_fds()  # before anything opens a file that would take a closed one's number
    if sa.wants_help(argv):
        os.write(1, sa.USAGE.encode())
        return 0
    env = os.environ
    windows = sys.platform == "win32"
    mode = None
    log = None
    args: object = None
    try:
        log = ShellLog.from_env(env)
        parsed = sa.parse(argv)
        if login:
            parsed = sa.as_login(parsed)
        mode = parsed.mode
        if parsed.mode == sa.INTERACTIVE and windows:
            raise sa.UsageError("an interactive shell is not served on Windows; use -c CMD or /c CMD")
        installed = None if windows or not sys.argv else sa.installed_name(sys.argv[0])
        shell = sa.resolve(parsed, env, sa.SelfCheck(_self_paths()), windows, installed=installed)
        mech = _choice_env(env, "TETHER_SHELL_MECHANISM", _MECHANISMS, "auto",
                           " (the shell wrapper is always transparent)")
        grace = _grace_env(env)
        scope = _choice_env(env, "TETHER_SHELL_SCOPE", _SCOPES, "command")
        with_caller = _bool_env(env, "TETHER_SHELL_WITH_CALLER", True)
        if scope == "caller" and not with_caller:
            raise sa.UsageError("TETHER_SHELL_SCOPE=caller needs the caller watched: "
                                "unset TETHER_SHELL_WITH_CALLER=0")
        if scope == "caller" and not (sys.platform.startswith("linux") and mech != "pgroup"):
            raise sa.UsageError("TETHER_SHELL_SCOPE=caller needs Linux and mechanism auto, cgroup "
                                f"or subreaper (not {mech})")
        if windows and parsed.mode == sa.SHELL:
            # A command line in the target's own quoting (cmd.exe knows no \").
            args = sa.windows_command_line(shell, parsed)
        elif parsed.mode != sa.COMSPEC:
            args = sa.shell_argv(shell, parsed, windows)  # (set options need a POSIX shell)
    except (sa.UsageError, sa.ShellNotFound) as exc:
        _say(str(exc))
        if log is not None:
            log.write("error", child=None, mode=mode, mechanism=None,
                      detail={"error": "usage" if exc.code == EXIT_USAGE else "no-shell",
                              "argc": len(argv)})
        return exc.code
    if parsed.mode == sa.COMSPEC:
        args = _windows_command(parsed, argv, shell)
    code = _run(args, shell, parsed, len(argv), mech, grace, log, scope, with_caller)
    if windows:
        # A DWORD (0xC0000005 = 3221225477 after an access violation), which
        # os._exit and sys.exit take only as the signed int of the same bits.
        from .platform._winapi import signed_exit_code

        return signed_exit_code(code)
    return code


def _run(args, shell: str, parsed, argc: int, mech: str, grace: float,
         log: "ShellLog | None", scope: str = "command", with_caller: bool = True) -> int:
    import time

    t0 = time.monotonic()
    # The one-command path (POSIX/Linux): a keeper forked from here, no socket,
    # no subprocess/threading/dataclasses - see tether.keeper.oneshot.
    if sys.platform.startswith("linux") and mech in ("auto", "cgroup", "subreaper"):
        from .keeper import oneshot

        if oneshot.available():
            try:
                return _run_oneshot(oneshot, args, shell, parsed, argc, mech, grace, log, t0,
                                    scope, with_caller)
            except oneshot.Unavailable:
                pass  # e.g. a multi-threaded caller of cli(): nothing ran yet
    # Handlers first, so no signal is lost while the job is set up. A Python
    # handler is not SIG_IGN, so the command still starts with SIG_DFL for them.
    from ._sigwatch import SignalWatch

    sigs = SignalWatch(_signal_numbers(_STOP_SIGNALS), _signal_numbers(_DEFER_SIGNALS))
    try:
        return _run_job(args, shell, parsed, argc, mech, grace, log, sigs, t0, with_caller)
    finally:
        sigs.restore()


def _job_fields(res, start: bool) -> "dict[str, object]":
    """What names the job in the log, for ``tether reap`` and ``tether ps``
    (``tether.runs`` reads these records): see :class:`ShellLog`."""
    from .identity import COOKIE_VAR, boot_id

    fields: dict[str, object] = {"run": res.run, "job": res.job, "scope": res.scope,
                                 "boot": boot_id(), "start": res.child_start or None}
    if start:
        owner = res.caller if res.scope == "caller" else (os.getpid(), res.owner_start)
        fields.update(owner=_ident(*owner), keeper=_ident(res.keeper, res.keeper_start),
                      caller=_ident(*(res.caller or (None, None))), cookie=res.cookie,
                      cookie_var=None if res.cookie_var == COOKIE_VAR else res.cookie_var,
                      cgroup=res.cgroup)
    return fields


def _run_oneshot(oneshot, args, shell, parsed, argc, mech, grace, log, t0, scope,
                 with_caller) -> int:
    import time

    from .errors import JobRefused

    def started(res) -> None:
        if log is not None:
            log.write("start", child=res.child, mode=parsed.mode, mechanism=res.mechanism,
                      detail={"argc": argc, "login": parsed.login}, job=_job_fields(res, True))

    caller = oneshot.watch_caller() if with_caller else None
    try:
        res = oneshot.run(args, executable=shell, mechanism=mech, grace=grace, on_start=started,
                          caller=caller, scope=scope)
    except JobRefused as exc:
        _say(f"cannot create a job, nothing was run: {exc}")
        if log is not None:
            log.write("error", child=None, mode=parsed.mode, mechanism=mech,
                      detail={"error": "job-refused"})
        return EXIT_INTERNAL
    except OSError as exc:  # the shell could not be executed
        code = EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) else EXIT_NOEXEC
        _say(f"{shell}: {_why(exc)}")
        if log is not None:
            log.write("error", child=None, mode=parsed.mode, mechanism=mech,
                      detail={"error": _errcode(exc)})
        return code
    if res.child is None and res.stopped_by is not None:
        return _die_by(res.stopped_by)  # interrupted before the command existed: nothing ran
    if res.child is None and res.error == "keeper-died":
        _say("the job's keeper died before the command started; nothing was run")
        return EXIT_INTERNAL
    st = res.status
    rc = None if st is None else os.waitstatus_to_exitcode(st)
    if log is not None:
        detail: dict[str, object] = {}
        if rc is None:
            detail["error"] = res.error or "no-status"
        elif rc < 0:
            detail["signal"] = -rc
        else:
            detail["code"] = rc
        detail["leftovers"] = res.leftovers
        detail["ms"] = round((time.monotonic() - t0) * 1000, 1)
        if res.stopped_by is not None:
            detail["stopped_by"] = res.stopped_by
        if res.ended_by is not None:
            detail["ended_by"] = res.ended_by
        log.write("exit", child=res.child, mode=parsed.mode, mechanism=res.mechanism,
                  detail=detail, job=_job_fields(res, False))
        log.close()
    if res.stopped_by is not None:
        return _die_by(res.stopped_by)
    if rc is None:
        from .runner import EXIT_GUARD_LOST  # the same code as `tether run`'s

        if res.error != "keeper-died":  # that one was said the moment it happened
            _say("the command's exit status was lost with the job's keeper")
        return EXIT_GUARD_LOST
    if rc < 0:
        return _die_by(-rc)
    return rc


def _run_job(args, shell, parsed, argc, mech, grace, log, sigs, t0, with_caller=True) -> int:
    import subprocess
    import time

    from .errors import TetherError

    try:
        from .job import Job

        job = Job(name="tether-shell", mechanism=mech, grace=grace)
    except (TetherError, OSError, ValueError) as exc:  # JobRefused, fork EAGAIN: one line, 125
        _say(f"cannot create a job, nothing was run: {exc}")
        if log is not None:
            log.write("error", child=None, mode=parsed.mode, mechanism=mech,
                      detail={"error": _errcode(exc)})
        return EXIT_INTERNAL
    p = None
    stop = None
    leftovers: list = []
    caller = _caller_pidfd() if with_caller else None
    try:
        early = sigs.first()
        if early is not None:
            # Stopped before the command existed (not by SIGINT or SIGQUIT,
            # which are the command's): run nothing, die as a shell would.
            job.close()
            return _die_by(early)
        try:
            # close_fds=False: the command inherits every inheritable fd, as under sh.
            p = job.popen(args, executable=shell, close_fds=False)
        except OSError as exc:
            code = EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) else EXIT_NOEXEC
            _say(f"{shell}: {_why(exc)}")
            if log is not None:
                log.write("error", child=None, mode=parsed.mode, mechanism=job.mechanism,
                          detail={"error": _errcode(exc)})
            return code
        except (TetherError, ValueError) as exc:  # a refused spawn (JobRefused): nothing ran
            _say(f"cannot start the shell in a job: {exc}")
            if log is not None:
                log.write("error", child=None, mode=parsed.mode, mechanism=job.mechanism,
                          detail={"error": _errcode(exc)})
            return EXIT_INTERNAL
        if log is not None:
            log.write("start", child=p.pid, mode=parsed.mode, mechanism=job.mechanism,
                      detail={"argc": argc, "login": parsed.login})
        stop = _wait(p, sigs, caller)
        if stop == _CALLER_GONE:
            job.terminate(0)  # the caller is gone: the job goes with it, at once (no grace)
            stop = None
            try:
                p.wait(timeout=5)
            except (subprocess.TimeoutExpired, TetherError):
                pass
        elif stop is not None:
            # The caller asked us to stop: end the whole job now (grace, then SIGKILL).
            job.terminate(grace)
            try:
                p.wait(timeout=5)
            except (subprocess.TimeoutExpired, TetherError):  # status unknown: report the stop
                pass
        leftovers = job.terminate(grace)
    finally:
        job.close()
        if caller is not None:
            os.close(caller)
    rc = p.returncode
    if log is not None:
        detail: dict[str, object] = {}
        if rc is None:
            detail["error"] = "no-status"
        elif rc < 0:
            detail["signal"] = -rc
        else:
            detail["code"] = rc
        detail["leftovers"] = len(leftovers)
        detail["ms"] = round((time.monotonic() - t0) * 1000, 1)
        if stop is not None:
            detail["stopped_by"] = stop
        log.write("exit", child=p.pid, mode=parsed.mode, mechanism=job.mechanism, detail=detail)
        log.close()
    if stop is not None:
        return _die_by(stop)
    if rc is None:
        return EXIT_INTERNAL
    if rc < 0:
        return _die_by(-rc)
    return rc


_CALLER_GONE = -1


def _caller_pidfd() -> "int | None":
    """The generic path's caller watch: a pidfd of the caller (Linux), else None."""
    if not sys.platform.startswith("linux") or not hasattr(os, "pidfd_open"):
        return None
    from .keeper.oneshot import watch_caller

    found = watch_caller()
    return found[2] if found is not None else None


def _wait(p, sigs: "SignalWatch", caller: "int | None" = None) -> int | None:
    """Wait for the shell; return None, the stop signal (SIGTERM/SIGHUP) we
    received, or ``_CALLER_GONE`` when the caller's pidfd says it is gone.

    SIGINT and SIGQUIT are recorded but not acted on, like a shell waiting for
    a foreground command: the command is in our process group, so a terminal's
    Ctrl+C (or the caller's killpg) reaches it directly.
    """
    # The job's Popen holds a pidfd of the shell: poll it together with the
    # signal wake-up pipe (no pidfd on other platforms: poll with a timeout).
    pidfd = getattr(p, "pidfd", None)
    if pidfd is None or sigs.rfd < 0:
        import subprocess

        while True:
            stop = sigs.first()
            if stop is not None:
                return stop
            try:
                p.wait(timeout=0.1)
                return None
            except subprocess.TimeoutExpired:
                continue
    import select

    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    poller.register(sigs.rfd, select.POLLIN)
    if caller is not None:
        poller.register(caller, select.POLLIN)
    while p.poll() is None:
        stop = sigs.first()
        if stop is not None:
            return stop
        if any(fd == caller for fd, _ in poller.poll()):
            return _CALLER_GONE
        sigs.drain()
    return None


def _die_by(sig: int) -> int:
    """End this process by ``sig``, as the shell's caller would have seen; else 128+sig."""
    import signal

    if sig in {int(getattr(signal, n)) for n in _CORE_SIGNALS if hasattr(signal, n)}:
        try:
            import resource  # no core file of the wrapper for the command's crash

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        except (ImportError, OSError, ValueError):
            pass
    try:
        signal.signal(sig, signal.SIG_DFL)  # refused for SIGKILL, which needs nothing
    except (OSError, ValueError):
        pass
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        signal.raise_signal(sig)
    except (OSError, ValueError, AttributeError):
        pass
    return 128 + sig


_CORE_SIGNALS = ("SIGQUIT", "SIGILL", "SIGTRAP", "SIGABRT", "SIGBUS", "SIGFPE", "SIGSEGV",
                 "SIGXCPU", "SIGXFSZ", "SIGSYS")


def _not_yet(_signum: int, _frame: object) -> None:
    """SIGINT/SIGQUIT before the wrapper waits for its command: ignored, as by
    the native program from its first instruction (the command gets them
    from the terminal itself). A handler, not SIG_IGN: exec resets it, so
    the command does not inherit it."""


def main() -> int:
    """Console script ``tether-shell`` (``tether-cmd`` on Windows)."""
    import _signal

    # first: a SIGINT now was a KeyboardInterrupt traceback and exit 1
    for sig in _signal_numbers(_DEFER_SIGNALS):
        if _signal.getsignal(sig) != _signal.SIG_IGN:  # the caller's ignored stay so
            _signal.signal(sig, _not_yet)
    # The native tether-shell hands what it does not serve to this one by
    # exec, saying through which path it was started (the installed name and
    # the recursion guard read sys.argv[0]); the command must not see it.
    handed = os.environ.pop(_HANDED_ARGV0, None)
    login = False
    if handed and handed[0] == "-":  # "-PATH": its argv[0] started with "-" (a login shell)
        login, handed = True, handed[1:]
    if handed and sys.argv:
        sys.argv[0] = handed
    argv = sys.argv[1:]
    if sys.platform == "win32" and sys.argv:
        from ._shellargs import unsplit_program

        argv = unsplit_program(argv, sys.argv[0])
    code = cli(argv, login=login)
    # Skip interpreter teardown: nothing is buffered (messages go straight to
    # fd 2) and the job is closed; this saves milliseconds on every command.
    os._exit(code)
    return code  # pragma: no cover - unreachable


if __name__ == "__main__":
    main()
