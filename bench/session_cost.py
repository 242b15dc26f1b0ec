#!/usr/bin/env python3
"""What ``tether run --session`` adds (issue 33): time and audit records,
with an empty log and with a 100 MiB one, against ``tether run --state-dir``
without a session, same run, interleaved rounds (medians).

The 100 MiB log is another app's records (run-start, spawn, exit, run-end of
~140 000 runs), last written an hour ago, in ``audit.jsonl.1`` beside the
current file, as rotation leaves them. Cases:

* ``--state-dir`` only: the Python CLI with the audit log, no session;
* ``--session`` (a fresh key each round): one copy per key, resume rule;
* ``--session``, the key's last holder dead (its lock file still names it:
  a crash, a minute ago) - the resume rule then reads the files written since
  it took the key (a minute's margin), not the whole log;
* ``--take-over`` of a fresh key (nothing to take over);
* ``--take-over`` of a live copy (``tether run --session KEY -- sleep 60``,
  started before the round's timing): its end included.

Also: the records one run appends (all, and those of its own run: a
take-over also makes the copy it ends write its job-close, and writes a reap
record for each process it ended), and the bytes it read (``rchar`` of
``/proc/PID/io``, interpreter start-up and imports included: the run is
started under a tiny Python parent that reads its child's ``io`` while it is
a zombie, before reaping it).

usage: python3 bench/session_cost.py [--n 7] [--mib 100]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "bench", "results", "session_cost.json")
APP = "bench-app"

# Runs CMD, and reads the child's rchar (bytes read through read(2) and
# friends, page cache or not) while it is a zombie, before reaping it.
_PROBE = r"""
import os, sys, time
pid = os.posix_spawn(sys.argv[1], sys.argv[1:], dict(os.environ))
t = time.perf_counter()
os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
dt = time.perf_counter() - t
io = dict(l.split(": ") for l in open(f"/proc/{pid}/io").read().splitlines())
_, st = os.waitpid(pid, 0)
print(dt * 1000, int(io["rchar"]), os.waitstatus_to_exitcode(st), pid)
"""


def _big_log(state: str, mib: int) -> int:
    boot = open("/proc/sys/kernel/random/boot_id").read().strip()
    size = i = 0
    with open(os.path.join(state, "audit.jsonl.1"), "w") as f:
        while size < mib * 2**20:
            run, own = f"{900000 + i}-{1000 + i}", {"pid": 900000 + i, "start": f"{1000 + i}@{boot}"}
            base = {"v": 1, "ts": time.time(), "run": run, "app": "other-app"}
            proc = {"job": f"j{i}-1", "pid": 1_000_000 + i, "start": f"{2000 + i}@{boot}"}
            for rec in ({**base, "event": "run-start", "owner": own},
                        {**base, "event": "spawn", **proc, "pgid": 1, "sid": 1, "comm": "node",
                         "session": f"s{i % 100}"},
                        {**base, "event": "exit", **proc, "status": 0},
                        {**base, "event": "run-end", "owner": own}):
                line = json.dumps(rec, separators=(",", ":")) + "\n"
                f.write(line)
                size += len(line)
            i += 1
    os.chmod(os.path.join(state, "audit.jsonl.1"), 0o600)
    hour_ago = time.time() - 3600  # old records, as a long-lived log's rotated copies are
    os.utime(os.path.join(state, "audit.jsonl.1"), (hour_ago, hour_ago))
    return size


def _crashed(state: str, key: str) -> None:
    """The key's lock file as a holder that died holding it leaves it."""
    d = os.path.join(state, "sessions")
    os.makedirs(d, mode=0o700, exist_ok=True)
    digest = hashlib.sha256(f"{APP}\0{key}".encode()).hexdigest()[:32]
    with open(os.path.join(d, f"{digest}.lock"), "w") as f:
        json.dump({"app": APP, "session": key, "run": "999999-1", "pid": 999999,
                   "start": "1@x", "ts": time.time() - 60}, f)
    os.chmod(os.path.join(d, f"{digest}.lock"), 0o600)


