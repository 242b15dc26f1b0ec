"""`tether run`: one command in a job, with the terminal and signals handled.

``--die-with-parent``: the job also ends (at once, no grace: nobody is left
to be graceful for) when the process that started ``tether run`` dies, watched
by pidfd from the start (the caller watch of the one-command path,
``oneshot.watch_caller``); ``--lifeline FD``: when FD, a pipe or socket whose
other end the app holds, reaches EOF or hangs up. stdin is not watched by
either. The job is then ended at once (no grace) and tether exits 137.

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

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .runner_session import SessionArgs

from .errors import StatusLost, TetherError  # noqa: E402

SI_KERNEL = 0x80
from ._constants import EXIT_GUARD_LOST  # noqa: E402 - the keeper died and the exit status with it
from ._constants import EXIT_INTERNAL as EXIT_TETHER_FAILURE  # noqa: E402 - shared with C

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


def check_lifeline(fd: int) -> str | None:
    """Why FD cannot be a lifeline (one line), or None: it must be an open pipe
    or socket above stdio (the same words as the native ``tether run``)."""
    import stat

    if fd < 3:
        return f"--lifeline {fd}: expected a file descriptor number of 3 or more; nothing was run"
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return f"--lifeline {fd}: not an open file descriptor; nothing was run"
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        return f"--lifeline {fd}: not a pipe or socket; nothing was run"
    return None


class _Lifelines:
    """What ``--die-with-parent`` and ``--lifeline`` watch: fds that poll
    readable when the job must end (POSIX), or handles (Windows)."""

    def __init__(self) -> None:
        self.parent_fd: int | None = None  # a pidfd (Linux) or kqueue (BSD, macOS)
        self.lifeline: int | None = None
        self.win_parent = None  # Windows: a SYNCHRONIZE handle of the parent
        self.win_pipe = None

    def any(self) -> bool:
        return (self.parent_fd is not None or self.lifeline is not None or self.win_parent is not None
                or self.win_pipe is not None)


def _watch_parent(lines: _Lifelines) -> str | None:
    """Start watching the process that started us; why not (one line) if it is gone."""
    gone = "--die-with-parent: the process that started tether run is already gone; nothing was run"
    if _WINDOWS:
        handle = _windows_parent_handle()
        if handle is None:
            return gone
        lines.win_parent = handle
        return None
    from .keeper import oneshot

    if hasattr(os, "pidfd_open"):
        caller = oneshot.watch_caller()
        if caller is None:
            return gone
        lines.parent_fd = caller[2]
        return None
    ppid = os.getppid()  # BSD, macOS: a kqueue's NOTE_EXIT
    import select

    if ppid <= 1 or not hasattr(select, "kqueue"):
        return gone if ppid <= 1 else "--die-with-parent: not supported on this platform; nothing was run"
    kq = select.kqueue()
    try:
        kq.control([select.kevent(ppid, select.KQ_FILTER_PROC,  # type: ignore[attr-defined]  # BSD-only stub
                                  select.KQ_EV_ADD, select.KQ_NOTE_EXIT)], 0, 0)  # type: ignore[attr-defined]
    except OSError:
        kq.close()
        return gone
    if os.getppid() != ppid:
        kq.close()
        return gone
    lines.parent_fd = kq.fileno()
    lines._kq = kq  # type: ignore[attr-defined]  # kept open with its fd
    return None


def run_command(cmd: list[str], *, mechanism: str = "auto", require: str | None = None,
                grace: float = 2.0, state_dir: str | None = None, die_with_stdin: bool = False,
                verbose: bool = False, die_with_parent: bool = False,
                lifeline: int | None = None, session: SessionArgs | None = None) -> int:
    from .errors import JobRefused, TetherError
    from .job import Job
    from .runner_session import _SessionRun

    lines = _Lifelines()
    if lifeline is not None:
        why = _check_lifeline_windows(lifeline, lines) if _WINDOWS else check_lifeline(lifeline)
        if why:
            return _fail(why)
        if not _WINDOWS:
            os.set_inheritable(lifeline, False)  # the keeper's to watch, never the command's
            lines.lifeline = lifeline
    if die_with_parent:
        why = _watch_parent(lines)
        if why:
            return _fail(why)

    if not _WINDOWS:
        # A child subreaper: should the job's keeper die, the command is
        # re-parented to us, and its exit status is still ours to report.
        from . import _prctl

        try:
            _prctl.set_subreaper()
        except OSError:
            pass  # not Linux: a keeper's death then loses the status (exit 123)
    held: _SessionRun | None = None
    end = None
    status = EXIT_TETHER_FAILURE
    try:
        if session is not None:
            held = _SessionRun(session, mechanism=mechanism, grace=grace, require=require)
            refused = held.open()
            if refused is not None:
                return refused
            assert held.session is not None
            job, end = held.session.job, held.end
        else:
            job = Job(name=os.path.basename(cmd[0]), mechanism=mechanism, grace=grace,
                      require=require, state_dir=state_dir)
    except JobRefused as exc:
        return _fail(f"refusing to run unprotected: {exc}")
    except (TetherError, OSError, ValueError) as exc:
        if held is not None:
            held.abandon()
        return _fail(f"cannot create the job: {exc}")
    if verbose:
        print(f"tether: {job.guarantee}", file=sys.stderr)
    tty = None if _WINDOWS else _foreground_tty()
    # A stop signal that comes once the command runs but before _supervise
    # blocks them (its records are being written meanwhile) is kept for it,
    # not taken by the default action (dying by it, the job unreported).
    early = [] if _WINDOWS else _keep_early_stops()
    try:
        try:
            proc = held.session.popen(cmd, label=session.label) if held and session else job.popen(cmd)
        except FileNotFoundError:
            job.close()
            print(f"tether: {cmd[0]}: command not found", file=sys.stderr)
            status = 127  # (the report's "exit" too)
            return status
        except PermissionError:
            job.close()
            print(f"tether: {cmd[0]}: permission denied", file=sys.stderr)
            status = 126
            return status
        except OSError as exc:
            job.close()
            if exc.errno == errno.ENOEXEC or getattr(exc, "winerror", None) == ERROR_BAD_EXE_FORMAT:
                print(f"tether: {cmd[0]}: cannot execute: {exc.strerror}", file=sys.stderr)
                status = 126
                return status
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
            status = _supervise_windows(job, proc, die_with_stdin, grace, lines, end)
        else:
            status = _supervise(job, proc, die_with_stdin, grace, lines, end, early)
        if handed_fg and tty is not None:
            try:
                old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
                os.tcsetpgrp(tty, os.getpgrp())
                signal.signal(signal.SIGTTOU, old)
            except OSError:
                pass
        return status
    finally:
        if held is not None:
            held.finish(status)
        else:
            try:
                job.terminate(grace)
            finally:
                job.close()


#: The stop signals kept when they come before _supervise waits for them
#: (SIGINT is not among them: typed at a terminal it is the command's).
_EARLY = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


def _reason(name: str) -> str:
    """A stop reason in the host layer's words (tether.stops), loaded only
    when a stop happens: the run's start does not pay for that module."""
    from . import stops

    return str(getattr(stops, name))


