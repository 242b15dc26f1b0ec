"""The owner's beacon (tether/keeper/_beacon.py, keeper.c's beacon_wait):
the native keeper told of its owner's death at the start of the owner's
exit, before the kernel unmaps the owner's memory and fires its pidfd - and
never told wrongly (a thread that ends while the process lives on)."""

from __future__ import annotations

import json
import os
import platform
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from procutil import available, poll_until

from tether.keeper import native

pytestmark = [
    pytest.mark.mechanism,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only"),
    pytest.mark.timeout(180),
]

MECHS = [m for m in ("cgroup", "subreaper", "pidns") if available(m)]

# An owner that holds MB megabytes (touched), opens two jobs of MECH (the
# kernel wakes one waiter of a robust futex: the other keeper must be told
# too) and starts a sleep in each.
BIG_OWNER = textwrap.dedent("""
    import json, os, sys, time
    held = bytearray(int(sys.argv[2]) * 2**20)
    held[::4096] = b"x" * len(held[::4096])
    from tether import Job
    jobs = [Job(mechanism=sys.argv[1]) for _ in range(2)]
    kids = [j.popen(["sleep", "300"]) for j in jobs]
    print(json.dumps({"members": [k.pid for k in kids],
                      "watch": [j.trace()["owner_watch"] for j in jobs]}), flush=True)
    time.sleep(600)
""")