def _records(state: str, pid: int | None = None) -> int:
    """The log's records; with ``pid``: only those of the run of that pid (its
    run id is "PID-START"), not those it made others write (a taken-over copy's
    job-close) or wrote about them (the reap record of each process it ended)."""
    try:
        with open(os.path.join(state, "audit.jsonl"), "rb") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return 0
    if pid is None:
        return len(lines)
    return sum(json.loads(ln).get("run", "").startswith(f"{pid}-") and
               json.loads(ln).get("event") != "reap" for ln in lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=7)
    ap.add_argument("--mib", type=int, default=100)
    a = ap.parse_args()
    tether = shutil.which("tether") or sys.exit("tether is not on PATH (activate the venv)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    tmp = tempfile.mkdtemp(prefix="tether-bench-session-")
    try:
        small, big = os.path.join(tmp, "small"), os.path.join(tmp, "big")
        for d in (small, big):
            os.mkdir(d, 0o700)
        log_bytes = _big_log(big, a.mib)

        def case(name: str, state: str, r: int) -> list[str]:
            key = f"k{r}-{random.getrandbits(32):x}"
            base = [tether, "run", "--state-dir", state]
            if name.startswith("session"):
                base += ["--app", APP, "--session", key]
            if name.startswith("session, last holder dead"):
                _crashed(state, key)
            if name.startswith("take-over"):
                base += ["--app", APP, "--session", key, "--take-over"]
            if name.startswith("take-over of a live copy"):
                holder = subprocess.Popen([tether, "run", "--state-dir", state, "--app", APP,
                                           "--session", key, "--", "sleep", "60"], env=env)
                holders.append(holder)
                lock = os.path.join(state, "sessions",
                                    hashlib.sha256(f"{APP}\0{key}".encode()).hexdigest()[:32] + ".lock")
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and not (
                        os.path.exists(lock) and os.path.getsize(lock) > 0):
                    time.sleep(0.05)
                time.sleep(0.5)  # its command started
            return base + ["--", "true"]

        names = ["--state-dir only", "session", "take-over (nothing held)",
                 "session, last holder dead", "take-over of a live copy"]
        holders: list[subprocess.Popen] = []
        times: dict[str, list[float]] = {}
        reads: dict[str, list[int]] = {}
        appended: dict[str, list[int]] = {}
        own: dict[str, list[int]] = {}
        for r in range(a.n):
            order = [(n, s) for n in names for s in (small, big)]
            random.shuffle(order)
            for name, state in order:
                label = f"{name} [{'100 MiB log' if state == big else 'empty log'}]"
                argv = case(name, state, r)  # (a live copy to take over: its records before)
                before = _records(state)
                out = subprocess.run([sys.executable, "-c", _PROBE, *argv],
                                     env=env, capture_output=True, text=True, check=True)
                ms, rchar, code, pid = out.stdout.split()
                if int(code) != 0:
                    raise SystemExit(f"{label}: exit {code}: {out.stderr}")
                times.setdefault(label, []).append(float(ms))
                reads.setdefault(label, []).append(int(rchar))
                appended.setdefault(label, []).append(_records(state) - before)
                own.setdefault(label, []).append(_records(state, int(pid)))
        rows = {k: {"median_ms": round(statistics.median(v), 1),
                    "read_bytes_median": int(statistics.median(reads[k])),
                    "records_appended": int(statistics.median(appended[k])),
                    "records_of_the_run": int(statistics.median(own[k]))}
                for k, v in times.items()}
        out = {"bench": "session_cost", "n": a.n, "log_bytes": log_bytes,
               "python": platform.python_version(), "kernel": platform.release(),
               "load_avg": os.getloadavg(), "cpus": os.cpu_count(), "cases": rows}
        os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
        with open(RESULTS, "w") as f:
            json.dump(out, f, indent=2)
            f.write("\n")
        print(f"tether run --session cost, {a.n} interleaved rounds, log {log_bytes / 2**20:.0f} MiB "
              f"(load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus)")
        print(f"  {'case':<52} {'median ms':>10} {'read MiB':>9} {'records':>8} {'its own':>8}")
        for k, v in sorted(rows.items()):
            print(f"  {k:<52} {v['median_ms']:>10.1f} {v['read_bytes_median'] / 2**20:>9.2f} "
                  f"{v['records_appended']:>8} {v['records_of_the_run']:>8}")
        print(f"wrote {os.path.relpath(RESULTS, REPO)}")
    finally:
        for h in holders:  # taken over: each has exited; reap them (bounded)
            try:
                h.wait(timeout=30)
            except subprocess.TimeoutExpired:
                h.kill()
                h.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
