"""Fixtures of the Windows lane (see scripts/windows-lane.sh).

Two kinds of test live here:
  * ``test_win_*.py`` run inside the official Windows CPython under Wine
    (pytest started by the lane script); on Linux they are not collected.
  * ``test_lane_*.py`` run on Linux and drive Wine processes from outside
    (SIGKILL of a Wine process's Linux pid); they need the lane's Wine set-up
    and skip, saying so, without it.

Every process a test starts is ended in a fixture finalizer, through a
handle opened while the process was known to be the test's own (its command
line carries the test's token), so a reused pid is never touched.
"""

from __future__ import annotations

import itertools
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = os.path.join(HERE, "_child.py")
OWNER = os.path.join(HERE, "_owner.py")

if sys.platform == "win32":
    collect_ignore_glob = ["test_lane_*.py"]
else:
    collect_ignore_glob = ["test_win_*.py"]

_tokens = itertools.count(1)


@pytest.fixture
def token() -> str:
    """A string unique to this test, carried on its processes' command lines."""
    return f"tethertest{os.getpid()}n{next(_tokens)}"


if sys.platform == "win32":
    import ctypes
    import subprocess

    from tether.platform import _winapi as w
    from tether.platform.base import JobOptions
    from tether.platform.windows import WindowsJob

    # PROCESS_QUERY_INFORMATION: Wine's IsProcessInJob wants it (the limited right is not enough).
    OPEN_ACCESS = w.SYNCHRONIZE | w.PROCESS_TERMINATE | w.PROCESS_QUERY_INFORMATION

    def child_cmd(mode: str, token: str, *args: str) -> list[str]:
        return [sys.executable, "-S", CHILD, mode, token, *args]

    class Tracker:
        """Handles and Popen objects a test owns; all ended at teardown."""

        def __init__(self, api: w.Api, capfd: pytest.CaptureFixture[str]) -> None:
            self.api = api
            self.capfd = capfd
            self.handles: list[int] = []
            self.popens: list[subprocess.Popen] = []
            self.jobs: list[WindowsJob] = []

        def popen(self, p: subprocess.Popen) -> subprocess.Popen:
            self.popens.append(p)
            return p

        def job(self, strategy: str | None = None, **options) -> WindowsJob:
            options.setdefault("name", f"t{len(self.jobs)}")
            options.setdefault("job_id", f"t{len(self.jobs)}")
            j = WindowsJob(JobOptions(**options), strategy=strategy)
            self.jobs.append(j)
            return j

        def first_line(self, p: subprocess.Popen, timeout: float = 45.0):
            """``p``'s first stdout line, waited for at most ``timeout`` s.

            Never a bare ``readline()``: when Wine fails to start a process
            (WinError 1359, see pytest-wine.ini) the line never comes, and
            pytest-timeout's only method on Windows (a thread) ends the whole
            run. No line in time, or end of file, fails the test with what
            its processes wrote on stderr, so Wine's failed start reads as
            such and pytest-wine.ini's rerun rule applies to it.
            """
            import _winapi
            import msvcrt
            import time

            handle = msvcrt.get_osfhandle(p.stdout.fileno())
            deadline = time.monotonic() + timeout
            while True:
                try:
                    if _winapi.PeekNamedPipe(handle, 0)[0]:
                        break
                except BrokenPipeError:
                    break  # every writer is gone: readline returns what is left at once
                if time.monotonic() > deadline:
                    self._no_line(p, f"no line in {timeout} s")
                time.sleep(0.02)
            line = p.stdout.readline()
            if not line.strip():
                self._no_line(p, f"end of output ({line!r}), exit code {p.poll()}")
            return line

        def _no_line(self, p: subprocess.Popen, why: str) -> None:
            err = self.capfd.readouterr().err
            sys.stderr.write(err)  # back into the report's captured stderr
            pytest.fail(f"{why} from {p.args!r}; stderr: {err!r}")

        def open(self, pid: int, token: str) -> int:
            """A handle to ``pid``, checked to be one of this test's processes."""
            import psutil

            handle = self.api.OpenProcess(OPEN_ACCESS, False, pid)
            self.handles.append(handle)
            # The pid could only have been reused if the process had ended;
            # with the handle open, its command line settles who it is.
            # Under Wine a process's command line can read as the bare image path
            # for a moment after it starts: look again briefly before deciding.
            import time

            deadline = time.monotonic() + 2.0
            while True:
                try:
                    cmdline = psutil.Process(pid).cmdline()
                except psutil.NoSuchProcess:
                    return handle  # already gone (ended by the job): nothing to check or end
                if any(token in part for part in cmdline) or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert any(token in part for part in cmdline), f"pid {pid} is not ours: {cmdline}"
            return handle

        def in_any_job(self, handle: int) -> bool:
            flag = w.BOOL(0)
            self.api.IsProcessInJob(handle, None, ctypes.byref(flag))
            return bool(flag.value)

        def alive(self, handle: int) -> bool:
            return self.api.WaitForSingleObject(handle, 0) == w.WAIT_TIMEOUT

        def wait_gone(self, handles: list[int], timeout: float = 3.0) -> list[int]:
            """Wait (bounded) for every handle's process to end; return the survivors."""
            import time

            deadline = time.monotonic() + timeout
            left = []
            for h in handles:
                remaining = max(0, int((deadline - time.monotonic()) * 1000))
                if self.api.WaitForSingleObject(h, remaining) != w.WAIT_OBJECT_0:
                    left.append(h)
            return left

        def exit_code(self, handle: int) -> int:
            code = w.DWORD()
            self.api.GetExitCodeProcess(handle, ctypes.byref(code))
            return code.value

        def cleanup(self) -> None:
            for p in self.popens:
                if p.poll() is None:
                    p.kill()
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    pass
                for stream in (p.stdin, p.stdout, p.stderr):
                    if stream is not None:
                        stream.close()
            for j in self.jobs:
                j.close()
            for h in self.handles:
                if self.alive(h):
                    self.api.TerminateProcess(h, 1)
                    self.api.WaitForSingleObject(h, 3000)
                self.api.CloseHandle(h)

    @pytest.fixture(name="child_cmd")
    def child_cmd_fixture():
        """``child_cmd(mode, token, *args)``: the argv of a ``_child.py`` process."""
        return child_cmd

    @pytest.fixture
    def api() -> w.Api:
        return w.load()

    @pytest.fixture
    def tracker(api: w.Api, capfd: pytest.CaptureFixture[str]):
        t = Tracker(api, capfd)
        yield t
        t.cleanup()


if sys.platform != "win32":
    from _linuxprocs import LinuxProcs

    @pytest.fixture
    def linux_procs(token):
        """This test's Linux processes (Wine processes seen from Linux); each
        one recorded is SIGKILLed at teardown, after its identity is re-checked."""
        procs = LinuxProcs(token)
        yield procs
        for pid in list(procs.known):
            procs.kill(pid)
