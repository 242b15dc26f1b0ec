"""ctypes declarations of the Win32 calls the Job Object backend makes.

Everything here imports on any platform: struct layouts use explicit
fixed-width ctypes types (``ctypes.wintypes.DWORD`` is ``c_ulong``, 8 bytes on
Linux but 4 on Windows, and ``c_wchar`` is 4 bytes on Linux), so the x64
layouts can be checked by tests on a Linux machine. DLLs are only bound by
``load()``, which works on Windows only.

Every prototype names its argument types: a Structure passed where ctypes
knows nothing of the argument is pushed *by value* and the call silently
reads garbage, so struct arguments are declared ``POINTER(...)`` or
``LPVOID`` (which only accepts pointers and ``byref``), and the wrappers pass
``ctypes.byref``.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Sequence
from typing import Any

# --- fixed-width Win32 types (x64 ABI) --------------------------------------
BYTE = ctypes.c_uint8
WORD = ctypes.c_uint16
DWORD = ctypes.c_uint32
UINT = ctypes.c_uint32
LONG = ctypes.c_int32
BOOL = ctypes.c_int32
LARGE_INTEGER = ctypes.c_int64
ULONGLONG = ctypes.c_uint64
SIZE_T = ctypes.c_size_t
ULONG_PTR = ctypes.c_size_t
HANDLE = ctypes.c_void_p
LPVOID = ctypes.c_void_p
LPBYTE = ctypes.POINTER(BYTE)
# Pointer to a NUL-terminated UTF-16 string. c_wchar_p is right on Windows
# (2-byte wchar_t); on Linux only its size (a pointer) matters for layouts.
LPWSTR = ctypes.c_wchar_p
LPCWSTR = ctypes.c_wchar_p
NTSTATUS = ctypes.c_int32
ULONG = ctypes.c_uint32
PULONG = ctypes.POINTER(ULONG)
PDWORD = ctypes.POINTER(DWORD)
PSIZE_T = ctypes.POINTER(SIZE_T)
PHANDLE = ctypes.POINTER(HANDLE)
PBOOL = ctypes.POINTER(BOOL)

INVALID_HANDLE_VALUE = (1 << 64) - 1  # (HANDLE)-1 as c_void_p reads it on x64

# --- constants ---------------------------------------------------------------
# Job limit flags (winnt.h)
JOB_OBJECT_LIMIT_PRIORITY_CLASS = 0x00000020
JOB_OBJECT_LIMIT_BREAKAWAY_OK = 0x00000800
JOB_OBJECT_LIMIT_SILENT_BREAKAWAY_OK = 0x00001000
JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE = 0x00002000
# Flags tether must never set on its jobs: they let members leave.
FORBIDDEN_LIMIT_FLAGS = JOB_OBJECT_LIMIT_BREAKAWAY_OK | JOB_OBJECT_LIMIT_SILENT_BREAKAWAY_OK

# JOBOBJECTINFOCLASS
JobObjectBasicAccountingInformation = 1
JobObjectBasicLimitInformation = 2
JobObjectBasicProcessIdList = 3
JobObjectExtendedLimitInformation = 9
JobObjectCpuRateControlInformation = 15

# JOBOBJECT_CPU_RATE_CONTROL_INFORMATION.ControlFlags
JOB_OBJECT_CPU_RATE_CONTROL_ENABLE = 0x1
JOB_OBJECT_CPU_RATE_CONTROL_WEIGHT_BASED = 0x2
JOB_OBJECT_CPU_RATE_CONTROL_HARD_CAP = 0x4

# Job access rights
JOB_OBJECT_ASSIGN_PROCESS = 0x0001
JOB_OBJECT_QUERY = 0x0004
JOB_OBJECT_TERMINATE = 0x0008

# Process creation flags
CREATE_SUSPENDED = 0x00000004
CREATE_NEW_CONSOLE = 0x00000010
CREATE_NEW_PROCESS_GROUP = 0x00000200
CREATE_UNICODE_ENVIRONMENT = 0x00000400
BELOW_NORMAL_PRIORITY_CLASS = 0x00004000
EXTENDED_STARTUPINFO_PRESENT = 0x00080000
CREATE_BREAKAWAY_FROM_JOB = 0x01000000
CREATE_NO_WINDOW = 0x08000000
DETACHED_PROCESS = 0x00000008

# Proc-thread attributes
PROC_THREAD_ATTRIBUTE_HANDLE_LIST = 0x00020002
PROC_THREAD_ATTRIBUTE_JOB_LIST = 0x0002000D

# Access rights and misc
PROCESS_TERMINATE = 0x0001
PROCESS_SET_QUOTA = 0x0100
PROCESS_QUERY_INFORMATION = 0x0400
PROCESS_QUERY_LIMITED_INFORMATION = 0x1000
SYNCHRONIZE = 0x00100000
THREAD_SUSPEND_RESUME = 0x0002
DUPLICATE_SAME_ACCESS = 0x2
TH32CS_SNAPTHREAD = 0x00000004
WAIT_OBJECT_0 = 0
WAIT_TIMEOUT = 0x102
INFINITE = 0xFFFFFFFF
CTRL_C_EVENT = 0
CTRL_BREAK_EVENT = 1
STILL_ACTIVE = 259

# Win32 error codes used by name
ERROR_FILE_NOT_FOUND = 2
ERROR_ACCESS_DENIED = 5
ERROR_INVALID_HANDLE = 6
ERROR_NOT_SUPPORTED = 50
ERROR_INVALID_PARAMETER = 87
ERROR_INSUFFICIENT_BUFFER = 122
ERROR_MORE_DATA = 234
ERROR_NO_MORE_FILES = 18

# PROCESSINFOCLASS
ProcessBasicInformation = 0


# --- structures (x64 sizes asserted in tests/test_winapi_layout.py) ----------
class IO_COUNTERS(ctypes.Structure):
    _fields_ = [
        ("ReadOperationCount", ULONGLONG),
        ("WriteOperationCount", ULONGLONG),
        ("OtherOperationCount", ULONGLONG),
        ("ReadTransferCount", ULONGLONG),
        ("WriteTransferCount", ULONGLONG),
        ("OtherTransferCount", ULONGLONG),
    ]


class JOBOBJECT_BASIC_LIMIT_INFORMATION(ctypes.Structure):
    _fields_ = [
        ("PerProcessUserTimeLimit", LARGE_INTEGER),
        ("PerJobUserTimeLimit", LARGE_INTEGER),
        ("LimitFlags", DWORD),
        ("MinimumWorkingSetSize", SIZE_T),
        ("MaximumWorkingSetSize", SIZE_T),
        ("ActiveProcessLimit", DWORD),
        ("Affinity", ULONG_PTR),
        ("PriorityClass", DWORD),
        ("SchedulingClass", DWORD),
    ]


class JOBOBJECT_EXTENDED_LIMIT_INFORMATION(ctypes.Structure):
    _fields_ = [
        ("BasicLimitInformation", JOBOBJECT_BASIC_LIMIT_INFORMATION),
        ("IoInfo", IO_COUNTERS),
        ("ProcessMemoryLimit", SIZE_T),
        ("JobMemoryLimit", SIZE_T),
        ("PeakProcessMemoryUsed", SIZE_T),
        ("PeakJobMemoryUsed", SIZE_T),
    ]


class _CPU_RATE_MINMAX(ctypes.Structure):
    _fields_ = [("MinRate", WORD), ("MaxRate", WORD)]


class _CPU_RATE_UNION(ctypes.Union):
    _fields_ = [("CpuRate", DWORD), ("Weight", DWORD), ("MinMax", _CPU_RATE_MINMAX)]


class JOBOBJECT_CPU_RATE_CONTROL_INFORMATION(ctypes.Structure):
    # CpuRate is in 1/100 of a percent of all processors: 1..10000.
    _anonymous_ = ("u",)
    _fields_ = [("ControlFlags", DWORD), ("u", _CPU_RATE_UNION)]


class JOBOBJECT_BASIC_ACCOUNTING_INFORMATION(ctypes.Structure):
    _fields_ = [
        ("TotalUserTime", LARGE_INTEGER),
        ("TotalKernelTime", LARGE_INTEGER),
        ("ThisPeriodTotalUserTime", LARGE_INTEGER),
        ("ThisPeriodTotalKernelTime", LARGE_INTEGER),
        ("TotalPageFaultCount", DWORD),
        ("TotalProcesses", DWORD),
        ("ActiveProcesses", DWORD),
        ("TotalTerminatedProcesses", DWORD),
    ]


class JOBOBJECT_BASIC_PROCESS_ID_LIST_HEADER(ctypes.Structure):
    # Followed by NumberOfProcessIdsInList ULONG_PTRs (see pid_list_buffer).
    _fields_ = [("NumberOfAssignedProcesses", DWORD), ("NumberOfProcessIdsInList", DWORD)]


class STARTUPINFOW(ctypes.Structure):
    _fields_ = [
        ("cb", DWORD),
        ("lpReserved", LPWSTR),
        ("lpDesktop", LPWSTR),
        ("lpTitle", LPWSTR),
        ("dwX", DWORD),
        ("dwY", DWORD),
        ("dwXSize", DWORD),
        ("dwYSize", DWORD),
        ("dwXCountChars", DWORD),
        ("dwYCountChars", DWORD),
        ("dwFillAttribute", DWORD),
        ("dwFlags", DWORD),
        ("wShowWindow", WORD),
        ("cbReserved2", WORD),
        ("lpReserved2", LPBYTE),
        ("hStdInput", HANDLE),
        ("hStdOutput", HANDLE),
        ("hStdError", HANDLE),
    ]


class STARTUPINFOEXW(ctypes.Structure):
    _fields_ = [("StartupInfo", STARTUPINFOW), ("lpAttributeList", LPVOID)]


class PROCESS_INFORMATION(ctypes.Structure):
    _fields_ = [
        ("hProcess", HANDLE),
        ("hThread", HANDLE),
        ("dwProcessId", DWORD),
        ("dwThreadId", DWORD),
    ]


class PROCESS_BASIC_INFORMATION(ctypes.Structure):
    # NtQueryInformationProcess(ProcessBasicInformation): the parent's pid
    # without the snapshot APIs (see parent_pid).
    _fields_ = [
        ("ExitStatus", NTSTATUS),
        ("PebBaseAddress", LPVOID),
        ("AffinityMask", ULONG_PTR),
        ("BasePriority", LONG),
        ("UniqueProcessId", ULONG_PTR),
        ("InheritedFromUniqueProcessId", ULONG_PTR),
    ]


class THREADENTRY32(ctypes.Structure):
    _fields_ = [
        ("dwSize", DWORD),
        ("cntUsage", DWORD),
        ("th32ThreadID", DWORD),
        ("th32OwnerProcessID", DWORD),
        ("tpBasePri", LONG),
        ("tpDeltaPri", LONG),
        ("dwFlags", DWORD),
    ]


STRUCT_SIZES_X64 = {
    "IO_COUNTERS": 48,
    "JOBOBJECT_BASIC_LIMIT_INFORMATION": 64,
    "JOBOBJECT_EXTENDED_LIMIT_INFORMATION": 144,
    "JOBOBJECT_CPU_RATE_CONTROL_INFORMATION": 8,
    "JOBOBJECT_BASIC_ACCOUNTING_INFORMATION": 48,
    "JOBOBJECT_BASIC_PROCESS_ID_LIST_HEADER": 8,
    "STARTUPINFOW": 104,
    "STARTUPINFOEXW": 112,
    "PROCESS_INFORMATION": 24,
    "THREADENTRY32": 28,
    "PROCESS_BASIC_INFORMATION": 48,
}


# --- errors ------------------------------------------------------------------
class Win32Error(OSError):
    """A Win32 call failed. ``call`` names it, ``code`` is GetLastError()."""

    def __init__(self, call: str, code: int) -> None:
        self.call = call
        self.code = code
        super().__init__(f"{call} failed with Win32 error {code}{_describe(code)}")


def _describe(code: int) -> str:
    format_error = getattr(ctypes, "FormatError", None)
    if format_error is None:
        return ""
    try:
        text = format_error(code).strip()
    except Exception:  # a description is a courtesy, never a second failure
        return ""
    return f" ({text})" if text else ""


def _get_last_error() -> int:
    get = getattr(ctypes, "get_last_error", None)
    return int(get()) if get is not None else 0


# errcheck kinds: how a return value tells failure.
CHECK_BOOL = "bool"  # zero is failure
CHECK_HANDLE = "handle"  # NULL is failure
CHECK_INVALID_HANDLE = "invalid_handle"  # INVALID_HANDLE_VALUE is failure
CHECK_DWORD_MINUS_ONE = "dword-1"  # (DWORD)-1 is failure
CHECK_NONE = None  # caller looks at the result itself


def _errcheck(kind: str | None):
    def check(result: Any, func: Any, args: tuple) -> Any:
        failed = (
            (kind == CHECK_BOOL and not result)
            or (kind == CHECK_HANDLE and not result)
            or (kind == CHECK_INVALID_HANDLE and (not result or result == INVALID_HANDLE_VALUE))
            or (kind == CHECK_DWORD_MINUS_ONE and result == 0xFFFFFFFF)
        )
        if failed:
            raise Win32Error(getattr(func, "__name__", "Win32 call"), _get_last_error())
        return result

    return check


# --- prototypes: (dll, name) -> (restype, argtypes, errcheck kind) ------------
PROTOTYPES: dict[tuple[str, str], tuple[Any, Sequence[Any], str | None]] = {
    ("kernel32", "CreateJobObjectW"): (HANDLE, (LPVOID, LPCWSTR), CHECK_HANDLE),
    ("kernel32", "SetInformationJobObject"): (BOOL, (HANDLE, ctypes.c_int, LPVOID, DWORD), CHECK_BOOL),
    ("kernel32", "QueryInformationJobObject"): (
        BOOL,
        (HANDLE, ctypes.c_int, LPVOID, DWORD, PDWORD),
        CHECK_NONE,  # ERROR_MORE_DATA is an expected answer: the caller decides
    ),
    ("kernel32", "AssignProcessToJobObject"): (BOOL, (HANDLE, HANDLE), CHECK_BOOL),
    ("kernel32", "TerminateJobObject"): (BOOL, (HANDLE, UINT), CHECK_BOOL),
    ("kernel32", "IsProcessInJob"): (BOOL, (HANDLE, HANDLE, PBOOL), CHECK_BOOL),
    ("kernel32", "CloseHandle"): (BOOL, (HANDLE,), CHECK_BOOL),
    ("kernel32", "GetCurrentProcess"): (HANDLE, (), CHECK_NONE),
    ("kernel32", "OpenProcess"): (HANDLE, (DWORD, BOOL, DWORD), CHECK_HANDLE),
    ("kernel32", "DuplicateHandle"): (
        BOOL,
        (HANDLE, HANDLE, HANDLE, PHANDLE, DWORD, BOOL, DWORD),
        CHECK_BOOL,
    ),
    ("kernel32", "CreateProcessW"): (
        BOOL,
        (
            LPCWSTR,  # lpApplicationName
            LPVOID,  # lpCommandLine: a writable buffer (create_unicode_buffer)
            LPVOID,  # lpProcessAttributes
            LPVOID,  # lpThreadAttributes
            BOOL,  # bInheritHandles
            DWORD,  # dwCreationFlags
            LPVOID,  # lpEnvironment (UTF-16 block with CREATE_UNICODE_ENVIRONMENT)
            LPCWSTR,  # lpCurrentDirectory
            ctypes.POINTER(STARTUPINFOW),  # STARTUPINFOEXW passes its first member
            ctypes.POINTER(PROCESS_INFORMATION),
        ),
        CHECK_BOOL,
    ),
    ("kernel32", "InitializeProcThreadAttributeList"): (
        BOOL,
        (LPVOID, DWORD, DWORD, PSIZE_T),
        CHECK_NONE,  # the sizing call fails with ERROR_INSUFFICIENT_BUFFER by design
    ),
    ("kernel32", "UpdateProcThreadAttribute"): (
        BOOL,
        (LPVOID, DWORD, ULONG_PTR, LPVOID, SIZE_T, LPVOID, PSIZE_T),
        CHECK_BOOL,
    ),
    ("kernel32", "DeleteProcThreadAttributeList"): (None, (LPVOID,), CHECK_NONE),
    ("kernel32", "ResumeThread"): (DWORD, (HANDLE,), CHECK_DWORD_MINUS_ONE),
    ("kernel32", "TerminateProcess"): (BOOL, (HANDLE, UINT), CHECK_BOOL),
    ("kernel32", "WaitForSingleObject"): (DWORD, (HANDLE, DWORD), CHECK_NONE),
    ("kernel32", "GetExitCodeProcess"): (BOOL, (HANDLE, PDWORD), CHECK_BOOL),
    ("kernel32", "GetProcessId"): (DWORD, (HANDLE,), CHECK_NONE),
    ("kernel32", "GenerateConsoleCtrlEvent"): (BOOL, (DWORD, DWORD), CHECK_BOOL),
    ("kernel32", "CreateToolhelp32Snapshot"): (HANDLE, (DWORD, DWORD), CHECK_INVALID_HANDLE),
    ("kernel32", "Thread32First"): (BOOL, (HANDLE, ctypes.POINTER(THREADENTRY32)), CHECK_NONE),
    ("kernel32", "Thread32Next"): (BOOL, (HANDLE, ctypes.POINTER(THREADENTRY32)), CHECK_NONE),
    ("kernel32", "OpenThread"): (HANDLE, (DWORD, BOOL, DWORD), CHECK_HANDLE),
    ("ntdll", "NtResumeProcess"): (NTSTATUS, (HANDLE,), CHECK_NONE),
    ("ntdll", "NtQueryInformationProcess"): (
        NTSTATUS,
        (HANDLE, ctypes.c_int, ctypes.POINTER(PROCESS_BASIC_INFORMATION), ULONG, PULONG),
        CHECK_NONE,  # an NTSTATUS: the caller looks at it
    ),
}


class Api:
    """The bound functions, one attribute per prototype name."""

    def __init__(self, dlls: dict[str, Any]) -> None:
        for (dll, name), (restype, argtypes, check) in PROTOTYPES.items():
            func = getattr(dlls[dll], name)
            func.restype = restype
            func.argtypes = list(argtypes)
            if check is not None:
                func.errcheck = _errcheck(check)
            setattr(self, name, func)

    # The attributes are set dynamically; this keeps type checkers quiet.
    def __getattr__(self, name: str) -> Any:  # pragma: no cover - only on a typo
        raise AttributeError(f"no Win32 prototype named {name!r}")


_API: Api | None = None


def load() -> Api:
    """Bind the prototypes (Windows only); raises OSError elsewhere."""
    global _API
    if _API is None:
        if sys.platform != "win32":
            raise OSError(f"the Win32 API is not available on {sys.platform}")
        dlls = {
            # use_last_error: GetLastError is saved right after each call, before
            # the interpreter can overwrite it.
            "kernel32": ctypes.WinDLL("kernel32", use_last_error=True),  # type: ignore[attr-defined]
            "ntdll": ctypes.WinDLL("ntdll"),  # type: ignore[attr-defined]
        }
        _API = Api(dlls)
    return _API


# --- helpers that need no DLL -------------------------------------------------
def pid_list_buffer(capacity: int) -> ctypes.Array:
    """A buffer for JOBOBJECT_BASIC_PROCESS_ID_LIST with room for ``capacity`` pids."""
    size = ctypes.sizeof(JOBOBJECT_BASIC_PROCESS_ID_LIST_HEADER) + capacity * ctypes.sizeof(
        ULONG_PTR
    )
    return (ctypes.c_byte * size)()


def parse_pid_list(buf: ctypes.Array) -> tuple[int, list[int]]:
    """(NumberOfAssignedProcesses, pids in the list) from a filled buffer."""
    header = JOBOBJECT_BASIC_PROCESS_ID_LIST_HEADER.from_buffer(buf)
    count = header.NumberOfProcessIdsInList
    offset = ctypes.sizeof(JOBOBJECT_BASIC_PROCESS_ID_LIST_HEADER)
    ids = (ULONG_PTR * count).from_buffer(buf, offset) if count else []
    return header.NumberOfAssignedProcesses, [int(x) for x in ids]


def environment_block(env: Any) -> ctypes.Array:
    """A CREATE_UNICODE_ENVIRONMENT block from a mapping, checked like CPython's _winapi.

    Sorted case-insensitively, as Windows keeps its own environment.
    """
    items = []
    for key, value in env.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError("environment can only contain strings")
        if not key or "=" in key[1:]:
            raise ValueError("illegal environment variable name")
        if "\0" in key or "\0" in value:
            raise ValueError("embedded null character")
        items.append((key, value))
    items.sort(key=lambda kv: kv[0].upper())
    text = "".join(f"{k}={v}\0" for k, v in items) + "\0"
    if len(items) == 0:
        text += "\0"  # an empty block is two NULs
    # Encode to UTF-16 ourselves: c_wchar is 4 bytes on Linux, and the block
    # is read as WCHARs by Windows whatever the host Python is.
    data = text.encode("utf-16-le")
    return (ctypes.c_char * len(data)).from_buffer_copy(data)


def cpu_rate_info(percent: int) -> JOBOBJECT_CPU_RATE_CONTROL_INFORMATION:
    """A hard CPU cap of ``percent`` % of the whole machine (1..100)."""
    if not 1 <= int(percent) <= 100:
        raise ValueError(f"cpu_percent must be 1..100, not {percent!r}")
    info = JOBOBJECT_CPU_RATE_CONTROL_INFORMATION()
    info.ControlFlags = JOB_OBJECT_CPU_RATE_CONTROL_ENABLE | JOB_OBJECT_CPU_RATE_CONTROL_HARD_CAP
    info.CpuRate = int(percent) * 100
    return info


def extended_limits(
    *, kill_on_close: bool, priority_class: int | None = None
) -> JOBOBJECT_EXTENDED_LIMIT_INFORMATION:
    """The limits tether sets: kill-on-close and a priority class, never breakaway."""
    info = JOBOBJECT_EXTENDED_LIMIT_INFORMATION()
    flags = 0
    if kill_on_close:
        flags |= JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
    if priority_class is not None:
        flags |= JOB_OBJECT_LIMIT_PRIORITY_CLASS
        info.BasicLimitInformation.PriorityClass = priority_class
    assert not flags & FORBIDDEN_LIMIT_FLAGS
    info.BasicLimitInformation.LimitFlags = flags
    return info


def parent_pid(api: Api | None = None) -> int:
    """The pid of the process that created this one (0 if none is known).

    What ``os.getppid()`` answers - but CPython 3.12+ reads it with
    ``PssCaptureSnapshot``, which Wine 8 lacks (the call aborts the whole
    process there), and older versions walk a toolhelp snapshot of every
    process. ``NtQueryInformationProcess(ProcessBasicInformation)`` of our own
    process is one call and works on both. As with ``os.getppid()`` on
    Windows, the creator may have exited since (its pid may then be reused):
    callers treat it as a hint, never as an identity.
    """
    api = api or load()
    info = PROCESS_BASIC_INFORMATION()
    status = api.NtQueryInformationProcess(
        api.GetCurrentProcess(), ProcessBasicInformation, ctypes.byref(info),
        ctypes.sizeof(info), None,
    )
    if status != 0:
        raise Win32Error("NtQueryInformationProcess(ProcessBasicInformation)", status & 0xFFFFFFFF)
    return int(info.InheritedFromUniqueProcessId)


def signed_exit_code(code: int) -> int:
    """A Windows exit code (a 32-bit DWORD, as ``GetExitCodeProcess`` and
    cmd.exe report it: 0xC0000005 after an access violation, 0xC000013A after
    Ctrl+C) as the signed 32-bit int that ``os._exit``, ``sys.exit`` and
    ``ExitProcess`` take: the same 32 bits. Values already in range pass as
    they are; anything wider keeps its low 32 bits."""
    code &= 0xFFFFFFFF
    return code - (1 << 32) if code >= (1 << 31) else code
