"""Immediate-close latency of a terminal session, against a plain PTY, same run.

Workload, identical on both sides: ``/bin/sh -c`` on a fresh pseudo-terminal
starts N background ``sleep 120`` (N = 0, 10, 100), prints READY and waits.
Latency is measured from the close call until every process of the tree is
gone (a zombie counts as gone: PID 1 here reaps orphans only every ~2 s):

* tether: ``PtySession.close("immediate")`` -- bounded capture, hang-up,
  SIGTERM to the captured set, wait, recheck, end of the job; it returns only
  once every captured process has exited. Per mechanism (``auto`` and the
  weakest, ``pgroup``, where the capture does the work).
* baseline: ``os.openpty`` + ``subprocess.Popen(start_new_session=True)``,
  closed by ``os.killpg(shell, SIGKILL)`` + closing the master, then polling
  the recorded identities until all are gone. It sees only the shell's own
  process group: it would miss a ``setsid`` child, which tether does not.

Also measured, since choosing it is a design decision (docs/pty.md): the cost
of giving the program its controlling terminal, as spawn + exit of
``/bin/true`` on a PTY inside a job, per method.

And (``--reads``, needs strace) what a close reads of /proc: a session of
10 background processes closed under ``cgroup`` and under ``pgroup``, with 0
and then 2 000 unrelated processes of the same user alive (started after the
session, by another job), each close in a fresh interpreter run under
``strace -f``: the /proc files every process of the close opened (the owner
and the job's keeper) between two markers, by kind (a table scan opens
``/proc`` once and every pid's ``stat``), and the close's own time without
strace (medians).

Writes bench/results/pty_close.json and prints a table (medians, p90, ratio
to the baseline). Safety: every process carries BENCH_MARK=<random> and is
recorded by identity; a ``finally`` ends whatever is left, by identity.

    python bench/pty_close.py [--repeats 15] [--sizes 0,10,100] [--mechanisms auto,pgroup]
                              [--reads] [--unrelated 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import secrets
import select
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# TETHER_BENCH_SRC: another tree's src (--compare runs a close with it).
sys.path.insert(0, os.environ.get("TETHER_BENCH_SRC") or str(HERE.parent / "src"))

from tether import gate, identity  # noqa: E402
from tether.job import Job  # noqa: E402
from tether.pty import PtySession  # noqa: E402

MARK = secrets.token_hex(8)
ENV = dict(os.environ, BENCH_MARK=MARK, TERM="xterm")


def script(n: int) -> str:
    return f"i=0; while [ $i -lt {n} ]; do sleep 120 & i=$((i+1)); done; echo READY; wait"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def marked_alive(born: int) -> list[identity.Identity]:
    needle = f"BENCH_MARK={MARK}".encode()
    out = []
    for ident in identity.capture(born_after=born).procs.values():
        try:
            with open(f"/proc/{ident.pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0") and identity.is_alive(ident):
                    out.append(ident)
        except OSError:
            continue
    return out


def wait_tree(born: int, root: int, n: int, timeout: float = 20.0) -> list[identity.Identity]:
    """The N sleeps below ``root``, once all are running."""
    deadline = time.monotonic() + timeout
    while True:
        kids = [i for i in identity.capture(born_after=born).descendants([root], born)
                if i.comm == "sleep"]
        if len(kids) >= n:
            return kids
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(kids)} of {n} sleeps started")
        time.sleep(0.005)


def wait_gone(idents: list[identity.Identity], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    left = idents
    while left:
        left = [i for i in left if identity.is_alive(i)]
        if left and time.monotonic() > deadline:
            raise RuntimeError(f"{len(left)} processes still alive")
        if left:
            time.sleep(0.0002)


def read_until(fd: int, needle: bytes, timeout: float = 20.0) -> None:
    buf = b""
    deadline = time.monotonic() + timeout
    while needle not in buf:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{needle!r} not seen: {buf[-200:]!r}")
        if select.select([fd], [], [], 0.05)[0]:
            try:
                buf += os.read(fd, 65536)
            except OSError:
                break


def one_baseline(n: int) -> float:
    born = identity.now_ticks()
    master, slave = os.openpty()
    p = subprocess.Popen(["/bin/sh", "-c", script(n)], stdin=slave, stdout=slave, stderr=slave,
                         start_new_session=True, env=ENV)
    os.close(slave)
    try:
        read_until(master, b"READY")
        tree = wait_tree(born, p.pid, n) + [identity.read(p.pid)]
        t0 = time.perf_counter()
        os.killpg(p.pid, signal.SIGKILL)  # our own direct child, not yet reaped: its group is ours
        os.close(master)
        master = -1
        p.wait()
        wait_gone([i for i in tree if i is not None])
        return time.perf_counter() - t0
    finally:
        if master >= 0:
            os.close(master)
        if p.poll() is None:
            p.kill()
            p.wait()


def one_tether(n: int, mechanism: str) -> tuple[float, dict]:
    born = identity.now_ticks()
    s = PtySession(["/bin/sh", "-c", script(n)], env=ENV, mechanism=mechanism)
    try:
        s.read_until(b"READY", 20)
        tree = wait_tree(born, s.pid, n) + [s.root]
        t0 = time.perf_counter()
        r = s.close("immediate")
        dt = time.perf_counter() - t0
        if not r.ok or any(identity.is_alive(i) for i in tree if i is not None):
            raise RuntimeError(f"close left something: {r}")
        return dt, {"capture_ms": r.capture_ms, "captured": len(r.captured)}
    finally:
        s.close("immediate")
        if s.job is not None:
            s.job.close()


# -- /proc reads of one close, with unrelated processes ------------------------------

MARK_START, MARK_END = "/tether-bench-mark-start", "/tether-bench-mark-end"


def one_close(mechanism: str, n: int) -> dict:
    """In this (fresh) interpreter: a session of ``n`` background sleeps; says
    ``ready`` and waits for a line on stdin (the parent starts its unrelated
    processes meanwhile, born after the session), then the close, between two
    markers strace sees (a stat of a path that does not exist)."""
    s = PtySession(["/bin/sh", "-c", script(n)], env=ENV, mechanism=mechanism)
    try:
        s.read_until(b"READY", 20)
        wait_tree(s.born_after, s.pid, n)
        print("ready", flush=True)
        sys.stdin.readline()
        try:
            os.stat(MARK_START)
        except OSError:
            pass
        t0 = time.perf_counter()
        r = s.close("immediate")
        dt = time.perf_counter() - t0
        try:
            os.stat(MARK_END)
        except OSError:
            pass
        return {"ms": dt * 1e3, "ok": r.ok, "captured": len(r.captured),
                "processes": sum(1 for x in os.listdir("/proc") if x.isdigit())}
    finally:
        s.close("immediate")


def run_one_close(mechanism: str, unrelated: int, trace: str | None = None,
                  src: str | None = None) -> dict:
    """One close in a fresh interpreter (under ``strace -f`` with ``trace``),
    with ``unrelated`` sleeps of ours in another job, started after the
    session opened and alive while it closes; ``src``: with that tree's tether."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", mechanism, "10"]
    if trace:
        cmd = ["strace", "-f", "-qq", "-e", "trace=openat,newfstatat,stat", "-o", trace, *cmd]
    env = dict(os.environ, TETHER_BENCH_SRC=src, PYTHONPATH=src) if src else None
    child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env=env)
    other = Job(name="bench-unrelated", mechanism="auto")
    try:
        if child.stdout.readline().strip() != "ready":
            raise RuntimeError("the close's interpreter did not start its session")
        if unrelated:
            h = other.popen(["/bin/sh", "-c", script(unrelated)], env=ENV, stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)
            read_until(h.stdout.fileno(), b"READY", 120)
            wait_tree(identity.now_ticks() - 120 * identity.clock_ticks(), h.pid, unrelated,
                      timeout=120)
        child.stdin.write("go\n")
        child.stdin.flush()
        out = json.loads(child.stdout.readline())
        child.wait(60)
        return out
    finally:
        other.close()
        if child.poll() is None:
            child.kill()  # our own direct child
            child.wait()


