"""The Windows backend's ctypes declarations, checked on Linux (no Wine needed).

Struct layouts are asserted at their x64 sizes and field offsets, the bytes
tether hands to SetInformationJobObject are checked, and every prototype is
checked to pass structs by pointer - through a real ctypes call into a
callback with the declared signature. This suite is for contributors without
Wine; it never stands in for the Wine lane (tests/windows, run by
scripts/windows-lane.sh), which runs the same code in the Windows build of
CPython against a real Job Object implementation.
"""

from __future__ import annotations

import ast
import ctypes
import inspect
import struct
import subprocess
import sys

import pytest

from tether.errors import JobRefused
from tether.platform import _winapi as w
from tether.platform import windows as W
from tether.platform.base import JobOptions

pytestmark = [
    pytest.mark.nowine,
    pytest.mark.skipif(ctypes.sizeof(ctypes.c_void_p) != 8, reason="x64 layouts need a 64-bit host"),
]


def test_struct_sizes_x64():
    expected = {
        "JOBOBJECT_BASIC_LIMIT_INFORMATION": 64,
        "JOBOBJECT_EXTENDED_LIMIT_INFORMATION": 144,
        "JOBOBJECT_CPU_RATE_CONTROL_INFORMATION": 8,
        "STARTUPINFOW": 104,
        "STARTUPINFOEXW": 112,
        "PROCESS_INFORMATION": 24,
        "IO_COUNTERS": 48,
        "JOBOBJECT_BASIC_ACCOUNTING_INFORMATION": 48,
        "THREADENTRY32": 28,
        "PROCESS_BASIC_INFORMATION": 48,
    }
    for name, size in expected.items():
        assert ctypes.sizeof(getattr(w, name)) == size, name
        assert w.STRUCT_SIZES_X64[name] == size, name


@pytest.mark.parametrize(
    "struct_name,offsets",
    [
        ("JOBOBJECT_BASIC_LIMIT_INFORMATION", {
            "PerProcessUserTimeLimit": 0, "PerJobUserTimeLimit": 8, "LimitFlags": 16,
            "MinimumWorkingSetSize": 24, "MaximumWorkingSetSize": 32, "ActiveProcessLimit": 40,
            "Affinity": 48, "PriorityClass": 56, "SchedulingClass": 60,
        }),
        ("JOBOBJECT_EXTENDED_LIMIT_INFORMATION", {
            "BasicLimitInformation": 0, "IoInfo": 64, "ProcessMemoryLimit": 112,
            "JobMemoryLimit": 120, "PeakProcessMemoryUsed": 128, "PeakJobMemoryUsed": 136,
        }),
        ("STARTUPINFOW", {
            "cb": 0, "lpReserved": 8, "lpDesktop": 16, "lpTitle": 24, "dwX": 32, "dwY": 36,
            "dwXSize": 40, "dwYSize": 44, "dwXCountChars": 48, "dwYCountChars": 52,
            "dwFillAttribute": 56, "dwFlags": 60, "wShowWindow": 64, "cbReserved2": 66,
            "lpReserved2": 72, "hStdInput": 80, "hStdOutput": 88, "hStdError": 96,
        }),
        ("STARTUPINFOEXW", {"StartupInfo": 0, "lpAttributeList": 104}),
        ("PROCESS_INFORMATION", {"hProcess": 0, "hThread": 8, "dwProcessId": 16, "dwThreadId": 20}),
        ("JOBOBJECT_CPU_RATE_CONTROL_INFORMATION", {"ControlFlags": 0, "u": 4}),
        ("JOBOBJECT_BASIC_ACCOUNTING_INFORMATION", {
            "TotalPageFaultCount": 32, "TotalProcesses": 36, "ActiveProcesses": 40,
            "TotalTerminatedProcesses": 44,
        }),
        ("THREADENTRY32", {"dwSize": 0, "th32ThreadID": 8, "th32OwnerProcessID": 12, "dwFlags": 24}),
        ("PROCESS_BASIC_INFORMATION", {
            "ExitStatus": 0, "PebBaseAddress": 8, "AffinityMask": 16, "BasePriority": 24,
            "UniqueProcessId": 32, "InheritedFromUniqueProcessId": 40,
        }),
    ],
)
def test_field_offsets_x64(struct_name, offsets):
    cls = getattr(w, struct_name)
    for field, offset in offsets.items():
        assert getattr(cls, field).offset == offset, f"{struct_name}.{field}"


