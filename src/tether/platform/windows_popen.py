"""Creating a child inside a Job Object: the Windows ``Popen`` subclass.

A Windows process runs from the moment ``CreateProcess`` returns, and only
what it starts *after* it joined a job joins too. Assigning it afterwards
(``AssignProcessToJobObject``) leaves a window in which it runs - and may
start children - outside the job, and those children never join. So the
child is in the job before its first instruction: created in it
(``PROC_THREAD_ATTRIBUTE_JOB_LIST`` in a ``STARTUPINFOEXW``, Windows 10+), or
created suspended and resumed once assigned. The trap of the second way: the
resume must find a previous suspend count of exactly 1 (0 means it already
ran outside the job), and ``subprocess`` closes the thread handle the resume
needs as soon as ``CreateProcess`` returns - so inside ``Popen`` the resume
happens in our stand-in for ``_winapi.CreateProcess``, and from outside
(``popen_suspended``) the thread is found again through a snapshot.

Here: the strategies' names; that stand-in (``_create_process``), which
``WindowsJob.popen`` reaches through a per-thread context (``_tls``); the
``Popen`` subclass whose ``_execute_child`` is a copy of CPython's with the
stand-in as its ``_winapi.CreateProcess`` (``_job_popen_class``; the
``subprocess`` module itself is not patched); the attribute-list buffer; the
resume from outside; and the kill of a child that never ran. The backend
(``windows``) imports these back, so ``windows.X`` still names them; this
module imports nothing from it at run time.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import threading
import types
from typing import Any, cast

from ..errors import JobRefused
from . import _winapi as w
from .base import JOBOBJECT

TYPE_CHECKING = False
if TYPE_CHECKING:  # a hint only: windows imports this module
    from .windows import WindowsJob

# The placement strategies (the windows module's docstring describes them).
STRATEGY_JOB_LIST = "job_list"
STRATEGY_SUSPENDED = "suspended"
STRATEGY_POPEN_SUSPENDED = "popen_suspended"
STRATEGIES = (STRATEGY_JOB_LIST, STRATEGY_SUSPENDED, STRATEGY_POPEN_SUSPENDED)

# Exit code of processes ended by TerminateJobObject (as Popen.kill uses 1).
KILLED_EXIT_CODE = 1

# CreateProcessW errors after which a job_list spawn is retried with the
# suspended strategy, which tells "cannot place in the job" (JobRefused) from
# "cannot start the program" (the usual OSError).
_JOB_LIST_RETRY_ERRORS = frozenset(
    {w.ERROR_ACCESS_DENIED, w.ERROR_INVALID_HANDLE, w.ERROR_NOT_SUPPORTED, w.ERROR_INVALID_PARAMETER}
)


# --- a child created suspended: killed before it ran, or resumed from outside Popen -----
def _kill_unplaced(api: w.Api, process_handle: int) -> None:
    """TerminateProcess on a child that never ran (it is still suspended)."""
    try:
        api.TerminateProcess(process_handle, KILLED_EXIT_CODE)
        api.WaitForSingleObject(process_handle, 5000)
    except w.Win32Error:
        pass


def _resume_all_threads(api: w.Api, process_handle: int, pid: int) -> None:
    """Resume a CREATE_SUSPENDED process whose thread handle subprocess closed.

    The snapshot lists its threads: a fresh process has one, whose previous
    suspend count must be 1 (0 would mean it already ran outside the job).
    Without a snapshot, NtResumeProcess.
    """
    try:
        snap = api.CreateToolhelp32Snapshot(w.TH32CS_SNAPTHREAD, 0)
    except w.Win32Error:
        snap = None
    threads: list[int] = []
    if snap is not None:
        try:
            entry = w.THREADENTRY32()
            entry.dwSize = ctypes.sizeof(entry)
            more = api.Thread32First(snap, ctypes.byref(entry))
            while more:
                if entry.th32OwnerProcessID == pid:
                    threads.append(entry.th32ThreadID)
                more = api.Thread32Next(snap, ctypes.byref(entry))
        finally:
            api.CloseHandle(snap)
    if not threads:
        status = api.NtResumeProcess(process_handle)
        if status != 0:
            raise w.Win32Error("NtResumeProcess", status & 0xFFFFFFFF)
        return
    for tid in threads:
        th = api.OpenThread(w.THREAD_SUSPEND_RESUME, False, tid)
        try:
            previous = api.ResumeThread(th)
        finally:
            api.CloseHandle(th)
        if previous != 1:
            raise w.Win32Error(f"ResumeThread (previous suspend count {previous}, expected 1)", 0)


class _AttributeList:
    """A PROC_THREAD_ATTRIBUTE_LIST buffer (Initialize/Delete around it)."""

    def __init__(self, api: w.Api, count: int) -> None:
        self._api = api
        size = w.SIZE_T(0)
        api.InitializeProcThreadAttributeList(None, count, 0, ctypes.byref(size))
        self.buffer = (ctypes.c_byte * max(size.value, 1))()
        self.address = ctypes.addressof(self.buffer)
        if not api.InitializeProcThreadAttributeList(self.address, count, 0, ctypes.byref(size)):
            raise w.Win32Error("InitializeProcThreadAttributeList", ctypes.get_last_error())  # type: ignore[attr-defined]
        self._keep: list[Any] = []  # values must outlive the list

    def add(self, attribute: int, value: ctypes.Array) -> None:
        self._keep.append(value)
        self._api.UpdateProcThreadAttribute(
            self.address, 0, attribute, ctypes.byref(value), ctypes.sizeof(value), None, None
        )

    def delete(self) -> None:
        self._api.DeleteProcThreadAttributeList(self.address)


# --- spawning inside subprocess.Popen ------------------------------------------------
class _SpawnContext:
    def __init__(self, job: WindowsJob, strategy: str) -> None:
        self.job = job
        self.strategy = strategy


_tls = threading.local()


def _create_process(
    application_name: str | None,
    command_line: str | None,
    process_attributes: Any,
    thread_attributes: Any,
    inherit_handles: int,
    creation_flags: int,
    env_mapping: Any,
    current_directory: str | None,
    startup_info: Any,
) -> tuple[int, int, int, int]:
    """Stands in for ``_winapi.CreateProcess`` inside our Popen subclass."""
    ctx: _SpawnContext | None = getattr(_tls, "ctx", None)
    if ctx is None:  # not reached through WindowsJob.popen: behave as the real one
        import _winapi  # type: ignore[import-not-found]

        return _winapi.CreateProcess(  # type: ignore[attr-defined]  # stub is win32-only; mypy checks as Linux
            application_name, command_line, process_attributes, thread_attributes,
            inherit_handles, creation_flags, env_mapping, current_directory, startup_info,
        )
    args = (application_name, command_line, inherit_handles, creation_flags, env_mapping,
            current_directory, startup_info)
    if ctx.strategy == STRATEGY_JOB_LIST:
        try:
            return _create_with_job_list(ctx.job, *args)
        except OSError as e:
            if getattr(e, "winerror", None) not in _JOB_LIST_RETRY_ERRORS:
                raise
            # Could be the job or the program: the suspended path tells them apart.
    return _create_suspended_then_assign(ctx.job, *args)


def _startupinfo_fields(si: Any) -> tuple[int, int, Any, Any, Any, list[int]]:
    attrs = getattr(si, "lpAttributeList", None) or {}
    handles = [int(h) for h in (attrs.get("handle_list") or [])]
    return (
        int(getattr(si, "dwFlags", 0) or 0),
        int(getattr(si, "wShowWindow", 0) or 0),
        getattr(si, "hStdInput", None),
        getattr(si, "hStdOutput", None),
        getattr(si, "hStdError", None),
        handles,
    )


def _create_with_job_list(
    job: WindowsJob,
    application_name: str | None,
    command_line: str | None,
    inherit_handles: int,
    creation_flags: int,
    env_mapping: Any,
    current_directory: str | None,
    startup_info: Any,
) -> tuple[int, int, int, int]:
    api = job._require_api()
    sys.audit("_winapi.CreateProcess", application_name, command_line, current_directory)
    dw_flags, show, h_in, h_out, h_err, handle_list = _startupinfo_fields(startup_info)
    siex = w.STARTUPINFOEXW()
    siex.StartupInfo.cb = ctypes.sizeof(siex)
    siex.StartupInfo.dwFlags = dw_flags
    siex.StartupInfo.wShowWindow = show
    siex.StartupInfo.hStdInput = int(h_in) if h_in else None
    siex.StartupInfo.hStdOutput = int(h_out) if h_out else None
    siex.StartupInfo.hStdError = int(h_err) if h_err else None
    env_block = w.environment_block(env_mapping) if env_mapping is not None else None
    flags = creation_flags | w.EXTENDED_STARTUPINFO_PRESENT
    if env_block is not None:
        flags |= w.CREATE_UNICODE_ENVIRONMENT
    cmd = ctypes.create_unicode_buffer(command_line) if command_line is not None else None
    attrs = _AttributeList(api, 2 if handle_list else 1)
    try:
        chain = job._chain()
        attrs.add(w.PROC_THREAD_ATTRIBUTE_JOB_LIST, (w.HANDLE * len(chain))(*chain))
        if handle_list:
            attrs.add(w.PROC_THREAD_ATTRIBUTE_HANDLE_LIST, (w.HANDLE * len(handle_list))(*handle_list))
        siex.lpAttributeList = attrs.address
        pi = w.PROCESS_INFORMATION()
        try:
            api.CreateProcessW(
                application_name,
                ctypes.addressof(cmd) if cmd is not None else None,
                None,
                None,
                bool(inherit_handles),
                flags,
                ctypes.addressof(env_block) if env_block is not None else None,
                current_directory,
                ctypes.byref(siex.StartupInfo),
                ctypes.byref(pi),
            )
        except w.Win32Error as e:
            # The plain OSError subprocess users expect (FileNotFoundError for
            # error 2...), as _winapi.CreateProcess raises it.
            raise _oserror_from_winerror(e.code) from None
    finally:
        attrs.delete()
    return int(pi.hProcess), int(pi.hThread), int(pi.dwProcessId), int(pi.dwThreadId)


def _oserror_from_winerror(code: int) -> OSError:
    make = getattr(ctypes, "WinError", None)
    if make is not None:
        return make(code)
    return OSError(None, f"Win32 error {code}", None, code)


def _create_suspended_then_assign(
    job: WindowsJob,
    application_name: str | None,
    command_line: str | None,
    inherit_handles: int,
    creation_flags: int,
    env_mapping: Any,
    current_directory: str | None,
    startup_info: Any,
) -> tuple[int, int, int, int]:
    import _winapi  # type: ignore[import-not-found]

    api = job._require_api()
    hp, ht, pid, tid = _winapi.CreateProcess(  # type: ignore[attr-defined]  # stub is win32-only; mypy checks as Linux
        application_name, command_line, None, None, inherit_handles,
        creation_flags | w.CREATE_SUSPENDED | (job._leave_flag or 0), env_mapping,
        current_directory, startup_info,
    )
    try:
        job._place(hp)
        if not creation_flags & w.CREATE_SUSPENDED:  # the caller's own flag is kept
            previous = api.ResumeThread(ht)
            if previous != 1:
                raise w.Win32Error(f"ResumeThread (previous suspend count {previous}, expected 1)", 0)
    except BaseException as e:
        _kill_unplaced(api, hp)
        for h in (hp, ht):
            try:
                api.CloseHandle(h)
            except w.Win32Error:
                pass
        raise JobRefused(
            f"job {job.options.name!r}: the child could not be placed in the job ({e}); "
            "it was terminated before it ran", reason=str(e), mechanism=JOBOBJECT
        ) from e
    return hp, ht, pid, tid


class _WinapiProxy:
    """``_winapi`` as seen by our copy of ``Popen._execute_child``."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.CreateProcess = _create_process

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


_popen_class: type[subprocess.Popen] | None = None


def _job_popen_class() -> type[subprocess.Popen]:
    """A Popen subclass whose _execute_child is CPython's, with our CreateProcess."""
    global _popen_class
    if _popen_class is None:
        import _winapi  # type: ignore[import-not-found]

        original = cast(Any, subprocess.Popen)._execute_child
        namespace = dict(vars(subprocess))
        namespace["_winapi"] = _WinapiProxy(_winapi)
        execute_child = types.FunctionType(
            original.__code__, namespace, original.__name__, original.__defaults__,
            original.__closure__,
        )
        execute_child.__kwdefaults__ = original.__kwdefaults__
        execute_child.__qualname__ = original.__qualname__
        _popen_class = type(
            "Popen", (subprocess.Popen,),
            {"_execute_child": execute_child, "__module__": __name__,
             "__doc__": "subprocess.Popen whose child is created inside a tether job."},
        )
    return _popen_class
