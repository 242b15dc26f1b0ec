#!/usr/bin/env python3
"""List processes our test suite left running; exit 1 if any is ours.

Ours, provably: a live process whose environment carries TETHER_TEST_MARK
(every process the core tests start has it), or a member of a tether-*
cgroup. Those are ended (by identity) and reported as a failure. Orphans
(PPID 1) born during this CI run are listed for a human to look at.
"""

from __future__ import annotations

import os
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from tether import identity  # noqa: E402


def _marked(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return any(e.startswith(b"TETHER_TEST_MARK=") for e in f.read().split(b"\0"))
    except OSError:
        return False


def _watch_new_pids(me: set[int], seconds: float) -> list[identity.Identity]:
    """A pid-hopper lives a few ms per pid and slips through one capture; watch
    the newest pids (the last one the kernel handed out is in /proc/loadavg)
    for a while, and end every marked process seen there."""
    import time

    found: dict[int, identity.Identity] = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with open("/proc/loadavg") as f:
            last = int(f.read().split()[-1])
        for pid in range(max(last - 8, 2), last + 2):
            if pid in me or pid in found or not _marked(pid):
                continue
            ident = identity.read(pid)
            if ident is None or ident.state == "Z":
                continue
            found[pid] = ident
            try:
                identity.send_signal(ident, signal.SIGKILL, member=True)
            except Exception:  # noqa: BLE001
                pass
        time.sleep(0.0005)
    return list(found.values())


def main() -> int:
    cap = identity.capture()
    me = identity.own_ancestors()
    ours = []
    for ident in cap.procs.values():
        if ident.pid in me or ident.pid <= 2 or ident.state == "Z":
            continue
        try:
            with open(f"/proc/{ident.pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if any(e.startswith(b"TETHER_TEST_MARK=") for e in env):
            ours.append(ident)
    try:
        from tether.cgroupfs import RUN_PREFIX
        from tether.cgroupfs import mount as cgroup2_mount

        mount = cgroup2_mount()
        if mount:
            for dirpath, dirs, _ in os.walk(mount):
                if os.path.basename(dirpath).startswith(RUN_PREFIX):
                    for sub, _d, _f in os.walk(dirpath):
                        try:
                            with open(os.path.join(sub, "cgroup.procs")) as f:
                                for pid in f.read().split():
                                    i = identity.read(int(pid))
                                    if i and i.state != "Z":
                                        ours.append(i)
                        except OSError:
                            pass
                    dirs[:] = []
    except Exception as exc:  # noqa: BLE001
        print(f"leak-check: cgroup scan failed: {exc}")
    ours += _watch_new_pids(me, seconds=2.0)
    for i in ours:
        print(f"LEAK: pid {i.pid} ({i.comm}) ppid {i.ppid} uid {i.uid}")
        try:
            identity.send_signal(i, signal.SIGKILL, member=True)
        except Exception:  # noqa: BLE001
            pass
    born = int(os.environ.get("TETHER_CI_BORN", "0") or 0)
    if born:
        for i in cap.procs.values():
            if i.ppid == 1 and i.start >= born and i.state != "Z" and i.pid not in me:
                print(f"note: orphan born during CI: pid {i.pid} ({i.comm}) uid {i.uid}")
    if ours:
        print(f"leak-check: {len(ours)} process(es) of our test suite were still running")
        return 1
    print("leak-check: nothing of ours left running")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