_OPEN = re.compile(r'openat\((AT_FDCWD|\d+)[^"]*, "([^"]*)"')


def count_reads(trace: str) -> dict[str, int]:
    """/proc opens between the markers in an ``strace -f`` log, by kind."""
    out: dict[str, int] = {}
    on = False
    with open(trace) as f:
        for line in f:
            if MARK_START in line:
                on = True
                continue
            if MARK_END in line:
                break
            if not on or "openat(" not in line:
                continue
            m = _OPEN.search(line)
            if m is None:
                continue
            path = m.group(2)
            if path == "/proc":
                kind = "table scans (/proc)"
            else:
                parts = path.removeprefix("/proc/").split("/")
                if not (path.startswith("/proc/") or parts[0].isdigit()) or len(parts) < 2:
                    continue
                if not parts[0].isdigit():
                    continue
                kind = "/".join(parts[1:])
                if len(parts) == 4 and parts[1] == "task" and parts[3] == "children":
                    kind = "task/TID/children"  # a children list (one per thread)
            out[kind] = out.get(kind, 0) + 1
    out["total /proc/PID files"] = sum(v for k, v in out.items() if not k.startswith("table"))
    return out


def bench_reads(unrelated: int, repeats: int, compare: str | None = None) -> dict:
    """With ``compare`` (another tree's src): each close with that tree too,
    one after the other in the same run, keyed "old: ..."."""
    import shutil
    import tempfile

    if not shutil.which("strace"):
        return {"skipped": "strace is not installed"}
    res: dict = {}
    trees = [("old: ", compare), ("", None)] if compare else [("", None)]
    for k in (0, unrelated):
        for m, (label, src) in [(m, t) for m in ("cgroup", "pgroup") for t in trees]:
            key = f"{label}{m}, {k} unrelated"
            with tempfile.NamedTemporaryFile(prefix="tether-strace-", suffix=".log") as log:
                run_one_close(m, k, trace=log.name, src=src)
                reads = count_reads(log.name)
            times = []
            for _ in range(repeats):
                one = run_one_close(m, k, src=src)
                if not one["ok"]:
                    raise RuntimeError(f"{key}: the close left something: {one}")
                times.append(one["ms"])
            res[key] = {"reads": reads, "close_ms_median": statistics.median(times),
                        "close_ms": times, "processes": one["processes"]}
    return res


