"""Linux-side helpers of the Windows lane: Wine processes seen from Linux.

Under Wine every Windows process is a Linux process whose ``/proc/PID/cmdline``
is its Windows command line. A test recognises its own by the token on that
line, bounded to processes born after the test began, and re-checks the start
time before every SIGKILL, so a reused pid is never touched.
"""

from __future__ import annotations

import os
import signal
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, start ticks) of a Linux process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = data[data.rindex(")") + 2:].split()
    return fields[0], int(fields[19])


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def _now_ticks() -> int:
    with open("/proc/uptime") as f:
        return int(float(f.read().split()[0]) * CLK_TCK)


class LinuxProcs:
    """Linux processes of this test: (pid, start ticks), recognised by token."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.born_after = _now_ticks() - 1
        self.known: dict[int, int] = {}

    def find(self, needle: str) -> list[int]:
        """This test's processes whose command line also holds ``needle``."""
        found = []
        me = os.getpid()
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) <= 2 or int(name) == me:
                continue
            pid = int(name)
            st = _stat(pid)
            if st is None or st[1] < self.born_after:
                continue
            cmd = _cmdline(pid)
            if self.token in cmd and needle in cmd:
                self.known[pid] = st[1]
                found.append(pid)
        return found

    def adopt(self, pid: int) -> None:
        """Record ``pid`` (a process the test started itself) as one of the test's."""
        st = _stat(pid)
        assert st is not None and self.token in _cmdline(pid), (pid, _cmdline(pid))
        self.known[pid] = st[1]

    def cmdline(self, pid: int) -> str:
        return _cmdline(pid)

    def is_same(self, pid: int) -> bool:
        st = _stat(pid)
        return st is not None and st[1] == self.known.get(pid) and self.token in _cmdline(pid)

    def alive(self, pid: int) -> bool:
        st = _stat(pid)
        return st is not None and st[1] == self.known.get(pid) and st[0] not in ("Z", "X")

    def kill(self, pid: int) -> None:
        if pid > 2 and self.is_same(pid):
            os.kill(pid, signal.SIGKILL)

    def wait_gone(self, pids: list[int], timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        while True:
            left = [p for p in pids if self.alive(p)]
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.01)
