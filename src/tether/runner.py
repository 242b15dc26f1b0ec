"""`tether run`: one command in a job, with the terminal and signals handled.

Exit status: the command's; 128+N if it died of signal N; 127 command not
found; 126 not executable; 125 tether's own failure, nothing ran (one line on
stderr); 123 the guard was lost and so was the command's status (see below).

If tether's keeper dies while the command runs (someone SIGKILLs it), tether
says so at once - ``tether: keeper died; the job is no longer guarded`` - and
keeps going: ``tether run`` is a child subreaper, so the command (and what it
left) is re-parented to it; it waits for the command and returns the
command's own status, then ends what is left from here (``cgroup.kill`` of
the job's cgroup, or the processes that carry the job's cookie). Only if the
status cannot be had is the exit 123.
SIGINT/SIGTERM/SIGHUP sent *to tether* stop the job gracefully and tether
exits 128+N. A Ctrl+C typed at the terminal is different: the kernel sends it
to the whole foreground process group, the command included, so tether
lets the command decide (an agent's TUI may treat Ctrl+C as "cancel", not
"quit") and only follows the command's exit. The two are told apart by the
signal's ``si_code`` (SI_KERNEL for the terminal, SI_USER for kill()).
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading

from .errors import StatusLost, TetherError

SI_KERNEL = 0x80
EXIT_GUARD_LOST = 123  # the keeper died and the command's exit status went with it
KEEPER_DIED = "tether: keeper died; the job is no longer guarded"
# Windows has neither SIGHUP nor SIGQUIT: keep the ones this platform has.
_STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))
_KEYBOARD = tuple(getattr(signal, n) for n in ("SIGINT", "SIGQUIT") if hasattr(signal, n))
_WINDOWS = sys.platform == "win32"
ERROR_BAD_EXE_FORMAT = 193


def _fail(msg: str) -> int:
    print(f"tether: {msg}", file=sys.stderr)
    return 125


def _foreground_tty() -> int | None:
    """fd of our controlling terminal if we are its foreground process group."""
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():
                return fd
        except OSError:
            continue
    return None


def run_command(cmd: list[str], *, mechanism: str = "auto", require: str | None = None,
                grace: float = 2.0, state_dir: str | None = None, die_with_stdin: bool = False,
                verbose: bool = False) -> int:
    from .errors import JobRefused, TetherError
    from .job import Job

    if not _WINDOWS:
        # A child subreaper: should the job's keeper die, the command is
        # re-parented to us, and its exit status is still ours to report.
        from . import _prctl

        try:
            _prctl.set_subreaper()
        except OSError:
            pass  # not Linux: a keeper's death then loses the status (exit 123)
    try:
        job = Job(name=os.path.basename(cmd[0]), mechanism=mechanism, grace=grace, require=require,
                  state_dir=state_dir)
    except JobRefused as exc:
        return _fail(f"refusing to run unprotected: {exc}")
    except (TetherError, OSError, ValueError) as exc:
        return _fail(f"cannot create the job: {exc}")
    if verbose:
        print(f"tether: {job.guarantee}", file=sys.stderr)
    tty = None if _WINDOWS else _foreground_tty()
    try:
        try:
            proc = job.popen(cmd)
        except FileNotFoundError:
            job.close()
            print(f"tether: {cmd[0]}: command not found", file=sys.stderr)
            return 127
        except PermissionError:
            job.close()
            print(f"tether: {cmd[0]}: permission denied", file=sys.stderr)
            return 126
        except OSError as exc:
            job.close()
            if exc.errno == errno.ENOEXEC or getattr(exc, "winerror", None) == ERROR_BAD_EXE_FORMAT:
                print(f"tether: {cmd[0]}: cannot execute: {exc.strerror}", file=sys.stderr)
                return 126
            return _fail(f"cannot start {cmd[0]}: {exc}")
        except (TetherError, ValueError) as exc:
            job.close()
            return _fail(str(exc))
        handed_fg = False
        if tty is not None:
            # Mechanisms that give the command its own process group must hand it
            # the terminal, or it would be stopped by SIGTTIN on its first read.
            try:
                pg = os.getpgid(proc.pid)
                if pg != os.getpgrp():
                    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
                    os.tcsetpgrp(tty, pg)
                    signal.signal(signal.SIGTTOU, old)
                    handed_fg = True
            except OSError:
                pass
        if _WINDOWS:
            status = _supervise_windows(job, proc, die_with_stdin, grace)
        else:
            status = _supervise(job, proc, die_with_stdin, grace)
        if handed_fg:
            try:
                old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
                os.tcsetpgrp(tty, os.getpgrp())
                signal.signal(signal.SIGTTOU, old)
            except OSError:
                pass
        return status
    finally:
        try:
            job.terminate(grace)
        finally:
            job.close()


def _supervise(job, proc, die_with_stdin: bool, grace: float) -> int:
    # A stop signal tether was started with ignored (nohup, a non-interactive
    # shell's background job) stays ignored: blocked, it would be delivered.
    waited = {s for s in (*_STOP_SIGNALS, signal.SIGQUIT)
              if signal.getsignal(s) != signal.SIG_IGN} | {signal.SIGCHLD}
    signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    main_id = threading.get_ident()
    state = {"exited": False, "stdin_hup": False, "keeper_died": False}

    def wake() -> None:
        try:
            signal.pthread_kill(main_id, signal.SIGCHLD)
        except (OSError, ProcessLookupError):
            pass

    keeper_fd = getattr(job._backend, "keeper_pidfd", lambda: None)()
    child_fd = getattr(proc, "pidfd", None)

    def waiter() -> None:
        try:
            if keeper_fd is not None and child_fd is not None:
                import select

                poller = select.poll()
                poller.register(child_fd, select.POLLIN)
                poller.register(keeper_fd, select.POLLIN)
                while True:
                    ready = {fd for fd, _ in poller.poll()}
                    if keeper_fd in ready and not state["keeper_died"]:
                        state["keeper_died"] = True
                        print(KEEPER_DIED, file=sys.stderr, flush=True)
                        poller.unregister(keeper_fd)
                    if child_fd in ready:
                        break
            proc.wait()
        except StatusLost:
            pass  # returncode stays None: said below, with its own exit status
        finally:
            state["exited"] = True
            wake()

    threading.Thread(target=waiter, name="tether-wait", daemon=True).start()
    if die_with_stdin:
        threading.Thread(target=_watch_stdin, args=(state, wake), name="tether-stdin",
                         daemon=True).start()
    stop_signal = 0
    stopper: threading.Thread | None = None
    while True:
        if state["exited"]:
            break
        if state["stdin_hup"] and not stop_signal:
            stop_signal = signal.SIGHUP
            job.terminate(grace)
            continue
        info = signal.sigwaitinfo(waited)
        sig = info.si_signo
        if sig == signal.SIGCHLD:
            continue
        if sig in _KEYBOARD and info.si_code == SI_KERNEL:
            continue  # typed at the terminal: the command got it too and decides
        if sig == signal.SIGQUIT:
            continue
        if not stop_signal:
            stop_signal = sig
            # In a thread, so a second signal is still seen while the grace runs.
            stopper = threading.Thread(target=_terminate_quietly, args=(job, grace),
                                       name="tether-stop", daemon=True)
            stopper.start()
    if stopper is not None:
        # Let it finish before the caller's own terminate and close (and before
        # interpreter shutdown, which a daemon thread still writing would abort).
        stopper.join(grace + 10)
    rc = proc.returncode
    if stop_signal:
        return 128 + stop_signal
    if rc is None or getattr(proc, "tether_status_lost", False):
        print("tether: the command's exit status was lost with its keeper", file=sys.stderr)
        return EXIT_GUARD_LOST
    return 128 - rc if rc < 0 else rc


def _terminate_quietly(job, grace: float) -> None:
    try:
        job.terminate(grace)
    except (TetherError, OSError):  # the caller terminates and closes the job again
        pass


def _watch_stdin(state: dict, wake) -> None:
    """Notice the writer of stdin going away, without reading (the command owns stdin)."""
    import select

    poller = select.poll()
    poller.register(0, getattr(select, "POLLRDHUP", 0x2000) | select.POLLHUP)
    while True:
        events = poller.poll()
        for _fd, ev in events:
            if ev & (select.POLLHUP | select.POLLERR | select.POLLNVAL | getattr(select, "POLLRDHUP", 0x2000)):
                state["stdin_hup"] = True
                wake()
                return


def _supervise_windows(job, proc, die_with_stdin: bool, grace: float) -> int:
    """Windows: follow the command's exit; its exit code is tether's.

    Ctrl+C and Ctrl+Break reach every process attached to the console, the
    command included: tether ignores them and lets the command decide, as on
    POSIX. If tether itself is killed (Task Manager, TerminateProcess), the
    kernel ends the job: kill-on-close needs no code of ours to run.
    """
    import subprocess

    keyboard = [s for s in (signal.SIGINT, getattr(signal, "SIGBREAK", None)) if s is not None]
    old = {s: signal.signal(s, signal.SIG_IGN) for s in keyboard}
    try:
        stdin_handle = _stdin_pipe_handle() if die_with_stdin else None
        while stdin_handle is not None:
            try:
                return _exit_status_windows(proc.wait(0.1))
            except subprocess.TimeoutExpired:
                pass
            if _pipe_writer_gone(stdin_handle):
                job.terminate(grace)
                job.close()  # whatever terminate could not reach (it works from members())
                return 129  # as for SIGHUP on POSIX
        return _exit_status_windows(proc.wait())
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _exit_status_windows(rc: int) -> int:
    """Windows exit codes are 32-bit DWORDs (0xC000013A after Ctrl+C): pass the same
    bits to ExitProcess, which SystemExit only takes as a signed 32-bit int."""
    from .platform._winapi import signed_exit_code

    return signed_exit_code(rc)


def _stdin_pipe_handle():
    """The handle of stdin if it is a pipe (whose writer we can watch), else None."""
    try:
        import _winapi
        import msvcrt

        handle = msvcrt.get_osfhandle(0)
        _winapi.PeekNamedPipe(handle, 0)
        return handle
    except (OSError, ValueError, ImportError):
        return None


def _pipe_writer_gone(handle) -> bool:
    import _winapi

    try:
        _winapi.PeekNamedPipe(handle, 0)  # looks without reading: the command owns stdin
    except BrokenPipeError:
        return True
    except OSError:
        return False
    return False