def _keep_early_stops() -> list[int]:
    """Note SIGTERM/SIGHUP in the returned list until _supervise blocks them
    (a handler, not a blocked mask: a child forked meanwhile must not start
    with them blocked; exec resets a handler). Ignored ones stay ignored.
    The list starts with SIGINT when one came whose KeyboardInterrupt Python
    lost (cli.main: catch_interrupts); taken, it is forgotten."""
    from ._sigwatch import INTERRUPTS

    early: list[int] = [signal.SIGINT] if INTERRUPTS else []
    INTERRUPTS.clear()
    for s in _EARLY:
        if signal.getsignal(s) != signal.SIG_IGN:
            signal.signal(s, lambda sig, _frame: early.append(sig))
    return early


def _supervise(job, proc, die_with_stdin: bool, grace: float, lines: _Lifelines, end=None,
               early: list[int] | None = None) -> int:
    """Wait for the command; ``end(reason, grace)`` ends the job on a stop
    (reason in the host layer's words; default: ``job.terminate``)."""
    if end is None:
        def end(_why: str, g: float) -> None:
            job.terminate(g)
    # A stop signal tether was started with ignored (nohup, a non-interactive
    # shell's background job) stays ignored: blocked, it would be delivered.
    waited = {s for s in (*_STOP_SIGNALS, signal.SIGQUIT)
              if signal.getsignal(s) != signal.SIG_IGN} | {signal.SIGCHLD}
    signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    main_id = threading.get_ident()
    state = {"exited": False, "stdin_hup": False, "keeper_died": False, "parent_gone": False}

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
    if lines.any():
        threading.Thread(target=_watch_lifelines, args=(lines, state, wake), name="tether-parent",
                         daemon=True).start()
    stop_signal = 0
    stopper: threading.Thread | None = None
    if early:  # came before the mask above: as if sigwaitinfo had returned it
        stop_signal = early[0]
        stopper = threading.Thread(target=_terminate_quietly, args=(end, _reason("USER_REQUEST"), grace),
                                   name="tether-stop", daemon=True)
        stopper.start()
    while True:
        if state["exited"]:
            break
        if state["parent_gone"] and stop_signal != signal.SIGKILL:
            stop_signal = signal.SIGKILL  # the app is gone: nobody to be graceful for
            end(_reason("APP_EXIT"), 0)
            continue
        if state["stdin_hup"] and not stop_signal:
            stop_signal = signal.SIGHUP
            end(_reason("APP_EXIT"), grace)
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
            stopper = threading.Thread(target=_terminate_quietly, args=(end, _reason("USER_REQUEST"), grace),
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


def _terminate_quietly(end, why: str, grace: float) -> None:
    try:
        end(why, grace)
    except (TetherError, OSError):  # the caller terminates and closes the job again
        pass


def _lifeline_gone(fd: int, ev: int) -> bool:
    """A lifeline's poll event: gone at hangup, error or EOF; what the app
    writes into it means nothing and is read away (never more than is there)."""
    import fcntl
    import select
    import termios

    if ev & (select.POLLHUP | select.POLLERR | select.POLLNVAL | getattr(select, "POLLRDHUP", 0x2000)):
        return True
    if not ev & select.POLLIN:
        return False
    import array

    n = array.array("i", [0])
    try:
        fcntl.ioctl(fd, termios.FIONREAD, n, True)
        if n[0] <= 0:
            return True  # readable with nothing to read: EOF
        return not os.read(fd, min(n[0], 4096))
    except InterruptedError:
        return False
    except OSError:
        return True


def _watch_lifelines(lines: _Lifelines, state: dict, wake) -> None:
    import select

    poller = select.poll()
    if lines.parent_fd is not None:
        poller.register(lines.parent_fd, select.POLLIN)
    if lines.lifeline is not None:
        poller.register(lines.lifeline, select.POLLIN | getattr(select, "POLLRDHUP", 0x2000))
    while not state["exited"]:
        for fd, ev in poller.poll():
            if fd == lines.parent_fd or _lifeline_gone(fd, ev):
                state["parent_gone"] = True
                wake()
                return


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


def _supervise_windows(job, proc, die_with_stdin: bool, grace: float, lines: _Lifelines,
                       end=None) -> int:
    """Windows: follow the command's exit; its exit code is tether's.

    Ctrl+C and Ctrl+Break reach every process attached to the console, the
    command included: tether ignores them and lets the command decide, as on
    POSIX. If tether itself is killed (Task Manager, TerminateProcess), the
    kernel ends the job: kill-on-close needs no code of ours to run.
    """
    import subprocess

    if end is None:
        def end(_why: str, g: float) -> None:
            job.terminate(g)
    keyboard = [s for s in (signal.SIGINT, getattr(signal, "SIGBREAK", None)) if s is not None]
    old = {s: signal.signal(s, signal.SIG_IGN) for s in keyboard}
    try:
        stdin_handle = _stdin_pipe_handle() if die_with_stdin else None
        while stdin_handle is not None or lines.any():
            try:
                return _exit_status_windows(proc.wait(0.1))
            except subprocess.TimeoutExpired:
                pass
            if stdin_handle is not None and _pipe_writer_gone(stdin_handle):
                end(_reason("APP_EXIT"), grace)
                job.close()  # whatever terminate could not reach (it works from members())
                return 129  # as for SIGHUP on POSIX
            if _windows_gone(lines):
                end(_reason("APP_EXIT"), 0)  # the app is gone: nobody to be graceful for
                job.close()
                return 128 + 9  # as for SIGKILL on POSIX
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

        handle = msvcrt.get_osfhandle(0)  # type: ignore[attr-defined]  # win32-only stub; mypy checks as Linux
        _winapi.PeekNamedPipe(handle, 0)  # type: ignore[attr-defined]  # win32-only stub
        return handle
    except (OSError, ValueError, ImportError):
        return None


def _pipe_writer_gone(handle) -> bool:
    import _winapi

    try:
        _winapi.PeekNamedPipe(handle, 0)  # type: ignore[attr-defined]  # win32-only stub; looks without reading: the command owns stdin
    except BrokenPipeError:
        return True
    except OSError:
        return False
    return False


def _windows_parent_handle():
    """A SYNCHRONIZE handle of the process that started us, checked to be
    older than we are (a reused pid would be younger); None if it is gone."""
    import ctypes
    from ctypes import wintypes

    k32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]  # win32-only
    k32.OpenProcess.restype = wintypes.HANDLE
    k32.OpenProcess.argtypes = [wintypes.DWORD, wintypes.BOOL, wintypes.DWORD]
    k32.GetCurrentProcess.restype = wintypes.HANDLE
    k32.GetProcessTimes.argtypes = [wintypes.HANDLE] + [ctypes.POINTER(wintypes.FILETIME)] * 4
    k32.WaitForSingleObject.argtypes = [wintypes.HANDLE, wintypes.DWORD]
    k32.WaitForSingleObject.restype = wintypes.DWORD
    synchronize, query_limited = 0x00100000, 0x1000
    k32.CloseHandle.argtypes = [wintypes.HANDLE]
    ppid = _parent_pid_windows(k32.GetCurrentProcess())
    if not ppid:
        return None
    handle = k32.OpenProcess(synchronize | query_limited, False, ppid)
    if not handle:
        return None
    if _is_our_launcher(k32, handle):
        # pip's tether.exe started this interpreter and waits for it: the app
        # is the launcher's parent (the launcher itself outlives the app)
        grand = _parent_pid_windows(handle)
        k32.CloseHandle(handle)
        handle = k32.OpenProcess(synchronize | query_limited, False, grand) if grand else None
        if not handle:
            return None

    def created(h) -> int:
        t = [wintypes.FILETIME() for _ in range(4)]
        if not k32.GetProcessTimes(h, *[ctypes.byref(x) for x in t]):
            return 0
        return (t[0].dwHighDateTime << 32) | t[0].dwLowDateTime

    if k32.WaitForSingleObject(handle, 0) == 0 or not 0 < created(handle) <= created(k32.GetCurrentProcess()):
        k32.CloseHandle(handle)
        return None
    return handle


