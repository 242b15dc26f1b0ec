"""A job's child inherits the owner's process state as of ``popen()``, as a
``subprocess`` child does: umask, resource limits, ignored and blocked signals.

Each case runs a real owner process (the state changes must not touch the
test runner) that opens a job, then changes its own state step by step; after
every step it starts ``cat /proc/self/status /proc/self/limits`` both with
``subprocess.Popen`` (the control: what a user expects) and in the job, and
reports both. The control must show each change (else the step proved
nothing), and the job's child must read the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from procutil import POSIX_MECHS, available

from tether.keeper import native

pytestmark = [pytest.mark.mechanism,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]

MECHS = [m for m in POSIX_MECHS if available(m)]

OWNER = r'''
import json, os, resource, signal, subprocess, sys, threading, time
from tether import Job

mech, threaded = sys.argv[1], sys.argv[2] == "1"
if threaded:  # a multi-threaded owner: its keepers come from the warden
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
CMD = ["cat", "/proc/self/status", "/proc/self/limits"]

def state(text):
    out = {}
    for line in text.splitlines():
        k, _, v = line.partition(":")
        if k in ("Umask", "SigIgn", "SigBlk"):
            out[k] = v.strip()
        elif line.startswith("Max "):
            parts = line.split()
            i = next(n for n, p in enumerate(parts) if p in ("unlimited",) or p.isdigit())
            out[" ".join(parts[:i])] = parts[i:i + 2]
    return out

def both(step, job, **kw):
    sub = subprocess.run(CMD, capture_output=True, text=True, check=True, **kw).stdout
    mine = job.run(CMD, capture_output=True, text=True, check=True, **kw).stdout
    print(json.dumps({"step": step, "subprocess": state(sub), "job": state(mine)}), flush=True)

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
with Job(mechanism=mech) as job:
    both("as opened", job)
    os.umask(0o027)
    both("umask 027", job)
    both("umask= argument", job, umask=0o077)
    resource.setrlimit(resource.RLIMIT_NOFILE, (512, hard))
    both("NOFILE soft 512", job)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 384))
    both("NOFILE hard 384", job)
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    resource.setrlimit(resource.RLIMIT_STACK, (4 << 20, resource.getrlimit(resource.RLIMIT_STACK)[1]))
    both("CORE 0, STACK 4 MiB", job)
    resource.setrlimit(resource.RLIMIT_CPU, (3000, 4000))
    resource.setrlimit(resource.RLIMIT_AS, (8 << 30, resource.RLIM_INFINITY))
    both("CPU 3000/4000 s, AS 8 GiB", job)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    both("SIGUSR1, SIGHUP ignored", job)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2, signal.SIGWINCH])
    both("SIGUSR2, SIGWINCH blocked", job)
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGWINCH])
    os.umask(0o002)
    resource.setrlimit(resource.RLIMIT_NOFILE, (300, 384))
    both("back: SIGUSR1 default, SIGWINCH unblocked, umask 002, NOFILE 300", job)
'''

# glibc's internal signals (SIGCANCEL 32, SIGSETXID 33): bits 31 and 32 of SigIgn.
_INTERNAL = (1 << 31) | (1 << 32)


# The two keepers: the native program (every Linux mechanism but pgroup)
# and the Python one (pgroup's, the keeper of macOS and the BSDs).
KEEPERS = ["native", "python"]


def _keeper_of(mech: str) -> str:
    return "python" if mech == "pgroup" else "native"


def _mech_for(keeper: str) -> str:
    """A mechanism this machine offers whose job ``keeper`` keeps."""
    mech = next((m for m in MECHS if _keeper_of(m) == keeper), None)
    if mech is None:
        pytest.skip(f"no mechanism of the {keeper} keeper is available here")
    if keeper == "native" and not native.built():
        pytest.skip("the native keeper is not built")
    return mech


def _run_owner(mech: str, threaded: bool, procs, **env) -> list[dict]:
    if _keeper_of(mech) == "native" and not native.built():
        pytest.skip("the native keeper is not built")
    r = subprocess.run([sys.executable, "-c", OWNER, mech, "1" if threaded else "0"],
                       capture_output=True, text=True, timeout=60, env=procs.env(**env))
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def _without_internal(state: dict) -> dict:
    out = dict(state)
    out["SigIgn"] = f"{int(state['SigIgn'], 16) & ~_INTERNAL:016x}"
    return out


def _check_steps(steps: list[dict], keeper: str) -> None:
    assert [s["step"] for s in steps][0] == "as opened" and len(steps) == 10
    first = steps[0]["subprocess"]
    for s in steps:
        # The control: subprocess's child shows every change of the owner.
        if s["step"] != "as opened":
            assert s["subprocess"] != first or s["step"] == "umask= argument", s["step"]
        if keeper == "native":  # glibc's 32 and 33 included (see below)
            assert s["job"] == s["subprocess"], s["step"]
        assert _without_internal(s["job"]) == _without_internal(s["subprocess"]), s["step"]
    by = {s["step"]: s["subprocess"] for s in steps}
    assert by["umask 027"]["Umask"] == "0027"
    assert by["umask= argument"]["Umask"] == "0077"
    assert by["NOFILE hard 384"]["Max open files"] == ["256", "384"]
    assert by["CPU 3000/4000 s, AS 8 GiB"]["Max cpu time"] == ["3000", "4000"]
    assert int(by["SIGUSR1, SIGHUP ignored"]["SigIgn"], 16) & (1 << 9)  # SIGUSR1
    assert int(by["SIGUSR2, SIGWINCH blocked"]["SigBlk"], 16) & (1 << 11)  # SIGUSR2


@pytest.mark.parametrize("threaded", [False, True], ids=["one-thread", "threaded"])
@pytest.mark.parametrize("mech", MECHS)
def test_job_child_has_the_owners_state_as_of_popen(mech, threaded, procs):
    if threaded and mech not in (MECHS[0], "pgroup"):
        pytest.skip("the threaded owner's path (the warden, or the native keeper spawned "
                    "from a thread) is the same for every mechanism of a keeper: checked "
                    "with one")
    _check_steps(_run_owner(mech, threaded, procs), _keeper_of(mech))


@pytest.mark.parametrize("keeper", KEEPERS)
def test_job_child_has_the_owners_state_when_the_keeper_cannot_read_it(procs, keeper):
    # The keeper reads the owner's ignored signals, umask and limits from the
    # owner's /proc (owner_state); where it cannot, it says so and the owner
    # sends them itself. The knob makes the keeper answer as if it could not
    # (test_native checks that it then does); the child's state must not change.
    mech = _mech_for(keeper)
    _check_steps(_run_owner(mech, False, procs, **{native.NO_OWNER_STATE: "1"}), keeper)


@pytest.mark.parametrize("keeper", [
    "native", pytest.param("python", marks=pytest.mark.xfail(strict=True, reason=(
        "glibc < 2.38 posix_spawn sets SIGCANCEL/SIGSETXID (32/33) to SIG_IGN in every child "
        "not given them in POSIX_SPAWN_SETSIGDEF, and os.posix_spawn cannot name them "
        "(sigaddset refuses glibc's internal signals); the native keeper sets every signal "
        "with the raw system call")))])
def test_job_child_does_not_ignore_glibc_internal_signals(procs, keeper):
    steps = _run_owner(_mech_for(keeper), False, procs)
    assert not int(steps[0]["subprocess"]["SigIgn"], 16) & _INTERNAL  # the control
    assert not int(steps[0]["job"]["SigIgn"], 16) & _INTERNAL


CHANGED_USER = r'''
import os, subprocess, sys
from tether import Job, JobRefused
job = Job(mechanism=sys.argv[1])
print(job.run(["id", "-u"], capture_output=True, text=True).stdout.strip())  # before: works
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
print(subprocess.run(["id", "-u"], capture_output=True, text=True).stdout.strip())
try:
    job.popen(["id", "-u"])
except JobRefused as exc:
    print("JobRefused:", exc)
'''


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() != 0,
                    reason="changing the owner's user needs root")
def test_owner_that_changed_user_gets_no_child_as_the_old_user(procs):
    # cwd /: the owner, as nobody, must be able to open its own working directory
    r = subprocess.run([sys.executable, "-c", CHANGED_USER, MECHS[0]], capture_output=True,
                       text=True, timeout=60, env=procs.env(), cwd="/")
    lines = r.stdout.splitlines()
    assert lines[:2] == ["0", "65534"], r.stdout + r.stderr  # the control: subprocess as nobody
    assert lines[2].startswith("JobRefused: spawn refused by the job's keeper: this process now "
                               "runs as uid/euid/gid/egid 65534/65534/65534/65534"), lines


NPROC = r'''
import os, resource, subprocess, sys
from tether import Job
if os.geteuid() == 0:  # root's forks are never held to RLIMIT_NPROC: be nobody
    # every module a job needs, read while we can (this Python may be under /root)
    import ctypes, traceback  # noqa: E401, F401 - the Python keeper's prctl, its last words
    with Job(mechanism=sys.argv[1]) as warm:
        warm.run(["true"])
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)

def attempt(spawn):
    try:
        p = spawn(["true"])
    except OSError as exc:
        return type(exc).__name__
    p.wait()
    return "ran"

with Job(mechanism=sys.argv[1]) as job:
    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    resource.setrlimit(resource.RLIMIT_NPROC, (1, hard))  # this user has a process: no fork
    print(attempt(subprocess.Popen), attempt(job.popen))
    resource.setrlimit(resource.RLIMIT_NPROC, (soft, hard))
    print(attempt(subprocess.Popen), attempt(job.popen))
'''


@pytest.mark.parametrize("keeper", KEEPERS)
def test_the_owners_process_limit_holds_for_a_jobs_spawn(procs, keeper):
    # RLIMIT_NPROC is checked at the fork, against the forking process's
    # limit: the keeper's, unless it takes the owner's for the spawn (the
    # native keeper set it on the child only, after its clone: it spawned).
    # (native: subreaper, which a user without a delegated cgroup has too)
    mech = _mech_for(keeper) if keeper == "python" else "subreaper"
    if mech not in MECHS:
        pytest.skip(f"{mech} is not available here")
    r = subprocess.run([sys.executable, "-c", NPROC, mech], capture_output=True,
                       text=True, timeout=60, env=procs.env(), cwd="/")
    lines = r.stdout.splitlines()
    # the control (subprocess) first; then, with the limit given back, both run
    assert lines == ["BlockingIOError BlockingIOError", "ran ran"], r.stdout + r.stderr


SMALL_AS = r'''
import resource, sys, time
from tether import Job, identity
with Job(mechanism=sys.argv[1]) as job:
    vm = int(identity.status_fields("self", b"VmSize")[b"VmSize"].split()[0]) * 1024
    limit = vm + (32 << 20)  # below the keeper's size + the spawn's headroom
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
    p = job.popen(["sleep", "5"])
    deadline = time.monotonic() + 2
    want = f"{limit}"
    while time.monotonic() < deadline:
        line = [ln for ln in open(f"/proc/{p.pid}/limits") if ln.startswith("Max address")][0]
        if line.split()[3] == want:
            break
        time.sleep(0.005)
    print(line.split()[3], want)
    p.kill()
    p.wait()
'''


def test_address_space_limit_below_the_keepers_size_is_set_on_the_child(procs):
    # The keeper cannot take such a limit itself (its spawn would fail):
    # the child gets it by prlimit right after it starts.
    r = subprocess.run([sys.executable, "-c", SMALL_AS, MECHS[0]], capture_output=True,
                       text=True, timeout=60, env=procs.env())
    got, want = r.stdout.split()
    assert got == want, r.stderr


CWD_OWNER = r'''
import json, os, subprocess, sys, tempfile
from tether import Job

mech = sys.argv[1]
here = tempfile.mkdtemp(prefix="tether-cwd-")
os.chdir(here)
os.rmdir(here)  # deleted: the child must start in it all the same, as subprocess's does
CMD = ["readlink", "/proc/self/cwd"]
with Job(mechanism=mech) as job:
    sub = subprocess.run(CMD, capture_output=True, text=True, check=True).stdout
    mine = job.run(CMD, capture_output=True, text=True, check=True).stdout
    other = job.run(CMD, capture_output=True, text=True, check=True, cwd="/").stdout
print(json.dumps({"here": here, "subprocess": sub.strip(), "job": mine.strip(),
                  "cwd=/": other.strip()}))
'''


@pytest.mark.parametrize("owner_state", ["keeper-reads", "owner-sends"])
@pytest.mark.parametrize("keeper", KEEPERS)
def test_job_child_starts_in_the_owners_deleted_working_directory(procs, keeper, owner_state):
    # The keeper opens the owner's working directory itself (its /proc/PID/cwd,
    # the directory, not its name); where it cannot, the owner passes it.
    mech = _mech_for(keeper)
    env = {native.NO_OWNER_STATE: "1"} if owner_state == "owner-sends" else {}
    r = subprocess.run([sys.executable, "-c", CWD_OWNER, mech], capture_output=True, text=True,
                       timeout=60, env=procs.env(**env))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    # The control: subprocess's child is in the deleted directory.
    assert out["subprocess"] == out["here"] + " (deleted)", out
    assert out["job"] == out["subprocess"], out
    assert out["cwd=/"] == "/", out


FORKED_OWNER = r'''
import json, os, subprocess, sys
from tether import Job

CMD = ["sh", "-c", "umask"]
os.umask(0o022)
with Job(mechanism=sys.argv[1]) as job:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # a forked child of the owner spawns into the job, with a umask of its own
        try:
            os.umask(0o077)
            out = {"sub": subprocess.run(CMD, capture_output=True, text=True).stdout.strip(),
                   "job": job.run(CMD, capture_output=True, text=True).stdout.strip()}
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        child = json.loads(f.read() or "{}")
    os.waitpid(pid, 0)
    parent = job.run(CMD, capture_output=True, text=True).stdout.strip()
print(json.dumps({"child": child, "parent": parent}))
'''


@pytest.mark.parametrize("keeper", KEEPERS)
def test_a_forked_child_of_the_owner_spawns_with_its_own_state(procs, keeper):
    # The keeper reads the owner's /proc (owner_state): not the state of a
    # forked child, which sends its own.
    mech = _mech_for(keeper)
    r = subprocess.run([sys.executable, "-c", FORKED_OWNER, mech], capture_output=True, text=True,
                       timeout=60, env=procs.env())
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["child"]["sub"] == "0077", out  # the control: subprocess's child has the child's
    assert out["child"]["job"] == "0077", out
    assert out["parent"] == "0022", out
