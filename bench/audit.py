"""Benchmark of the spawn-audit log (tether.audit).

1. Append cost, µs per record (median of several batches), against two
   baselines in the same run on the same disk:
     - buffered:  f.write(json.dumps(r) + "\\n") on a buffered text file
     - os.write:  os.write(fd, (json.dumps(r) + "\\n").encode()) on O_APPEND
   tether adds to the os.write baseline: a stat of the live name per record
   (to follow other writers' rotations), the size check, rotation at 5 MiB.
2. Cold cost: a fresh AuditWriter + its first record + close (what a shell
   wrapper process pays once).
3. Reading N (default 1 000 000) records across rotated files: seconds, and
   peak memory measured two ways in a fresh child process per reader:
     - rss_delta: ru_maxrss after reading minus ru_maxrss before (KiB, Linux)
     - tracemalloc_peak: peak of Python allocations during a second pass
   against a naive streaming reader (`for line in f: json.loads(line)`) and a
   naive load-everything reader (a list of all records).

Usage: python bench/audit.py [--records N] [--batches B] [--batch-size K]
       (--records 0 measures appends only)
Writes bench/results/audit.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
sys.path.insert(0, str(SRC))

from tether import audit  # noqa: E402


def sample_fields(i: int) -> dict:
    return audit.spawn_fields(
        pid=100000 + i,
        start=f"{123456 + i}@6f1c0c4b-4d5e-4c1e-9d4b-2f0f4e1b9a77",
        boot="6f1c0c4b-4d5e-4c1e-9d4b-2f0f4e1b9a77",
        pgid=100000 + i,
        sid=4242,
        uid=1000,
        job="j-000017",
        session="session-3f9a",
        mechanism="subreaper",
        in_job=True,
        background=False,
        detached=False,
        app="bench",
        run="20250101T000000-4242-deadbeef",
        owner={"pid": 4242, "start": "99@6f1c0c4b-4d5e-4c1e-9d4b-2f0f4e1b9a77"},
    )


def per_record_us(fn, n: int) -> float:
    t0 = time.perf_counter()
    fn(n)
    return (time.perf_counter() - t0) / n * 1e6


def bench_append(tmp: Path, batches: int, size: int) -> dict:
    recs = [sample_fields(i) for i in range(size)]
    results: dict[str, list[float]] = {
        "tether": [],
        "os_write": [],
        "buffered": [],
        "json_only": [],
    }

    def run_tether(n: int) -> None:
        d = tmp / "w-tether"
        w = audit.AuditWriter(d)
        write = w.write
        for r in recs[:n]:
            write("spawn", **r)
        w.close()

    def run_os_write(n: int) -> None:
        d = tmp / "w-os"
        d.mkdir(exist_ok=True)
        fd = os.open(d / "log.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        dumps, now, w = json.dumps, time.time, os.write
        for r in recs[:n]:
            rec = {"v": 1, "ts": now(), "event": "spawn", **r}
            w(fd, (dumps(rec) + "\n").encode())
        os.close(fd)

    def run_buffered(n: int) -> None:
        d = tmp / "w-buf"
        d.mkdir(exist_ok=True)
        dumps, now = json.dumps, time.time
        with open(d / "log.jsonl", "a") as f:
            for r in recs[:n]:
                rec = {"v": 1, "ts": now(), "event": "spawn", **r}
                f.write(dumps(rec) + "\n")

    def run_json(n: int) -> None:
        dumps, now = json.dumps, time.time
        for r in recs[:n]:
            rec = {"v": 1, "ts": now(), "event": "spawn", **r}
            (dumps(rec) + "\n").encode()

    fns = {
        "tether": run_tether,
        "os_write": run_os_write,
        "buffered": run_buffered,
        "json_only": run_json,
    }
    for fn in fns.values():  # warm-up
        fn(min(size, 2000))
    for _ in range(batches):
        # interleave the contenders so drift in machine load hits all alike
        for name, fn in fns.items():
            results[name].append(per_record_us(fn, size))
        for d in tmp.glob("w-*"):
            shutil.rmtree(d)
    med = {k: statistics.median(v) for k, v in results.items()}
    return {
        "batches": batches,
        "batch_size": size,
        "record_bytes": len(
            (json.dumps({"v": 1, "ts": time.time(), "event": "spawn", **recs[0]}) + "\n").encode()
        ),
        "median_us": med,
        "all_us": results,
        "ratio_vs_os_write": med["tether"] / med["os_write"],
        "ratio_vs_buffered": med["tether"] / med["buffered"],
    }


def bench_cold(tmp: Path, n: int = 300) -> dict:
    d = tmp / "cold"
    times = []
    rec = sample_fields(0)
    for _ in range(n):
        t0 = time.perf_counter()
        w = audit.AuditWriter(d)
        w.write("spawn", **rec)
        w.close()
        times.append((time.perf_counter() - t0) * 1e6)
    shutil.rmtree(d)
    return {"n": n, "median_us": statistics.median(times)}


READ_CHILD = r"""
import json, os, resource, sys, time, tracemalloc
sys.path.insert(0, sys.argv[1])
from tether import audit
d, how = sys.argv[2], sys.argv[3]

