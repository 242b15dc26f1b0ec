#!/usr/bin/env python3
"""tether against the alternatives users have, on one adversarial tree, in one run.

The tree (started by one command, ``sh -c LAUNCHER``, the owner's direct child):

* the plain child (the launcher itself, which ends as ``exec sleep 300``),
* a ``sleep 300 &`` job,
* a double-forked ``setsid`` daemon,
* ``nohup setsid sleep 300 &``,
* a process that ignores SIGTERM and SIGHUP,
* a pid-hopper (``setsid``, fork, parent exits, in a loop: each of its
  processes lives a few ms),
* 100 ``sleep 300 &``.

Each alternative starts that command from an *owner* process, which the
observer (this script) then SIGKILLs. Reported per alternative: survivors
after the kill, the time until the last member died (p50/p99 over the
trials), spawn overhead as a ratio to plain ``subprocess.Popen`` measured in
the same run, and, with a few extra trials, what survives when the owner gets
SIGTERM instead and can run its own clean-up.

How members are seen, precisely and safely: every process of the tree
carries ``TETHER_BENCH_MARK=<run id>-<trial>`` in its environment (and a
``TETHER_BENCH_ROLE``); only processes born after the trial began that carry
the trial's mark are ever considered. Before the kill the observer opens a
pidfd on each of them and afterwards polls the pidfds (a pidfd fires when the
process exits, so a zombie counts as dead). A pid-hopper's processes live a
few ms -- no /proc scan sees them reliably -- so it appends its pid to a hop
log at every hop and is dead when the log stops growing. Leftovers of every
trial are ended by recorded identity (``tether.gate.send_signal``)
before the next trial, and the end of the run verifies that none is left.

Who would kill what, modelled on what users write:

* ``popen``: nothing ties the children to the owner.
* ``killpg``: ``start_new_session=True`` and an ``atexit``/SIGTERM handler
  that ``os.killpg``s the child's group. A SIGKILLed owner runs no handler,
  so nothing happens (the SIGTERM trials show what the handler does reach).
* ``psutil``: an ``atexit``/SIGTERM handler that kills
  ``psutil.Process().children(recursive=True)``: same caveat.
* ``unshare``: ``unshare --pid --fork --kill-child`` (``-Ur`` added when not
  root): the kernel ends the namespace when unshare dies -- but nothing ends
  unshare when the owner dies. ``unshare+pdeathsig`` adds the usual recipe,
  ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` in ``preexec_fn``.
* ``bwrap``: ``bwrap --dev-bind / / --unshare-pid --die-with-parent``.
* ``tini``: ``tini -s -g`` (nothing ties tini to its parent);
  ``tini -p``: ``tini -s -g -p SIGTERM``, tini's own parent-death option.
* ``tether:<mechanism>``: ``Job(mechanism=...).popen(...)``, for every
  mechanism available here.

An alternative that cannot run here is listed with the reason, never dropped.
bwrap and tini are Debian packages (bubblewrap, tini): ``--install`` installs
them with apt-get when missing (root only).

usage: python3 bench/compare.py [--trials 20] [--quick] [--install]
                                [--only NAME,...] [--spawn-rounds 200]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import resource
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")
sys.path.insert(0, SRC)

from tether import gate, identity  # noqa: E402
from tether.platform import choose, probe  # noqa: E402

RESULTS = os.path.join(HERE, "results", "compare.json")
MARK = "TETHER_BENCH_MARK"
ROLE = "TETHER_BENCH_ROLE"
ROLES = ("child", "bg", "daemon", "nohup", "ignorer", "hopper", "sleeps")
ROLE_LABELS = {
    "child": "plain child",
    "bg": "`sleep &` job",
    "daemon": "double-forked setsid daemon",
    "nohup": "`nohup setsid sleep &`",
    "ignorer": "ignores SIGTERM/SIGHUP",
    "hopper": "pid-hopper",
    "sleeps": "100 sleeps",
}

# Every long-lived process ends up as `sleep 300`; the hopper's are `sh`.
# SIG_IGN set by `trap ''` survives exec, so the ignorer is a single sleep.
LAUNCHER = r"""
TETHER_BENCH_ROLE=bg sleep 300 &
(TETHER_BENCH_ROLE=daemon setsid sh -c 'exec sleep 300' &)
TETHER_BENCH_ROLE=nohup nohup setsid sleep 300 >/dev/null 2>&1 &
(trap '' TERM HUP; TETHER_BENCH_ROLE=ignorer exec sleep 300) &
H='[ -e "$TETHER_BENCH_STOP" ] && exit 0; echo $$ >> "$TETHER_BENCH_HOPLOG"; setsid sh -c "$H" &'
export H
TETHER_BENCH_ROLE=hopper setsid sh -c "$H" &
i=0
while [ $i -lt "$TETHER_BENCH_SLEEPS" ]; do TETHER_BENCH_ROLE=sleeps sleep 300 & i=$((i+1)); done
exec sleep 300
"""

# The owner: a separate Python process, so that it can be SIGKILLed for real.
# It starts the tree the way the alternative says, reports, and waits.
OWNER = r"""
import atexit, json, os, signal, subprocess, sys, time
cfg = json.loads(sys.argv[1])
kind, argv = cfg["kind"], cfg["argv"]
helpers = []
kw = dict(stdin=subprocess.DEVNULL)
if kind == "popen":
    p = subprocess.Popen(argv, **kw)