def test_cpu_rate_union_members_share_the_dword():
    info = w.JOBOBJECT_CPU_RATE_CONTROL_INFORMATION()
    info.CpuRate = 0x00020001
    assert info.Weight == 0x00020001
    assert (info.MinMax.MinRate, info.MinMax.MaxRate) == (1, 2)


# --- the bytes tether passes ---------------------------------------------------------
def test_kill_on_close_limits_bytes():
    info = w.extended_limits(kill_on_close=True)
    raw = bytes(info)
    assert len(raw) == 144
    assert struct.unpack_from("<I", raw, 16)[0] == 0x2000  # LimitFlags = KILL_ON_JOB_CLOSE
    assert raw[:16] == bytes(16) and raw[20:] == bytes(124)


def test_background_limits_bytes():
    info = w.extended_limits(kill_on_close=False, priority_class=w.BELOW_NORMAL_PRIORITY_CLASS)
    raw = bytes(info)
    assert struct.unpack_from("<I", raw, 16)[0] == w.JOB_OBJECT_LIMIT_PRIORITY_CLASS == 0x20
    assert struct.unpack_from("<I", raw, 56)[0] == w.BELOW_NORMAL_PRIORITY_CLASS == 0x4000


@pytest.mark.parametrize("kill", [True, False])
@pytest.mark.parametrize("prio", [None, w.BELOW_NORMAL_PRIORITY_CLASS])
def test_limits_never_allow_breakaway(kill, prio):
    flags = w.extended_limits(kill_on_close=kill, priority_class=prio).BasicLimitInformation.LimitFlags
    assert not flags & (0x800 | 0x1000)  # BREAKAWAY_OK, SILENT_BREAKAWAY_OK
    assert w.FORBIDDEN_LIMIT_FLAGS == 0x1800


def test_cpu_rate_bytes():
    assert bytes(w.cpu_rate_info(25)) == struct.pack("<II", 0x1 | 0x4, 2500)  # ENABLE|HARD_CAP
    assert bytes(w.cpu_rate_info(100)) == struct.pack("<II", 5, 10000)
    for bad in (0, 101, -5):
        with pytest.raises(ValueError):
            w.cpu_rate_info(bad)


def test_environment_block():
    raw = bytes(w.environment_block({"b": "2", "A": "1", "Path": "C:\\x", "=C:": "C:\\"}))
    text = raw.decode("utf-16-le")
    assert text == "=C:=C:\\\0A=1\0b=2\0Path=C:\\x\0\0"
    assert bytes(w.environment_block({})) == "\0\0".encode("utf-16-le")
    assert bytes(w.environment_block({"K": "\u2603"})) == "K=\u2603\0\0".encode("utf-16-le")
    with pytest.raises(ValueError):
        w.environment_block({"A=B": "1"})
    with pytest.raises(ValueError):
        w.environment_block({"": "1"})
    with pytest.raises(ValueError):
        w.environment_block({"A": "x\0y"})
    with pytest.raises(TypeError):
        w.environment_block({b"A": "1"})


def test_pid_list_buffer_parsing():
    buf = w.pid_list_buffer(3)
    assert ctypes.sizeof(buf) == 8 + 3 * 8
    struct.pack_into("<IIQQ", buf, 0, 7, 2, 1204, 88)
    assert w.parse_pid_list(buf) == (7, [1204, 88])
    assert w.parse_pid_list(w.pid_list_buffer(1)) == (0, [])


# --- prototypes: structs go by pointer ---------------------------------------------
def _is_pointer_type(t) -> bool:
    return t is ctypes.c_void_p or t is ctypes.c_wchar_p or issubclass(t, ctypes._Pointer)


def test_no_prototype_takes_a_struct_by_value():
    for (dll, name), (restype, argtypes, _check) in w.PROTOTYPES.items():
        for t in list(argtypes) + ([restype] if restype is not None else []):
            assert not issubclass(t, (ctypes.Structure, ctypes.Union)), f"{dll}.{name}: {t}"
            assert issubclass(t, (ctypes._SimpleCData, ctypes._Pointer)), f"{dll}.{name}: {t}"


