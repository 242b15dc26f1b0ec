"""Windows: one Job Object per job, with ``JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE``.

The kernel ends every process in the job when the last handle to it closes.
tether holds the only handle (never inheritable), so the job ends when the
owner ends, however it ends: normal exit, crash, ``TerminateProcess``,
Task Manager's "End task". What a member starts is a member; no member can
leave, because tether never sets ``BREAKAWAY_OK`` or ``SILENT_BREAKAWAY_OK``.

Placement before the first instruction, by one of three strategies:

``job_list`` (Windows 10+)
    ``CreateProcessW`` with ``PROC_THREAD_ATTRIBUTE_JOB_LIST`` in a
    ``STARTUPINFOEXW``: the process is created inside the job.
``suspended``
    ``CreateProcess(CREATE_SUSPENDED)`` -> ``AssignProcessToJobObject`` ->
    ``ResumeThread`` (whose previous suspend count must be 1).
``popen_suspended``
    the same from outside ``subprocess.Popen``, for a Python whose
    ``Popen._execute_child`` no longer calls ``_winapi.CreateProcess``:
    resume through a thread snapshot (or ``NtResumeProcess``).

The first two run *inside* ``subprocess.Popen``: ``popen()`` returns an
instance of a ``Popen`` subclass whose ``_execute_child`` is CPython's own
code with ``_winapi.CreateProcess`` replaced for that one call (a copy of the
function with its own globals; the ``subprocess`` module is not patched). So
pipes, ``communicate``, ``wait``, return codes, ``startupinfo`` and the
caller's ``creationflags`` behave exactly as with ``subprocess.Popen``.

If a child cannot be placed in the job it is terminated before it ran and the
spawn fails with ``JobRefused`` (the job gate). If the job itself could not be
created or configured, ``guarantee.disabled`` names the Win32 call and error
and every ``popen`` is refused: nothing is ever started outside the job.

Nested jobs (``options.parent`` is a ``WindowsJob``): every process started
in the inner job is placed in the outer job first and then in the inner one,
which makes the inner job a child of the outer in the kernel's job tree.
Closing the inner job ends its processes; closing the outer job (or its owner
dying) ends both.

Polite stop: Windows has no SIGTERM. ``signal_all`` sends ``CTRL_BREAK_EVENT``
to the console process groups that the caller asked for with
``creationflags=CREATE_NEW_PROCESS_GROUP`` (tether does not add that flag by
itself: a new process group ignores Ctrl+C from the console, which would
break interactive programs). Everything else is ended by
``TerminateJobObject`` in ``kill_all``.

Background jobs (``options.background``): no kill-on-close (they outlive the
owner on purpose), ``BELOW_NORMAL_PRIORITY_CLASS`` as a job limit, and a hard
CPU rate cap when ``cpu_percent`` is given. They are never nested: a process
in a kill-on-close parent would die with it. The same holds for a Job Object
that the owner itself runs in (``tether run``, pip's ``.exe`` launcher, a CI
runner, a terminal): what the owner starts is in that job too, and ends with
it. So when the owner is in a job, a background job's processes must leave
it: with ``CREATE_BREAKAWAY_FROM_JOB`` where the enclosing job allows that,
or by its ``SILENT_BREAKAWAY_OK``; each child is created suspended and, before
it runs, checked to be in no job at all (a job further out may keep it). If
no child can leave (``leave_enclosing_job``), the background job is refused:
``guarantee.disabled`` says why, and nothing is started that would die with
the enclosing job while its owner was told it would outlive it.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
import time
import weakref
from typing import Any, cast

from ..ending import KILL_BOUND
from ..errors import JobClosed, JobRefused
from . import _winapi as w
from .base import JOBOBJECT, Availability, Guarantee, JobBackend, JobOptions, with_cookie
from .windows_popen import (
    KILLED_EXIT_CODE,
    STRATEGIES,
    STRATEGY_JOB_LIST,
    STRATEGY_POPEN_SUSPENDED,
    STRATEGY_SUSPENDED,
    _AttributeList,
    _create_process,  # noqa: F401 - windows._create_process: tests pin its signature
    _job_popen_class,
    _kill_unplaced,
    _resume_all_threads,
    _SpawnContext,
    _tls,
)

MECHANISM = JOBOBJECT

# First guess of the pid-list size; grown on ERROR_MORE_DATA.
PID_LIST_INITIAL = 64

NOT_COVERED = (
    "processes started on the job's behalf by another parent (a service, the Task Scheduler, "
    "WMI Win32_Process.Create, an out-of-process COM server) are not in the job",
    "the polite stop (CTRL_BREAK_EVENT) reaches only console process groups created with "
    "CREATE_NEW_PROCESS_GROUP; every other member is ended by TerminateJobObject without warning",
)


# --- what this Windows offers ---------------------------------------------------
_job_list_supported: bool | None = None


def _check_job_list(api: w.Api) -> bool:
    """Whether PROC_THREAD_ATTRIBUTE_JOB_LIST is accepted (Windows 10+)."""
    global _job_list_supported
    if _job_list_supported is None:
        try:
            ver = sys.getwindowsversion()  # type: ignore[attr-defined]
            if ver.major < 10:
                _job_list_supported = False
            else:
                attrs = _AttributeList(api, 1)
                try:
                    attrs.add(w.PROC_THREAD_ATTRIBUTE_JOB_LIST, (w.HANDLE * 1)(None))
                    _job_list_supported = True
                finally:
                    attrs.delete()
        except (OSError, AttributeError):
            _job_list_supported = False
    return _job_list_supported


def _clone_available() -> bool:
    """Whether Popen._execute_child calls ``_winapi.CreateProcess`` (CPython 3.3+)."""
    code = getattr(cast(Any, subprocess.Popen)._execute_child, "__code__", None)
    return code is not None and "_winapi" in code.co_names and "CreateProcess" in code.co_names


def default_strategy(api: w.Api) -> str:
    if not _clone_available():
        return STRATEGY_POPEN_SUSPENDED
    return STRATEGY_JOB_LIST if _check_job_list(api) else STRATEGY_SUSPENDED


def probe() -> Availability:
    """Whether Job Objects with kill-on-close work here; never raises."""
    if sys.platform != "win32":
        return Availability(JOBOBJECT, False, f"not Windows (sys.platform is {sys.platform!r})")
    try:
        api = w.load()
        job = api.CreateJobObjectW(None, None)
        try:
            limits = w.extended_limits(kill_on_close=True)
            api.SetInformationJobObject(
                job, w.JobObjectExtendedLimitInformation,
                ctypes.byref(limits), ctypes.sizeof(limits),
            )
        finally:
            api.CloseHandle(job)
        ver = sys.getwindowsversion()  # type: ignore[attr-defined]
        detail = {
            "placement": default_strategy(api),
            "job_list": _check_job_list(api),
            "nested_jobs": (ver.major, ver.minor) >= (6, 2),
            "owner_in_job": _in_any_job(api),
            "windows_version": f"{ver.major}.{ver.minor}.{ver.build}",
        }
        return Availability(JOBOBJECT, True, "Job Object with KILL_ON_JOB_CLOSE", detail)
    except w.Win32Error as e:
        return Availability(JOBOBJECT, False, f"kill-on-close DISABLED: {e}", {"win32_error": e.code})
    except Exception as e:  # probe() must never raise
        return Availability(JOBOBJECT, False, f"kill-on-close DISABLED: {type(e).__name__}: {e}")


def _in_any_job(api: w.Api, process: int | None = None) -> bool | None:
    """Whether ``process`` (default: this one) is in any Job Object; None if unknown."""
    try:
        flag = w.BOOL(0)
        api.IsProcessInJob(api.GetCurrentProcess() if process is None else process, None,
                           ctypes.byref(flag))
        return bool(flag.value)
    except OSError:
        return None


# --- leaving the job this process runs in (background jobs) --------------------------
_leave_cache: tuple[int | None, str] | None = None


def leave_enclosing_job(api: w.Api) -> tuple[int | None, str]:
    """Whether a child of this process can be created outside every Job Object
    this process is in: ``(creation flag to add, the way's name)`` -
    ``CREATE_BREAKAWAY_FROM_JOB`` or ``silent breakaway`` (flag 0) - or
    ``(None, why not)``.

    Tried for real, once per process: a child is created suspended (it never
    runs) with ``CREATE_BREAKAWAY_FROM_JOB``, then without it (an enclosing
    job with ``SILENT_BREAKAWAY_OK`` lets every child go), and asked
    ``IsProcessInJob`` - which also catches a job further out that keeps the
    child although the nearest one let it go.
    """
    global _leave_cache
    if _leave_cache is None:
        _leave_cache = _probe_leave(api)
    return _leave_cache


def _probe_leave(api: w.Api) -> tuple[int | None, str]:
    seen = []
    for flag, name in ((w.CREATE_BREAKAWAY_FROM_JOB, "CREATE_BREAKAWAY_FROM_JOB"),
                       (0, "silent breakaway")):
        try:
            kept = _probe_child_in_job(api, flag)
        except w.Win32Error as e:
            seen.append(f"{name} refused (Win32 error {e.code})")
            continue
        if kept is False:
            return flag, name
        seen.append(f"with {name} the child stayed in a job" if kept
                    else f"{name}: IsProcessInJob failed")
    return None, "; ".join(seen)


def _probe_child_in_job(api: w.Api, extra_flags: int) -> bool | None:
    exe = sys.executable if sys.executable and os.path.isfile(sys.executable) else os.path.join(
        os.environ.get("SystemRoot", "C:\\Windows"), "System32", "cmd.exe")
    si = w.STARTUPINFOW()
    si.cb = ctypes.sizeof(si)
    pi = w.PROCESS_INFORMATION()
    cmd = ctypes.create_unicode_buffer(f'"{exe}"')
    api.CreateProcessW(exe, ctypes.addressof(cmd), None, None, False,
                       w.CREATE_SUSPENDED | w.CREATE_NO_WINDOW | extra_flags, None, None,
                       ctypes.byref(si), ctypes.byref(pi))
    try:
        return _in_any_job(api, int(pi.hProcess))
    finally:
        _kill_unplaced(api, int(pi.hProcess))
        for h in (pi.hProcess, pi.hThread):
            try:
                api.CloseHandle(h)
            except w.Win32Error:
                pass


def limits_readback_verdict(
    info: w.JOBOBJECT_EXTENDED_LIMIT_INFORMATION, kill_on_close: bool
) -> str | None:
    """Judge limits read back from the kernel: None if fine, else the problem.

    Wine answers a limit query with zeros; "nothing reported" is not "not set",
    so an all-zero answer is accepted (and traced as unverified).
    """
    flags = info.BasicLimitInformation.LimitFlags
    if bytes(info) == bytes(ctypes.sizeof(info)):
        return None
    if flags & w.FORBIDDEN_LIMIT_FLAGS:
        return f"limits read back with breakaway allowed (LimitFlags=0x{flags:x})"
    if kill_on_close and not flags & w.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE:
        return f"limits read back without KILL_ON_JOB_CLOSE (LimitFlags=0x{flags:x})"
    return None


# --- the backend -----------------------------------------------------------------
def guarantee(options: JobOptions | None = None, *, nested: bool = False,
              notes: tuple[str, ...] = (), enclosing: bool = False) -> Guarantee:
    """What a Job Object job guarantees: kernel-enforced kill-on-close and
    what it does not cover (``tether doctor`` prints this). A background job
    (``options.background``) has no kill-on-close: it outlives its owner.
    ``enclosing``: the owner runs inside a Job Object of its own (which ends
    the job too, should it end first)."""
    if options is not None and options.background:
        return Guarantee(
            mechanism=JOBOBJECT,
            kernel_enforced=False,
            transparent=True,
            ends_job="nobody: a background job outlives its owner on purpose "
            "(close() or kill_all() ends it with TerminateJobObject)",
            not_covered=NOT_COVERED + tuple(notes),
        )
    ends = "the Windows kernel, when the last handle to the Job Object closes"
    if nested:
        ends += " (this job's or its enclosing job's)"
    if enclosing:
        ends += "; also when the Job Object the owner runs in ends"
    return Guarantee(
        mechanism=JOBOBJECT,
        kernel_enforced=True,
        transparent=True,
        ends_job=ends,
        not_covered=NOT_COVERED + tuple(notes),
    )


class WindowsJob(JobBackend):
    """One Job Object; see the module docstring."""

    mechanism = JOBOBJECT

    def __init__(self, options: JobOptions, *, strategy: str | None = None) -> None:
        self.options = options
        self._lock = threading.RLock()
        self._closed = False
        self._handle: int | None = None
        self._disabled: str | None = None
        self._disabled_what = "kill-on-close DISABLED: "  # how a refused popen names it
        self._notes: list[str] = []
        self._groups: list[tuple[int, int]] = []  # (pid, our process handle) of CTRL_BREAK groups
        self._children: weakref.WeakSet[WindowsJob] = weakref.WeakSet()
        self._parent: WindowsJob | None = None
        self._limits: w.JOBOBJECT_EXTENDED_LIMIT_INFORMATION | None = None
        self._cpu_rate: w.JOBOBJECT_CPU_RATE_CONTROL_INFORMATION | None = None
        self._readback = "not read"
        self._api: w.Api | None = None
        self._enclosing: bool | None = None  # the owner runs in a Job Object of its own
        # Background jobs in such an owner: the flag each child is created with
        # to leave that job (0: it lets them go silently); None: no leaving needed.
        self._leave_flag: int | None = None
        self._leave_how = ""  # its name: CREATE_BREAKAWAY_FROM_JOB or silent breakaway
        self._leave_note: str | None = None
        self.strategy = strategy
        parent = options.parent
        if parent is not None and not isinstance(parent, WindowsJob):
            raise TypeError(f"a Windows job can only nest in a WindowsJob, not {type(parent).__name__}")
        if parent is not None and options.background:
            # A member of a kill-on-close parent dies with it; a background job
            # must outlive its owner, so it is not nested (and says so).
            self._notes.append("not nested in its parent job: a background job outlives it on purpose")
        elif parent is not None:
            if parent._closed:
                raise JobClosed(f"parent job {parent.options.name!r} is closed")
            self._parent = parent
        if strategy is not None and strategy not in STRATEGIES:
            raise ValueError(f"unknown placement strategy {strategy!r}")
        if options.cpu_percent is not None:
            w.cpu_rate_info(options.cpu_percent)  # validate early: ValueError
        self._open()
        if self._parent is not None:
            self._parent._children.add(self)

    # -- creation -------------------------------------------------------------------
    def _create_job_object(self, api: w.Api) -> int:
        """CreateJobObjectW; its own method so that a test can make it fail for real."""
        return api.CreateJobObjectW(None, None)

    def _open(self) -> None:
        try:
            api = self._api = w.load()
        except OSError as e:
            self._disabled = f"the Win32 API could not be loaded: {e}"
            return
        if self.strategy is None:
            self.strategy = default_strategy(api)
        background = self.options.background
        self._enclosing = _in_any_job(api)
        if background and self._enclosing is not False:
            flag, how = leave_enclosing_job(api)
            if flag is None:
                self._disabled_what = ""
                self._disabled = (
                    "background job refused: the owner runs inside a Job Object that keeps what "
                    f"it starts ({how}), so the job's processes would end with that Job Object "
                    "instead of outliving their owner")
                return
            self._leave_flag, self._leave_how = flag, how
            self._leave_note = f"its processes leave the Job Object the owner runs in ({how})"
            self._notes.append(self._leave_note)
        try:
            self._handle = self._create_job_object(api)
        except w.Win32Error as e:
            self._disabled = str(e)
            return
        low = self.options.low_priority or background
        limits = w.extended_limits(
            kill_on_close=not background,
            priority_class=w.BELOW_NORMAL_PRIORITY_CLASS if low else None,
        )
        try:
            self._set_info(api, w.JobObjectExtendedLimitInformation, limits)
            self._limits = limits
        except w.Win32Error as e:
            if not background:
                self._disabled = str(e)
                return
            self._notes.append(f"priority class not set: {e}")
        if self.options.cpu_percent is not None:
            rate = w.cpu_rate_info(self.options.cpu_percent)
            try:
                self._set_info(api, w.JobObjectCpuRateControlInformation, rate)
                self._cpu_rate = rate
            except w.Win32Error as e:
                self._notes.append(f"CPU cap of {self.options.cpu_percent}% not applied: {e}")
        self._verify_limits(api)

    def _set_info(self, api: w.Api, info_class: int, value: Any) -> None:
        """One SetInformationJobObject on this job (a Win32Error if refused)."""
        api.SetInformationJobObject(self._handle, info_class, ctypes.byref(value),
                                    ctypes.sizeof(value))

    def _verify_limits(self, api: w.Api) -> None:
        back = w.JOBOBJECT_EXTENDED_LIMIT_INFORMATION()
        ok = api.QueryInformationJobObject(
            self._handle, w.JobObjectExtendedLimitInformation,
            ctypes.byref(back), ctypes.sizeof(back), None,
        )
        if not ok:
            self._readback = f"query failed with Win32 error {ctypes.get_last_error()}"  # type: ignore[attr-defined]
            return
        if bytes(back) == bytes(ctypes.sizeof(back)):
            self._readback = "not reported (all zero, as under Wine)"
            return
        problem = limits_readback_verdict(back, kill_on_close=not self.options.background)
        if problem and not self.options.background:
            self._disabled = problem
        self._readback = problem or "verified"

    # -- the contract -----------------------------------------------------------------
    @property
    def guarantee(self) -> Guarantee:
        if self._disabled:
            return Guarantee(
                mechanism=JOBOBJECT,
                kernel_enforced=False,
                transparent=True,
                ends_job="nobody: the Job Object could not be set up, so nothing is started",
                not_covered=("every process: no job protects them",),
                disabled=self._disabled,
            )
        return guarantee(self.options, nested=self._parent is not None,
                         notes=tuple(self._notes),
                         enclosing=bool(self._enclosing) and not self.options.background)

    def _chain(self) -> list[int]:
        """Job handles a new member joins, outermost first (builds the nesting)."""
        handles = self._parent._chain() if self._parent is not None else []
        assert self._handle is not None
        return handles + [self._handle]

    def popen(self, args: Any, kwargs: dict[str, Any]) -> subprocess.Popen:
        with self._lock:
            if self._closed:
                raise JobClosed(f"job {self.options.name!r} is closed")
            if self._disabled:
                raise JobRefused(
                    f"job {self.options.name!r}: {self._disabled_what}{self._disabled}; "
                    "nothing is started outside a job", reason=self._disabled, mechanism=JOBOBJECT
                )
            if self._parent is not None and self._parent._closed:
                raise JobClosed(f"parent job {self._parent.options.name!r} is closed")
            kw = dict(kwargs)
            # The job's cookie first in the child's environment, as on POSIX:
            # what proves a process is this job's once the job is gone.
            env = kw.get("env")
            kw["env"] = with_cookie(dict(os.environ) if env is None else dict(env), self.options)
            flags = int(kw.get("creationflags") or 0)
            if self.strategy == STRATEGY_POPEN_SUSPENDED:
                proc = self._popen_suspended(args, kw, flags)
            else:
                # A child that must leave the owner's job is created suspended,
                # checked to be in no job, then placed (job_list would put it
                # in ours at once, with no moment to check).
                strategy = self.strategy or STRATEGY_SUSPENDED
                if self._leave_flag is not None:
                    strategy = STRATEGY_SUSPENDED
                cls = _job_popen_class()
                _tls.ctx = _SpawnContext(self, strategy)
                try:
                    proc = cls(args, **kw)
                finally:
                    _tls.ctx = None
            if flags & w.CREATE_NEW_PROCESS_GROUP:
                self._remember_group(proc)
            return proc

    def member_pids(self) -> list[int]:
        with self._lock:
            if self._closed or self._handle is None:
                return []
            return query_pids(self._require_api(), self._handle)

    def signal_all(self, sig: int) -> list[int]:
        """The polite step: CTRL_BREAK_EVENT to the live process groups the job created.

        Whatever ``sig`` is (SIGTERM, SIGINT, CTRL_BREAK_EVENT): Windows has one
        console event that can be aimed at a process group. Each target is a
        process whose handle we hold since its creation, so its pid cannot
        have been reused.
        """
        with self._lock:
            if self._closed or self._handle is None:
                return []
            api = self._require_api()
            sent = []
            for pid, handle in self._groups:
                if pid <= 0 or pid == os.getpid():  # 0 would be our own group
                    continue
                if api.WaitForSingleObject(handle, 0) != w.WAIT_TIMEOUT:
                    continue  # the group's first process has ended
                try:
                    api.GenerateConsoleCtrlEvent(w.CTRL_BREAK_EVENT, pid)
                except w.Win32Error:
                    continue  # no shared console: TerminateJobObject will do it
                sent.append(pid)
            return sent

    def polite(self, targets: list) -> list[int]:
        """``tether.ending``'s polite round here: CTRL_BREAK_EVENT to the
        groups that can receive it (Windows has no SIGTERM); [] when none can."""
        return self.signal_all(15)

    def kill_all(self, timeout: float | None = None) -> None:
        timeout = KILL_BOUND if timeout is None else timeout
        with self._lock:
            if self._closed or self._handle is None:
                return
            api = self._require_api()
            api.TerminateJobObject(self._handle, KILLED_EXIT_CODE)
            handle = self._handle
        _wait_empty(api, handle, timeout)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            for child in list(self._children):
                child.close()
            self._closed = True
            api, handle = self._api, self._handle
            self._handle = None
            try:
                if api is not None and handle is not None:
                    try:
                        api.TerminateJobObject(handle, KILLED_EXIT_CODE)
                        _wait_empty(api, handle, KILL_BOUND)
                    except w.Win32Error as e:
                        # Closing the last handle still ends a kill-on-close job.
                        self._notes.append(f"close: {e}")
                    finally:
                        api.CloseHandle(handle)
            finally:
                self._close_group_handles()

    def release(self) -> None:
        """Close tether's handle without ending the members (background jobs).

        For a kill-on-close job this ends the members anyway (the kernel does).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._api is not None and self._handle is not None:
                self._api.CloseHandle(self._handle)
            self._handle = None
            self._close_group_handles()

    def trace(self) -> dict[str, Any]:
        limits = None
        if self._limits is not None:
            basic = self._limits.BasicLimitInformation
            limits = {"LimitFlags": basic.LimitFlags, "PriorityClass": basic.PriorityClass}
        cpu = None
        if self._cpu_rate is not None:
            cpu = {"ControlFlags": self._cpu_rate.ControlFlags, "CpuRate": self._cpu_rate.CpuRate}
        return {
            "mechanism": JOBOBJECT,
            "job_handle": self._handle,
            "placement": self.strategy,
            "nested": self._parent is not None,
            # The owner runs inside a Job Object of its own (tether run, a
            # launcher, a CI runner): what it starts is in that job as well,
            # unless it leaves it ("leave": how a background job's processes do).
            "enclosing_job": self._enclosing,
            "leave": self._leave_note,
            "kill_on_close": not self.options.background,
            "limits": limits,
            "cpu_rate": cpu,
            "limits_readback": self._readback,
            "disabled": self._disabled,
            "notes": list(self._notes),
        }

    # -- helpers ------------------------------------------------------------------------
    def _require_api(self) -> w.Api:
        assert self._api is not None
        return self._api

    def _place(self, process_handle: int) -> None:
        """AssignProcessToJobObject along the chain, outermost first - after
        checking that a background job's child really left the owner's job."""
        api = self._require_api()
        if self._leave_flag is not None and _in_any_job(api, process_handle) is not False:
            raise w.Win32Error(f"the child stayed in the Job Object the owner runs in "
                               f"({self._leave_how})", w.ERROR_ACCESS_DENIED)
        for job in self._chain():
            api.AssignProcessToJobObject(job, process_handle)

    def _remember_group(self, proc: subprocess.Popen) -> None:
        api = self._require_api()
        # Forget the groups whose first process has ended, so that a long-lived
        # job does not collect handles.
        live = []
        for pid, handle in self._groups:
            if api.WaitForSingleObject(handle, 0) == w.WAIT_TIMEOUT:
                live.append((pid, handle))
            else:
                api.CloseHandle(handle)
        self._groups = live
        me = api.GetCurrentProcess()
        dup = w.HANDLE()
        try:
            api.DuplicateHandle(
                me, int(proc._handle), me, ctypes.byref(dup), 0, False, w.DUPLICATE_SAME_ACCESS  # type: ignore[attr-defined]
            )
        except w.Win32Error:
            return
        self._groups.append((proc.pid, int(dup.value or 0)))

    def _close_group_handles(self) -> None:
        api = self._api
        groups, self._groups = self._groups, []
        for _pid, handle in groups:
            if api is not None and handle:
                try:
                    api.CloseHandle(handle)
                except w.Win32Error:
                    pass

    def _popen_suspended(self, args: Any, kw: dict[str, Any], flags: int) -> subprocess.Popen:
        api = self._require_api()
        kw["creationflags"] = flags | w.CREATE_SUSPENDED | (self._leave_flag or 0)
        proc = subprocess.Popen(args, **kw)
        handle = int(proc._handle)  # type: ignore[attr-defined]
        try:
            self._place(handle)
            if not flags & w.CREATE_SUSPENDED:  # the caller's own CREATE_SUSPENDED is kept
                _resume_all_threads(api, handle, proc.pid)
        except BaseException as e:
            _kill_unplaced(api, handle)
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
            proc.wait(5)
            raise JobRefused(
                f"job {self.options.name!r}: the child could not be placed in the job "
                f"({e}); it was terminated before it ran", reason=str(e), mechanism=JOBOBJECT
            ) from e
        return proc


# --- pieces used by the backend ----------------------------------------------------
def query_pids(api: w.Api, job: int, initial: int = PID_LIST_INITIAL) -> list[int]:
    """Pids of the job's live members (JobObjectBasicProcessIdList).

    A short buffer answers ERROR_MORE_DATA with the assigned count filled in;
    the buffer grows and the query repeats (bounded: members may keep coming).
    """
    capacity = max(1, int(initial))
    for _ in range(16):
        buf = w.pid_list_buffer(capacity)
        ok = api.QueryInformationJobObject(
            job, w.JobObjectBasicProcessIdList, ctypes.byref(buf), ctypes.sizeof(buf), None
        )
        err = ctypes.get_last_error() if not ok else 0  # type: ignore[attr-defined]
        assigned, pids = w.parse_pid_list(buf)
        if ok:
            return pids
        if err != w.ERROR_MORE_DATA:
            raise w.Win32Error("QueryInformationJobObject(JobObjectBasicProcessIdList)", err)
        capacity = max(capacity * 2, assigned + 16)
    raise w.Win32Error("QueryInformationJobObject(JobObjectBasicProcessIdList)", w.ERROR_MORE_DATA)


def _wait_empty(api: w.Api, job: int, timeout: float) -> bool:
    """Poll until the job has no live member (bounded). True if it emptied."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        try:
            if not query_pids(api, job):
                return True
        except w.Win32Error:
            return False
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


Backend = WindowsJob