elif kind == "killpg":
    p = subprocess.Popen(argv, start_new_session=True, **kw)
    def cleanup():
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
    atexit.register(cleanup)
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
elif kind == "psutil":
    import psutil
    p = subprocess.Popen(argv, **kw)
    def cleanup():
        for c in psutil.Process().children(recursive=True):
            try:
                c.kill()
            except psutil.Error:
                pass
    atexit.register(cleanup)
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
elif kind == "wrap":
    pre = None
    if cfg.get("pdeathsig"):
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        def pre():
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    p = subprocess.Popen(cfg["wrapper"] + argv, preexec_fn=pre, **kw)
    helpers.append(p.pid)
elif kind == "tether":
    sys.path.insert(0, cfg["src"])
    from tether import Job
    job = Job(name="compare", mechanism=cfg["mechanism"])
    p = job.popen(argv, **kw)
    k = job.trace().get("keeper_pid")
    if k:
        helpers.append(k)
print(json.dumps({"child": p.pid, "helpers": helpers}), flush=True)
time.sleep(600)
"""


@dataclass
class Alt:
    name: str
    label: str
    kind: str  # popen | killpg | psutil | wrap | tether
    who_ends: str
    wrapper: list[str] = field(default_factory=list)
    mechanism: str = ""
    pdeathsig: bool = False
    package: str = ""  # Debian package that provides the wrapper
    available: bool = True
    reason: str = ""


def alternatives() -> list[Alt]:
    unpriv = os.geteuid() != 0
    unshare = ["unshare"] + (["-Ur"] if unpriv else []) + ["--pid", "--fork", "--kill-child"]
    alts = [
        Alt("popen", "subprocess.Popen", "popen", "nobody"),
        Alt("killpg", "start_new_session + os.killpg at exit", "killpg",
            "the owner's atexit/SIGTERM handler (never runs on SIGKILL)"),
        Alt("psutil", "psutil children(recursive=True) kill at exit", "psutil",
            "the owner's atexit/SIGTERM handler (never runs on SIGKILL)"),
        Alt("unshare", " ".join(unshare), "wrap",
            "the kernel, when unshare dies; nothing ends unshare when the owner dies",
            wrapper=unshare, package="util-linux"),
        Alt("unshare+pdeathsig", " ".join(unshare) + " + PR_SET_PDEATHSIG in preexec_fn", "wrap",
            "the kernel (PID namespace), triggered by PDEATHSIG on unshare",
            wrapper=unshare, pdeathsig=True, package="util-linux"),
        Alt("bwrap", "bwrap --unshare-pid --die-with-parent", "wrap",
            "the kernel (PID namespace), triggered by bwrap's PDEATHSIG",
            wrapper=["bwrap", "--dev-bind", "/", "/", "--unshare-pid", "--die-with-parent"],
            package="bubblewrap"),
        Alt("tini", "tini -s -g", "wrap", "nobody (nothing ties tini to its parent)",
            wrapper=["tini", "-s", "-g", "--"], package="tini"),
        Alt("tini -p", "tini -s -g -p SIGTERM", "wrap",
            "tini, forwarding SIGTERM to the child's process group when its parent dies",
            wrapper=["tini", "-s", "-g", "-p", "SIGTERM", "--"], package="tini"),
    ]
    for m in ("cgroup", "subreaper", "pidns", "pgroup"):
        from tether.doctor import describe

        av = probe(m)
        who = describe(m).ends_job if av.available else ""
        alts.append(Alt(f"tether:{m}", f"tether Job(mechanism={m!r})", "tether", who, mechanism=m,
                        available=av.available, reason=av.reason if not av.available else ""))
    return alts


def check_alternative(alt: Alt, install: bool) -> None:
    """Set alt.available/alt.reason: can it run here? Installs packages if allowed."""
    if alt.kind == "tether":
        return
    if alt.kind == "psutil":
        try:
            import psutil  # noqa: F401
        except ImportError:
            alt.available, alt.reason = False, "psutil not installed (pip install psutil)"
        return
    if alt.kind != "wrap":
        return
    tool = alt.wrapper[0]
    if shutil.which(tool) is None and install:
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            alt.available = False
            alt.reason = f"{tool} missing; --install needs root and apt-get"
            return
        print(f"installing {alt.package} with apt-get ...", flush=True)
        r = subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", alt.package],
                           env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"),
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            alt.available = False
            tail = (r.stderr.strip().splitlines() or ["?"])[-1]
            alt.reason = f"apt-get install {alt.package} failed: {tail}"
            return
    if shutil.which(tool) is None:
        alt.available = False
        alt.reason = (f"{tool} not installed (Debian package {alt.package}; "
                      "run with --install, or apt-get install it)")
        return
    try:
        r = subprocess.run(alt.wrapper + ["/bin/true"], capture_output=True, text=True, timeout=20,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        alt.available, alt.reason = False, f"{tool} failed to run: {exc}"
        return
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
        alt.available, alt.reason = False, f"{' '.join(alt.wrapper)} /bin/true failed: {tail}"


# ----------------------------------------------------------------------------
# Seeing the tree


def env_of(pid: int) -> dict[bytes, bytes] | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return None
    out = {}
    for item in data.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep and k in (MARK.encode(), ROLE.encode()):
            out[k] = v
    return out


def marked(born: int, mark_prefix: str, exact: bool = True) -> list[tuple[identity.Identity, str]]:
    """(identity, role) of live processes born at or after ``born`` carrying the mark.

    A forked subshell that has not exec'd yet shows its parent's environment
    (role "child"): callers wait until the tree is settled before trusting roles.
    """
    want = mark_prefix.encode()
    out = []
    for ident in identity.capture(born_after=born).procs.values():
        if ident.state in ("Z", "X"):
            continue
        env = env_of(ident.pid)
        if not env:
            continue
        m = env.get(MARK.encode())
        if m is None or not (m == want if exact else m.startswith(want)):
            continue
        out.append((ident, env.get(ROLE.encode(), b"?").decode()))
    return out


def open_pidfd(ident: identity.Identity) -> int | None:
    try:
        fd = os.pidfd_open(ident.pid)
    except OSError:
        return None
    # The pidfd pins whoever held the pid when it was opened; make sure that
    # is still the process we captured (same kernel start time).
    if not identity.matches(ident):
        os.close(fd)
        return None
    return fd


def pct(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (p99 of 20 samples is the largest)."""
    xs = sorted(xs)
    k = max(0, min(len(xs) - 1, int(-(-q * len(xs) // 1)) - 1))
    return xs[k]


# ----------------------------------------------------------------------------
# One trial


@dataclass
class Trial:
    members: int = 0
    survivors: int = 0
    survived_roles: dict[str, int] = field(default_factory=dict)
    last_death_ms: float | None = None
    last_role: str = ""
    hopper_ms: float | None = None
    helpers: int = 0
    helpers_left: int = 0
    cleaned: int = 0
    setup_s: float = 0.0
    error: str = ""


def tree_argv(mark: str, hoplog: str, stop: str, sleeps: int) -> list[str]:
    return ["/usr/bin/env", f"{MARK}={mark}", f"{ROLE}=child", f"TETHER_BENCH_HOPLOG={hoplog}",
            f"TETHER_BENCH_STOP={stop}", f"TETHER_BENCH_SLEEPS={sleeps}", "/bin/sh", "-c", LAUNCHER]


def run_trial(alt: Alt, mark: str, tmp: str, *, sleeps: int, sig: int, deadline: float,
              quiet: float) -> Trial:
    res = Trial()
    hoplog = os.path.join(tmp, f"{mark}.hop")
    stop = os.path.join(tmp, f"{mark}.stop")
    cfg = {"kind": alt.kind, "argv": tree_argv(mark, hoplog, stop, sleeps), "src": SRC,
           "wrapper": alt.wrapper, "pdeathsig": alt.pdeathsig, "mechanism": alt.mechanism}
    born = identity.now_ticks()
    t_setup = time.monotonic()
    owner = subprocess.Popen([sys.executable, "-c", OWNER, json.dumps(cfg)], stdout=subprocess.PIPE,
                             stdin=subprocess.DEVNULL, start_new_session=True)
    fds: dict[int, tuple[str, identity.Identity]] = {}
    helper_fds: dict[int, identity.Identity] = {}
    helper_ids: list[identity.Identity] = []
    try:
        line = owner.stdout.readline()
        if not line:
            res.error = f"owner exited with {owner.wait()} before starting the tree"
            return res
        info = json.loads(line)
        # Wait until the tree has settled: sleeps + 5 long-lived processes, all
        # exec'd into `sleep`, and the hopper hopping.
        want = sleeps + 5
        limit = time.monotonic() + 60
        members: list[tuple[identity.Identity, str]] = []
        while time.monotonic() < limit:
            members = [(i, r) for i, r in marked(born, mark) if r != "hopper" and i.comm == "sleep"]
            if len(members) >= want and os.path.exists(hoplog) and os.path.getsize(hoplog) > 0:
                break
            time.sleep(0.02)
        else:
            res.error = f"tree did not settle: {len(members)} of {want} sleeps seen"
            return res
        time.sleep(0.03)
        tree = marked(born, mark)
        members = [(i, r) for i, r in tree if r != "hopper"]
        cap = identity.capture(born_after=born)
        member_pids = {i.pid for i, _ in tree}  # hopper processes are the tree's, not helpers
        helper_ids = [h for h in cap.descendants([owner.pid], born_after=born)
                      if h.pid not in member_pids and h.state not in ("Z", "X")
                      and (env_of(h.pid) or {}).get(MARK.encode()) != mark.encode()]
        seen = {h.pid for h in helper_ids}
        for pid in info.get("helpers", []):
            h = cap.get(pid)
            if h is not None and pid not in seen and pid not in member_pids:
                helper_ids.append(h)
        for ident, role in members:
            fd = open_pidfd(ident)
            if fd is not None:
                fds[fd] = (role, ident)
        for h in helper_ids:
            fd = open_pidfd(h)
            if fd is not None:
                helper_fds[fd] = h
        poller = select.poll()
        for fd in list(fds) + list(helper_fds):
            poller.register(fd, select.POLLIN)
        # Anything that already exited (a transient shell) is not part of the test.
        for fd, _ in poller.poll(0):
            poller.unregister(fd)
            fds.pop(fd, None)
            helper_fds.pop(fd, None)
        res.members = len(fds) + 1  # + the hopper
        res.helpers = len(helper_fds)
        res.setup_s = time.monotonic() - t_setup
        pending = set(fds)
        pending_helpers = set(helper_fds)
        last_size = os.path.getsize(hoplog)
        last_growth = None  # perf_counter of the last growth seen after the kill

        t0 = time.perf_counter()
        owner.send_signal(sig)
        last_death, last_role = t0, ""
        end = t0 + deadline
        while True:
            now = time.perf_counter()
            for fd, _ in poller.poll(1):
                poller.unregister(fd)
                if fd in pending:
                    pending.discard(fd)
                    last_death, last_role = now, fds[fd][0]
                pending_helpers.discard(fd)
            try:
                size = os.path.getsize(hoplog)
            except OSError:
                size = last_size
            if size != last_size:
                last_size, last_growth = size, now
            hop_quiet = now - (last_growth if last_growth is not None else t0) > quiet
            if (not pending and hop_quiet and not pending_helpers) or now > end:
                break
        # The hopper is dead when its log stops growing; a loaded machine can
        # stall it, so look once more before believing that.
        time.sleep(0.05)
        hop_alive = (not hop_quiet) or os.path.getsize(hoplog) != last_size
        res.survivors = len(pending) + (1 if hop_alive else 0)
        roles: dict[str, int] = {}
        for fd in pending:
            roles[fds[fd][0]] = roles.get(fds[fd][0], 0) + 1
        if hop_alive:
            roles["hopper"] = 1
        res.survived_roles = roles
        res.helpers_left = len(pending_helpers)
        if not hop_alive:
            res.hopper_ms = ((last_growth - t0) * 1000) if last_growth is not None else 0.0
        if res.survivors == 0:
            res.last_death_ms = (last_death - t0) * 1000
            res.last_role = last_role
            if (res.hopper_ms or 0.0) > res.last_death_ms:
                res.last_death_ms, res.last_role = res.hopper_ms, "hopper"

        return res
    except Exception as exc:  # noqa: BLE001 - one failed trial must not stop the run
        res.error = f"{type(exc).__name__}: {exc}"
        return res
    finally:
        for fd in list(fds) + list(helper_fds):
            os.close(fd)
        if owner.poll() is None:
            owner.kill()
        owner.wait()
        owner.stdout.close()
        res.cleaned = cleanup(born, mark, stop, helper_ids)
        for p in (hoplog, stop):
            try:
                os.unlink(p)
            except OSError:
                pass


def cleanup(born: int, mark: str, stop: str, helpers: list[identity.Identity]) -> int:
    """End what the trial left, by recorded identity; return how many were ended."""
    with open(stop, "w"):
        pass  # the hopper stops hopping when it sees this file
    from tether.ending import end

    ending = end(lambda: [i for i, _ in marked(born, mark)] + list(helpers), born_after=born,
                 grace=0, quiet=0.2, bound=20)
    return len([i for i, how in ending.ended if how != "exit"])


# ----------------------------------------------------------------------------
# Spawn overhead


def spawn_fn(alt: Alt, jobs: list) -> Any:
    true = ["/bin/true"]
    if alt.kind in ("popen", "psutil"):
        return lambda: subprocess.Popen(true).wait()
    if alt.kind == "killpg":
        return lambda: subprocess.Popen(true, start_new_session=True).wait()
    if alt.kind == "wrap":
        pre = None
        if alt.pdeathsig:
            libc = ctypes.CDLL(None, use_errno=True)

            def pre() -> None:
                libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG

        argv = alt.wrapper + true
        return lambda: subprocess.Popen(argv, preexec_fn=pre).wait()
    from tether import Job

    job = Job(name="compare-spawn", mechanism=alt.mechanism)
    jobs.append(job)
    return lambda: job.popen(true).wait()


def measure_spawn(alt: Alt, rounds: int) -> dict[str, Any]:
    jobs: list = []
    try:
        fn = spawn_fn(alt, jobs)

        def plain() -> None:
            subprocess.Popen(["/bin/true"]).wait()

        for _ in range(5):  # warm up both paths
            plain()
            fn()
        base, ours = [], []
        for _ in range(rounds):  # interleaved: machine noise hits both alike
            t = time.perf_counter()
            plain()
            base.append(time.perf_counter() - t)
            t = time.perf_counter()
            fn()
            ours.append(time.perf_counter() - t)
        out: dict[str, Any] = {"rounds": rounds,
                               "plain_us": round(statistics.median(base) * 1e6, 1),
                               "us": round(statistics.median(ours) * 1e6, 1)}
        out["ratio"] = round(out["us"] / out["plain_us"], 3)
        if alt.kind == "tether":
            from tether import Job

            t_open = []
            for _ in range(max(5, rounds // 20)):
                t = time.perf_counter()
                Job(mechanism=alt.mechanism).close()
                t_open.append(time.perf_counter() - t)
            out["open_job_us"] = round(statistics.median(t_open) * 1e6, 1)
        return out
    except Exception as exc:  # noqa: BLE001
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        for j in jobs:
            j.close()


# ----------------------------------------------------------------------------


def summarize(trials: list[Trial]) -> dict[str, Any]:
    ok = [t for t in trials if not t.error]
    out: dict[str, Any] = {"trials": len(ok), "errors": [t.error for t in trials if t.error]}
    if not ok:
        return out
    surv = [t.survivors for t in ok]
    roles: dict[str, int] = {}
    for t in ok:
        for r, n in t.survived_roles.items():
            roles[r] = max(roles.get(r, 0), n)
    times = [t.last_death_ms for t in ok if t.last_death_ms is not None]
    hops = [t.hopper_ms for t in ok if t.hopper_ms is not None]
    out.update({
        "members_median": statistics.median(t.members for t in ok),
        "helpers_median": statistics.median(t.helpers for t in ok),
        "survivors_median": statistics.median(surv),
        "survivors_max": max(surv),
        "trials_with_survivors": sum(1 for s in surv if s),
        "survived_roles": roles,  # role -> most processes of that role left in one trial
        "helpers_left_max": max(t.helpers_left for t in ok),
        "setup_s_median": round(statistics.median(t.setup_s for t in ok), 3),
        "last_death_ms": None,
        "hopper_ms_p50": round(statistics.median(hops), 2) if hops else None,
        "last_to_die": {r: sum(1 for t in ok if t.last_role == r)
                        for r in sorted({t.last_role for t in ok if t.last_role})},
    })
    if times:
        out["last_death_ms"] = {"p50": round(statistics.median(times), 2),
                                "p99": round(pct(times, 0.99), 2),
                                "min": round(min(times), 2), "max": round(max(times), 2),
                                "n": len(times), "all": [round(x, 3) for x in times]}
    return out


def tool_versions() -> dict[str, str]:
    out = {}
    for tool, arg in (("unshare", "--version"), ("bwrap", "--version"), ("tini", "--version")):
        if shutil.which(tool):
            try:
                r = subprocess.run([tool, arg], capture_output=True, text=True, timeout=10)
                out[tool] = (r.stdout or r.stderr).strip().splitlines()[0]
            except (OSError, subprocess.TimeoutExpired, IndexError):
                out[tool] = "?"
    try:
        import psutil

        out["psutil"] = psutil.__version__
    except ImportError:
        pass
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=20, help="owner-SIGKILL trials per alternative")
    ap.add_argument("--leaky-trials", type=int, default=5,
                    help="stop an alternative after this many trials if every one left survivors "
                         "(its time to last death is 'never'; survivors repeat exactly)")
    ap.add_argument("--sigterm-trials", type=int, default=2,
                    help="extra trials where the owner gets SIGTERM and may run its clean-up")
    ap.add_argument("--sleeps", type=int, default=100)
    ap.add_argument("--deadline", type=float, default=2.0, help="seconds to wait after the kill")
    ap.add_argument("--quiet", type=float, default=0.5,
                    help="hop log silent this long = pid-hopper dead")
    ap.add_argument("--spawn-rounds", type=int, default=200)
    ap.add_argument("--only", default="", help="comma-separated alternative names")
    ap.add_argument("--install", action="store_true",
                    help="apt-get install bubblewrap/tini when missing (root)")
    ap.add_argument("--quick", action="store_true",
                    help="3 trials, 2 leaky, 1 SIGTERM trial, 40 spawn rounds")
    ap.add_argument("--out", default=RESULTS)
    a = ap.parse_args()
    if a.quick:
        a.trials, a.leaky_trials, a.sigterm_trials, a.spawn_rounds = 3, 2, 1, 40
    if not sys.platform.startswith("linux") or not hasattr(os, "pidfd_open"):
        print("compare.py needs Linux >= 5.3 and Python >= 3.9 (pidfds)", file=sys.stderr)
        return 2
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))

    alts = alternatives()
    if a.only:
        names = set(a.only.split(","))
        alts = [x for x in alts if x.name in names]
    for alt in alts:
        check_alternative(alt, a.install)
    run_id = uuid.uuid4().hex[:12]
    run_born = identity.now_ticks()
    out: dict[str, Any] = {
        "bench": "compare",
        "command": "python3 bench/compare.py " + " ".join(sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                    "python": platform.python_version(), "uid": os.geteuid(),
                    "tools": tool_versions()},
        "auto": choose("auto"),
        "load_avg_start": [round(x, 2) for x in os.getloadavg()],
        "params": {"trials": a.trials, "leaky_trials": a.leaky_trials,
                   "sigterm_trials": a.sigterm_trials, "sleeps": a.sleeps,
                   "deadline_s": a.deadline, "hop_quiet_s": a.quiet,
                   "spawn_rounds": a.spawn_rounds},
        "tree": {r: ROLE_LABELS[r] for r in ROLES},
        "alternatives": [],
    }
    runnable = [x for x in alts if x.available]
    for x in alts:
        if not x.available:
            print(f"  {x.name}: cannot run here: {x.reason}")
    kill: dict[str, list[Trial]] = {x.name: [] for x in runnable}
    term: dict[str, list[Trial]] = {x.name: [] for x in runnable}
    tmp = tempfile.mkdtemp(prefix="tether-compare-")
    n = 0
    try:
        print(f"owner-SIGKILL trials: up to {a.trials} rounds over {len(runnable)} alternatives "
              f"(load {out['load_avg_start']})", flush=True)
        # Round-robin over the alternatives, so the machine's load hits all alike.
        for rnd in range(a.trials):
            for alt in runnable:
                done = kill[alt.name]
                if (len(done) >= a.leaky_trials
                        and all(t.survivors or t.error for t in done[: a.leaky_trials])):
                    continue
                n += 1
                t = run_trial(alt, f"{run_id}-{n}", tmp, sleeps=a.sleeps, sig=signal.SIGKILL,
                              deadline=a.deadline, quiet=a.quiet)
                done.append(t)
                if t.error:
                    print(f"    {alt.name}: trial error: {t.error}", flush=True)
            out.setdefault("load_avg_rounds", []).append(round(os.getloadavg()[0], 2))
            print(f"  round {rnd + 1}/{a.trials} done (load {os.getloadavg()[0]:.1f})", flush=True)
        for _ in range(a.sigterm_trials):
            for alt in runnable:
                n += 1
                term[alt.name].append(run_trial(alt, f"{run_id}-{n}", tmp, sleeps=a.sleeps,
                                                sig=signal.SIGTERM, deadline=a.deadline,
                                                quiet=a.quiet))
        print("spawn overhead ...", flush=True)
        spawn = {alt.name: measure_spawn(alt, a.spawn_rounds) for alt in runnable}
    finally:
        # Verify that no process of this run is left (every trial cleaned up its own).
        leftovers = marked(run_born, run_id + "-", exact=False)
        for ident, _ in leftovers:
            try:
                gate.send_signal(ident, signal.SIGKILL, member=True)
            except Exception:  # noqa: BLE001
                pass
        shutil.rmtree(tmp, ignore_errors=True)
    out["leftovers_at_end"] = len(leftovers)
    out["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]

    for alt in alts:
        row: dict[str, Any] = {"name": alt.name, "label": alt.label,
                               "tether": alt.kind == "tether", "who_ends": alt.who_ends,
                               "available": alt.available}
        if not alt.available:
            row["reason"] = f"cannot run here: {alt.reason}"
        else:
            row["owner_sigkill"] = summarize(kill[alt.name])
            row["owner_sigterm"] = summarize(term[alt.name])
            row["spawn"] = spawn[alt.name]
        out["alternatives"].append(row)

    print_table(out)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=2)
    print(f"wrote {a.out}")
    if leftovers:
        print(f"WARNING: {len(leftovers)} processes of this run were left and have been killed",
              file=sys.stderr)
        return 1
    return 0


def print_table(out: dict[str, Any]) -> None:
    members = out["params"]["sleeps"] + 6
    print(f"\nowner SIGKILLed; tree of {members} processes "
          f"(plain child, & job, setsid daemon, nohup setsid, TERM-ignorer, pid-hopper, "
          f"{out['params']['sleeps']} sleeps); load {out['load_avg_start']} -> {out['load_avg_end']}")
    print(f"  {'alternative':<19} {'trials':>6} {'survivors':>9} {'what survived':<38} "
          f"{'last death p50/p99 ms':>22} {'on SIGTERM':>10} {'spawn':>7}")
    for row in out["alternatives"]:
        if not row["available"]:
            print(f"  {row['name']:<19} {row['reason']}")
            continue
        k = row["owner_sigkill"]
        if not k.get("trials"):
            print(f"  {row['name']:<19} no successful trial: {k.get('errors')}")
            continue
        sr = k["survived_roles"]
        if set(sr) >= set(ROLES):
            roles = "everything"
        else:
            roles = ", ".join(r + (f"×{c}" if c > 1 else "")
                              for r, c in sorted(sr.items(), key=lambda x: ROLES.index(x[0])
                                                 if x[0] in ROLES else 99)) or "-"
        if k["helpers_left_max"]:
            roles += f" (+{k['helpers_left_max']} helper)"
        ld = k["last_death_ms"]
        times = f"{ld['p50']:.1f} / {ld['p99']:.1f}" if ld and not k["trials_with_survivors"] else "never"
        if ld and k["trials_with_survivors"]:
            times = f"never ({k['trials_with_survivors']}/{k['trials']})"
        t = row["owner_sigterm"]
        term = str(t.get("survivors_max", "-")) if t.get("trials") else "-"
        sp = row["spawn"]
        spawn = f"{sp['ratio']:.2f}x" if "ratio" in sp else "err"
        surv = f"{k['survivors_median']:g}" + (f"-{k['survivors_max']}" if k["survivors_max"] !=
                                               k["survivors_median"] else "")
        print(f"  {row['name']:<19} {k['trials']:>6} {surv:>9} {roles[:38]:<38} {times:>22} "
              f"{term:>10} {spawn:>7}")
    print(f"  survivors: processes of the tree alive {out['params']['deadline_s']:g} s after the kill (median, or range); "
          "on SIGTERM: survivors when the owner gets SIGTERM instead (max); "
          "spawn: spawn+wait of /bin/true / plain Popen, same run (median ratio)")


if __name__ == "__main__":
    raise SystemExit(main())
