#!/usr/bin/env python3
"""Reading a long audit log: `tether reap`, `tether ps` and `Host()` start-up
against 1 M records, wall time and peak RSS, beside the floor in the same
run: the bare streaming reader (`audit.read_records`) over the same file.

The log is synthetic but shaped like a host's: runs of 20 jobs, each job
open -> 11 spawns, each with its exit -> close, every owner long gone. What
memory must follow is the number of runs and processes that may still be
alive, not the number of records (issue 13, item 7: under 64 MiB at 1 M).

usage: python3 bench/log_read.py [--records 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "bench", "results", "log_read.json")
TARGET_MIB = 64


def make_log(d: str, n: int) -> int:
    os.makedirs(d, mode=0o700, exist_ok=True)
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    path = os.path.join(d, "audit.jsonl")
    ts = time.time() - 86400
    i = run = 0
    with open(path, "w") as out:
        while i < n:
            run += 1
            owner = {"pid": 3_000_000 + run, "start": f"{1000 + run}@{boot}"}  # never alive
            rid = f"{3_000_000 + run}-{1000 + run}"
            recs = [{"event": "run-start"}]
            for j in range(20):
                job = f"j{run}-{j}"
                recs.append({"event": "job-open", "job": job, "name": "x", "mechanism": "cgroup",
                             "session": f"s{j}", "cookie": f"{rid}:{job}:0"})
                for k in range(11):
                    pid = 3_500_000 + (i % 100_000) + k
                    tok = f"{5000 + k}@{boot}"
                    recs.append({"event": "spawn", "job": job, "pid": pid, "start": tok,
                                 "pgid": pid, "sid": pid, "uid": 0, "in_job": True})
                    recs.append({"event": "exit", "job": job, "pid": pid, "start": tok,
                                 "status": 0})
                recs.append({"event": "job-close", "job": job, "ended": 0})
            recs.append({"event": "run-end"})
            for r in recs:
                out.write(json.dumps({"v": 1, "ts": ts, "run": rid, "owner": owner, **r},
                                     separators=(",", ":")) + "\n")
                i += 1
                ts += 0.01
    os.chmod(path, 0o600)
    return i


def measure(argv: list[str], env: dict[str, str]) -> dict:
    t = time.perf_counter()
    pid = os.posix_spawn(argv[0], argv, env, file_actions=[
        (os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0)])
    _, status, ru = os.wait4(pid, 0)
    return {"wall_s": round(time.perf_counter() - t, 2), "max_rss_mib": round(ru.ru_maxrss / 1024, 1),
            "status": os.waitstatus_to_exitcode(status)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="tether-bench-log-")
    try:
        state = os.path.join(tmp, "state")
        n = make_log(state, a.records)
        env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "src"))
        env.pop("TETHER_STATE_DIR", None)
        py = sys.executable
        cases = {
            "floor: audit.read_records": [py, "-c", "import sys; from tether import audit; "
                                          "sum(1 for _ in audit.read_records(sys.argv[1]))", state],
            "tether reap --dry-run": [py, "-m", "tether", "reap", "--dry-run", "--no-cgroups",
                                      "--state-dir", state],
            "tether ps --json": [py, "-m", "tether", "ps", "--json", "--state-dir", state],
            "Host() start-up (reap)": [py, "-c", "import sys; from tether.runs import read_runs; "
                                       "from tether.reaper import reap; "
                                       "reap(sys.argv[1], app='bench', runs=read_runs(sys.argv[1]))",
                                       state],
        }
        rows = {name: measure(argv, env) for name, argv in cases.items()}
        out = {"bench": "log_read", "records": n,
               "log_mib": round(os.path.getsize(os.path.join(state, "audit.jsonl")) / 2**20, 1),
               "target_max_rss_mib": TARGET_MIB, "cases": rows,
               "meets_target": all(r["max_rss_mib"] <= TARGET_MIB for r in rows.values())}
        os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
        with open(RESULTS, "w") as f:
            json.dump(out, f, indent=2)
            f.write("\n")
        print(f"{n} records ({out['log_mib']} MiB):")
        for name, r in rows.items():
            print(f"  {name:<28} {r['wall_s']:>6.2f} s  peak RSS {r['max_rss_mib']:>6.1f} MiB"
                  f"  (exit {r['status']})")
        print(f"target: every entry point under {TARGET_MIB} MiB: "
              f"{'met' if out['meets_target'] else 'MISSED'}")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
