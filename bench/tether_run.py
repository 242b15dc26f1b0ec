#!/usr/bin/env python3
"""Start-up of ``tether run -- true`` against ``true`` and ``unshare -pf --kill-child true``, same run.

``tether`` is measured as users get it: what pip installs into a fresh venv
(``pip install -e`` of this repo; bench/shell.py's venv) - the native program
where a C compiler built it (it serves ``run`` itself), and ``tether-py``
beside it, the Python CLI (what the native one hands every other command
to). Rounds interleave every command in a shuffled order so machine noise hits
all alike; medians, p90, the difference to ``true`` and the ratio to
``unshare``, plus the CPU time of each command's whole process tree.

Targets (issue 18): ``tether run -- true`` at most 5 ms above ``true`` and
within 2x of ``unshare -pf --kill-child true`` (the kernel's own kill-on-exit
job: a PID namespace), at the median; ``tether run --die-with-parent -- true``
(the job also tied to the caller by pidfd, issue 33) at most 5 ms above ``true``.

usage: python3 bench/tether_run.py [--n 200] [--quick] [--venv DIR] [--baseline CHECKOUT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shell import ensure_venv, interleaved  # noqa: E402 - bench/shell.py: the same venv and rounds

RESULTS = os.path.join(REPO, "bench", "results", "tether_run.json")
OVER_TRUE_MS = 5.0
OVER_UNSHARE = 2.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--venv", default=os.path.join(tempfile.gettempdir(), "tether-bench-shell-venv"))
    ap.add_argument("--baseline", default=None, metavar="CHECKOUT",
                    help="another tether checkout whose tether runs in the same rounds")
    a = ap.parse_args()
    n = 40 if a.quick else a.n
    bindir = os.path.dirname(ensure_venv(a.venv))
    tether, tether_py = os.path.join(bindir, "tether"), os.path.join(bindir, "tether-py")
    sys.path.insert(0, os.path.join(REPO, "src"))
    from tether.keeper.native import is_program

    native = is_program(tether)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TETHER_") and k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    true = shutil.which("true")
    unshare = shutil.which("unshare")
    unpriv = os.geteuid() != 0
    cases: dict[str, list[str]] = {
        "true": [true],
        "unshare -pf --kill-child true": [unshare, *(["-Ur"] if unpriv else []), "-pf",
                                          "--kill-child", true],
        "tether run -- true": [tether, "run", "--", "true"],
        "tether run -m subreaper -- true": [tether, "run", "-m", "subreaper", "--", "true"],
        "tether run --die-with-parent -- true": [tether, "run", "--die-with-parent", "--", "true"],
    }
    if native:
        cases["tether-py run -- true (the Python CLI)"] = [tether_py, "run", "--", "true"]
    if a.baseline:  # before/after in the same rounds (bench/shell.py's venv of that tree)
        base_bin = os.path.dirname(ensure_venv(a.venv + "-baseline", os.path.abspath(a.baseline)))
        cases["baseline: tether run -- true"] = [os.path.join(base_bin, "tether"), "run", "--", "true"]
        cases["baseline: tether-py run -- true"] = [os.path.join(base_bin, "tether-py"), "run", "--",
                                                    "true"]
    load_start = os.getloadavg()
    times, cpu = interleaved({k: (argv, env) for k, argv in cases.items()}, n)
    base = statistics.median(times["true"])
    uns = statistics.median(times["unshare -pf --kill-child true"])
    rows = {}
    for name in cases:
        t = sorted(times[name])
        med = statistics.median(t)
        rows[name] = {"median_ms": round(med, 3), "p90_ms": round(t[int(len(t) * 0.9)], 3),
                      "minus_true_ms": round(med - base, 3), "ratio_to_unshare": round(med / uns, 2),
                      "cpu_median_ms": round(statistics.median(cpu[name]), 3)}
    mine = rows["tether run -- true"]
    parent = rows["tether run --die-with-parent -- true"]
    meets = (mine["minus_true_ms"] <= OVER_TRUE_MS and mine["ratio_to_unshare"] <= OVER_UNSHARE
             and parent["minus_true_ms"] <= OVER_TRUE_MS)
    out = {"bench": "tether_run", "n": n, "python": platform.python_version(),
           "kernel": platform.release(), "uid": os.geteuid(), "native": native,
           "load_avg_start": load_start, "load_avg": os.getloadavg(), "cpus": os.cpu_count(),
           "targets": {"minus_true_ms": OVER_TRUE_MS, "ratio_to_unshare": OVER_UNSHARE},
           "meets_targets": meets, "commands": rows}
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    print(f"start-up, {n} interleaved rounds ({'native' if native else 'Python'} tether, "
          f"load {load_start[0]:.1f} -> {out['load_avg'][0]:.1f} on {out['cpus']} cpus)")
    print(f"  {'command':<42} {'median':>8} {'p90':>8} {'-true':>8} {'x unshare':>9} {'cpu':>7}")
    for name, r in rows.items():
        print(f"  {name:<42} {r['median_ms']:>8.2f} {r['p90_ms']:>8.2f} {r['minus_true_ms']:>+8.2f}"
              f" {r['ratio_to_unshare']:>9.2f} {r['cpu_median_ms']:>7.2f}")
    print("  (ms; cpu = user+sys of the whole tree)")
    print(f"tether run -- true: {mine['minus_true_ms']:+.2f} ms over true (target <= +{OVER_TRUE_MS:g}), "
          f"{mine['ratio_to_unshare']:.2f}x unshare (target <= {OVER_UNSHARE:g}x): "
          f"{'meets' if meets else 'MISSES'} the targets")
    print(f"tether run --die-with-parent -- true: {parent['minus_true_ms']:+.2f} ms over true "
          f"(target <= +{OVER_TRUE_MS:g})")
    print(f"wrote {os.path.relpath(RESULTS, REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