def test_handle_and_dword_widths():
    assert ctypes.sizeof(w.HANDLE) == 8 and ctypes.sizeof(w.DWORD) == 4
    assert ctypes.sizeof(w.BOOL) == 4 and ctypes.sizeof(w.WORD) == 2
    assert ctypes.sizeof(w.SIZE_T) == 8 and ctypes.sizeof(w.ULONG_PTR) == 8
    # Every handle-typed argument is pointer-sized: a 32-bit c_int would truncate.
    for (_dll, name), (_restype, argtypes, _check) in w.PROTOTYPES.items():
        for t in argtypes:
            assert ctypes.sizeof(t) in (4, 8), name


def _call_through(name: str, *args):
    """Call a Python stand-in through a C function pointer of ``name``'s declared type.

    On x64 the Windows and System V conventions differ, but ctypes marshals
    arguments by the declared types the same way: what the callback receives
    is what the Win32 function would receive.
    """
    restype, argtypes, _ = w.PROTOTYPES[("kernel32", name)]
    seen = []

    def stand_in(*received):
        seen.append(received)
        return 1

    cfunc = ctypes.CFUNCTYPE(ctypes.c_int32, *argtypes)(stand_in)
    cfunc(*args)
    return seen[0]


def test_set_information_receives_a_pointer_and_the_size():
    info = w.extended_limits(kill_on_close=True)
    _, klass, ptr, size = _call_through(
        "SetInformationJobObject", 0x40, w.JobObjectExtendedLimitInformation,
        ctypes.byref(info), ctypes.sizeof(info),
    )
    assert klass == 9 and ptr == ctypes.addressof(info) and size == 144
    assert ctypes.string_at(ptr, size) == bytes(info)


def test_a_struct_by_value_is_refused_not_pushed():
    info = w.extended_limits(kill_on_close=True)
    restype, argtypes, _ = w.PROTOTYPES[("kernel32", "SetInformationJobObject")]
    cfunc = ctypes.CFUNCTYPE(ctypes.c_int32, *argtypes)(lambda *a: 1)
    with pytest.raises(ctypes.ArgumentError):
        cfunc(0x40, 9, info, ctypes.sizeof(info))


def test_create_process_receives_the_startupinfoex_address():
    siex = w.STARTUPINFOEXW()
    siex.StartupInfo.cb = ctypes.sizeof(siex)
    pi = w.PROCESS_INFORMATION()
    cmd = ctypes.create_unicode_buffer("prog.exe arg")
    got = _call_through(
        "CreateProcessW", None, ctypes.addressof(cmd), None, None, True, 0x80000, None, None,
        ctypes.byref(siex.StartupInfo), ctypes.byref(pi),
    )
    assert got[1] == ctypes.addressof(cmd)
    assert ctypes.addressof(got[8].contents) == ctypes.addressof(siex)
    assert got[8].contents.cb == 112
    assert ctypes.addressof(got[9].contents) == ctypes.addressof(pi)


def test_query_pid_list_receives_the_buffer():
    buf = w.pid_list_buffer(4)
    got = _call_through(
        "QueryInformationJobObject", 0x40, w.JobObjectBasicProcessIdList,
        ctypes.byref(buf), ctypes.sizeof(buf), None,
    )
    assert got[2] == ctypes.addressof(buf) and got[3] == 40 and not got[4]


def test_job_list_attribute_value_is_an_array_of_handles():
    restype, argtypes, _ = w.PROTOTYPES[("kernel32", "UpdateProcThreadAttribute")]
    jobs = (w.HANDLE * 2)(0x40, 0x44)
    seen = []
    cfunc = ctypes.CFUNCTYPE(ctypes.c_int32, *argtypes)(lambda *a: seen.append(a) or 1)
    cfunc(0x1000, 0, w.PROC_THREAD_ATTRIBUTE_JOB_LIST, ctypes.byref(jobs), ctypes.sizeof(jobs),
          None, None)
    _, _, attr, value, size, _, _ = seen[0]
    assert attr == 0x2000D and size == 16
    assert struct.unpack("<QQ", ctypes.string_at(value, 16)) == (0x40, 0x44)


def test_nt_query_information_process_gets_the_struct_by_pointer():
    restype, argtypes, check = w.PROTOTYPES[("ntdll", "NtQueryInformationProcess")]
    info = w.PROCESS_BASIC_INFORMATION()
    seen = []
    cfunc = ctypes.CFUNCTYPE(ctypes.c_int32, *argtypes)(lambda *a: seen.append(a) or 0)
    cfunc(0x40, w.ProcessBasicInformation, ctypes.byref(info), ctypes.sizeof(info), None)
    _, klass, ptr, size, _ = seen[0]
    assert klass == 0 and size == 48 and ctypes.addressof(ptr.contents) == ctypes.addressof(info)
    assert restype is w.NTSTATUS and check is None  # an NTSTATUS: parent_pid looks at it


