"""The Job API: a Popen drop-in, run, asyncio, members, terminate, close, guarantee."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from procutil import POSIX_MECHS, available

from tether import Job, JobClosed, JobRefused, StatusLost, gate, identity
from tether.keeper import native

pytestmark = pytest.mark.mechanism

MECHS = [m for m in POSIX_MECHS if available(m)]


@pytest.fixture(params=MECHS)
def job(request, procs):
    j = Job(name="t", mechanism=request.param, grace=0.5)
    yield j
    j.close()


def test_popen_pipes_communicate_text(job, procs):
    p = job.popen([sys.executable, "-c", "import sys; d=sys.stdin.read(); print(d.upper()); "
                   "print('err', file=sys.stderr); sys.exit(4)"],
                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                  env=procs.env())
    out, err = p.communicate("héllo wörld", timeout=20)
    assert out == "HÉLLO WÖRLD\n"
    assert err == "err\n"
    assert p.returncode == 4
    assert isinstance(p, subprocess.Popen)


def test_popen_stderr_to_stdout_cwd_env_bufsize(job, tmp_path, procs):
    p = job.popen(["sh", "-c", "pwd; echo $FOO; echo e >&2"], stdout=subprocess.PIPE,
                  stderr=subprocess.STDOUT, cwd=tmp_path, env=procs.env(FOO="bar"), bufsize=0)
    out = p.stdout.read()
    p.stdout.close()
    assert p.wait(timeout=20) == 0
    assert out.split() == [str(tmp_path).encode(), b"bar", b"e"]


def test_popen_inherits_stdio_and_pass_fds(job, tmp_path):
    r, w = os.pipe()
    try:
        p = job.popen(["bash", "-c", f"echo through >&{w}"], pass_fds=(w,))
        assert p.wait(timeout=20) == 0
        os.close(w)
        w = -1
        assert os.read(r, 100) == b"through\n"
    finally:
        os.close(r)
        if w != -1:
            os.close(w)


def test_close_fds_false_passes_inheritable(job):
    r, w = os.pipe()
    os.set_inheritable(w, True)
    try:
        p = job.popen(["bash", "-c", f"echo x >&{w}"], close_fds=False)
        assert p.wait(timeout=20) == 0
        assert os.read(r, 10) == b"x\n"
    finally:
        os.close(r)
        os.close(w)


def test_shell_true_and_start_new_session(job):
    p = job.popen("echo $((6*7))", shell=True, stdout=subprocess.PIPE)
    assert p.communicate(timeout=20)[0] == b"42\n"
    p = job.popen(["sh", "-c", "ps -o sid= -p $$"], start_new_session=True, stdout=subprocess.PIPE)
    out = p.communicate(timeout=20)[0]
    if job.mechanism != "pidns":  # pids differ inside a namespace
        assert int(out) == p.pid


def test_wait_timeout_poll_signal_kill(job):
    p = job.popen(["sleep", "30"])
    assert p.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(timeout=0.05)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=10) == -signal.SIGTERM
    p.kill()  # after exit: a no-op, never a stray signal
    p2 = job.popen(["sleep", "30"])
    p2.kill()
    assert p2.wait(timeout=10) == -signal.SIGKILL


def test_exec_errors_like_subprocess(job, tmp_path):
    with pytest.raises(FileNotFoundError):
        job.popen(["/nonexistent/cmd"])
    with pytest.raises(FileNotFoundError):
        job.popen(["no-such-command-tether-xyz"])
    f = tmp_path / "noexec"
    f.write_text("#!/bin/sh\n")
    with pytest.raises(PermissionError):
        job.popen([str(f)])
    with pytest.raises(FileNotFoundError):
        job.popen(["true"], cwd=str(tmp_path / "missing"))
    with pytest.raises(ValueError):
        job.popen(["true"], preexec_fn=lambda: None)


def _path_case(root, case: str) -> tuple[str, str]:
    """A PATH of two directories and a program name for one search case."""
    a, b = root / "a", root / "b"
    a.mkdir()
    b.mkdir()
    good = b / "prog"
    good.write_text("#!/bin/sh\necho second\n")
    good.chmod(0o755)
    first = a / "prog"
    if case == "dir-first":
        first.mkdir()
    elif case == "unexecutable-first":
        first.write_text("#!/bin/sh\necho first\n")
    elif case == "no-shebang-first":  # execve: ENOEXEC
        first.write_text("echo first\n")
        first.chmod(0o755)
    elif case == "bad-interpreter-first":  # execve: ENOENT, from the interpreter
        first.write_text("#!/nonexistent/interp\n")
        first.chmod(0o755)
    elif case == "loop-first":  # execve: ELOOP
        first.symlink_to(first)
    elif case == "file-in-path":  # ENOTDIR
        (root / "f").write_text("")
        a = root / "f"
    elif case == "unexecutable-only":
        first.write_text("#!/bin/sh\n")
        good.unlink()
    elif case == "no-shebang-only":
        first.write_text("echo first\n")
        first.chmod(0o755)
        good.unlink()
    elif case == "empty-name":
        return f"{a}:{b}", ""
    return f"{a}:{b}", "prog"


def _outcome(start, name: str, path: str):
    try:
        p = start([name], env={"PATH": path}, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    except OSError as e:
        return type(e).__name__, e.errno
    out = p.communicate(timeout=20)[0]
    return p.returncode, out


@pytest.mark.parametrize("case", ["dir-first", "unexecutable-first", "no-shebang-first",
                                  "bad-interpreter-first", "loop-first", "file-in-path",
                                  "unexecutable-only", "no-shebang-only", "empty-name"])
def test_the_path_search_is_popens(procs, tmp_path, case):
    # The keeper searches the owner's PATH for the child: every candidate in
    # order, the first error other than ENOENT/ENOTDIR is the one raised, and
    # a later candidate that runs wins (CPython's _posixsubprocess). The native
    # keeper stopped at ENOEXEC or ELOOP; the Python one at a file it judged
    # runnable, and raised ENOENT for an empty name (Popen: EACCES).
    path, name = _path_case(tmp_path, case)
    want = _outcome(subprocess.Popen, name, path)
    with Job(name="path") as job:
        got = _outcome(job.popen, name, path)
    assert got == want, (case, got, want)


def _closed_fd() -> int:
    """A number no fd has here (high: opening the job takes the low free ones)."""
    import resource

    for fd in range(min(resource.getrlimit(resource.RLIMIT_NOFILE)[0], 4096) - 1, 2, -1):
        try:
            os.fstat(fd)
        except OSError:
            return fd
    raise AssertionError("no closed fd number")


@pytest.mark.parametrize("case", ["cwd-with-nul", "stdin-closed-fd", "stdout-negative-fd",
                                  "pass-closed-fd", "pass-negative-fd", "negative-process-group"])
def test_bad_arguments_are_refused_as_subprocess_refuses_them(procs, case):
    # The job used to run the child anyway: in the keeper's directory for a
    # cwd with a NUL (the native keeper), without the named fd for a closed
    # one; and the Python keeper refused a negative process_group that
    # subprocess ignores.
    kw = {"cwd-with-nul": {"cwd": "/tmp/\0x"}, "stdin-closed-fd": {"stdin": _closed_fd()},
          "stdout-negative-fd": {"stdout": -5}, "pass-closed-fd": {"pass_fds": (_closed_fd(),)},
          "pass-negative-fd": {"pass_fds": (-1,)},
          "negative-process-group": {"process_group": -5}}[case]
    if case == "negative-process-group" and sys.version_info < (3, 11):
        pytest.skip("process_group is a Popen keyword from Python 3.11 on")

    def outcome(start):
        try:
            p = start(["true"], env=procs.env(), **kw)
        except (OSError, ValueError) as e:
            return type(e).__name__, getattr(e, "errno", None)
        return "ran", p.wait(timeout=20)

    want = outcome(subprocess.Popen)
    with Job(name="bad-args") as job:
        got = outcome(job.popen)
    assert got == want, (case, got, want)


FLAT_OWNER = r"""
import subprocess, sys
from tether import Job

