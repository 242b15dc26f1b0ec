#!/usr/bin/env python3
"""Where a contained spawn+wait (of /bin/true, or --program) spends its time, beside plain Popen.

bench/spawn.py gives the ratio; this says what the difference is made of. A
native keeper's spawn crosses between two processes three times (the request
to the keeper, its reply once the child has exec'd, the exit status it
pushes after it reaps), where plain ``Popen`` forks, execs and waits in one.
So each round, interleaved with a plain ``Popen`` round, stamps a contained
spawn at: entry to ``popen``; the request on its way (``send`` returned);
the reply in (the keeper has cloned the child, it has exec'd, and the keeper
has had a CPU to answer on: docs/benchmarks.md, "When popen() returns"); ``popen``
returned; the child's pidfd readable (it exited); ``wait`` returned (the
keeper's pushed status taken). The stamps come from wrapping the job's
message functions in this process; nothing else changes.

Beside them, in the same run: when ``popen()`` returned, against plain
``Popen()``'s return (its own fork and exec, interleaved); and the round trip
of one small datagram between two processes on a socketpair (a forked echo),
back to back and 0.5 ms apart: the floor of one request and its reply on this
machine. ``--gap MS`` waits that long before each spawn (an agent's pace;
default 0, back to back). ``--pin`` puts this process on one CPU and the
keeper (so its children too) on another: what the spawn costs in work,
without the scheduler's placement, which on a VM can cost more than the work
(a reply sent to a process whose idle vCPU must first be woken).

usage: python3 bench/spawn_parts.py [--n 400] [--gap MS] [--mechanism cgroup|subreaper|pidns]
                                    [--program CMD] [--keeper PATH] [--pin] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from tether import Job  # noqa: E402
from tether.keeper import _proto, native, posix  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "spawn_parts.json")
PARTS = ("python before the request", "request sent (sendmsg)", "request to reply",
         "python after the reply", "child runs until its exit", "exit status taken")


def round_trip_us(n: int, gap: float) -> float:
    """Median round trip of a 1-byte datagram to a forked echo and back."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        a.close()
        try:
            while data := b.recv(64):
                b.send(data)
        finally:
            os._exit(0)
    b.close()
    ts = []
    try:
        for _ in range(n):
            t = time.perf_counter()
            a.send(b"x")
            a.recv(64)
            ts.append(time.perf_counter() - t)
            if gap:
                time.sleep(gap)
    finally:
        a.close()
        os.waitpid(pid, 0)
    return statistics.median(ts[n // 10:]) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--gap", type=float, default=0.0, metavar="MS",
                    help="quiet before each spawn, ms (default 0: back to back)")
    ap.add_argument("--mechanism", default="cgroup", choices=("cgroup", "subreaper", "pidns"))
    ap.add_argument("--keeper", default="", metavar="PATH",
                    help="another native keeper program to take apart (default: the built one)")
    ap.add_argument("--pin", action="store_true",
                    help="this process on one CPU, the keeper and its children on another")
    ap.add_argument("--out", default=RESULTS, help=f"where the results go (default {RESULTS})")
    ap.add_argument("--program", default="/bin/true",
                    help="what each round spawns, split as a shell would (default /bin/true)")
    a = ap.parse_args()
    argv = shlex.split(a.program)
    if not argv:
        ap.error("--program is empty")
    if a.n < 10 or a.gap < 0:
        ap.error("--n must be at least 10 and --gap not negative")
    if a.keeper:
        if not os.access(a.keeper, os.X_OK):
            ap.error(f"--keeper: {a.keeper} is not an executable file")
        native.HELPER = a.keeper
    elif not native.built():
        print("the native keeper is not built: nothing to take apart", file=sys.stderr)
        return 2
    pc = time.perf_counter
    stamp: dict[str, float] = {}
    send, recv, exited = _proto.send, _proto.recv, posix.JobPopen._exited

    def timed_send(*args, **kw):
        stamp["send"] = pc()
        try:
            return send(*args, **kw)
        finally:
            stamp["sent"] = pc()

    def timed_recv(*args, **kw):
        out = recv(*args, **kw)
        stamp.setdefault("reply", pc())  # the first message after the request
        return out

    def timed_exited(self, timeout):
        out = exited(self, timeout)
        stamp["exited"] = pc()
        return out

    _proto.send, _proto.recv, posix.JobPopen._exited = timed_send, timed_recv, timed_exited
    job = Job(mechanism=a.mechanism)
    if a.pin:
        cpus = sorted(os.sched_getaffinity(0))
        keeper = job.trace().get("keeper_pid")
        if len(cpus) < 2 or not keeper:
            job.close()
            ap.error("--pin needs two CPUs and a keeper")
        os.sched_setaffinity(0, {cpus[0]})
        os.sched_setaffinity(keeper, {cpus[1]})
    rows, plain, plain_ret = [], [], []
    gap = a.gap / 1000
    try:
        for i in range(a.n + 20):  # 20 warm-ups
            if gap:
                time.sleep(gap)
            t0 = pc()
            q = subprocess.Popen(argv)
            tq = pc()
            q.wait()
            tw = pc()
            if gap:
                time.sleep(gap)
            t1 = pc()
            stamp.clear()
            p = job.popen(argv)
            t3 = pc()
            p.wait()
            t4 = pc()
            if i < 20:
                continue
            plain.append(tw - t0)
            plain_ret.append(tq - t0)
            s = stamp
            rows.append((s["send"] - t1, s["sent"] - s["send"], s["reply"] - s["sent"],
                         t3 - s["reply"], s["exited"] - t3, t4 - s["exited"], t4 - t1, t3 - t1))
    finally:
        _proto.send, _proto.recv, posix.JobPopen._exited = send, recv, exited
        job.close()
    med = [statistics.median(r[k] for r in rows) * 1e6 for k in range(8)]
    p90_ret = statistics.quantiles([r[7] for r in rows], n=10)[-1] * 1e6
    plain_us = statistics.median(plain) * 1e6
    plain_ret_us = statistics.median(plain_ret) * 1e6
    plain_ret_p90 = statistics.quantiles(plain_ret, n=10)[-1] * 1e6
    rtt_tight, rtt_spaced = round_trip_us(2000, 0), round_trip_us(1000, 0.0005)
    pace = f"{a.gap:g} ms apart" if a.gap else "back to back"
    pace += ", owner and keeper pinned to two CPUs" if a.pin else ""
    print(f"contained spawn+wait of {a.program} ({a.mechanism}, native keeper), {a.n} rounds {pace}, "
          "median µs of each part")
    for name, v in zip(PARTS, med[:6], strict=True):
        print(f"  {name:<30} {v:8.1f}")
    print(f"  {'whole (its own median)':<30} {med[6]:8.1f}   plain Popen {plain_us:.1f}  "
          f"ratio {med[6] / plain_us:.2f}")
    print(f"popen() returned after {med[7]:.1f} µs (p90 {p90_ret:.1f}); plain Popen() after "
          f"{plain_ret_us:.1f} (p90 {plain_ret_p90:.1f})")
    print(f"socketpair round trip, median µs: back to back {rtt_tight:.1f}, 0.5 ms apart {rtt_spaced:.1f}")
    out = {"bench": "spawn_parts", "n": a.n, "gap_ms": a.gap, "program": argv, "pinned": a.pin,
           "keeper": a.keeper or native.HELPER, "mechanism": a.mechanism,
           "python": platform.python_version(),
           "kernel": platform.release(), "cpus": os.cpu_count(), "load_avg": os.getloadavg(),
           "parts_us": {n: round(v, 1) for n, v in zip(PARTS, med[:6], strict=True)},
           "tether_us": round(med[6], 1), "plain_us": round(plain_us, 1),
           "ratio": round(med[6] / plain_us, 3),
           "popen_returned_us": {"tether": round(med[7], 1), "tether_p90": round(p90_ret, 1),
                                 "plain": round(plain_ret_us, 1), "plain_p90": round(plain_ret_p90, 1)},
           "round_trip_us": {"back_to_back": round(rtt_tight, 1), "spaced_0.5ms": round(rtt_spaced, 1)}}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
