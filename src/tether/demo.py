"""`tether demo`: an escape-artist tree in a job, its owner SIGKILLed.

The owner is a separate Python process (so it can be SIGKILLed for real).
It opens a job, starts one process per escape technique, writes their PIDs
to a file and waits. We SIGKILL it, then watch every recorded identity
(pid + kernel start time) until it is gone; a zombie counts as gone.
``--control`` runs the same tree with plain ``subprocess.Popen``: that is
what the techniques achieve without tether (survivors are then ended here,
by the identities we recorded).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .identity import Identity

# technique -> shell snippet; each writes "<name> <pid>" of the process to watch to $F
TECHNIQUES: dict[str, tuple[str, str]] = {
    "child": ("plain child", 'echo "child $$" >> "$F"; exec sleep 300'),
    "background": ("`sleep &` from sh", 'sleep 300 & echo "background $!" >> "$F"; wait'),
    "daemon": ("double-forked setsid daemon",
               '(setsid sh -c \'echo "daemon $$" >> "$F"; exec sleep 300\' &) ; exit 0'),
    "nohup": ("`nohup setsid sleep &`",
              'nohup setsid sh -c \'echo "nohup $$" >> "$F"; exec sleep 300\' >/dev/null 2>&1 & exit 0'),
    "ignorer": ("ignores SIGTERM and SIGHUP",
                'trap "" TERM HUP; echo "ignorer $$" >> "$F"; while :; do sleep 1; done'),
    "hopper": ("pid-hopper (setsid, fork, parent exits)",
               'H=\'[ -e "$F" ] || exit 0; echo "$$" > "$F.hop"; sleep 0.2; setsid sh -c "$H" & exit 0\'; export H; '
               'echo "hopper $$" >> "$F"; setsid sh -c "$H" & exit 0'),
}

OWNER = r"""
import os, subprocess, sys, time
mech, control, f = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
sys.path.insert(0, sys.argv[4])
scripts = sys.argv[5:]
env = dict(os.environ, F=f)
if control:
    procs = [subprocess.Popen(["/bin/sh", "-c", s], env=env, stdin=subprocess.DEVNULL) for s in scripts]
else:
    from tether import Job
    job = Job(name="demo", mechanism=mech)
    procs = [job.popen(["/bin/sh", "-c", s], env=env, stdin=subprocess.DEVNULL) for s in scripts]
    print(job.mechanism, flush=True)
print("started", flush=True)
time.sleep(600)
"""


def _read_pids(path: str) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2 and parts[1].isdigit():
                    out[parts[0]] = int(parts[1])
    except OSError:
        pass
    return out


def _hop_pid(path: str) -> int | None:
    try:
        with open(path + ".hop") as f:
            txt = f.read().strip()
        return int(txt) if txt.isdigit() else None
    except OSError:
        return None


def run_tree(mechanism: str = "auto", control: bool = False, timeout: float = 3.0) -> dict:
    """Start the tree under an owner, SIGKILL the owner, watch. Returns the results."""
    from . import gate, identity
    from .ending import end

    src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tmp = tempfile.mkdtemp(prefix="tether-demo-")
    f = os.path.join(tmp, "pids")
    born = identity.now_ticks()
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, mechanism, "1" if control else "0", f, src,
         *[s for _, s in TECHNIQUES.values()]],
        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    used = "none (plain subprocess.Popen)" if control else ""
    survivors_cleaned: list[int] = []
    assert owner.stdout is not None  # stdout=PIPE
    try:
        line = owner.stdout.readline().strip()
        if not control:
            used = line
            line = owner.stdout.readline().strip()
        if line != "started":
            raise RuntimeError(f"demo owner failed to start (said {line!r})")
        # Wait until every technique has reported its pid (bounded).
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if len(_read_pids(f)) >= len(TECHNIQUES) and _hop_pid(f):
                break
            time.sleep(0.01)
        time.sleep(0.1)  # let the escapees finish escaping
        # The pids were written by the processes themselves: inside a PID
        # namespace that is their inner pid. Map each to the outer pid through
        # NSpid, among the processes carrying this demo's marker (never others).
        watched = _watched(born, f)
        t0 = time.monotonic()
        owner.kill()
        owner.wait()
        death = _deaths(watched, born, f, t0, timeout)
        results = []
        for name, (label, _) in TECHNIQUES.items():
            ms = death.get(name)
            survived = name in watched and ms is None
            results.append({"technique": name, "label": label, "survived": survived,
                            "ms_to_death": None if ms is None else round(ms, 2),
                            "seen": name in watched})
        # Clean up survivors (control runs, or a failure): only processes born after
        # the demo began that carry its marker; stop once none was seen for 300 ms.
        try:
            os.unlink(f)  # the hopper stops hopping when its file is gone
        except OSError:
            pass
        proof = gate.Proof(b"F=" + f.encode())  # found by the marker: must still carry it
        ended = end(lambda: _tree_after(born, f), born_after=born, grace=0, quiet=0.3, bound=10,
                    proof=lambda _i: proof)
        survivors_cleaned.extend(i.pid for i in ended.identities())
        return {"mechanism": used, "control": control, "results": results,
                "survivors": sum(r["survived"] for r in results),
                "cleaned_up_after": sorted(set(survivors_cleaned))}
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        for name in ("pids", "pids.hop"):
            try:
                os.unlink(os.path.join(tmp, name))
            except OSError:
                pass
        try:
            os.rmdir(tmp)
        except OSError:
            pass
        if sys.platform.startswith("linux") and not control:
            _remove_stale_run_dirs()


def _watched(born: int, f: str) -> dict[str, Identity]:
    """Each technique's process. The pids were written by the processes
    themselves: inside a PID namespace that is their inner pid. Each is mapped
    to the outer pid through NSpid, among the processes carrying this demo's
    marker (never others)."""
    from . import identity

    ours = _ours(born, f)
    pids = _read_pids(f)
    watched: dict[str, Identity] = {}
    for name in TECHNIQUES:
        pid = _hop_pid(f) if name == "hopper" else pids.get(name)
        outer = ours.get(pid) if pid else None
        if name == "hopper" and outer is None:
            for _ in range(20):  # it hopped while we looked: look again
                ours = _ours(born, f)
                pid = _hop_pid(f)
                outer = ours.get(pid) if pid else None
                if outer:
                    break
                time.sleep(0.005)
        ident = identity.read(outer) if outer else None
        if ident is not None:
            watched[name] = ident
    return watched


def _deaths(watched: dict[str, Identity], born: int, f: str, t0: float,
            timeout: float) -> dict[str, float | None]:
    """Milliseconds from the owner's kill (at ``t0``) to each watched
    process's death, None for one still alive after ``timeout``."""
    from . import identity

    death: dict[str, float | None] = {n: None for n in watched}
    hop_dead_at: float | None = None
    hop_last = _hop_pid(f)
    last_hop_check = 0.0
    while time.monotonic() - t0 < timeout:
        now = time.monotonic()
        for name, ident in watched.items():
            if death[name] is not None:
                continue
            if name == "hopper":
                if now - last_hop_check < 0.02:
                    continue
                last_hop_check = now
                # A hopper's pid changes every ~20 ms: it is dead when the last pid
                # it wrote is dead and no new one appeared for 400 ms (it hops every 200 ms).
                cur = _hop_pid(f)
                if cur != hop_last:
                    hop_last, hop_dead_at = cur, None
                outer = _ours(born, f).get(cur) if cur else None
                alive = outer is not None and any(
                    identity.is_alive(i) for i in [identity.read(outer)] if i is not None)
                if alive:
                    hop_dead_at = None
                elif hop_dead_at is None:
                    hop_dead_at = now
                elif now - hop_dead_at > 0.4:
                    death[name] = (hop_dead_at - t0) * 1000
                continue
            if not identity.is_alive(ident):
                death[name] = (now - t0) * 1000
        if all(v is not None for v in death.values()):
            break
        time.sleep(0.001)
    return death