def files():
    return [str(p) for p in audit.log_files(d)]

def tether_read():
    s = audit.ReadStats()
    n = 0
    for _ in audit.read_records(d, stats=s):
        n += 1
    assert s.corrupt == 0 and s.truncated == 0, s
    return n

def naive_stream():
    n = 0
    for p in files():
        with open(p, "rb") as f:
            for line in f:
                json.loads(line)
                n += 1
    return n

def naive_list():
    out = []
    for p in files():
        with open(p, "rb") as f:
            out.extend(json.loads(line) for line in f)
    return len(out)

fn = {"tether": tether_read, "naive_stream": naive_stream, "naive_list": naive_list}[how]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
n = fn()
secs = time.perf_counter() - t0
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tracemalloc.start()
fn()
_, peak = tracemalloc.get_traced_memory()
tracemalloc.stop()
print(json.dumps({"records": n, "seconds": secs, "rss_delta_kib": after - before,
                  "tracemalloc_peak_kib": peak / 1024}))
"""


def bench_read(tmp: Path, n: int, repeats: int) -> dict:
    d = tmp / "read"
    t0 = time.perf_counter()
    w = audit.AuditWriter(d, keep_files=100000)  # keep all: every record must be read
    for i in range(n):
        w.write("spawn", seq=i, **sample_fields(i))
    w.close()
    write_secs = time.perf_counter() - t0
    files = audit.log_files(d)
    size = sum(p.stat().st_size for p in files)
    out: dict = {
        "records": n,
        "files": len(files),
        "bytes": size,
        "write_seconds_total": write_secs,
        "readers": {},
    }
    for how in ("tether", "naive_stream", "naive_list"):
        runs = []
        for _ in range(repeats):
            r = subprocess.run(
                [sys.executable, "-c", READ_CHILD, str(SRC), str(d), how],
                capture_output=True,
                text=True,
                check=True,
                timeout=1200,
            )
            runs.append(json.loads(r.stdout))
        assert all(r["records"] == n for r in runs), runs
        out["readers"][how] = {
            "seconds_median": statistics.median(r["seconds"] for r in runs),
            "us_per_record": statistics.median(r["seconds"] for r in runs) / n * 1e6,
            "rss_delta_mib": statistics.median(r["rss_delta_kib"] for r in runs) / 1024,
            "tracemalloc_peak_mib": statistics.median(r["tracemalloc_peak_kib"] for r in runs)
            / 1024,
            "runs": runs,
        }
    t = out["readers"]
    out["ratio_seconds_vs_naive_stream"] = (
        t["tether"]["seconds_median"] / t["naive_stream"]["seconds_median"]
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--batches", type=int, default=7)
    ap.add_argument("--batch-size", type=int, default=20000)
    ap.add_argument("--read-repeats", type=int, default=3)
    ap.add_argument("--out", default=str(HERE / "results" / "audit.json"))
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="tether-bench-audit-", dir=os.environ.get("BENCH_TMP")))
    try:
        fs = subprocess.run(
            ["stat", "-f", "-c", "%T", str(tmp)], capture_output=True, text=True
        ).stdout.strip()
        append = bench_append(tmp, args.batches, args.batch_size)
        cold = bench_cold(tmp)
        read = bench_read(tmp, args.records, args.read_repeats) if args.records else None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    result = {
        "bench": "audit",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "filesystem": fs,
        "append": append,
        "cold_first_record": cold,
        "read": read,
        "memory_note": "rss_delta = ru_maxrss after - before the read, in a fresh child "
        "process; tracemalloc_peak = Python allocations, measured in a second pass",
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")

    m = append["median_us"]
    print(
        f"append, µs/record (median of {append['batches']} x {append['batch_size']}, "
        f"{append['record_bytes']} B records, {fs}):"
    )
    print(f"  {'writer':<22}{'µs':>8}{'vs os.write':>14}")
    for k, label in (
        ("tether", "tether AuditWriter"),
        ("os_write", "os.write O_APPEND"),
        ("buffered", "buffered f.write"),
        ("json_only", "json.dumps only"),
    ):
        print(f"  {label:<22}{m[k]:>8.2f}{m[k] / m['os_write']:>13.2f}x")
    print(
        f"  cold writer + first record + close: {cold['median_us']:.0f} µs (median of {cold['n']})"
    )
    if read is None:
        print(f"wrote {out}")
        return
    print(
        f"read {read['records']:,} records, {read['files']} files, "
        f"{read['bytes'] / 2**20:.0f} MiB (median of {args.read_repeats} fresh processes):"
    )
    print(f"  {'reader':<16}{'seconds':>9}{'µs/rec':>9}{'rss Δ MiB':>11}{'tracemalloc MiB':>17}")
    for k, r in read["readers"].items():
        print(
            f"  {k:<16}{r['seconds_median']:>9.2f}{r['us_per_record']:>9.2f}"
            f"{r['rss_delta_mib']:>11.1f}{r['tracemalloc_peak_mib']:>17.1f}"
        )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
