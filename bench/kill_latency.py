#!/usr/bin/env python3
"""Owner SIGKILLed -> last member dead, per mechanism, beside the kernel's own
PID-namespace teardown (`unshare --pid --fork --kill-child`) in the same run.

Trees of 1/10/100/1000 processes, escapees included (a double-forked setsid
daemon, `nohup setsid`, a SIGTERM-ignorer): a shell with the rest beside
each other below it. ``--shape chain``: instead, a chain N deep, each a
shell waiting for the next (the kernel kills a namespace at any depth at
once; a kill loop has to find each level). The observer opens a pidfd on
every member *before* the kill and polls them afterwards: exact, and cheap
even for 1000 processes; a zombie counts as dead (pidfds fire at exit).
Members are found only among processes born after the trial began that carry
the trial's environment mark; leftovers are ended by recorded identity.

Each mechanism runs with the keeper it has: the native program for
``cgroup/native``, ``subreaper/native``, ``pidns/native`` (the only keeper
of those on Linux), the Python one for ``pgroup``.

Targets: issue 2, tether's median within 1.5x of the unshare baseline at 100
and 1000 processes; issue 18, the native keeper at or below 1.0x there.

A second baseline, ``unshare+python``, is the same kernel teardown started by
the death of an owner like tether's: a Python process that imported tether,
whose child unshare dies with it (PR_SET_PDEATHSIG). The plain ``unshare``
row's owner is unshare itself, a small C program that exits in a fraction of
the time an interpreter takes to (its memory unmapped before its pidfd fires).

A third, ``--keeper-baseline PATH``, runs each native kind a second time with
the keeper program at PATH (``cgroup/baseline``: say, a keeper built from the
commit before a change), interleaved, so a change to the keeper is measured
against the one it replaces in the same run (a keeper built before the
owner's beacon, whose usage line names no ``beacon=``, runs without one).

A fourth, ``--beacon-baseline``, runs each native kind a second time without
the owner's beacon (``cgroup/nobeacon``: _TETHER_BEACON=0, the keeper told by
the owner's pidfd alone; see tether/keeper/_beacon.py), interleaved.

``--owner-mb N``: every Python owner (tether's, and unshare+python's) first
fills N MB of memory, as a real host holds hundreds: the kernel unmaps it
before the owner's pidfd fires.

usage: python3 bench/kill_latency.py [--trials 20] [--sizes 1,10,100,1000] [--quick]
                                    [--kinds subreaper/native,...] [--keeper-baseline PATH]
                                    [--beacon-baseline] [--owner-mb N] [--shape tree|chain]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import select
import shlex
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
from tether.keeper import native  # noqa: E402
from tether.platform import probe  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "kill_latency.json")

TREE = ("n=$((N-3)); i=0; while [ $i -lt $n ]; do sleep 300 & i=$((i+1)); done; "
        "(setsid sh -c 'exec sleep 300' &); nohup setsid sleep 300 >/dev/null 2>&1 & "
        "trap '' TERM HUP; exec sleep 300")

# One level of --shape chain: "$1" more to go; the last one a sleep.
LEVEL = 'if [ "$1" -gt 1 ]; then sh -c "$0" "$0" $(($1 - 1)) & wait; else exec sleep 300; fi'


def chain(n: int) -> str:
    """--shape chain: n processes, each a shell waiting for the next, the last a sleep."""
    return f"L={shlex.quote(LEVEL)}; sh -c \"$L\" \"$L\" {n - 1} & wait"


SHAPE = "tree"  # --shape

# (TETHER_BENCH_OWNER_MB: --owner-mb)
FILL = ("import os; _mb = int(os.environ.get('TETHER_BENCH_OWNER_MB') or 0); "
        "_held = bytearray(_mb * 2**20); _held[::4096] = b'x' * len(_held[::4096]); ")
OWNER = (FILL + "import sys, time; sys.path.insert(0, sys.argv[1]); from tether import Job; "
         "j = Job(mechanism=sys.argv[2]); j.popen(['/bin/sh', '-c', sys.argv[3]]); "
         "print('up', flush=True); time.sleep(600)")


# A Python keeper is forked from its owner, so it carries the mark too; a
# keeper is no member, and its own exit (after the members', by design) is
# not what is timed. (It was, for the */python kinds, before 2026-12-02.)
KEEPER = "tether-keeper"


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


# The same kernel teardown behind an owner like tether's (a Python process that
# imported tether): its exit, not unshare's, starts the teardown; unshare dies
# with it (PR_SET_PDEATHSIG) and takes the namespace's init along (--kill-child).
PY_UNSHARE_OWNER = (FILL + "import ctypes, subprocess, sys, time; sys.path.insert(0, sys.argv[1]); import tether; "
                    "libc = ctypes.CDLL(None, use_errno=True); "
                    "subprocess.Popen(sys.argv[2:], preexec_fn=lambda: libc.prctl(1, 9)); "
                    "print('up', flush=True); time.sleep(600)")


def unshare_argv(tree: str) -> list[str]:
    args = ["unshare", "--pid", "--fork", "--kill-child"]
    if os.geteuid() != 0:
        args.insert(1, "-Ur")
    return args + ["/bin/sh", "-c", tree]


BASELINE_KEEPER = ""  # --keeper-baseline: the keeper program of the */baseline kinds
BASELINE_TAKES_BEACON = True  # whether it knows beacon= (takes_beacon, asked once)


def takes_beacon(keeper: str) -> bool:
    """Whether the keeper program at ``keeper`` knows ``beacon=`` (one built
    before the owner's beacon does not, and refuses a job that passes one:
    its usage line says)."""
    r = subprocess.run([keeper], capture_output=True, text=True, timeout=30,
                       stdin=subprocess.DEVNULL)
    return "beacon=" in r.stderr


def start_owner(kind: str, n: int, env: dict) -> subprocess.Popen:
    tree = (chain(n) if SHAPE == "chain" else TREE) if n > 1 else "trap '' TERM HUP; exec sleep 300"
    kind, _, keeper = kind.partition("/")
    if keeper == "nobeacon":
        env["_TETHER_BEACON"] = "0"
    if keeper == "baseline":
        env["_TETHER_NATIVE_HELPER"] = BASELINE_KEEPER
        if not BASELINE_TAKES_BEACON:
            env["_TETHER_BEACON"] = "0"
    if kind == "unshare":
        args = unshare_argv(tree)
    elif kind == "unshare+python":
        args = [sys.executable, "-c", PY_UNSHARE_OWNER, SRC, *unshare_argv(tree)]
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
        # unshare's init is the tree's top (sh, then exec sleep): n, as under
        # tether; under a Python owner, unshare itself too
        want = n + (1 if kind == "unshare+python" else 0)
        deadline = time.monotonic() + 30
        members = []
        while time.monotonic() < deadline:
            members = [m for m in marked(born, mark) if m.pid != owner.pid and m.comm != KEEPER]
            if len(members) >= want:
                break
            time.sleep(0.02)
        time.sleep(0.05)
        members = [m for m in marked(born, mark) if m.pid != owner.pid and m.comm != KEEPER]
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
    ap.add_argument("--kinds", default="", help="only these, comma-separated (e.g. subreaper/native);"
                    " the two unshare baselines always run")
    ap.add_argument("--keeper-baseline", default="", metavar="PATH",
                    help="also run each native kind with the keeper program at PATH (kind */baseline)")
    ap.add_argument("--beacon-baseline", action="store_true",
                    help="also run each native kind without the owner's beacon (kind */nobeacon)")
    ap.add_argument("--owner-mb", type=int, default=0, metavar="N",
                    help="every Python owner first fills N MB of memory")
    ap.add_argument("--shape", choices=("tree", "chain"), default="tree",
                    help="a wide tree with escapees (default), or a chain N deep")
    a = ap.parse_args()
    global SHAPE
    SHAPE = a.shape
    if a.owner_mb:
        os.environ["TETHER_BENCH_OWNER_MB"] = str(a.owner_mb)
    global BASELINE_KEEPER, BASELINE_TAKES_BEACON
    if a.keeper_baseline:
        if not os.access(a.keeper_baseline, os.X_OK):
            ap.error(f"--keeper-baseline: not an executable program: {a.keeper_baseline}")
        BASELINE_KEEPER = os.path.abspath(a.keeper_baseline)
        BASELINE_TAKES_BEACON = takes_beacon(BASELINE_KEEPER)
    trials = 5 if a.quick else a.trials
    sizes = [1, 10, 100] if a.quick else [int(x) for x in a.sizes.split(",")]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    kinds = [f"{m}/native" if m != "pgroup" else m
             for m in ("cgroup", "subreaper", "pidns", "pgroup")
             if probe(m).available and (m == "pgroup" or native.built())]
    if a.kinds:
        wanted = a.kinds.split(",")
        unknown = [k for k in wanted if k not in kinds and not k.startswith("unshare")]
        if unknown:
            ap.error(f"--kinds: not available here: {', '.join(unknown)} (available: {', '.join(kinds)})")
        kinds = [k for k in kinds if k in wanted]
    natives = [k for k in kinds if k.endswith("/native")]
    if BASELINE_KEEPER:
        kinds += [k.replace("/native", "/baseline") for k in natives]
    if a.beacon_baseline:
        kinds += [k.replace("/native", "/nobeacon") for k in natives]
    baseline_ok = shutil.which("unshare") is not None
    if baseline_ok:
        kinds[:0] = ["unshare", "unshare+python"]
    out: dict = {"bench": "kill_latency", "trials": trials, "sizes": sizes, "uid": os.geteuid(),
                 "kernel": platform.release(), "load_avg_start": os.getloadavg(), "results": {},
                 "baseline": "unshare --pid --fork --kill-child" if baseline_ok else "unavailable",
                 "keeper_baseline": BASELINE_KEEPER or None, "owner_mb": a.owner_mb, "shape": SHAPE}
    print("owner SIGKILL -> last member dead (ms); " + ("a chain N deep" if SHAPE == "chain" else
          "tree includes setsid/nohup escapees and a TERM-ignorer"))
    print("(rounds interleave the kinds, so drift in the machine's speed hits them alike)")
    print(f"  {'mechanism':<18} {'size':>5} {'p50':>8} {'p99':>8} {'max':>8} {'survivors':>9} "
          f"{'vs unshare':>10} {'vs unshare+python':>17}")
    fmt = lambda v: f"{v:8.2f}" if v is not None else f"{'-':>8}"  # noqa: E731
    for n in sizes:
        t = trials if n < 1000 else max(3, trials // 2)
        runs: dict[str, list[dict]] = {kind: [] for kind in kinds}
        for _ in range(t):
            for kind in kinds:
                runs[kind].append(trial(kind, n))
        res = out["results"].setdefault(str(n), {})
        for kind in kinds:
            rs = runs[kind]
            ms = [r["ms"] for r in rs if r["ms"] is not None]
            surv = sum(r["survivors"] for r in rs)
            res[kind] = row = {"trials": t, "members_median": statistics.median(r["members"] for r in rs),
                               "survivors_total": surv,
                               "p50_ms": round(statistics.median(ms), 2) if ms else None,
                               "p99_ms": round(pct(ms, 0.99), 2) if ms else None,
                               "max_ms": round(max(ms), 2) if ms else None,
                               "all_ms": [round(x, 3) for x in ms]}
            ratios = []
            for base_kind, key in (("unshare", "ratio_vs_unshare"), ("unshare+python", "ratio_vs_unshare_python")):
                base = res.get(base_kind, {}).get("p50_ms")
                ratio = (row["p50_ms"] / base) if (base and row["p50_ms"]) else None
                row[key] = round(ratio, 2) if ratio else None
                ratios.append(f"{ratio:.2f}x" if ratio else "-")
            print(f"  {kind:<18} {n:5d} {fmt(row['p50_ms'])} {fmt(row['p99_ms'])} {fmt(row['max_ms'])} "
                  f"{surv:9d} {ratios[0]:>10} {ratios[1]:>17}")
    out["load_avg_end"] = os.getloadavg()
    # A run of some kinds only does not replace the full one the docs quote.
    results = (RESULTS.replace(".json", "-baseline.json") if BASELINE_KEEPER
               else RESULTS.replace(".json", "-kinds.json") if a.kinds else RESULTS)
    if a.owner_mb:
        results = results.replace(".json", f"-owner{a.owner_mb}mb.json")
    if SHAPE != "tree":
        results = results.replace(".json", f"-{SHAPE}.json")
    os.makedirs(os.path.dirname(results), exist_ok=True)
    with open(results, "w") as f:
        json.dump(out, f, indent=2)
    print(f"wrote {results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
