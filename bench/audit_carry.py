"""What carrying proof forward costs a rotation (tether.audit, issue 15).

Every rotation that deletes a copy first reads it and carries forward the
records that still prove a live process (``tether.records.still_needed``). This
measures the write() calls that rotated - the only ones that pay it - with
the default retention (5 MiB x 5 copies), against the same writes with the
carry switched off (the old prune: delete unread), in the same run:

* ``carry``: spawn records of gone processes (the carry reads every copy it
  deletes and keeps nothing - its cost is the read);
* ``carry+live``: the same, plus 200 records of live processes in every copy
  (the carry reads and writes them forward again and again);
* ``baseline``: the carry off.

Usage: python bench/audit_carry.py [--mib 60]
Writes bench/results/audit_carry.json and prints a table (median / max ms of
the rotating writes, and total seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from tether import audit, identity  # noqa: E402


def run(kind: str, mib: int, live: list) -> dict:
    d = Path(tempfile.mkdtemp(prefix="tether-carry-"))
    gone = subprocess.Popen(["true"])
    gone_id = identity.read(gone.pid)
    gone.wait()
    owner = {"pid": gone_id.pid, "start": gone_id.token()}
    saved = audit.AuditWriter._carry
    if kind == "baseline":
        audit.AuditWriter._carry = lambda self, doomed: True  # the old prune: delete unread
    stalls: list[float] = []
    t0 = time.perf_counter()
    try:
        with audit.AuditWriter(d) as w:
            w.write("run-start", run="bench")
            written, i = 0, 0
            while written < mib * 2**20:
                ino = os.stat(d / "audit.jsonl").st_ino
                if kind == "carry+live" and i % 100 == 0:
                    p = live[(i // 100) % len(live)]
                    rec = audit.spawn_fields(identity=p, job="j1", app="bench")
                else:
                    rec = audit.spawn_fields(identity=gone_id, job=f"j{i % 9}", app="bench",
                                             session="s", label="npm run build")
                t = time.perf_counter()
                w.write("spawn", run=f"r{i // 500}", owner=owner, **rec)
                dt = time.perf_counter() - t
                if os.stat(d / "audit.jsonl").st_ino != ino:
                    stalls.append(dt * 1000)
                written += 330
                i += 1
    finally:
        audit.AuditWriter._carry = saved
        total = time.perf_counter() - t0
        size = sum(f.stat().st_size for f in audit.log_files(d))
        shutil.rmtree(d)
    return {"kind": kind, "rotations": len(stalls),
            "rotate_ms_median": round(statistics.median(stalls), 2) if stalls else None,
            "rotate_ms_max": round(max(stalls), 2) if stalls else None,
            "total_s": round(total, 2), "bytes_on_disk": size}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=60)
    a = ap.parse_args()
    sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(20)]
    try:
        live = [identity.read(p.pid) for p in sleepers]
        rows = [run(k, a.mib, live) for k in ("baseline", "carry", "carry+live", "baseline")]
    finally:
        for p in sleepers:  # our own children, by their Popen
            p.kill()
            p.wait()
    base = statistics.median([r["rotate_ms_median"] for r in rows if r["kind"] == "baseline"])
    print(f"{'kind':12} {'rotations':>9} {'median ms':>10} {'max ms':>8} {'total s':>8} "
          f"{'x base':>7} {'MiB on disk':>11}")
    for r in rows:
        print(f"{r['kind']:12} {r['rotations']:9d} {r['rotate_ms_median']:10.2f} "
              f"{r['rotate_ms_max']:8.2f} {r['total_s']:8.2f} "
              f"{r['rotate_ms_median'] / base:7.1f} {r['bytes_on_disk'] / 2**20:11.1f}")
    out = HERE / "results" / "audit_carry.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"mib": a.mib, "python": sys.version.split()[0], "rows": rows},
                              indent=2) + "\n")


if __name__ == "__main__":
    main()