@pytest.mark.parametrize("code,signed", [
    (0, 0), (1, 1), (255, 255), (256, 256), (0x7FFFFFFF, 0x7FFFFFFF),
    (0x80000000, -0x80000000), (0xC0000005, -1073741819), (0xC000013A, -1073741510),
    (0xFFFFFFFF, -1), (-1, -1), (-1073741819, -1073741819), (1 << 32 | 7, 7),
])
def test_signed_exit_code_keeps_the_32_bits(code, signed):
    assert w.signed_exit_code(code) == signed
    assert w.signed_exit_code(code) & 0xFFFFFFFF == code & 0xFFFFFFFF  # what the caller sees


# --- errors --------------------------------------------------------------------------
def test_errcheck_kinds():
    class F:
        __name__ = "AssignProcessToJobObject"

    assert w._errcheck(w.CHECK_BOOL)(1, F(), ()) == 1
    with pytest.raises(w.Win32Error, match="AssignProcessToJobObject failed with Win32 error"):
        w._errcheck(w.CHECK_BOOL)(0, F(), ())
    with pytest.raises(w.Win32Error):
        w._errcheck(w.CHECK_HANDLE)(None, F(), ())
    with pytest.raises(w.Win32Error):
        w._errcheck(w.CHECK_INVALID_HANDLE)(w.INVALID_HANDLE_VALUE, F(), ())
    with pytest.raises(w.Win32Error):
        w._errcheck(w.CHECK_DWORD_MINUS_ONE)(0xFFFFFFFF, F(), ())
    assert w._errcheck(w.CHECK_DWORD_MINUS_ONE)(1, F(), ()) == 1
    e = w.Win32Error("CreateJobObjectW", 5)
    assert (e.call, e.code) == ("CreateJobObjectW", 5) and isinstance(e, OSError)


def test_readback_verdicts():
    zero = w.JOBOBJECT_EXTENDED_LIMIT_INFORMATION()
    assert W.limits_readback_verdict(zero, kill_on_close=True) is None  # Wine: not reported
    good = w.extended_limits(kill_on_close=True)
    assert W.limits_readback_verdict(good, kill_on_close=True) is None
    lost = w.extended_limits(kill_on_close=False, priority_class=0x4000)
    assert "without KILL_ON_JOB_CLOSE" in W.limits_readback_verdict(lost, kill_on_close=True)
    leaky = w.extended_limits(kill_on_close=True)
    leaky.BasicLimitInformation.LimitFlags |= w.JOB_OBJECT_LIMIT_SILENT_BREAKAWAY_OK
    assert "breakaway" in W.limits_readback_verdict(leaky, kill_on_close=True)


# --- off Windows -----------------------------------------------------------------------
@pytest.mark.skipif(sys.platform == "win32", reason="checks the non-Windows behaviour")
def test_off_windows_probe_says_why_and_nothing_starts():
    av = W.probe()
    assert not av.available and "not Windows" in av.reason
    with pytest.raises(OSError):
        w.load()
    job = W.WindowsJob(JobOptions(name="x", job_id="x"))
    assert job.guarantee.disabled and "kill-on-close DISABLED" in str(job.guarantee)
    with pytest.raises(JobRefused):
        job.popen(["true"], {})
    job.close()


def test_windows_execute_child_calls_winapi_create_process():
    """The Popen subclass re-uses CPython's Windows ``_execute_child`` with its own
    ``_winapi``: check, in this CPython's subprocess.py, that the Windows branch
    still calls ``_winapi.CreateProcess`` with nine arguments and unpacks four."""
    tree = ast.parse(inspect.getsource(subprocess))
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "_execute_child":
            doc = ast.get_docstring(node) or ""
            if "Windows" not in doc:
                continue
            for sub in ast.walk(node):
                if (isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Call)
                        and ast.unparse(sub.value.func) == "_winapi.CreateProcess"):
                    calls.append((len(sub.value.args), len(sub.targets[0].elts)))
    assert calls == [(9, 4)]