def _parent_pid_windows(handle) -> int:
    """The pid that created the process of ``handle`` (0 if unknown). Not
    ``os.getppid()``: CPython 3.12 takes it from PssCaptureSnapshot, which
    Wine does not implement (the process aborts)."""
    import ctypes
    from ctypes import wintypes

    class _Basic(ctypes.Structure):  # PROCESS_BASIC_INFORMATION
        _fields_ = [("ExitStatus", ctypes.c_long), ("PebBaseAddress", ctypes.c_void_p),
                    ("AffinityMask", ctypes.c_size_t), ("BasePriority", ctypes.c_long),
                    ("UniqueProcessId", ctypes.c_size_t),
                    ("InheritedFromUniqueProcessId", ctypes.c_size_t)]

    ntdll = ctypes.WinDLL("ntdll")  # type: ignore[attr-defined]  # win32-only
    ntdll.NtQueryInformationProcess.argtypes = [wintypes.HANDLE, ctypes.c_int, ctypes.c_void_p,
                                                wintypes.ULONG, ctypes.POINTER(wintypes.ULONG)]
    ntdll.NtQueryInformationProcess.restype = ctypes.c_long
    info = _Basic()
    if ntdll.NtQueryInformationProcess(handle, 0, ctypes.byref(info), ctypes.sizeof(info), None):
        return 0
    return int(info.InheritedFromUniqueProcessId)