def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS"))

with Job(name="flat") as job:
    keeper = job._backend.keeper_pid
    for i in range(200):
        job.popen(["true"], stdout=subprocess.PIPE).communicate()
    before = rss(keeper)
    for i in range(5000):  # (an environment of its own each, as an agent's commands)
        job.popen(["true"], stdout=subprocess.PIPE, env={"N": str(i)}).communicate()
    print(rss(keeper) - before)
"""


@pytest.mark.skipif("ASAN_OPTIONS" in os.environ,
                    reason="a keeper built with AddressSanitizer keeps freed memory in quarantine")
def test_a_keepers_memory_stays_flat_over_thousands_of_spawns(procs):
    # The Python keeper kept every pid it ever spawned (only pgroup needs
    # them): ~130 kB more per 1 000 spawns, for a job's whole life - an agent
    # host's session runs that many commands in an afternoon. Either keeper
    # (auto: cgroup here), flat after warming up. The owner is a small
    # process of its own: the Python keeper is its fork, and the test
    # runner's roomy heap would hide the growth.
    p = procs.popen([sys.executable, "-c", FLAT_OWNER], stdout=subprocess.PIPE)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0
    grew = int(out)
    assert grew < 160, f"the keeper grew {grew} kB over 5 000 spawns"


def test_run_like_subprocess_run(job):
    r = job.run(["sh", "-c", "cat; exit 3"], input=b"abc", capture_output=True)
    assert (r.returncode, r.stdout) == (3, b"abc")
    with pytest.raises(subprocess.CalledProcessError):
        job.run(["false"], check=True)
    with pytest.raises(subprocess.TimeoutExpired):
        job.run(["sleep", "10"], timeout=0.2)


def test_asyncio_create_subprocess_exec(job):
    async def go():
        p = await job.create_subprocess_exec("sh", "-c", "cat; echo done >&2; exit 5",
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE)
        out, err = await p.communicate(b"async")
        return p.returncode, out, err

    assert asyncio.run(asyncio.wait_for(go(), 20)) == (5, b"async", b"done\n")


def test_members_include_escapees_and_terminate_returns_ended(job, procs):
    p = job.popen(["sh", "-c", "sleep 300 & (setsid sleep 301 &); trap '' TERM; sleep 302"],
                  env=procs.env())
    # pgroup too: the double-forked escapee left parentage, group and session,
    # but carries the job's cookie.
    want = 3
    deadline = time.monotonic() + 10
    while [m.comm for m in job.members()].count("sleep") < want and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.05)
    members = job.members()
    comms = sorted(m.comm for m in members)
    assert comms.count("sleep") == 3, comms
    t0 = time.monotonic()
    ended = job.terminate(grace=0.5)
    # pgroup finds members by capturing the process table: slower under load.
    assert time.monotonic() - t0 < (6 if job.mechanism == "pgroup" else 3)
    assert {m.pid for m in members} <= {e.pid for e in ended} | {
        m.pid for m in members if not identity.is_alive(m)}
    assert not job.members()
    assert p.wait(timeout=5) is not None
    # The job stays usable after terminate().
    assert job.run(["true"]).returncode == 0


def test_close_ends_everything_now_and_refuses_more(job, procs):
    job.popen(["sh", "-c", "trap '' TERM HUP; sleep 300 & wait"], env=procs.env())
    deadline = time.monotonic() + 10
    while len(job.members()) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    t0 = time.monotonic()
    ended = job.close()
    assert time.monotonic() - t0 < 3
    assert len(ended) >= 2
    assert not procs.wait_all_dead(3)
    with pytest.raises(JobClosed):
        job.popen(["true"])
    assert job.close() == []


def test_guarantee_says_what_protects(job):
    g = job.guarantee
    assert g.mechanism == job.mechanism
    assert g.not_covered or g.kernel_enforced
    if job.mechanism == "pidns":
        assert g.kernel_enforced and not g.transparent and g.visible
    if job.mechanism in ("cgroup", "subreaper"):
        assert g.transparent and not g.kernel_enforced
    assert job.mechanism in str(g)


def test_transparent_auto_keeps_pids_visible():
    with Job() as job:
        assert job.guarantee.transparent
        p = job.popen(["sh", "-c", "sleep 5 & echo $!"], stdout=subprocess.PIPE)
        pid = int(p.stdout.readline())
        deadline = time.monotonic() + 5
        ident = identity.read(pid)
        while ident is not None and ident.comm != "sleep" and time.monotonic() < deadline:
            time.sleep(0.01)  # $! is known before the forked shell has exec'd sleep
            ident = identity.read(pid)
        assert ident is not None and ident.comm == "sleep"  # the outside knows this pid
        p.stdout.close()


def test_require_kernel_refuses_guardian_mechanisms():
    for mech in ("subreaper", "pgroup", "cgroup"):
        if available(mech):
            with pytest.raises(JobRefused, match="kernel"):
                Job(mechanism=mech, require="kernel")


def test_require_kernel_refused_when_nothing_kernel_enforced(monkeypatch):
    # Simulated kernel refusal (we cannot disable namespaces on this machine from a test).
    from tether import platform
    from tether.platform.base import Availability

    monkeypatch.setitem(platform._cache, "pidns",
                        Availability("pidns", False, "unshare(CLONE_NEWPID) failed: EPERM"))
    with pytest.raises(JobRefused, match="EPERM"):
        Job(require="kernel")
    with pytest.raises(JobRefused, match="EPERM"):
        Job(mechanism="strict")


def test_bad_options_are_clear():
    with pytest.raises(ValueError, match="unknown mechanism"):
        Job(mechanism="magic")
    with pytest.raises(ValueError, match="require"):
        Job(require="yes")
    with pytest.raises(ValueError, match="grace"):
        Job(grace=-1)


def test_a_bad_state_dir_or_parent_is_refused_clearly(tmp_path, monkeypatch):
    # "" was the current directory, silently (the log landed in whatever
    # directory the app ran in); parent=5 an AttributeError; a closed parent
    # "cannot create the job: No such file or directory".
    from tether import Host
    from tether.audit import AuditWriter

    monkeypatch.chdir(tmp_path)
    for make in (lambda: Job(state_dir=""), lambda: Host("app", state_dir=""),
                 lambda: AuditWriter(""), lambda: AuditWriter(b"")):
        with pytest.raises(ValueError, match="state_dir must not be empty"):
            make()
    assert os.listdir(tmp_path) == []
    with pytest.raises(TypeError, match="parent must be a tether.Job, not int"):
        Job(parent=5)
    parent = Job()
    parent.close()
    with pytest.raises(JobClosed, match="parent job .* is closed"):
        Job(parent=parent)
    with Job(state_dir=str(tmp_path / "st")) as ok:  # the control
        assert ok.run(["true"]).returncode == 0
    assert (tmp_path / "st" / "audit.jsonl").exists()


@pytest.mark.skipif(not available("pgroup"), reason="pgroup not available")
def test_multithreaded_owner_uses_warden(procs):
    """A multi-threaded owner must not fork: Python keepers (pgroup's) come
    from the warden."""
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        with Job(mechanism="pgroup") as job:
            r = job.run(["sh", "-c", "echo hi"], capture_output=True)
            assert r.stdout == b"hi\n"
            keeper = identity.read(job.trace()["keeper_pid"])
            assert keeper is not None and keeper.ppid != os.getpid()  # forked by the warden
    finally:
        stop.set()
        t.join()


@pytest.mark.skipif(not native.built(), reason="the native keeper is not built")
def test_multithreaded_owner_starts_the_native_keeper_itself(procs):
    """posix_spawn of the native keeper is safe from any thread: no warden."""
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        with Job(mechanism="auto") as job:
            r = job.run(["sh", "-c", "echo hi"], capture_output=True)
            assert r.stdout == b"hi\n"
            assert job.trace()["keeper"] == "native"
            keeper = identity.read(job.trace()["keeper_pid"])
            # started by this very process, from its thread (no warden between)
            assert keeper is not None and keeper.ppid == os.getpid() and \
                keeper.comm == "tether-keeper"
    finally:
        stop.set()
        t.join()


def test_nested_job_closes_with_parent(procs):
    with Job(name="outer") as outer:
        inner = Job(name="inner", parent=outer)
        inner.popen(["sleep", "300"], env=procs.env())
        outer.popen(["sleep", "301"], env=procs.env())
        assert len(procs.wait_count(2)) == 2
    assert inner.closed
    assert not procs.wait_all_dead(3)


def test_audit_records_when_state_dir_given(tmp_path):
    from tether import audit

    with Job(state_dir=tmp_path, session="s1") as job:
        p = job.popen(["true"])
        p.wait(timeout=10)
    recs = list(audit.iter_records(tmp_path))
    events = [r["event"] for r in recs]
    assert "job-open" in events and "spawn" in events and "job-close" in events
    spawn = next(r for r in recs if r["event"] == "spawn")
    assert spawn["pid"] == p.pid and spawn["session"] == "s1" and "@" in spawn["start"]
    assert "argv" not in spawn


def test_audit_argv_only_when_opted_in(tmp_path):
    import pathlib

    from tether import audit

    with Job(state_dir=tmp_path) as job:
        job.popen([pathlib.Path("/bin/echo"), "a b", b"\xff"], record_argv=True,
                  stdout=subprocess.DEVNULL).wait(timeout=10)
        job.popen(["true", "secret"]).wait(timeout=10)
    spawns = [r for r in audit.iter_records(tmp_path) if r["event"] == "spawn"]
    assert spawns[0]["argv"] == ["/bin/echo", "a b", "\udcff"]
    assert "argv" not in spawns[1]


@pytest.mark.parametrize("mech", MECHS)
def test_audited_spawn_identity_is_read_before_reaping(tmp_path, mech):
    # A short command can be reaped by the keeper before the owner looks at
    # /proc: the spawn record must still carry its start-time token. Several
    # `true`s make the race likely; every record must carry the identity.
    from tether import audit

    with Job(mechanism=mech, state_dir=tmp_path) as job:
        ps = [job.popen(["true"]) for _ in range(8)]
        for p in ps:
            p.wait(timeout=10)
    spawns = [r for r in audit.iter_records(tmp_path) if r["event"] == "spawn"]
    assert sorted(r["pid"] for r in spawns) == sorted(p.pid for p in ps)
    for p in ps:
        ident = p.tether_identity
        assert ident is not None and ident.pid == p.pid
    by_pid = {r["pid"]: r for r in spawns}
    for p in ps:
        assert by_pid[p.pid]["start"] == p.tether_identity.token()


def _cgroup_of(pid):
    with open(f"/proc/{pid}/cgroup") as f:
        return next(line[3:].strip() for line in f if line.startswith("0::"))


@pytest.mark.skipif(not available("cgroup"), reason="cgroup not available")
@pytest.mark.skipif(not native.built(), reason="the native keeper is not built")
@pytest.mark.parametrize("legacy", [False, True], ids=["clone3", "old-kernel"])
def test_native_cgroup_keeper_lives_outside_and_children_are_born_inside(procs, monkeypatch,
                                                                         legacy):
    if legacy:  # as on a kernel without clone3 or cgroup.kill: fork, move in, kill each
        monkeypatch.setenv("_TETHER_NATIVE_LEGACY", "1")
    with Job(mechanism="cgroup") as job:
        path = job.trace()["cgroup_path"]
        keeper = job.trace()["keeper_pid"]
        assert job.trace()["keeper"] == "native"
        assert not path.endswith(_cgroup_of(keeper))  # never inside: cgroup.kill spares it
        # A child reads its cgroup as its first act (no time for a move after).
        p = job.popen(["sh", "-c", "trap '' TERM; grep '^0::' /proc/self/cgroup; exec sleep 30"],
                      env=procs.env(),
                      stdout=subprocess.PIPE, text=True)
        first = p.stdout.readline()
        assert first.startswith("0::") and path.endswith(first[3:].strip()), first
        deadline = time.monotonic() + 5  # grep is on its way out
        while job.member_pids() != [p.pid] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert job.member_pids() == [p.pid]
        job.terminate(0.2)  # sleep ignores SIGTERM: cgroup.kill (old kernel: each, frozen)
        assert p.wait(timeout=5) == -signal.SIGKILL
        # The job stays open after its cgroup was killed: the next child is
        # born a member and lives (Linux 6.14+ kills children cloned into a
        # killed cgroup at birth; the keeper notices and moves them in).
        q = job.popen(["sleep", "30"], env=procs.env())
        time.sleep(0.1)
        assert q.poll() is None, q.returncode
        assert path.endswith(_cgroup_of(q.pid))
        assert job.run(["true"]).returncode == 0
    assert q.wait(timeout=5) is not None
    assert not os.path.exists(path)


def _pin_pids(path: str) -> list[int]:
    from tether import cgroupfs

    d = os.path.join(path, cgroupfs.PIN_DIR)
    return cgroupfs.procs_here(d) if os.path.isdir(d) else []


@pytest.mark.skipif(not available("cgroup"), reason="cgroup not available")
@pytest.mark.skipif(not native.built(), reason="the native keeper is not built")
def test_native_cgroup_job_keeps_a_pin_that_is_no_member_and_ends_with_the_job(procs, monkeypatch):
    from procutil import wait_until

    from tether import cgroupfs

    with Job(mechanism="cgroup") as job:
        path, keeper = job.trace()["cgroup_path"], job.trace()["keeper_pid"]
        assert _pin_pids(path) == []  # none before the first spawn
        assert job.run(["true"]).returncode == 0
        pid = wait_until(lambda: _pin_pids(path))[0]

        def named():  # it names itself after its exec (pin_main): till then, tether-keeper
            ident = identity.read(pid)
            return ident if ident is not None and ident.comm == "tether-pin" else None

        pin = wait_until(named, 3.0)
        assert pin.ppid == keeper
        assert cgroupfs.is_pin(pin.pid) and not cgroupfs.is_pin(keeper)
        # It keeps the idle job populated, and is nobody's member.
        assert job.member_pids() == [] and cgroupfs.populated(path)
        assert cgroupfs.procs(path) == []
        p = job.popen(["sleep", "30"], env=procs.env())
        assert job.member_pids() == [p.pid] and cgroupfs.procs(path) == [p.pid]
        # Its cgroup.procs is read-only: a member cannot hide there (but root).
        mode = os.stat(os.path.join(path, cgroupfs.PIN_DIR, "cgroup.procs")).st_mode
        assert mode & 0o777 == 0o444
        assert os.listdir(f"/proc/{pin.pid}/fd") == []  # it holds nothing of the keeper's
        assert job.run(["true"]).returncode == 0
        assert _pin_pids(path) == [pin.pid]  # one pin per job, not one per spawn
    assert p.wait(timeout=5) is not None
    wait_until(lambda: not identity.is_alive(pin), 3.0)  # ended with the job
    assert not os.path.exists(path)


FORKED_EXIT = r"""
import os, sys
from tether import Job
how = sys.argv[1]
with Job() as job:
    p = job.popen(["sleep", "30"])
    pid = os.fork()
    if pid == 0:  # a forked child that leaves: its close() or the with block it inherited
        if how == "close":
            job.close()
            os._exit(0)
        sys.exit(0)  # unwinds through the parent's with block
    os.waitpid(pid, 0)
    print(p.poll() is None, job.run(["true"]).returncode, flush=True)
print(p.poll() is not None)  # the control: the owner's own with block ends it
"""


FORKED_TOGETHER = r"""
import os, sys, threading
from tether import Job
job = Job(mechanism=sys.argv[1])
job.run(["true"])
pid = os.fork()
who = 1 if pid == 0 else 2
wrong = 0
for i in range(80):
    code = (i * 3 + who) % 100
    try:
        r = job.run(["sh", "-c", f"echo {who}-{i}; exit {code}"], capture_output=True, text=True,
                    timeout=20)
        wrong += r.stdout != f"{who}-{i}\n" or r.returncode != code
    except Exception as exc:
        wrong += 1
        print(type(exc).__name__, exc, file=sys.stderr)
if pid == 0:
    os._exit(min(wrong, 100))
_, st = os.waitpid(pid, 0)
print(wrong, os.waitstatus_to_exitcode(st), job.run(["true"]).returncode)
job.close()
"""


FORKED_ENV = r"""
import os, sys
from tether import Job
job = Job(mechanism=sys.argv[1])
os.environ["WHO"] = "parent"
SAY = ["sh", "-c", "echo $WHO"]
first = job.run(SAY, capture_output=True, text=True).stdout.strip()  # the keeper keeps this env
pid = os.fork()
if pid == 0:
    os.environ["WHO"] = "child"
    ok = job.run(SAY, capture_output=True, text=True).stdout.strip() == "child"
    os._exit(0 if ok else 1)
_, st = os.waitpid(pid, 0)
# the same environment as the keeper keeps: sent as "the same as last time"
again = job.run(SAY, capture_output=True, text=True).stdout.strip()
print(first, os.waitstatus_to_exitcode(st), again)
job.close()
"""


@pytest.mark.parametrize("mech", MECHS)
def test_a_forked_childs_environment_never_becomes_its_parents(procs, mech):
    # The keeper keeps the last environment sent, and the owner then sends
    # only "the same": a forked child's spawn with its own replaced it, and
    # the parent's next child ran with the child's environment.
    r = subprocess.run([sys.executable, "-c", FORKED_ENV, mech], capture_output=True, text=True,
                       timeout=60, env=procs.env())
    assert r.stdout.split() == ["parent", "0", "parent"], r.stdout + r.stderr


@pytest.mark.parametrize("mech", MECHS)
def test_a_forked_child_and_its_parent_use_the_job_at_once(procs, mech):
    # They shared the keeper's socket: each read the other's replies and
    # pushed exit statuses (KeyError 'pid' in ~40% of 200 runs each). Now
    # the child asks the keeper for a channel of its own on first use.
    r = subprocess.run([sys.executable, "-c", FORKED_TOGETHER, mech], capture_output=True,
                       text=True, timeout=120, env=procs.env())
    assert r.stdout.split() == ["0", "0", "0"], r.stdout + r.stderr[-2000:]


@pytest.mark.parametrize("how", ["close", "sys.exit"])
def test_a_forked_childs_close_lets_go_and_ends_nothing(procs, how):
    # It ended the owner's whole job: its processes were killed and the job
    # unusable ("the job's keeper is gone"), from a child that only exited.
    r = subprocess.run([sys.executable, "-c", FORKED_EXIT, how], capture_output=True, text=True,
                       timeout=60, env=procs.env())
    assert r.stdout.split() == ["True", "0", "True"], r.stdout + r.stderr


SETSID_CHILD = r"""
import os, subprocess, sys
from tether import Job, JobRefused
job = Job(mechanism=sys.argv[1])
r, w = os.pipe()
pid = os.fork()
if pid == 0:  # a forked child of the owner leaves for a session of its own
    os.setsid()
    out = [subprocess.run(["true"]).returncode]  # the control: subprocess's child joins it
    try:
        out.append(job.run(["true"]).returncode)
    except JobRefused as exc:
        out.append(str(exc))
    out.append(job.run(["true"], start_new_session=True).returncode)
    os.write(w, repr(out).encode())
    os._exit(0)
os.close(w)
print(os.read(r, 4096).decode())
os.waitpid(pid, 0)
job.close()
"""


@pytest.mark.parametrize("mech", MECHS)
def test_an_owner_that_left_the_jobs_session_is_told_why(procs, mech):
    """A child joins its owner's process group; after setsid() the owner's
    group is in another session than the keeper's, which no setpgid can
    reach: a clear refusal, not a bare EPERM. A child that leads its own
    group (pgroup, pidns) or session still starts."""
    r = subprocess.run([sys.executable, "-c", SETSID_CHILD, mech], capture_output=True,
                       text=True, timeout=60, env=procs.env())
    import ast

    out = ast.literal_eval(r.stdout.strip() or "None")
    assert out is not None, r.stderr
    assert out[0] == 0 and out[2] == 0, out
    if mech in ("pgroup", "pidns"):
        assert out[1] == 0, out
    else:
        assert out[1].startswith("spawn refused: this process is now in session "), out
        assert "start_new_session=True" in out[1], out


@pytest.mark.parametrize("mech", [m for m in ("cgroup", "subreaper", "pgroup") if available(m)])
def test_a_keeper_survives_what_a_caller_may_send_its_owners_group(procs, mech):
    """SIGHUP, SIGINT, SIGQUIT, SIGTERM, the stop signals and SIGPIPE leave a
    keeper serving (the native one, cgroup's and subreaper's, blocks them;
    the Python one, pgroup's, ignores them). Control: SIGUSR1, which no
    keeper takes, ends it."""
    from procutil import wait_until

    from tether.keeper._keeper import KEEPER_IGNORES

    if mech != "pgroup" and not native.built():
        pytest.skip("the native keeper is not built")
    job = Job(mechanism=mech)
    try:
        k = identity.read(job.trace()["keeper_pid"])
        assert k is not None
        for sig in KEEPER_IGNORES:
            assert gate.send_signal(k, sig)
        assert job.run(["true"]).returncode == 0  # it serves: not stopped, not gone
        now = identity.read(k.pid)
        assert now is not None and now.start == k.start and now.state not in ("T", "Z")
        assert gate.send_signal(k, signal.SIGUSR1)
        wait_until(lambda: not identity.is_alive(k), 3.0)
    finally:
        job.close()


# A member whose child backgrounds a short sleep and exits: the sleep is
# orphaned. It prints the sleep's pid and its own.
ORPHANING = "sh -c 'sleep 1 & echo $! $$'; exec sleep 300"


def _orphan_of(p: subprocess.Popen) -> tuple[identity.Identity, int]:
    orphan, parent = map(int, p.stdout.readline().split())
    ident = identity.read(orphan)
    assert ident is not None
    return ident, parent


def _parent_once_orphaned(orphan: identity.Identity, parent: int) -> int:
    from procutil import wait_until

    def now() -> identity.Identity:
        cur = identity.read(orphan.pid)
        assert cur is not None and cur.start == orphan.start, "the orphan ended too soon"
        return cur

    return wait_until(lambda: now().ppid != parent and now(), 3.0).ppid


@pytest.mark.parametrize("mech", [m for m in ("cgroup", "subreaper") if available(m)])
def test_a_members_orphan_goes_to_the_keeper_never_to_pid_1(procs, mech):
    """Every keeper is its job's child subreaper (a cgroup job's too: its
    orphans went to PID 1, which may reap late or never): the orphan's
    parent is the keeper, which reaps it when it exits. Control: the same
    tree under plain Popen, whose orphan goes to PID 1."""
    from procutil import wait_until

    if not native.built():
        pytest.skip("the native keeper is not built")
    plain = procs.popen(["sh", "-c", ORPHANING], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    orphan, parent = _orphan_of(plain)
    # the control: PID 1, or this process where it is a subreaper itself
    # (pytest --tether-leaks makes it one)
    import ctypes

    flag = ctypes.c_int(0)
    ctypes.CDLL(None).prctl(37, ctypes.byref(flag), 0, 0, 0)  # PR_GET_CHILD_SUBREAPER
    above = os.getpid() if flag.value else 1
    assert _parent_once_orphaned(procs.track(orphan), parent) == above
    job = Job(mechanism=mech)
    try:
        p = job.popen(["sh", "-c", ORPHANING], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                      env=procs.env())
        orphan, parent = _orphan_of(p)
        assert _parent_once_orphaned(procs.track(orphan), parent) == job.trace()["keeper_pid"]

        def reaped() -> bool:  # not a zombie: gone (or its pid another's)
            cur = identity.read(orphan.pid)
            return cur is None or cur.start != orphan.start

        wait_until(reaped, 5.0)  # the keeper reaps it when it exits
        assert p.poll() is None  # the member itself runs on
    finally:
        job.close()


@pytest.mark.skipif(not available("cgroup"), reason="cgroup not available")
@pytest.mark.skipif(not native.built(), reason="the native keeper is not built")
def test_a_native_cgroup_keeper_holds_the_procs_files_its_clones_are_checked_against(monkeypatch):
    """CLONE_INTO_CGROUP checks that the keeper may write the job's
    cgroup.procs and that of the lowest cgroup above both the job's and its
    own; the keeper holds both files (O_PATH), so the kernel does not make
    and drop their inodes on every spawn."""
    from tether import cgroupfs

    with Job(mechanism="cgroup") as job:
        path, keeper = job.trace()["cgroup_path"], job.trace()["keeper_pid"]
        held = set()
        for fd in os.listdir(f"/proc/{keeper}/fd"):
            try:
                held.add(os.readlink(f"/proc/{keeper}/fd/{fd}"))
            except OSError:
                continue
        ours = cgroupfs.path_of(cgroupfs.own(keeper) or "/")
        common = os.path.commonpath([ours, path])
        assert os.path.join(path, "cgroup.procs") in held
        assert os.path.join(common, "cgroup.procs") in held
        assert job.run(["true"]).returncode == 0


@pytest.mark.skipif(not available("cgroup"), reason="cgroup not available")
@pytest.mark.skipif(not native.built(), reason="the native keeper is not built")
def test_a_pin_dies_with_its_keeper(procs, monkeypatch):
    """The keeper SIGKILLed first: its job's members survive (stated for the
    mechanism), its pin does not (PR_SET_PDEATHSIG)."""
    from procutil import wait_until

    job = Job(mechanism="cgroup")
    try:
        path, keeper = job.trace()["cgroup_path"], job.trace()["keeper_pid"]
        p = job.popen(["sleep", "30"], env=procs.env())
        pin = identity.read(wait_until(lambda: _pin_pids(path))[0])
        k = identity.read(keeper)
        assert gate.send_signal(k, signal.SIGKILL)
        wait_until(lambda: not identity.is_alive(pin), 3.0)
        # Control: the member, which nothing ties to the keeper, is still alive.
        assert identity.is_alive(identity.read(p.pid))
    finally:
        from tether import cgroupfs

        cgroupfs.kill(path, 5.0)
        with pytest.raises(StatusLost):  # its parent, the keeper, is gone
            p.wait(timeout=5)
        try:
            job.close()
        except Exception:
            pass
        cgroupfs.remove_tree(path)


@pytest.mark.skipif(not available("cgroup"), reason="cgroup not available")
def test_nested_cgroup_job_keeper_is_no_member_and_survives_outer_terminate(procs):
    with Job(mechanism="cgroup") as outer, Job(mechanism="cgroup", parent=outer) as inner:
        p = inner.popen(["sleep", "30"], env=procs.env())
        inner_keeper = inner.trace()["keeper_pid"]
        assert outer.member_pids() == [p.pid]  # the inner keeper lives inside, but is not a member
        ended = outer.terminate(0.2)
        assert [i.pid for i in ended] == [p.pid]
        assert identity.read(inner_keeper) is not None  # stepped aside, not ended
        q = inner.popen(["sleep", "30"], env=procs.env())  # the inner job is still open
        assert outer.member_pids() == [q.pid] and inner.member_pids() == [q.pid]
    assert q.wait(timeout=5) is not None


@pytest.mark.skipif(not available("cgroup"), reason="cgroup not available")
def test_owner_death_ends_cgroup_job_from_inside_and_next_job_removes_the_empty_dirs(procs):
    from procutil import run_owner

    from tether.cgroupfs import base_dir

    owner, info = run_owner(procs, "cgroup", "background")
    me = identity.read(owner.pid)
    run_dir = os.path.join(base_dir()[0], f"tether-{owner.pid}-{me.start}")
    assert os.path.isdir(run_dir) and procs.wait_count(1)
    owner.kill()
    owner.wait(timeout=5)
    assert not procs.wait_all_dead(3.0)  # the job ended with its owner
    keeper = identity.Identity(info["keeper"], 0, "")
    deadline = time.monotonic() + 5
    while identity.read(keeper.pid) is not None and time.monotonic() < deadline:
        time.sleep(0.01)  # the keeper ended itself with its cgroup.kill
    assert identity.read(keeper.pid) is None
    # Nobody was left to remove the (now empty) directories: the next job's open
    # does (here, or in another xdist worker: either way it is gone).
    with Job(mechanism="cgroup"):
        assert not os.path.exists(run_dir)


@pytest.mark.skipif(not available("cgroup"), reason="cgroup not available")
def test_stale_run_dirs_removed_only_when_empty_and_owner_gone(procs):
    from tether.cgroupfs import base_dir, remove_stale_run_dirs

    base = base_dir()[0]
    gone = subprocess.Popen(["true"])
    gone_ident = identity.read(gone.pid)
    gone.wait(timeout=5)
    me = identity.read(os.getpid())
    dead = os.path.join(base, f"tether-{gone.pid}-{gone_ident.start}")
    alive = os.path.join(base, f"tether-{os.getpid()}-{me.start}-test")  # not a run-dir name
    mine = os.path.join(base, f"tether-{os.getpid()}-{me.start}")
    busy = os.path.join(base, f"tether-{gone.pid}-{gone_ident.start + 1}")
    made = []
    try:
        for d in (dead, alive, busy, os.path.join(busy, "j1")):
            os.mkdir(d)
            made.append(d)
        if not os.path.isdir(mine):
            os.mkdir(mine)
            made.append(mine)
        p = procs.popen(["sleep", "30"])
        with open(os.path.join(busy, "j1", "cgroup.procs"), "w") as f:
            f.write(str(p.pid))
        remove_stale_run_dirs(base)
        assert not os.path.exists(dead)  # empty, owner gone
        assert os.path.isdir(alive) and os.path.isdir(mine)  # not a run dir / owner alive
        assert os.path.isdir(busy)  # a process is in it: tether reap's work, not ours
        assert p.poll() is None
    finally:
        procs.cleanup()
        for d in reversed(made):
            for _ in range(100):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)  # the killed sleep is still leaving the cgroup


CLOSED_STDIN_OWNER = r"""
import os, subprocess, sys
os.close(0)
from tether import Job
probe = "[ -e /proc/$$/fd/0 ] && readlink /proc/$$/fd/0 || echo closed"
with Job() as j:
    taken = os.readlink("/proc/self/fd/0")  # something of the job's took the number
    a = j.popen(["sh", "-c", probe], stdout=subprocess.PIPE, text=True).communicate()[0]
    b = subprocess.Popen(["sh", "-c", probe], stdout=subprocess.PIPE, text=True).communicate()[0]
with open(sys.argv[1], "w") as f:
    f.write(f"{taken}|{a.strip()}|{b.strip()}")
"""


def test_an_owners_closed_stdin_is_closed_in_the_child(procs, tmp_path):
    """An owner whose stdin is closed: the job's first fd (its keeper's
    socket) takes number 0, close-on-exec. A child started with stdin left
    as it is finds it closed, as subprocess's child does, never that socket
    (it could talk to the keeper). Before: the owner handed fd 0 over as the
    child's stdin (both keepers), or the native keeper gave its own
    /dev/null. Control: subprocess.Popen in the same owner."""
    out = tmp_path / "out"
    p = procs.popen([sys.executable, "-c", CLOSED_STDIN_OWNER, str(out)], env=procs.env())
    assert p.wait(timeout=60) == 0
    taken, child, plain = out.read_text().split("|")
    assert taken != "" and plain == "closed"
    assert child == plain, taken
