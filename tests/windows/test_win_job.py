"""The Job Object backend, for real: Windows CPython under Wine (scripts/windows-lane.sh).

Each spawn test runs once per placement strategy (PROC_THREAD_ATTRIBUTE_JOB_LIST,
CREATE_SUSPENDED -> assign -> ResumeThread inside Popen, and the same from
outside Popen), since a Windows version or a future CPython may pick any of them.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from tether.errors import JobClosed, JobRefused
from tether.platform import _winapi as w
from tether.platform import windows as W
from tether.platform.base import JobOptions

pytestmark = pytest.mark.wine
PIPE = subprocess.PIPE
ALL = W.STRATEGIES


def _ready(tracker, p: subprocess.Popen) -> None:
    line = tracker.first_line(p)
    assert line.startswith("ready"), line


def _processes_with(token: str) -> list[int]:
    """Pids whose command line carries ``token`` (a Wine prefix holds a dozen processes)."""
    import psutil

    found = []
    for pid in psutil.pids():
        try:
            if any(token in part for part in psutil.Process(pid).cmdline()):
                found.append(pid)
        except (psutil.Error, OSError):
            continue
    return found


def test_probe_says_available_with_details():
    av = W.probe()
    assert av.available, av.reason
    assert av.mechanism == "jobobject"
    assert av.detail["placement"] in ALL
    assert av.detail["job_list"] in (True, False)


def test_guarantee_and_limits_passed(tracker):
    job = tracker.job()
    g = job.guarantee
    assert g.kernel_enforced and g.transparent and g.disabled is None
    assert "kernel" in g.ends_job
    tr = job.trace()
    assert tr["limits"] == {"LimitFlags": w.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE, "PriorityClass": 0}
    # Wine answers a limit query with zeros: traced as unverified, not as "not set".
    assert tr["limits_readback"] in ("verified", "not reported (all zero, as under Wine)")


@pytest.mark.parametrize("strategy", ALL)
def test_pipes_communicate_and_return_code(tracker, child_cmd, token, strategy):
    job = tracker.job(strategy)
    p = tracker.popen(job.popen(
        child_cmd("echo", token, "5"), dict(stdin=PIPE, stdout=PIPE, stderr=PIPE, text=True)
    ))
    assert isinstance(p, subprocess.Popen)
    out, err = p.communicate("hello", timeout=30)
    assert (out, err, p.returncode) == ("HELLO", "err", 5)


@pytest.mark.parametrize("strategy", ALL)
def test_child_is_a_member_before_it_runs(tracker, api, child_cmd, token, tmp_path, strategy):
    job = tracker.job(strategy)
    marker = tmp_path / "ran"
    # The caller's own CREATE_SUSPENDED is kept: the child has run no instruction.
    p = tracker.popen(job.popen(
        child_cmd("marker", token, str(marker)), dict(creationflags=w.CREATE_SUSPENDED)
    ))
    flag = w.BOOL(0)
    api.IsProcessInJob(int(p._handle), job._handle, ctypes.byref(flag))
    assert flag.value == 1
    assert job.member_pids() == [p.pid]
    time.sleep(0.3)
    assert p.poll() is None and not marker.exists()  # still suspended, as asked
    assert api.NtResumeProcess(int(p._handle)) == 0
    assert p.wait(30) == 0
    assert marker.exists()


def test_child_sees_itself_in_a_job(tracker, api, child_cmd, token):
    job = tracker.job()
    p = tracker.popen(job.popen(child_cmd("injob", token), dict(stdout=PIPE, text=True)))
    assert p.communicate(timeout=30)[0].split() == ["injob", "1"]
    if not W._in_any_job(api):  # control: the same program outside any job says 0
        out = subprocess.run(child_cmd("injob", token), stdout=PIPE, text=True, timeout=30).stdout
        assert out.split() == ["injob", "0"]


# Job semantics, not placement: the two in-Popen strategies are enough here.
IN_POPEN = [W.STRATEGY_JOB_LIST, W.STRATEGY_SUSPENDED]


@pytest.mark.parametrize("strategy", IN_POPEN)
def test_kill_all_ends_child_and_grandchild(tracker, child_cmd, token, strategy):
    job = tracker.job(strategy)
    p = tracker.popen(job.popen(child_cmd("tree", token), dict(stdout=PIPE, text=True)))
    _, cpid, gpid = tracker.first_line(p).split()
    hc, hg = tracker.open(int(cpid), token), tracker.open(int(gpid), token)
    assert sorted(job.member_pids()) == sorted([int(cpid), int(gpid)])  # the grandchild joined
    job.kill_all()
    assert tracker.wait_gone([hc, hg], 3.0) == []
    assert tracker.exit_code(hg) == W.KILLED_EXIT_CODE
    assert p.wait(5) == W.KILLED_EXIT_CODE
    assert job.member_pids() == []
    # The job stays open: more can start in it.
    q = tracker.popen(job.popen(child_cmd("echo", token, "0"), dict(stdin=PIPE, stdout=PIPE, text=True)))
    assert q.communicate("x", timeout=30)[0] == "X"


def test_close_ends_members_and_is_idempotent(tracker, child_cmd, token):
    job = tracker.job()
    p = tracker.popen(job.popen(child_cmd("tree", token), dict(stdout=PIPE, text=True)))
    _, cpid, gpid = tracker.first_line(p).split()
    handles = [tracker.open(int(cpid), token), tracker.open(int(gpid), token)]
    job.close()
    assert tracker.wait_gone(handles, 3.0) == []
    job.close()
    assert job.member_pids() == [] and job.signal_all(signal.SIGTERM) == []
    with pytest.raises(JobClosed):
        job.popen(child_cmd("sleep", token), {})


def test_member_listing_grows_its_buffer(tracker, api, child_cmd, token):
    job = tracker.job()
    procs = [tracker.popen(job.popen(child_cmd("sleep", token), dict(stdout=PIPE, text=True)))
             for _ in range(5)]
    for p in procs:
        _ready(tracker, p)
    # A one-slot buffer: the kernel answers ERROR_MORE_DATA with the count filled in.
    buf = w.pid_list_buffer(1)
    ok = api.QueryInformationJobObject(
        job._handle, w.JobObjectBasicProcessIdList, ctypes.byref(buf), ctypes.sizeof(buf), None
    )
    assert not ok and ctypes.get_last_error() == w.ERROR_MORE_DATA
    assigned, listed = w.parse_pid_list(buf)
    assert assigned == 5 and len(listed) == 1
    want = sorted(p.pid for p in procs)
    assert sorted(W.query_pids(api, job._handle, initial=1)) == want
    assert sorted(job.member_pids()) == want


def test_two_jobs_are_isolated(tracker, child_cmd, token):
    a, b = tracker.job(), tracker.job()
    pa = tracker.popen(a.popen(child_cmd("sleep", token), dict(stdout=PIPE, text=True)))
    pb = tracker.popen(b.popen(child_cmd("sleep", token), dict(stdout=PIPE, text=True)))
    _ready(tracker, pa)
    _ready(tracker, pb)
    ha, hb = tracker.open(pa.pid, token), tracker.open(pb.pid, token)
    assert a.member_pids() == [pa.pid] and b.member_pids() == [pb.pid]
    a.kill_all()
    assert tracker.wait_gone([ha], 3.0) == []
    # The control: the same check sees b's member alive.
    assert tracker.wait_gone([hb], 0.5) == [hb]
    assert b.member_pids() == [pb.pid]


@pytest.mark.parametrize("strategy", IN_POPEN)
def test_nested_job_closing_the_inner_one(tracker, child_cmd, token, strategy):
    outer = tracker.job(strategy)
    inner = tracker.job(strategy, parent=outer)
    po = tracker.popen(outer.popen(child_cmd("sleep", token), dict(stdout=PIPE, text=True)))
    pi = tracker.popen(inner.popen(child_cmd("tree", token), dict(stdout=PIPE, text=True)))
    _ready(tracker, po)
    _, cpid, gpid = tracker.first_line(pi).split()
    ho = tracker.open(po.pid, token)
    hi = [tracker.open(int(cpid), token), tracker.open(int(gpid), token)]
    assert sorted(inner.member_pids()) == sorted([int(cpid), int(gpid)])
    assert sorted(outer.member_pids()) == sorted([po.pid, int(cpid), int(gpid)])
    inner.close()
    assert tracker.wait_gone(hi, 3.0) == []
    assert tracker.wait_gone([ho], 0.5) == [ho]  # the outer job's own member lives on
    assert outer.member_pids() == [po.pid]


def test_nested_job_closing_the_outer_one(tracker, child_cmd, token):
    outer = tracker.job()
    inner = tracker.job(parent=outer)
    pi = tracker.popen(inner.popen(child_cmd("tree", token), dict(stdout=PIPE, text=True)))
    _, cpid, gpid = tracker.first_line(pi).split()
    hi = [tracker.open(int(cpid), token), tracker.open(int(gpid), token)]
    outer.close()
    assert tracker.wait_gone(hi, 3.0) == []
    with pytest.raises(JobClosed):
        inner.popen(child_cmd("sleep", token), {})


def test_background_job_limits_and_guarantee(tracker):
    job = tracker.job(background=True, cpu_percent=25)
    tr = job.trace()
    assert tr["kill_on_close"] is False
    # What was passed to SetInformationJobObject (Wine accepts and ignores the priority).
    assert tr["limits"] == {
        "LimitFlags": w.JOB_OBJECT_LIMIT_PRIORITY_CLASS,
        "PriorityClass": w.BELOW_NORMAL_PRIORITY_CLASS,
    }
    g = job.guarantee
    assert not g.kernel_enforced and g.disabled is None and "outlives" in g.ends_job
    if tr["cpu_rate"] is None:
        # Wine 8 rejects JobObjectCpuRateControlInformation (ERROR_INVALID_PARAMETER):
        # the guarantee must say so, never pretend.
        assert any("CPU cap of 25% not applied" in n and "Win32 error" in n for n in g.not_covered)
    else:
        assert tr["cpu_rate"] == {
            "ControlFlags": w.JOB_OBJECT_CPU_RATE_CONTROL_ENABLE | w.JOB_OBJECT_CPU_RATE_CONTROL_HARD_CAP,
            "CpuRate": 2500,
        }


@pytest.mark.parametrize("strategy", ALL)
def test_missing_program_raises_file_not_found(tracker, strategy):
    job = tracker.job(strategy)
    with pytest.raises(FileNotFoundError):
        job.popen([r"C:\no\such\dir\program.exe"], {})
    assert job.member_pids() == []


# popen_suspended is plain subprocess.Popen: nothing of ours touches env or cwd there.
@pytest.mark.parametrize("strategy", IN_POPEN)
def test_env_and_cwd_reach_the_child(tracker, child_cmd, token, tmp_path, strategy):
    job = tracker.job(strategy)
    value = "h\u00e9llo w\u00f6rld \u2603"
    env = dict(os.environ, TETHER_LANE_VALUE=value)
    p = tracker.popen(job.popen(
        child_cmd("env", token, "TETHER_LANE_VALUE"),
        dict(stdout=PIPE, text=True, env=env, cwd=str(tmp_path)),
    ))
    lines = p.communicate(timeout=30)[0].splitlines()
    assert lines[0] == ascii(value)
    assert os.path.normcase(lines[1]) == os.path.normcase(str(tmp_path))


@pytest.mark.parametrize("strategy", ALL)
def test_the_job_cookie_is_first_in_the_childs_environment(tracker, child_cmd, token, strategy):
    job = tracker.job(strategy, cookie="run-1:j1:feedc0de", cookie_var="TETHER_JOB")
    env = dict(os.environ, TETHER_JOB="a forged one", OTHER="x")
    p = tracker.popen(job.popen(child_cmd("env", token, "TETHER_JOB"),
                                dict(stdout=PIPE, text=True, env=env)))
    assert p.communicate(timeout=30)[0].splitlines()[0] == ascii("run-1:j1:feedc0de")
    # Control: a job without a cookie passes the environment as given.
    plain = tracker.job(strategy)
    q = tracker.popen(plain.popen(child_cmd("env", token, "TETHER_JOB"),
                                  dict(stdout=PIPE, text=True, env=env)))
    assert q.communicate(timeout=30)[0].splitlines()[0] == ascii("a forged one")


def test_signal_all_reaches_only_groups_the_job_created(tracker, child_cmd, token):
    job = tracker.job()
    plain = tracker.popen(job.popen(child_cmd("sleep", token), dict(stdout=PIPE, text=True)))
    group = tracker.popen(job.popen(
        child_cmd("break", token),
        dict(stdout=PIPE, text=True, creationflags=subprocess.CREATE_NEW_PROCESS_GROUP),
    ))
    _ready(tracker, plain)
    _ready(tracker, group)
    sent = job.signal_all(signal.SIGTERM)
    assert plain.pid not in sent  # no polite signal can reach a process without a group
    if sent:  # Windows: the group's console got CTRL_BREAK_EVENT
        assert sent == [group.pid]
        assert group.wait(5) == 42
    else:  # Wine 8: GenerateConsoleCtrlEvent fails; nothing was sent, nothing harmed
        assert group.poll() is None
    assert plain.poll() is None
    job.kill_all()
    assert plain.wait(5) == W.KILLED_EXIT_CODE


def test_concurrent_spawns_land_in_their_own_jobs(tracker, api, child_cmd, token):
    """The Popen subclass carries its job in a thread-local: threads must not mix."""
    jobs = [tracker.job(), tracker.job()]
    spawned: dict[str, list[subprocess.Popen]] = {"0": [], "1": [], "plain": []}
    errors: list[BaseException] = []
    lock = threading.Lock()

    def spawn(key: str) -> None:
        try:
            for _ in range(3):
                cmd = child_cmd("sleep", token)
                kw = dict(stdout=PIPE, text=True)
                p = subprocess.Popen(cmd, **kw) if key == "plain" else jobs[int(key)].popen(cmd, kw)
                with lock:
                    spawned[key].append(tracker.popen(p))
        except BaseException as e:  # reported below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=spawn, args=(k,)) for k in spawned]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    for key in ("0", "1"):
        assert sorted(jobs[int(key)].member_pids()) == sorted(p.pid for p in spawned[key])
    for p in spawned["plain"]:
        flag = w.BOOL(1)
        for j in jobs:
            api.IsProcessInJob(int(p._handle), j._handle, ctypes.byref(flag))
            assert flag.value == 0


# --- failures are loud ------------------------------------------------------------
class _CollidingJob(W.WindowsJob):
    """CreateJobObjectW under the name of an existing event: it fails for real."""

    name_taken = ""

    def _create_job_object(self, api):
        return api.CreateJobObjectW(None, self.name_taken)


def test_job_that_cannot_be_created_starts_nothing(tracker, child_cmd, token, tmp_path):
    k = ctypes.WinDLL("kernel32", use_last_error=True)
    k.CreateEventW.restype = ctypes.c_void_p
    k.CreateEventW.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_wchar_p]
    k.CloseHandle.argtypes = [ctypes.c_void_p]
    name = f"Local\\{token}"
    event = k.CreateEventW(None, 1, 0, name)
    assert event
    try:
        _CollidingJob.name_taken = name
        job = _CollidingJob(JobOptions(name="collide", job_id=token))
        g = job.guarantee
        assert g.disabled and "CreateJobObjectW failed with Win32 error" in g.disabled
        assert "kill-on-close DISABLED" in str(g)
        assert not g.kernel_enforced
        marker = tmp_path / "ran"
        with pytest.raises(JobRefused, match="kill-on-close DISABLED"):
            job.popen(child_cmd("marker", token, str(marker)), {})
        assert _processes_with(token) == []
        assert not marker.exists()
        job.close()
    finally:
        k.CloseHandle(event)


class _AssignDeniedJob(W.WindowsJob):
    """The job handle is swapped for one without JOB_OBJECT_ASSIGN_PROCESS, so
    placement fails for real with ERROR_ACCESS_DENIED (what real Windows has
    been seen to answer for some nested-job orders)."""

    def _open(self):
        super()._open()
        api = self._api
        me = api.GetCurrentProcess()
        limited = w.HANDLE()
        api.DuplicateHandle(me, self._handle, me, ctypes.byref(limited), w.JOB_OBJECT_QUERY, False, 0)
        self._full_handle = self._handle
        self._handle = limited.value

    def close(self):
        full = getattr(self, "_full_handle", None)
        if full and not self._closed:
            self._api.CloseHandle(self._handle)
            self._handle, self._full_handle = full, None
        super().close()


@pytest.mark.parametrize("strategy", ALL)
def test_child_that_cannot_join_the_job_never_runs(tracker, child_cmd, token, tmp_path, strategy):
    job = _AssignDeniedJob(JobOptions(name="denied", job_id=token), strategy=strategy)
    tracker.jobs.append(job)
    marker = tmp_path / "ran"
    with pytest.raises(JobRefused, match="could not be placed in the job"):
        job.popen(child_cmd("marker", token, str(marker)), dict(stdout=PIPE))
    assert _processes_with(token) == []
    time.sleep(0.3)
    assert not marker.exists()


def test_plain_subprocess_is_untouched(api, child_cmd, token):
    """Our Popen subclass copies _execute_child; subprocess itself is not patched."""
    job = W.WindowsJob(JobOptions(name="x", job_id=token))
    try:
        assert subprocess._winapi.CreateProcess is not W._create_process
        out = subprocess.run(child_cmd("echo", token, "3"), input="a", stdout=PIPE, text=True,
                             timeout=30)
        assert (out.stdout, out.returncode) == ("A", 3)
    finally:
        job.close()


def test_struct_sizes_on_real_windows_python():
    """The layouts, measured by the Windows build of CPython itself, and the
    fixed-width types against ctypes.wintypes (which is right on Windows)."""
    from ctypes import wintypes

    assert sys.maxsize > 2**32  # the lane runs the x64 build
    for name, size in w.STRUCT_SIZES_X64.items():
        assert ctypes.sizeof(getattr(w, name)) == size, name
    for ours, theirs in [(w.DWORD, wintypes.DWORD), (w.WORD, wintypes.WORD),
                         (w.BOOL, wintypes.BOOL), (w.HANDLE, wintypes.HANDLE),
                         (w.LONG, wintypes.LONG), (w.LARGE_INTEGER, wintypes.LARGE_INTEGER)]:
        assert ctypes.sizeof(ours) == ctypes.sizeof(theirs)
    assert ctypes.sizeof(ctypes.c_wchar) == 2
    assert W._clone_available()  # this CPython's Popen calls _winapi.CreateProcess


def test_no_member_can_break_away(tracker, api, child_cmd, token):
    """tether never sets BREAKAWAY_OK: CREATE_BREAKAWAY_FROM_JOB is refused inside the job."""
    job = tracker.job()
    p = tracker.popen(job.popen(child_cmd("breakaway", token), dict(stdout=PIPE, text=True)))
    assert p.communicate(timeout=30)[0].split() == ["denied", str(w.ERROR_ACCESS_DENIED)]
    if not W._in_any_job(api):  # control: outside any job the same flag starts the process
        out = subprocess.run(child_cmd("breakaway", token), stdout=PIPE, text=True, timeout=30).stdout
        assert out.split()[0] == "escaped"


@pytest.mark.parametrize("in_tether_job", [True, False])
def test_a_libuv_style_inner_job_cannot_take_members_out(tracker, api, child_cmd, token,
                                                         in_tether_job):
    """Node's libuv puts itself in a job with SILENT_BREAKAWAY_OK: its children leave
    that job, but not tether's, which does not allow breakaway. The control (no
    tether job) shows the breakaway is real: there the grandchild is in no job."""
    if not in_tether_job and W._in_any_job(api):
        pytest.skip("the test runner is itself in a job: no clean control here")
    job = tracker.job()
    cmd, kw = child_cmd("libuv", token), dict(stdout=PIPE, text=True)
    p = tracker.popen(job.popen(cmd, kw) if in_tether_job else subprocess.Popen(cmd, **kw))
    line = tracker.first_line(p).split()
    assert line[0] == "pids", line
    child, grandchild = int(line[1]), int(line[2])
    handles = [tracker.open(child, token), tracker.open(grandchild, token)]
    if in_tether_job:
        assert sorted(job.member_pids()) == sorted([child, grandchild])
        assert tracker.in_any_job(handles[1])
        job.kill_all()
        assert tracker.wait_gone(handles, 3.0) == []
    else:
        assert not tracker.in_any_job(handles[1])  # it broke away from libuv's job