def _is_our_launcher(k32, handle) -> bool:
    """Whether ``handle`` is the console-script launcher (``tether.exe``) that runs us."""
    import ctypes
    from ctypes import wintypes

    if not sys.argv or not sys.argv[0]:
        return False
    buf = ctypes.create_unicode_buffer(32768)
    size = wintypes.DWORD(len(buf))
    k32.QueryFullProcessImageNameW.argtypes = [wintypes.HANDLE, wintypes.DWORD, wintypes.LPWSTR,
                                               ctypes.POINTER(wintypes.DWORD)]
    if not k32.QueryFullProcessImageNameW(handle, 0, buf, ctypes.byref(size)):
        return False
    def norm(path: str) -> str:  # sys.argv[0] is the launcher's path, with or without ".exe"
        path = os.path.normcase(os.path.abspath(path))
        return path[:-4] if path.endswith(".exe") else path

    return norm(buf.value) == norm(sys.argv[0])


def _check_lifeline_windows(fd: int, lines: _Lifelines) -> str | None:
    """Windows: FD (a C runtime fd, as Node passes stdio[3]) must be a pipe."""
    try:
        import msvcrt

        handle = msvcrt.get_osfhandle(fd)  # type: ignore[attr-defined]  # win32-only stub
    except OSError:
        return f"--lifeline {fd}: not an open file descriptor; nothing was run"
    if fd < 3:
        return f"--lifeline {fd}: expected a file descriptor number of 3 or more; nothing was run"
    import _winapi

    try:
        _winapi.PeekNamedPipe(handle, 0)  # type: ignore[attr-defined]  # win32-only stub
    except BrokenPipeError:
        pass  # a pipe, its writer gone already: seen as gone at the first look
    except OSError:
        return f"--lifeline {fd}: not a pipe or socket; nothing was run"
    lines.win_pipe = handle
    return None


def _windows_gone(lines: _Lifelines) -> bool:
    if lines.win_parent is not None:
        import ctypes
        from ctypes import wintypes

        k32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]  # win32-only
        k32.WaitForSingleObject.argtypes = [wintypes.HANDLE, wintypes.DWORD]
        k32.WaitForSingleObject.restype = wintypes.DWORD
        if k32.WaitForSingleObject(lines.win_parent, 0) == 0:  # WAIT_OBJECT_0: it exited
            return True
    return lines.win_pipe is not None and _pipe_writer_gone(lines.win_pipe)
