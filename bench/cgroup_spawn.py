#!/usr/bin/env python3
"""The kernel's share of a spawn into a cgroup, measured in C with no tether
code: why an idle native cgroup job keeps a pin, and why its keeper holds the
cgroup.procs files (src/tether/_native/keeper.c: pin_job, hold_procs_files).

``bench/_cgroup_spawn.c`` (built here with ``cc``) clones ``/bin/true`` with
``clone3`` and waits for it, in rounds whose order rotates, into five places:

- outside any cgroup: no ``CLONE_INTO_CGROUP`` (the baseline);
- an empty cgroup: the first process in and the last out flip "populated"
  in ``cgroup.events``, which the kernel reports through a workqueue, at
  most every 10 ms (so a tight loop never pays it);
- a cgroup with a process inside it;
- a cgroup with a process in a cgroup below it (a job with its pin);
- the same, with the target's ``cgroup.procs`` held open (``O_PATH``):
  ``CLONE_INTO_CGROUP`` checks that the caller may write that file, and with
  no dentry holding its inode the kernel makes one and evicts it again on
  every spawn.

Run 50 ms apart (an agent's pace) and back to back. Needs a cgroup2
directory it may create cgroups in: root, or ``--base`` in a delegated
subtree; elsewhere it says why and writes nothing.

usage: python3 bench/cgroup_spawn.py [--rounds 200] [--quick] [--base DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

from tether import cgroupfs  # noqa: E402

RESULTS = os.path.join(HERE, "results", "cgroup_spawn.json")


def build(out_dir: str) -> str | None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    exe = os.path.join(out_dir, "cgroup_spawn")
    subprocess.run([cc, "-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", "-o", exe,
                    os.path.join(HERE, "_cgroup_spawn.c")], check=True)
    return exe


def run(exe: str, base: str, rounds: int, gap_us: int) -> dict:
    r = subprocess.run([exe, base, str(rounds), str(gap_us)], capture_output=True, text=True,
                       timeout=60 + rounds * 5 * (gap_us / 1e6 + 0.01))
    if r.returncode != 0:
        raise RuntimeError(f"{exe} exited {r.returncode}: {r.stderr.strip()}")
    out = {}
    for line in r.stdout.splitlines():
        name, med, p10, p90, clone = line.split("\t")
        out[name] = {"median_us": float(med), "p10_us": float(p10), "p90_us": float(p90),
                     "clone_median_us": float(clone)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--quick", action="store_true", help="40 rounds")
    ap.add_argument("--base", default="", help="a cgroup2 directory to work in (default: the mount)")
    a = ap.parse_args()
    rounds = 40 if a.quick else a.rounds
    parent = a.base or cgroupfs.mount()
    if not parent:
        print("cgroup_spawn: no cgroup2 mount here; nothing measured")
        return 0
    try:
        base = tempfile.mkdtemp(prefix="tether-bench-", dir=parent)
    except OSError as exc:
        print(f"cgroup_spawn: cannot create a cgroup in {parent} ({exc.strerror}); nothing "
              f"measured (run as root, or give --base in a delegated subtree)")
        return 0
    out: dict = {"bench": "cgroup_spawn", "rounds": rounds, "kernel": platform.release(),
                 "uid": os.geteuid(), "load_avg": os.getloadavg(), "runs": {}}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            exe = build(tmp)
            if exe is None:
                print("cgroup_spawn: no C compiler (cc); nothing measured")
                return 0
            for label, gap in (("50 ms apart", 50_000), ("back to back", 0)):
                res = run(exe, base, rounds, gap)
                out["runs"][label] = res
                plain = res["outside any cgroup"]["median_us"]
                print(f"clone3 + exec + wait of /bin/true, {label}, {rounds} rounds "
                      f"(median, p10-p90, clone3's median; µs)")
                for name, v in res.items():
                    print(f"  {name:<30} {v['median_us']:7.0f}  {v['p10_us']:6.0f}-{v['p90_us']:<6.0f}"
                          f" x{v['median_us'] / plain:5.2f}   clone3 {v['clone_median_us']:5.0f}")
    finally:
        try:
            os.rmdir(base)
        except OSError as exc:
            print(f"cgroup_spawn: could not remove {base}: {exc.strerror}")
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump(out, f, indent=2)
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
