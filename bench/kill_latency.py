#!/usr/bin/env python3
"""Owner SIGKILLed -> last member dead, per mechanism, beside the kernel's own
PID-namespace teardown (`unshare --pid --fork --kill-child`) in the same run.

Trees of 1/10/100/1000 processes, escapees included (a double-forked setsid
daemon, `nohup setsid`, a SIGTERM-ignorer). The observer opens a pidfd on
every member *before* the kill and polls them afterwards: exact, and cheap
even for 1000 processes; a zombie counts as dead (pidfds fire at exit).
Members are found only among processes born after the trial began that carry
the trial's environment mark; leftovers are ended by recorded identity.

Each keeper mechanism runs with both keepers where the native one is built
(``cgroup/native`` and ``cgroup/python``: TETHER_NATIVE=1 / 0).

Targets: issue 2, tether's median within 1.5x of the unshare baseline at 100
and 1000 processes; issue 18, the native keeper at or below 1.0x there.

usage: python3 bench/kill_latency.py [--trials 20] [--sizes 1,10,100,1000] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import select
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
sys.path.insert(0, SRC)

from tether import identity  # noqa: E402
from tether.platform import native, probe  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "kill_latency.json")

TREE = ("n=$((N-3)); i=0; while [ $i -lt $n ]; do sleep 300 & i=$((i+1)); done; "
        "(setsid sh -c 'exec sleep 300' &); nohup setsid sleep 300 >/dev/null 2>&1 & "
        "trap '' TERM HUP; exec sleep 300")

OWNER = ("import sys, time; sys.path.insert(0, sys.argv[1]); from tether import Job; "
         "j = Job(mechanism=sys.argv[2]); j.popen(['/bin/sh', '-c', sys.argv[3]]); "
         "print('up', flush=True); time.sleep(600)")


def marked(born: int, mark: bytes) -> list[identity.Identity]:
    out = []
    for ident in identity.capture(born_after=born, time_cap=30.0, mem_cap=256 * 2**20).procs.values():
        if ident.state in ("Z", "X"):
            continue
        try:
            with open(f"/proc/{ident.pid}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    out.append(ident)
        except OSError:
            continue
    return out


def start_owner(kind: str, n: int, env: dict) -> subprocess.Popen:
    tree = TREE if n > 1 else "trap '' TERM HUP; exec sleep 300"
    kind, _, keeper = kind.partition("/")
    if keeper:
        env = dict(env, TETHER_NATIVE="1" if keeper == "native" else "0")
    if kind == "unshare":
        args = ["unshare", "--pid", "--fork", "--kill-child"]
        if os.geteuid() != 0:
            args.insert(1, "-Ur")
        args += ["/bin/sh", "-c", tree]
    else:
        args = [sys.executable, "-c", OWNER, SRC, kind, tree]
    return subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            start_new_session=True)


def trial(kind: str, n: int) -> dict:
    mark = f"TETHER_BENCH_MARK={uuid.uuid4().hex}".encode()
    env = dict(os.environ, N=str(n), TETHER_BENCH_MARK=mark.split(b"=", 1)[1].decode())
    born = identity.now_ticks()
    owner = start_owner(kind, n, env)
    pidfds: list[int] = []
    try:
        if kind != "unshare":
            owner.stdout.readline()
        want = n + (1 if kind == "unshare" else 0)  # unshare's init sh is in the tree too
        deadline = time.monotonic() + 30
        members = []
        while time.monotonic() < deadline:
            members = [m for m in marked(born, mark) if m.pid != owner.pid]
            if len(members) >= want:
                break
            time.sleep(0.02)
        time.sleep(0.05)
        members = [m for m in marked(born, mark) if m.pid != owner.pid]
        for m in members:
            try:
                pidfds.append(os.pidfd_open(m.pid))
            except OSError:
                pass
        poller = select.poll()
        for fd in pidfds:
            poller.register(fd, select.POLLIN)
        pending = set(pidfds)
        t0 = time.perf_counter()
        owner.kill()
        last = t0
        limit = t0 + 5
        while pending and time.perf_counter() < limit:
            for fd, _ in poller.poll(50):
                if fd in pending:
                    pending.discard(fd)
                    poller.unregister(fd)
                    last = time.perf_counter()
        return {"members": len(pidfds), "survivors": len(pending),
                "ms": (last - t0) * 1000 if not pending else None}
    finally:
        for fd in pidfds:
            os.close(fd)
        if owner.poll() is None:
            owner.kill()
        owner.wait()
        if owner.stdout:
            owner.stdout.close()
        cleanup(born, mark)


def cleanup(born: int, mark: bytes) -> None:
    from tether.ending import end

    end(lambda: marked(born, mark), born_after=born, grace=0, quiet=0.1, bound=5)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main() -> int:
    # A timeout's SIGTERM must still run the trial's cleanup (finally blocks).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--sizes", default="1,10,100,1000")
    ap.add_argument("--quick", action="store_true", help="5 trials, sizes 1,10,100")
    a = ap.parse_args()
    trials = 5 if a.quick else a.trials
    sizes = [1, 10, 100] if a.quick else [int(x) for x in a.sizes.split(",")]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    keepers = ["native", "python"] if native.built() else ["python"]
    kinds = [f"{m}/{k}" if m != "pgroup" else m
             for m in ("cgroup", "subreaper", "pidns", "pgroup") if probe(m).available
             for k in (keepers if m != "pgroup" else ["python"])]
    baseline_ok = shutil.which("unshare") is not None
    if baseline_ok:
        kinds.insert(0, "unshare")
    out: dict = {"bench": "kill_latency", "trials": trials, "sizes": sizes, "uid": os.geteuid(),
                 "kernel": platform.release(), "load_avg_start": os.getloadavg(), "results": {},
                 "baseline": "unshare --pid --fork --kill-child" if baseline_ok else "unavailable"}
    print("owner SIGKILL -> last member dead (ms); tree includes setsid/nohup escapees and a TERM-ignorer")
    print(f"  {'mechanism':<17} {'size':>5} {'p50':>8} {'p99':>8} {'max':>8} {'survivors':>9} {'vs unshare':>10}")
    for n in sizes:
        t = trials if n < 1000 else max(3, trials // 2)
        for kind in kinds:
            rs = [trial(kind, n) for _ in range(t)]
            ms = [r["ms"] for r in rs if r["ms"] is not None]
            surv = sum(r["survivors"] for r in rs)
            row = {"trials": t, "members_median": statistics.median(r["members"] for r in rs),
                   "survivors_total": surv,
                   "p50_ms": round(statistics.median(ms), 2) if ms else None,
                   "p99_ms": round(pct(ms, 0.99), 2) if ms else None,
                   "max_ms": round(max(ms), 2) if ms else None, "all_ms": [round(x, 3) for x in ms]}
            out["results"].setdefault(str(n), {})[kind] = row
            base = out["results"][str(n)].get("unshare", {}).get("p50_ms")
            ratio = (row["p50_ms"] / base) if (base and row["p50_ms"]) else None
            row["ratio_vs_unshare"] = round(ratio, 2) if ratio else None
            fmt = lambda v: f"{v:8.2f}" if v is not None else f"{'-':>8}"  # noqa: E731
            print(f"  {kind:<17} {n:5d} {fmt(row['p50_ms'])} {fmt(row['p99_ms'])} {fmt(row['max_ms'])} "
                  f"{surv:9d} {(f'{ratio:.2f}x') if ratio else '-':>10}")
    out["load_avg_end"] = os.getloadavg()
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump(out, f, indent=2)
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
