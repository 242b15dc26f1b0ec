#!/usr/bin/env python3
"""Run every benchmark in bench/, collect bench/results/*.json, draw docs/figures/*.png.

Every ``bench/*.py`` runs except this file and ``_``-prefixed helpers, one
after the other (they measure timings: running them side by side would
measure each other). Each writes its own ``bench/results/<name>.json``; this
script adds ``bench/results/run_all.json`` (what ran, exit status, seconds,
load average before and after) and then draws the figures with matplotlib
(the ``bench`` extra: ``pip install -e '.[bench]'``).

The figures are drawn from the copies of each result that run_all.json keeps
(taken the moment each bench finished), so a bench run by hand later does not
change them; ``--plot-only`` redraws from those copies.

``--quick`` runs each benchmark's small variant (CI-like, about 15 minutes on 2 CPUs):
``--quick`` where a script has it, otherwise the smaller arguments below.

usage: python3 bench/run_all.py [--quick] [--only a,b] [--skip a,b] [--install]
                                [--no-plot | --plot-only]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# Preferred order: cheap and self-contained first, the long comparison last.
ORDER = ("spawn", "capture", "kill_latency", "shell", "pty_close", "audit", "compare")
# Small variants for scripts that have no --quick of their own.
QUICK_ARGS = {
    "audit": ["--records", "100000", "--batches", "3"],
    "capture": ["--levels", "100,1000", "--repeats", "5"],
    "pty_close": ["--repeats", "5", "--sizes", "0,10"],
}
TIMEOUT_S = {"quick": 900, "full": 3600}


def scripts() -> list[str]:
    names = sorted(f[:-3] for f in os.listdir(HERE)
                   if f.endswith(".py") and not f.startswith("_") and f != "run_all.py")
    return sorted(names, key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))


def has_quick(name: str) -> bool:
    with open(os.path.join(HERE, f"{name}.py")) as f:
        return '"--quick"' in f.read()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small variants (CI-like)")
    ap.add_argument("--only", default="", help="comma-separated benchmark names")
    ap.add_argument("--skip", default="", help="comma-separated benchmark names")
    ap.add_argument("--install", action="store_true",
                    help="let compare.py apt-get install bubblewrap and tini when missing")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--plot-only", action="store_true", help="draw figures from existing results")
    a = ap.parse_args()

    results_dir = os.path.join(HERE, "results")
    os.makedirs(results_dir, exist_ok=True)
    runs = []
    failed = 0
    if not a.plot_only:
        names = scripts()
        if a.only:
            names = [n for n in names if n in a.only.split(",")]
        if a.skip:
            names = [n for n in names if n not in a.skip.split(",")]
        mode = "quick" if a.quick else "full"
        for name in names:
            args: list[str] = []
            if a.quick:
                args = ["--quick"] if has_quick(name) else QUICK_ARGS.get(name, [])
            if name == "compare" and a.install:
                args.append("--install")
            cmd = [sys.executable, os.path.join(HERE, f"{name}.py"), *args]
            shown = "python3 bench/" + f"{name}.py" + ("" if not args else " " + " ".join(args))
            print(f"\n=== {shown}", flush=True)
            load0 = os.getloadavg()
            t0 = time.monotonic()
            try:
                rc = subprocess.run(cmd, timeout=TIMEOUT_S[mode], stdin=subprocess.DEVNULL).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"  # subprocess.run killed the script; its own cleanup did not run
            secs = time.monotonic() - t0
            if rc != 0:
                failed += 1
                print(f"=== {name}: FAILED ({rc})", flush=True)
            runs.append({"bench": name, "command": shown, "exit": rc, "seconds": round(secs, 1),
                         "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "mode": mode,
                         "load_avg_before": [round(x, 2) for x in load0],
                         "load_avg_after": [round(x, 2) for x in os.getloadavg()],
                         # A copy taken at once: someone may run one bench again later and
                         # overwrite its file; the figures are drawn from these copies.
                         "result": _read_json(os.path.join(results_dir, f"{name}.json"))
                         if rc == 0 else None})
        write_summary(results_dir, runs, partial=bool(a.only or a.skip))
        print("\nsummary:")
        for r in runs:
            status = "ok" if r["exit"] == 0 else f"FAILED ({r['exit']})"
            print(f"  {r['bench']:<14} {status:<12} {r['seconds']:7.1f} s  "
                  f"load {r['load_avg_before'][0]:.1f} -> {r['load_avg_after'][0]:.1f}")
    if not a.no_plot:
        print("\nfigures:")
        try:
            import _plot
        except ImportError as exc:
            print(f"  cannot draw figures: {exc} (pip install matplotlib)")
            return 1
        with tempfile.TemporaryDirectory(prefix="tether-bench-") as snap:
            source = snapshot(results_dir, snap)
            try:
                _plot.draw_all(source)
            except ImportError as exc:
                print(f"  cannot draw figures: {exc} (pip install -e '.[bench]')")
                return 1
    return 1 if failed else 0


def _read_json(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_summary(results_dir: str, runs: list[dict], partial: bool) -> None:
    """bench/results/run_all.json: the latest run_all run of every bench.

    A full run replaces the file; a partial one (--only/--skip) replaces the
    entries of the benches it ran and keeps the others.
    """
    path = os.path.join(results_dir, "run_all.json")
    old = _read_json(path) if partial else None
    by_name = {r["bench"]: r for r in (old or {}).get("runs", []) if isinstance(r, dict)}
    for r in runs:
        by_name[r["bench"]] = r
    order = scripts()
    merged = sorted(by_name.values(), key=lambda r: order.index(r["bench"])
                    if r["bench"] in order else len(order))
    summary = {"python": platform.python_version(), "kernel": platform.release(),
               "cpus": os.cpu_count(), "uid": os.geteuid(),
               "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "runs": merged}
    with open(path, "w") as f:
        json.dump(summary, f, indent=2)


def snapshot(results_dir: str, into: str) -> str:
    """A results directory for the figures: run_all.json's copies where it has
    them (what this script measured), else the bench's own current file."""
    summary = _read_json(os.path.join(results_dir, "run_all.json")) or {}
    have = {r["bench"]: r["result"] for r in summary.get("runs", [])
            if isinstance(r, dict) and r.get("result") is not None}
    for f in os.listdir(results_dir):
        if f.endswith(".json") and f != "run_all.json":
            name = f[:-5]
            data = have.get(name, _read_json(os.path.join(results_dir, f)))
            if data is not None:
                with open(os.path.join(into, f), "w") as out:
                    json.dump(data, out)
    return into


if __name__ == "__main__":
    raise SystemExit(main())