def _remove_stale_run_dirs() -> None:
    """Empty cgroup run directories a job's keeper could not remove (one that
    died first) are removed now: the demo's owner is gone."""
    from . import cgroupfs

    base, _why = cgroupfs.base_dir()
    if base is not None:
        cgroupfs.remove_stale_run_dirs(base)


def _ours(born: int, marker: str) -> dict[int, int]:
    """inner-or-outer pid -> outer pid, for live processes carrying this demo's marker."""
    from . import identity

    out: dict[int, int] = {}
    for ident in _tree_after(born, marker):
        out[ident.pid] = ident.pid
        ns = identity.nspid(ident.pid)
        if ns:
            out.setdefault(ns[-1], ident.pid)  # its pid inside a PID namespace
    return out


def _tree_after(born: int, marker: str):
    """Live processes running our demo scripts, born after the demo began
    (never anything older), found by the marker in their environment."""
    from . import capture, environ

    cap = capture.capture(born_after=born)
    entry = b"F=" + marker.encode()
    return [i for i in cap.procs.values()
            if i.uid == os.getuid() and i.state not in ("Z", "X", "x")
            and environ.environ_has(i.pid, entry)]


def demo(mechanism: str = "auto", control: bool = False, as_json: bool = False) -> int:
    from .errors import TetherError

    try:
        res = run_tree(mechanism, control)
    except (TetherError, OSError, RuntimeError, ValueError) as exc:
        print(f"tether demo: {exc}", file=sys.stderr)
        return 125
    if as_json:
        print(json.dumps(res, indent=2))
    else:
        print(f"mechanism: {res['mechanism']}")
        print("owner: SIGKILLed; watching each process by pid + kernel start time\n")
        print(f"  {'technique':<42} {'survived?':<10} {'ms to death':>11}")
        for r in res["results"]:
            ms = "-" if r["ms_to_death"] is None else f"{r['ms_to_death']:.1f}"
            surv = "not seen" if not r["seen"] else ("YES" if r["survived"] else "no")
            print(f"  {r['label']:<42} {surv:<10} {ms:>11}")
        verdict = "nothing survived" if res["survivors"] == 0 else f"{res['survivors']} survived"
        print(f"\n{verdict}.")
        if res["cleaned_up_after"]:
            print(f"(demo ended the {len(res['cleaned_up_after'])} survivor processes it started)")
    ok = res["survivors"] == 0 and all(r["seen"] for r in res["results"])
    return 0 if ok else 1
