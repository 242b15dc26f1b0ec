#!/usr/bin/env python3
"""What ``TETHER_SHELL_SCOPE=caller`` keeps running for its caller, and its cost.

In scope caller, what a command leaves runs on until the caller ends, so
tether keeps a process for it: with cgroup v2, one ``tether-scope`` watcher
per caller (it ends the caller's cgroup when the caller dies); with the
subreaper, the command's own keeper, which stays while the leftovers live.
They live as long as an agent session does, so their memory is what counts.
This measures, for this tree and (``--baseline CHECKOUT``) another, in the
same run: the PSS of that process once a command has left a ``sleep`` behind,
and that the caller's death ends it and the sleep.

Each tree is run as its ``tether-shell-py`` (``python -m`` style, with the
tree's ``src`` on ``PYTHONPATH``; a tree's native keeper is the one built in
it by ``pip install -e``). As root (the cgroup row needs a writable cgroup v2).

usage: sudo python3 bench/scope_keepers.py [--trials 5] [--baseline CHECKOUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "bench", "results", "scope_keepers.json")
sys.path.insert(0, os.path.join(REPO, "src"))

from tether import identity, proctree  # noqa: E402
from tether.platform import probe  # noqa: E402

# The caller: runs one command through the tree's tether-shell, says the
# leftover's pid, then waits to be killed.
CALLER = r"""
import os, subprocess, sys, time
shell = [sys.executable, "-c", "import sys; from tether.shell import main; sys.exit(main())"]
r = subprocess.run(shell + ["-c", "sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True,
                   text=True, start_new_session=True)
print(r.stdout.strip() or "none " + r.stderr.replace("\n", " "), flush=True)
time.sleep(600)
"""


def pss_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def kept_by(tree: str, mech: str, born: int) -> tuple[int | None, bool]:
    """One trial: the PSS of what keeps the leftover (kB), and whether the
    caller's death ended both it and the leftover within 3 s."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env.update(PYTHONPATH=os.path.join(tree, "src"), TETHER_SHELL_SCOPE="caller",
               TETHER_SHELL_MECHANISM=mech, TETHER_SHELL_LOG="off")
    caller = subprocess.Popen([sys.executable, "-c", CALLER], env=env, stdout=subprocess.PIPE,
                              text=True)
    try:
        line = caller.stdout.readline().split()
        if not line or not line[0].isdigit():
            raise SystemExit(f"{tree} ({mech}): the command did not run: {' '.join(line)}")
        left = identity.read(int(line[0]))
        assert left is not None and left.start >= born
        time.sleep(0.2)  # the command has returned; its keeper settles
        if mech == "cgroup":  # the caller's watcher: born after us, named tether-scope
            keeper = [i for i in map(identity.read, sorted(proctree.pids() or ()))
                      if i is not None and i.comm == "tether-scope" and i.state not in "ZX"]
        else:  # the lingering keeper: the leftover's parent (its subreaper)
            now = identity.read(left.pid)
            keeper = [identity.read(now.ppid)] if now is not None else []
        keeper = [k for k in keeper if k is not None and k.start >= born]
        assert len(keeper) == 1, keeper
        pss = pss_kb(keeper[0].pid)
        caller.kill()
        caller.wait(timeout=5)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and any(identity.is_alive(i) for i in (left, *keeper)):
            time.sleep(0.01)
        ended = not any(identity.is_alive(i) for i in (left, *keeper))
        return pss, ended
    finally:
        if caller.poll() is None:
            caller.kill()
            caller.wait(timeout=5)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--baseline", default=None, metavar="CHECKOUT")
    a = ap.parse_args()
    trees = {"this tree": REPO}
    if a.baseline:
        trees["baseline"] = os.path.abspath(a.baseline)
    mechs = [m for m in ("cgroup", "subreaper") if probe(m).available]
    rows: dict[str, dict] = {}
    for _ in range(a.trials):
        for mech in mechs:
            for name, tree in trees.items():  # interleaved: noise hits both alike
                born = identity.now_ticks()
                pss, ended = kept_by(tree, mech, born)
                row = rows.setdefault(f"{name}: {mech}", {"pss_kb": [], "ended": True})
                if pss is not None:
                    row["pss_kb"].append(pss)
                row["ended"] = row["ended"] and ended
    print(f"what scope caller keeps per caller (cgroup) or per command that left something "
          f"(subreaper), {a.trials} trials")
    out = {"bench": "scope_keepers", "trials": a.trials, "uid": os.geteuid(), "rows": {}}
    for name, row in rows.items():
        med = statistics.median(row["pss_kb"]) if row["pss_kb"] else None
        out["rows"][name] = {"pss_kb_median": med, "ended_with_the_caller": row["ended"]}
        print(f"  {name:<24} PSS {med} kB (median); ended with the caller: {row['ended']}")
    for mech in mechs:
        mine, theirs = out["rows"].get(f"this tree: {mech}"), out["rows"].get(f"baseline: {mech}")
        if mine and theirs and mine["pss_kb_median"] and theirs["pss_kb_median"]:
            ratio = mine["pss_kb_median"] / theirs["pss_kb_median"]
            out["rows"][f"this tree: {mech}"]["versus_baseline"] = round(ratio, 3)
            print(f"  {mech}: {mine['pss_kb_median']} vs {theirs['pss_kb_median']} kB ({ratio:.3f}x)")
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    return 0 if all(r["ended_with_the_caller"] for r in out["rows"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
