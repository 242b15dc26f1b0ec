"""Import-light Linux helpers for ending a job: cgroup v2 files and the subreaper loop.

Shared by the generic keeper (``_keeper``, ``linux_cgroup``,
``linux_subreaper`` re-export these names) and by the one-command path
(``oneshot``) that ``tether-shell`` runs on every command. This module imports
only ``os``, ``time`` and ``_signal`` (not ``signal``, which pulls in ``enum``;
not ``contextlib``/``dataclasses``), so the one-command path starts fast.
"""

from __future__ import annotations

import _signal
import os
import sys
import time

RUN_PREFIX = "tether-"
PR_SET_CHILD_SUBREAPER = 36
SIGKILL = 9

HAVE_PIDFD = hasattr(os, "pidfd_open") and sys.platform.startswith("linux")


# -- naming ------------------------------------------------------------------------

def name_process(name: bytes) -> None:
    """Set our comm (`tether ps` finds keepers and wardens by it)."""
    try:
        with open("/proc/self/comm", "wb") as f:
            f.write(name)
    except OSError:
        pass


def set_subreaper() -> None:
    """``prctl(PR_SET_CHILD_SUBREAPER, 1)``: orphans below us re-parent to us."""
    import ctypes  # ~3 ms to import: only where a subreaper is really made

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(err)}")


# -- cgroup v2 -----------------------------------------------------------------------

def cgroup2_mount() -> str | None:
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if right.split(" ", 1)[0] == "cgroup2":
                    return left.split(" ")[4].replace("\\040", " ")
    except OSError:
        return None
    return None


def own_cgroup(pid: int | str = "self") -> str | None:
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        return None
    return None


def _write(path: str, data: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data.encode())
    finally:
        os.close(fd)


def procs_here(path: str) -> list[int]:
    """The processes directly in cgroup ``path`` (not in its children)."""
    try:
        with open(os.path.join(path, "cgroup.procs"), "rb") as f:
            return [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return []


def _procs(path: str) -> list[int]:
    """The processes in cgroup ``path`` and every cgroup below it."""
    out: list[int] = []
    for dirpath, _dirs, _files in os.walk(path):
        out.extend(procs_here(dirpath))
    return out


def populated(path: str) -> bool:
    try:
        with open(os.path.join(path, "cgroup.events"), "rb") as f:
            for line in f:
                if line.startswith(b"populated "):
                    return line.split()[1] != b"0"
    except FileNotFoundError:
        return False
    except OSError:
        pass
    return bool(_procs(path))


def kill_cgroup(path: str, timeout: float, reap=None) -> bool:
    """End every process in ``path`` and below; True once it is empty."""
    deadline = time.monotonic() + timeout
    kill_file = os.path.join(path, "cgroup.kill")
    while True:
        if os.path.exists(kill_file):
            try:
                _write(kill_file, "1")
            except OSError:
                pass
        else:  # Linux < 5.14: freeze so nobody forks between read and kill
            freeze = os.path.join(path, "cgroup.freeze")
            try:
                _write(freeze, "1")
            except OSError:
                pass
            for pid in _procs(path):
                try:
                    os.kill(pid, SIGKILL)  # members of our own cgroup, read a moment ago
                except OSError:
                    pass
            try:
                _write(freeze, "0")
            except OSError:
                pass
        if reap is not None:
            reap()
        if not populated(path):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.0005)


def remove_tree(path: str) -> bool:
    """rmdir the cgroup and its children, deepest first."""
    ok = True
    for dirpath, _dirs, _files in sorted(os.walk(path), key=lambda t: -t[0].count("/")):
        for _ in range(20):
            try:
                os.rmdir(dirpath)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.002)
        else:
            ok = False
    return ok


# -- the subreaper kill loop ---------------------------------------------------------

def read_children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                data = f.read()
        except OSError:
            continue
        out.extend(int(x) for x in data.split())
    return out


def descendants(root: int) -> list[int]:
    seen: list[int] = []
    stack = read_children(root)
    visited = set()
    while stack:
        pid = stack.pop()
        if pid in visited or pid <= 1:
            continue
        visited.add(pid)
        seen.append(pid)
        stack.extend(read_children(pid))
    return seen


def kill_pid(pid: int, sig: int) -> None:
    # These pids come from our own children lists a moment ago; the pidfd pins
    # the process so a pid recycled in between cannot be hit after the open.
    if HAVE_PIDFD:
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return
        try:
            _signal.pidfd_send_signal(fd, sig)
        except OSError:
            pass
        finally:
            os.close(fd)
    else:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def kill_descendants_loop(timeout: float, sig: int = SIGKILL, on_reap=None) -> bool:
    """Kill every descendant of this process, in rounds, until waitpid says ECHILD.

    Works because the caller is a subreaper (or a PID namespace's init): an
    orphan anywhere below is re-parented to it and shows up in the next scan.
    The children lists are not atomic, so scan again after each round of
    reaping - but not after each single reap, which is quadratic.
    ``on_reap(pid, status)`` is called for every child reaped.
    """
    me = os.getpid()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = descendants(me)
        for pid in pids:
            kill_pid(pid, sig)
        # Reap what is ready; then block briefly for the rest.
        reaped_any = False
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return True
            if pid == 0:
                break
            reaped_any = True
            if on_reap is not None:
                on_reap(pid, status)
        if not pids and not reaped_any:
            time.sleep(0.0005)
    return False
