"""Smoke test of the Linux arm64 wheel's programs under qemu-aarch64 (user mode).

    python3 scripts/qemu-aarch64-smoke.py WHEEL VERSION

(scripts/check-wheels.sh aarch64 runs it.) The wheel is installed by pip as
for an arm64 machine (``--platform manylinux2014_aarch64 --target``): its
Python code is this machine's to run, its programs (tether-keeper, the
native tether) run under ``qemu-aarch64-static``. Checks, one line each
(``ok: ...`` / ``FAILED: ...``):

* ``tether-keeper --version`` answers;
* the native ``tether --version`` hands over to the wheel's tether-py;
* the native ``tether run -- sh -c ...`` runs (default mechanism), with the
  system calls qemu-user could not emulate (``QEMU_STRACE``) listed;
* the wheel's Python tether opening jobs whose keeper is the arm64
  ``tether-keeper`` (``_TETHER_NATIVE_HELPER``: a script that execs it under
  qemu, so the keeper's pid is qemu's): the keeper answers (the job opens, its
  trace says ``native``), a spawned tree is contained (its members are the
  job's), and SIGKILL of the owner ends the tree, while the control tree the
  same owner started without tether is seen alive afterwards (then ended here,
  by recorded identity).

qemu-user is not a kernel: whatever it cannot emulate is reported, and a
mechanism it cannot carry is reported as such, not as a tether failure.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

WHEEL, VERSION = sys.argv[1:3]
QEMU = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
failed = 0


def ok(what: str) -> None:
    print(f"ok: aarch64: {what}", flush=True)


def bad(what: str) -> None:
    global failed
    failed += 1
    print(f"FAILED: aarch64: {what}", flush=True)


if QEMU is None:
    bad("no qemu-aarch64-static (Debian: qemu-user-static)")
    sys.exit(1)
qemu_version = subprocess.run([QEMU, "--version"], capture_output=True, text=True).stdout
print(f"qemu: {qemu_version.splitlines()[0] if qemu_version else '?'}")

T = tempfile.mkdtemp(prefix="tether-aarch64-")
r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--disable-pip-version-check", "--platform", "manylinux2014_aarch64",
                    "--only-binary=:all:", "--target", T, WHEEL], capture_output=True, text=True)
if r.returncode != 0:
    bad(f"pip install --platform manylinux2014_aarch64: {r.stderr.strip()}")
    sys.exit(1)
KEEPER = os.path.join(T, "tether", "_native", "tether-keeper")
CLI = os.path.join(T, "bin", "tether")
WRAP = os.path.join(T, "keeper-under-qemu")
with open(WRAP, "w") as f:
    f.write(f'#!/bin/sh\nexec {QEMU} {KEEPER} "$@"\n')
os.chmod(WRAP, 0o755)
ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": T, "PYTHONPATH": T,
       "LC_ALL": "C.UTF-8"}
sys.path.insert(0, T)
from tether import identity  # noqa: E402  (the wheel's own)


def qemu(*args: str, strace: bool = False, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(ENV, QEMU_STRACE="1") if strace else ENV
    return subprocess.run([QEMU, *args], capture_output=True, text=True, env=env, timeout=timeout)


try:
    r = qemu(KEEPER, "--version")
    if r.returncode == 0 and r.stdout.startswith("tether-keeper "):
        ok(f"tether-keeper --version: {r.stdout.strip()}")
    else:
        bad(f"tether-keeper --version: exit {r.returncode}: {r.stdout}{r.stderr}")

    r = qemu(CLI, "--version")
    if r.stdout.strip() == f"tether {VERSION}":
        ok(f"the native tether --version (handed over to tether-py): {r.stdout.strip()}")
    else:
        bad(f"tether --version: exit {r.returncode}: {r.stdout}{r.stderr}")

    r = qemu(CLI, "run", "--", "sh", "-c", "echo ran $((6 * 7))", strace=True)
    out = [ln for ln in r.stdout.splitlines() if ln.startswith("ran ")]
    if r.returncode == 0 and out == ["ran 42"]:
        ok("the native tether run -- sh -c 'echo ...' (default mechanism)")
    else:
        bad(f"tether run: exit {r.returncode}: {r.stdout[-500:]}{r.stderr[-500:]}")
    # What qemu-user refused, from its own trace (stderr; the command's output is stdout).
    missing = sorted({ln.split(" ", 1)[1].strip() for ln in r.stderr.splitlines()
                      if "Unknown syscall" in ln or "errno=38 " in ln or "errno=22 " in ln})
    missing = [m.replace("Unknown syscall 435", "clone3 (syscall 435): unknown to qemu, ENOSYS")
               .replace("prctl(36,1,", "prctl(PR_SET_CHILD_SUBREAPER,1,") for m in missing]
    print("qemu-user, under the native tether run: " + ("; ".join(missing) or "nothing refused"))

    OWNER = textwrap.dedent("""
        import json, os, subprocess, sys, time
        import tether
        from tether import identity
        TREE = ["sh", "-c", "sleep 300 & echo $!; sleep 300 & echo $!; echo $$; wait"]
        def pids(p):
            return [int(p.stdout.readline()) for _ in range(3)]
        job = tether.Job(mechanism=sys.argv[1])
        p = job.popen(TREE, stdout=subprocess.PIPE, text=True)
        pids(p)  # all three started (pids as the job's namespace, if any, numbers them)
        deadline = time.monotonic() + 30
        while len(job.member_pids()) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        mine = job.member_pids()  # this machine's pids
        c = subprocess.Popen(TREE, stdout=subprocess.PIPE, text=True, start_new_session=True)
        control = pids(c)
        print(json.dumps({"trace": job.trace(), "members": job.member_pids(),
                          "tree": [identity.read(x) for x in mine],
                          "control": [identity.read(x) for x in control]}), flush=True)
        time.sleep(300)
    """)
    for mech in ("cgroup", "subreaper", "pidns"):
        env = dict(ENV, _TETHER_NATIVE_HELPER=WRAP)
        owner = subprocess.Popen([sys.executable, "-c", OWNER, mech], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env)
        control: list = []
        try:
            line = owner.stdout.readline()  # bounded: the owner's job opens or it exits
            if not line:
                owner.wait(30)
                err = owner.stderr.read().strip().splitlines()
                print(f"{mech}: the job did not open under qemu-user: "
                      f"{err[-1] if err else owner.returncode}")
                continue
            info = json.loads(line)
            control = [identity.Identity(*c) for c in info["control"] if c]
            tree = [identity.Identity(*c) for c in info["tree"] if c]
            kpid = info["trace"].get("keeper_pid")
            exe = os.readlink(f"/proc/{kpid}/exe") if kpid else "?"
            if info["trace"].get("keeper") == "native" and os.path.samefile(exe, QEMU):
                ok(f"{mech}: the arm64 tether-keeper answered (job open, keeper pid {kpid} is "
                   f"{os.path.basename(exe)} running it)")
            else:
                bad(f"{mech}: keeper {info['trace']}, exe {exe}")
                continue
            names = sorted(t.comm for t in tree)
            if len(tree) >= 3 and names.count("sleep") == 2 and "sh" in names:
                ok(f"{mech}: a spawned tree is contained: the job's members are {names}")
            else:
                bad(f"{mech}: the job's members are {names}, not sh and two sleeps")
            owner.send_signal(signal.SIGKILL)  # our own Popen child
            owner.wait(30)
            deadline = time.monotonic() + 20
            while any(identity.is_alive(t) for t in tree) and time.monotonic() < deadline:
                time.sleep(0.05)
            left = [t[0] for t in tree if identity.is_alive(t)]
            alive = [c[0] for c in control if identity.is_alive(c)]
            if not left and len(alive) == 3:
                ok(f"{mech}: owner SIGKILLed: its tree ended; the control tree (no tether) "
                   "is alive")
            else:
                bad(f"{mech}: after the owner's SIGKILL: tree left {left}, control alive {alive}")
        finally:
            if owner.poll() is None:
                owner.send_signal(signal.SIGKILL)
                owner.wait(30)
            for c in control:  # the control tree: ours, by recorded identity
                identity.send_signal(c, signal.SIGKILL)
finally:
    shutil.rmtree(T, ignore_errors=True)
sys.exit(1 if failed else 0)