# -- controlling-terminal methods ------------------------------------------------

PY_SHIM = ("import fcntl,os,sys,termios;fcntl.ioctl(0,termios.TIOCSCTTY,0);"
           "os.execvp(sys.argv[1],sys.argv[1:])")


def ctty_methods() -> dict[str, tuple[list[str], dict]]:
    m = {
        "none (no controlling tty)": ([], {"start_new_session": True}),
        "sh shim (chosen)": (["/bin/sh", "-c", 'exec "$@" <>"$0" >&0 2>&0', "{tty}"],
                             {"start_new_session": True}),
        "setsid --ctty (non-leader)": (["setsid", "-c"], {}),
        "python shim (TIOCSCTTY)": ([sys.executable, "-S", "-c", PY_SHIM],
                                    {"start_new_session": True}),
    }
    if getattr(Job, "supports_ctty", False):
        m["core ctty=True (no exec)"] = ([], {"ctty": True})
    return m


def bench_ctty(repeats: int) -> dict[str, dict]:
    out: dict[str, list[float]] = {}
    methods = ctty_methods()
    with Job(name="bench-ctty", mechanism="auto") as job:
        cheap = [n for n in methods if not n.startswith("python")]
        # Rotated each round: whichever goes first pays for warming up. The
        # Python shim runs in rounds of its own: the spawn right after one
        # pays ~10 ms more here (its exit and 40 ms of CPU on 2 cores).
        rounds = [cheap[i % len(cheap):] + cheap[:i % len(cheap)] for i in range(repeats)]
        rounds += [[n for n in methods if n.startswith("python")]] * max(5, repeats // 4)
        for names in rounds:
            for name in names:
                prefix, kw = methods[name]
                master, slave = os.openpty()
                tty = os.ttyname(slave)
                argv = [a.replace("{tty}", tty) for a in prefix] + ["/bin/true"]
                t0 = time.perf_counter()
                p = job.popen(argv, stdin=slave, stdout=slave, stderr=slave, env=ENV, **kw)
                rc = p.wait(10)
                out.setdefault(name, []).append(time.perf_counter() - t0)
                os.close(slave)
                os.close(master)
                if rc != 0:
                    raise RuntimeError(f"{name}: exit {rc}")
    return {k: {"median_ms": statistics.median(v) * 1e3, "p90_ms": pct(v, 0.9) * 1e3, "n": len(v)}
            for k, v in out.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--sizes", default="0,10,100")
    ap.add_argument("--mechanisms", default="auto,pgroup")
    ap.add_argument("--out", default=str(HERE / "results" / "pty_close.json"))
    ap.add_argument("--reads", action="store_true",
                    help="also count /proc reads of a close (strace), with --unrelated others")
    ap.add_argument("--unrelated", type=int, default=2000)
    ap.add_argument("--reads-repeats", type=int, default=5)
    ap.add_argument("--compare", metavar="SRC",
                    help="with --reads: each close also with the tether of SRC (another tree's "
                         "src directory, e.g. `git archive main src`), same run")
    ap.add_argument("--one", nargs=2, metavar=("MECHANISM", "N"),
                    help=argparse.SUPPRESS)  # one close, in a fresh interpreter (--reads)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one_close(args.one[0], int(args.one[1]))))
        return 0
    sizes = [int(x) for x in args.sizes.split(",") if x]
    mechs = args.mechanisms.split(",")
    born = identity.now_ticks()
    from tether.platform import choose

    resolved = {m: choose(m) for m in mechs}
    results: dict = {
        "machine": {"python": platform.python_version(), "kernel": platform.release(),
                    "cpus": os.cpu_count(), "uid": os.getuid(),
                    "loadavg": os.getloadavg(),
                    "processes": sum(1 for n in os.listdir("/proc") if n.isdigit())},
        "repeats": args.repeats,
        "mechanisms": resolved,
        "close": {},
    }
    try:
        for n in sizes:
            row: dict[str, list[float]] = {"baseline": []}
            extra: dict[str, list[dict]] = {}
            for _ in range(args.repeats):
                # Interleaved, so load drifts hit every side alike.
                row["baseline"].append(one_baseline(n))
                for m in mechs:
                    dt, info = one_tether(n, m)
                    row.setdefault(m, []).append(dt)
                    extra.setdefault(m, []).append(info)
            base = statistics.median(row["baseline"])
            res = {}
            for k, v in row.items():
                med = statistics.median(v)
                res[k] = {"median_ms": med * 1e3, "p90_ms": pct(v, 0.9) * 1e3,
                          "min_ms": min(v) * 1e3, "max_ms": max(v) * 1e3,
                          "ratio_to_baseline": med / base if base else None}
                if k in extra:
                    res[k]["capture_ms_median"] = statistics.median(
                        e["capture_ms"] for e in extra[k])
                    res[k]["captured_median"] = statistics.median(e["captured"] for e in extra[k])
            results["close"][str(n)] = res
        results["ctty"] = bench_ctty(max(60, args.repeats * 6)) if args.repeats else {}
        if args.reads:
            results["reads"] = bench_reads(args.unrelated, args.reads_repeats, args.compare)
    finally:
        for ident in marked_alive(born):
            try:
                gate.send_signal(ident, signal.SIGKILL, member=True)
            except Exception:  # noqa: BLE001 - best effort cleanup of our own processes
                pass
    results["machine"]["loadavg_after"] = os.getloadavg()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
        f.write("\n")

    print(f"immediate close, {args.repeats} repeats; mechanisms {resolved}; "
          f"{results['machine']['processes']} processes on the machine, "
          f"load {results['machine']['loadavg'][0]:.1f}")
    print(f"{'bg procs':>8} {'side':<10} {'median ms':>10} {'p90 ms':>8} {'x base':>7} "
          f"{'capture ms':>10}")
    for n, res in results["close"].items():
        for k, v in res.items():
            cap = v.get("capture_ms_median")
            print(f"{n:>8} {k:<10} {v['median_ms']:>10.1f} {v['p90_ms']:>8.1f} "
                  f"{v['ratio_to_baseline']:>7.2f} {'' if cap is None else f'{cap:.1f}':>10}")
    if "reads" in results:
        print("\n/proc files opened by one close of a 10-process session (owner + keeper), "
              "and its time (median, no strace):")
        for key, v in results["reads"].items():
            if key == "skipped":
                print(f"  skipped: {v}")
                continue
            r = v["reads"]
            kinds = ", ".join(f"{k} {n}" for k, n in sorted(r.items()) if not k.startswith("total"))
            print(f"  {key:<29} {v['close_ms_median']:7.1f} ms  {r['total /proc/PID files']:6d} "
                  f"files ({kinds}); {v['processes']} processes")
    print("\ncontrolling terminal: spawn+exit of /bin/true on a PTY in a job")
    for k, v in results["ctty"].items():
        print(f"  {k:<30} median {v['median_ms']:6.2f} ms  p90 {v['p90_ms']:6.2f} ms")
    print(f"\nwritten: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