def _deaths(procs, mech: str, mb: int, beacon: bool) -> tuple[float, list[float], list[str]]:
    """SIGKILL a BIG_OWNER: when (ms after the kill) its pidfd and its two
    members' pidfds fired, and what its jobs said watched it."""
    env = procs.env(_TETHER_BEACON="1" if beacon else "0")
    owner = procs.popen([sys.executable, "-c", BIG_OWNER, mech, str(mb)], env=env,
                        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    info = json.loads(owner.stdout.readline() or "null")
    assert info, "the owner died before it reported"
    fds = {os.pidfd_open(owner.pid): "owner"}
    fds.update((os.pidfd_open(pid), f"member {pid}") for pid in info["members"])
    when: dict[str, float] = {}
    try:
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        t0 = time.monotonic()
        owner.kill()
        while len(when) < len(fds) and time.monotonic() < t0 + 10:
            for fd, _ in poller.poll(100):
                when[fds[fd]] = (time.monotonic() - t0) * 1000
                poller.unregister(fd)
    finally:
        for fd in fds:
            os.close(fd)
    owner.wait(timeout=10)
    assert len(when) == 3, f"not all gone within 10 s: {when}"
    return when.pop("owner"), sorted(when.values()), info["watch"]


@pytest.mark.parametrize("mech", MECHS)
def test_a_big_owners_jobs_end_while_it_is_still_unmapping_its_memory(procs, mech):
    """An owner holding 1 GiB takes tens of ms to unmap it after SIGKILL, and
    only then does its pidfd fire; told by the beacon at the start of that
    exit, both of its keepers (the kernel wakes one: it wakes the other) end
    their jobs in the first half of it."""
    tries = []
    for _ in range(3):  # the first almost always; a loaded machine may need another
        owner, members, watch = _deaths(procs, mech, 1024, beacon=True)
        if watch != ["pidfd+beacon"] * 2:
            pytest.skip(f"this run's keeper has no beacon (owner_watch: {watch})")
        tries.append((owner, members))
        if members[-1] < owner / 2:
            break
    assert members[-1] < owner / 2, f"(owner's pidfd, members' pidfds) in ms: {tries}"
    # The control: the same owner without a beacon. Its keepers learn of its
    # death from its socket's end and its pidfd, after the memory is gone.
    owner, members, watch = _deaths(procs, mech, 1024, beacon=False)
    assert watch == ["pidfd", "pidfd"]
    assert members[0] >= owner / 2, (owner, members)


# The owner's main thread ends (the raw exit system call: that thread only)
# while a second thread lives on: the kernel tells the beacon (the mutex's
# holder died), and the keeper must see that the process lives on.
SYS_EXIT = {"x86_64": 60, "aarch64": 93, "riscv64": 93, "i686": 1, "armv7l": 1,
            "ppc64le": 1, "s390x": 1}.get(platform.machine())
LEADER_EXITS = textwrap.dedent("""
    import ctypes, json, os, sys, threading, time
    from tether import Job
    from tether.keeper import _beacon
    job = Job(mechanism=sys.argv[1])
    kid = job.popen(["sleep", "300"])
    libc = ctypes.CDLL(None)

    def second():
        def leader_state():
            with open(f"/proc/self/task/{os.getpid()}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0]
        while leader_state() != "Z":
            time.sleep(0.01)
        time.sleep(0.5)  # the keeper has long been told by now
        made = _beacon.for_keeper()  # (this process's, made by the main thread, or None)
        told = made is not None and bool(  # FUTEX_OWNER_DIED
            int.from_bytes(_beacon._pages[0][made[1]:made[1] + 4], sys.byteorder) & 0x40000000)
        print(json.dumps({"member": kid.pid, "watch": job.trace()["owner_watch"], "told": told}),
              flush=True)
        time.sleep(600)

    threading.Thread(target=second).start()
    time.sleep(0.2)
    libc.syscall(int(sys.argv[2]), 0)
""")


@pytest.mark.skipif(SYS_EXIT is None, reason=f"the exit system call's number on {platform.machine()}")
@pytest.mark.parametrize("mech", MECHS)
def test_the_owners_main_thread_ending_alone_ends_nothing(procs, mech):
    owner = procs.popen([sys.executable, "-c", LEADER_EXITS, mech, str(SYS_EXIT)],
                        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    info = json.loads(owner.stdout.readline() or "null")
    assert info, "the owner died before it reported"
    if info["watch"] != "pidfd+beacon":
        pytest.skip(f"this run's keeper has no beacon (owner_watch: {info['watch']})")
    member = os.pidfd_open(info["member"])
    try:
        # the kernel did tell the keeper (the main thread held the mutex) ...
        assert info["told"], info
        # ... and the keeper, seeing a thread that is not exiting, ended nothing
        assert not select.select([member], [], [], 0.5)[0], "the member was ended"
        # the control: the process's real end does end it
        owner.send_signal(signal.SIGKILL)
        assert select.select([member], [], [], 5)[0], "the member outlived its owner"
    finally:
        os.close(member)


def test_the_beacon_is_the_main_threads_and_each_processs_own(procs):
    """Made on the main thread only (a thread before it gets none, one after
    it the same); a forked child makes its own, held by its own thread."""
    code = textwrap.dedent("""
        import json, os, sys, threading
        from tether.keeper import _beacon
        got = {}
        t = threading.Thread(target=lambda: got.update(before=_beacon.for_keeper()))
        t.start(); t.join()
        main = _beacon.for_keeper()
        t = threading.Thread(target=lambda: got.update(after=_beacon.for_keeper()))
        t.start(); t.join()
        def word(made):
            page = _beacon._pages[-1]
            return int.from_bytes(page[made[1]:made[1] + 4], sys.byteorder) & 0x3FFFFFFF
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            child = _beacon.for_keeper()
            os.write(w, json.dumps({"fd": child[0], "pages": len(_beacon._pages),
                                    "word": word(child), "pid": os.getpid()}).encode())
            os._exit(0)
        os.close(w)
        child = json.loads(os.read(r, 4096))
        os.waitpid(pid, 0)
        print(json.dumps({"before": got["before"], "main": main, "after": got["after"],
                          "word": word(main), "pid": os.getpid(), "child": child}))
    """)
    r = subprocess.run([sys.executable, "-c", code], env=procs.env(_TETHER_BEACON="1"),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    if out["main"] is None:
        pytest.skip("no beacon in this process (its libc's mutex layout is not one tether knows)")
    assert out["before"] is None
    assert out["after"] == out["main"]
    assert out["word"] == out["pid"]  # held by the main thread
    child = out["child"]
    assert child["pages"] == 2 and child["word"] == child["pid"] != out["pid"]


def test_turned_off_there_is_none(procs):
    r = subprocess.run([sys.executable, "-c", "from tether.keeper import _beacon; "
                        "print(_beacon.for_keeper())"], env=procs.env(_TETHER_BEACON="0"),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "None", r


@pytest.mark.skipif(not native.built(), reason="the native keeper is not built")
@pytest.mark.parametrize("spec", ["", "x", "5", "5:", ":4", "5:3", "5:4096", "5:-4", "2:0",
                                  "5:4x"])
def test_a_malformed_beacon_argument_is_a_usage_error(spec):
    r = subprocess.run([native.HELPER, "serve", "subreaper", "0", str(os.getpid()), "-1",
                        f"beacon={spec}"], capture_output=True, text=True, timeout=30,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and "usage" in r.stderr, (spec, r)


def test_a_job_watched_with_a_beacon_says_so(procs):
    r = subprocess.run([sys.executable, "-c", "from tether import Job; j = Job(); "
                        "print(j.trace()['owner_watch'], j.trace()['keeper']); j.close()"],
                       env=procs.env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    watch, keeper = r.stdout.split()
    assert watch == ("pidfd+beacon" if keeper == "native" else "pidfd"), r.stdout
    assert poll_until(lambda: not procs.alive(), 5)
