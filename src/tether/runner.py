"""`tether run`: one command in a job, with the terminal and signals handled.

Exit status: the command's; 128+N if it died of signal N; 127 command not
found; 126 not executable; 125 tether's own failure (one line on stderr).
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

SI_KERNEL = 0x80
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_KEYBOARD = (signal.SIGINT, signal.SIGQUIT)


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

    try:
        job = Job(name=os.path.basename(cmd[0]), mechanism=mechanism, grace=grace, require=require,
                  state_dir=state_dir)
    except JobRefused as exc:
        return _fail(f"refusing to run unprotected: {exc}")
    except (TetherError, OSError, ValueError) as exc:
        return _fail(f"cannot create the job: {exc}")
    if verbose:
        print(f"tether: {job.guarantee}", file=sys.stderr)
    tty = _foreground_tty()
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
            if exc.errno == errno.ENOEXEC:
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
    waited = set(_STOP_SIGNALS) | {signal.SIGQUIT, signal.SIGCHLD}
    signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    main_id = threading.get_ident()
    state = {"exited": False, "stdin_hup": False}

    def wake() -> None:
        try:
            signal.pthread_kill(main_id, signal.SIGCHLD)
        except (OSError, ProcessLookupError):
            pass

    def waiter() -> None:
        try:
            proc.wait()
        finally:
            state["exited"] = True
            wake()

    threading.Thread(target=waiter, name="tether-wait", daemon=True).start()
    if die_with_stdin:
        threading.Thread(target=_watch_stdin, args=(state, wake), name="tether-stdin",
                         daemon=True).start()
    stop_signal = 0
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
            threading.Thread(target=job.terminate, args=(grace,), daemon=True).start()
    rc = proc.returncode
    if stop_signal:
        return 128 + stop_signal
    if rc is None:
        return 125
    return 128 - rc if rc < 0 else rc


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
