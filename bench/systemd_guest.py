#!/usr/bin/env python3
"""tether's start-up cost under a real systemd 252 user manager, per context.

Runs the systemd guest harness (``../shared/systemd-guest/run-all.sh`` with
``ONLY=systemd``, as root: it boots Debian 12 twice with systemd-nspawn,
hybrid and unified cgroup layouts, installs this checkout for an
unprivileged user and measures in the login's scope and in ``systemd-run
--user`` services and scopes with and without ``Delegate=yes``), then reads
its summary: per context the mechanism ``auto`` picks, the median of 15
starts of ``sh -c true`` (the baseline, same run), ``tether-shell -c true``
and ``tether run -- true``, how often tether ran ``systemctl`` per start, and
the survivors. Writes ``bench/results/systemd_guest.json`` and prints each
context's difference to ``sh -c true``.

Targets (issue 32): ``tether-shell -c true`` at most 3 ms and ``tether run --
true`` at most 5 ms above the baseline in every context, ``cgroup`` only where
the unit is delegated, no survivors. (The harness's baseline is ``sh -c
true``, which costs a little more than ``true``.)

usage: sudo python3 bench/systemd_guest.py [--summary FILE]   (~4 minutes)
    --summary FILE: parse an earlier run's summary.txt instead of running.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HARNESS = os.path.join(os.path.dirname(REPO), "shared", "systemd-guest", "run-all.sh")
RESULTS = os.path.join(REPO, "bench", "results", "systemd_guest.json")
ROW = re.compile(r"^(hybrid|unified)\s+(.+?)\s+(cgroup|subreaper|pidns|pgroup)\s+"
                 r"(?:([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d./]+)\s+)?(\S+)\s*$")


def parse(summary: str) -> list[dict]:
    rows = []
    for line in summary.splitlines():
        m = ROW.match(line)
        if m:
            layout, ctx, mech, sh, shell, run, calls, surv = m.groups()
            if sh is None:  # root's rows: what it picks and survivors only
                rows.append({"layout": layout, "context": ctx.strip(), "picks": mech,
                             "survivors": surv})
                continue
            rows.append({"layout": layout, "context": ctx.strip(), "picks": mech,
                         "sh_ms": float(sh), "shell_ms": float(shell), "run_ms": float(run),
                         "shell_over_sh_ms": round(float(shell) - float(sh), 2),
                         "run_over_sh_ms": round(float(run) - float(sh), 2),
                         "systemctl_per_start": calls, "survivors": surv})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--summary")
    a = ap.parse_args()
    if a.summary:
        text = open(a.summary).read()
    else:
        out = tempfile.mkdtemp(prefix="tether-systemd-guest.")
        r = subprocess.run(["bash", HARNESS], cwd=REPO, env=dict(os.environ, ONLY="systemd", R=out))
        if r.returncode != 0:
            print(f"the harness failed (exit {r.returncode}); see {out}", file=sys.stderr)
            return 1
        text = open(os.path.join(out, "summary.txt")).read()
    rows = parse(text)
    if not rows:
        print("no context rows in the summary", file=sys.stderr)
        return 1
    head = text.splitlines()[0]
    with open(RESULTS, "w") as f:
        json.dump({"tether_under_test": head, "rows": rows}, f, indent=1)
    print(f"{'layout':8} {'context':45} {'picks':10} {'sh':>5} {'shell':>6} {'+':>5} "
          f"{'run':>5} {'+':>5}  systemctl  survivors")
    for r in rows:
        if "sh_ms" not in r:
            print(f"{r['layout']:8} {r['context']:45} {r['picks']:10} {'':40} {r['survivors']}")
            continue
        print(f"{r['layout']:8} {r['context']:45} {r['picks']:10} {r['sh_ms']:5.1f} "
              f"{r['shell_ms']:6.1f} {r['shell_over_sh_ms']:+5.1f} {r['run_ms']:5.1f} "
              f"{r['run_over_sh_ms']:+5.1f}  {r['systemctl_per_start']:10} {r['survivors']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
