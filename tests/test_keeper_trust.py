"""What a job's keeper trusts, and how long a job lives.

- A request's privileges come from its sender, as the kernel names it
  (SCM_CREDENTIALS, per message), never from the request: a worker the
  owner forked, which dropped to another user, gets no spawn as the owner's
  user over the socket it inherited, however it words the request.
- A job lives as long as its owner process, across an ``execve`` of it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from procutil import POSIX_MECHS, available, poll_until, read_line, wait_until

from tether import gate, identity

pytestmark = pytest.mark.mechanism

MECHS = [m for m in POSIX_MECHS if available(m)]
NOBODY = 65534

# A root owner opens a job and forks a worker, which drops to NOBODY and
# asks the keeper, over the socket it inherited, to run `id -u >> $OUT`:
# raw requests (ids forged as root's, none, its own) and then through the
# Job API (its own channel). Then the owner runs the same command itself.
# One JSON line: the replies.
TRUST_OWNER = r"""
import json, os, resource, sys, tether  # (resource: before the worker may not read it)
from tether.keeper import _proto

mech, out, uid = sys.argv[1], sys.argv[2], int(sys.argv[3])
job = tether.Job(mechanism=mech)
sock = job._backend._sock
cmd = [b"/bin/sh", b"-c", b'id -u >> "$OUT"']
env = {"PATH": "/usr/bin:/bin", "OUT": out, "TETHER_TEST_MARK": os.environ["TETHER_TEST_MARK"]}
envb = {os.fsencode(k): os.fsencode(v) for k, v in env.items()}

def raw(ids):
    msg = {"op": "spawn", "argv": cmd, "executable": cmd[0], "cwd": "/",
           "path": ["/usr/bin", "/bin"], "fdmap": {}, "pgroup": -1, "setsid": True,
           "owner_pgid": 0, "umask": -1, "env": envb}
    if ids is not None:
        msg["ids"] = ids
    _proto.send(sock, msg)
    while True:
        reply, fds = _proto.recv(sock)
        for fd in fds:
            os.close(fd)
        if reply is None or "exit" not in reply:
            return reply

r, w = os.pipe()
pid = os.fork()
if pid == 0:
    res = {}
    try:
        os.close(r)
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        for name, ids in (("forged", [0, 0, 0, 0]), ("none", None), ("own", [uid] * 4)):
            res[name] = raw(ids)
        try:
            job.popen(["/bin/sh", "-c", 'id -u >> "$OUT"'], env=env).wait(30)
            res["api"] = "started"
        except tether.JobRefused as exc:
            res["api"] = str(exc)
    except BaseException as exc:
        res["error"] = repr(exc)
    os.write(w, json.dumps(res, default=repr).encode())
    os._exit(0)
os.close(w)
data = b""
while True:
    chunk = os.read(r, 65536)
    if not chunk:
        break
    data += chunk
os.waitpid(pid, 0)
res = json.loads(data)
res["owner"] = job.popen(["/bin/sh", "-c", 'id -u >> "$OUT"'], env=env).wait(30)
job.close()
print(json.dumps(res), flush=True)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the worker drops to another user")
@pytest.mark.parametrize("mech", MECHS)
def test_privilege_dropped_worker_gets_no_spawn_as_the_owner(mech, procs, tmp_path):
    out = tmp_path / "ids"
    owner = procs.popen([sys.executable, "-c", TRUST_OWNER, mech, str(out), str(NOBODY)],
                        stdout=subprocess.PIPE, text=True)
    res = json.loads(read_line(owner, what="the owner"))
    assert owner.wait(timeout=30) == 0
    assert "error" not in res, res
    for name in ("forged", "none"):  # what only the kernel's word on the sender refuses
        reply = res[name]
        assert reply["ok"] is False and reply["kind"] == "refused", (name, reply)
        assert f"uid {NOBODY} gid {NOBODY}" in reply["strerror"], (name, reply)
        assert "more privilege than its sender" in reply["strerror"], (name, reply)
    # Its own ids stated: refused as an owner that changed user is.
    own = f"runs as uid/euid/gid/egid {NOBODY}/{NOBODY}/{NOBODY}/{NOBODY}"
    assert res["own"]["ok"] is False and res["own"]["kind"] == "refused", res["own"]
    assert own in res["own"]["strerror"], res["own"]
    assert own in res["api"] and "refused" in res["api"], res["api"]
    # The owner's own request ran, as the owner; nothing else ran (any root
    # spawn of the worker's would have added a line).
    assert res["owner"] == 0
    assert out.read_text().split() == ["0"]


# The owner opens a job, starts a member and a plain child (the control:
# in no job), reports both, and execs `sleep`: the same process lives on.
EXEC_OWNER = r"""
import json, os, subprocess, sys, tether
job = tether.Job(mechanism=sys.argv[1])
member = job.popen(["sleep", "300"])
plain = subprocess.Popen(["sleep", "301"])
print(json.dumps({"member": member.pid, "plain": plain.pid}), flush=True)
os.execv("/bin/sleep", ["sleep", "300"])
"""


@pytest.mark.parametrize("mech", MECHS)
def test_job_lives_across_the_owners_exec_and_ends_with_it(mech, procs):
    owner = procs.popen([sys.executable, "-c", EXEC_OWNER, mech], stdout=subprocess.PIPE,
                        text=True)
    pids = json.loads(read_line(owner, what="the owner"))
    member, plain = identity.read(pids["member"]), identity.read(pids["plain"])
    assert member is not None and plain is not None
    # The exec happened (the owner is sleep now), and the job is still there:
    # before, the keeper took the closed socket for the owner's death (~1 s).
    assert wait_until(lambda: identity.read(owner.pid) and identity.read(owner.pid).comm == "sleep",
                      10)
    assert not poll_until(lambda: not identity.is_alive(member), 2.0), \
        "the job ended at its owner's exec"
    owner.send_signal(signal.SIGKILL)
    owner.wait(timeout=10)
    assert wait_until(lambda: not identity.is_alive(member), 3.0), "the job outlived its owner"
    # Control: the same check sees the owner's plain child alive (not in the job).
    assert identity.is_alive(plain)


# Dropped without close(): the keeper still ends what is left (the owner's
# socket closing no longer says so by itself: an exec closes it too).
DROP_OWNER = r"""
import gc, json, os, sys, time, tether
job = tether.Job(mechanism=sys.argv[1])
p = job.popen(["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"], stdout=-1, text=True)
inner = int(p.stdout.read())
p.wait()
p.stdout.close()
print(json.dumps({"left": [i.pid for i in job.members()]}), flush=True)
sys.stdin.readline()
del job, p
gc.collect()
time.sleep(300)
"""


@pytest.mark.parametrize("mech", MECHS)
def test_dropped_job_still_ends_its_members(mech, procs):
    owner = procs.popen([sys.executable, "-c", DROP_OWNER, mech], stdout=subprocess.PIPE,
                        stdin=subprocess.PIPE, text=True)
    left = [identity.read(p) for p in json.loads(read_line(owner, what="the owner"))["left"]]
    assert left and all(i is not None for i in left)
    # Control: the same check sees them alive until the job is dropped.
    assert not poll_until(lambda: not any(identity.is_alive(i) for i in left), 0.5)
    owner.stdin.write("drop\n")
    owner.stdin.flush()
    assert wait_until(lambda: not any(identity.is_alive(i) for i in left), 3.0)
    assert owner.poll() is None  # the owner lives on: the job ended because it was dropped


@pytest.mark.parametrize("mech", MECHS)
def test_a_status_lost_with_the_keeper_is_an_error_not_a_kill(mech, procs):
    """The child exits 3 after its keeper was SIGKILLed: nobody can know
    that 3 here, so wait() raises StatusLost - never -9 - and poll() says
    None (a poll that raised would abort loops, tether's own among them)."""
    from tether import Job, StatusLost

    job = Job(mechanism=mech)
    r, w = os.pipe()
    try:
        # Control: with the keeper alive the same wait() returns the real 3.
        assert job.popen(["sh", "-c", "exit 3"], env=procs.env()).wait(timeout=20) == 3
        p = job.popen(["sh", "-c", "read x; exit 3"], stdin=r, env=procs.env())
        os.close(r)
        r = -1
        keeper = identity.read(job.trace()["keeper_pid"])
        assert gate.send_signal(keeper, signal.SIGKILL, member=True)
        wait_until(lambda: not identity.is_alive(keeper), 5.0)
        os.close(w)  # now it exits 3 (under pidns it died with its namespace)
        w = -1
        if mech == "pidns":
            # The namespace's teardown SIGKILLed it: a status this process may
            # really get (the kernel reparents the namespace's last children
            # to the nearest subreaper). That one is real; a 3 or a lost status
            # read as -9 is not.
            try:
                rc = p.wait(timeout=10)
            except StatusLost:
                rc = None
            if rc is not None:
                assert rc == -signal.SIGKILL and not p.tether_status_lost, rc
                return
        with pytest.raises(StatusLost, match=f"exit status of pid {p.pid} was lost") as err:
            p.wait(timeout=10)
        assert err.value.pid == p.pid and err.value.mechanism == mech
        assert p.poll() is None and p.returncode is None and p.tether_status_lost
        with pytest.raises(StatusLost):
            p.wait(timeout=10)  # and again: no made-up status later either
    finally:
        for fd in (r, w):
            if fd != -1:
                os.close(fd)
        job.close()


FREEZER = "/sys/fs/cgroup/freezer"  # cgroup v1's freezer: its frozen tasks outlive SIGKILL


@pytest.fixture
def freezer():
    """A v1 freezer cgroup of the test's own; thawed and removed at the end
    (what it held dies then of the SIGKILL it has pending)."""
    if os.geteuid() != 0 or not os.access(FREEZER, os.W_OK):
        pytest.skip("needs a writable cgroup v1 freezer hierarchy")
    import uuid

    path = os.path.join(FREEZER, f"tether-test-{uuid.uuid4().hex[:12]}")
    os.mkdir(path)
    try:
        yield path
    finally:
        with open(os.path.join(path, "freezer.state"), "w") as f:
            f.write("THAWED")

        def empty() -> bool:
            with open(os.path.join(path, "cgroup.procs")) as f:
                return not f.read().strip()

        poll_until(empty, 5.0)
        os.rmdir(path)


@pytest.mark.parametrize("mech", MECHS)
def test_close_names_a_member_it_could_not_end(mech, procs, freezer):
    from tether import Job

    job = Job(mechanism=mech)
    try:
        stuck = job.popen(["sleep", "300"], env=procs.env())
        other = job.popen(["sleep", "301"], env=procs.env())
        stuck_id = identity.read(stuck.pid)
        with open(os.path.join(freezer, "cgroup.procs"), "w") as f:
            f.write(str(stuck.pid))
        with open(os.path.join(freezer, "freezer.state"), "w") as f:
            f.write("FROZEN")
        wait_until(lambda: open(os.path.join(freezer, "freezer.state")).read().strip() == "FROZEN")
        with pytest.warns(RuntimeWarning, match=rf"could not be ended.*: pid {stuck.pid} \(sleep"):
            result = job.close()
        assert [i.pid for i in result.left] == [stuck.pid]
        assert identity.is_alive(stuck_id)  # it is there, as the result says
        # Control: the member that could be ended was, and is not named.
        assert [i.pid for i in result] == [other.pid]
    finally:
        job.close()


@pytest.mark.parametrize("mech", MECHS)
def test_a_pty_session_closes_after_its_keeper_died(mech, procs):
    """A lost status must not break what polls on its way: PtySession.close()
    reads its root's returncode with poll() (it raised StatusLost out of
    close() while poll() raised)."""
    from tether import PtySession

    s = PtySession(["sh", "-c", "sleep 0.3; exit 3"], mechanism=mech, env=procs.env())
    keeper = identity.read(s.job.trace()["keeper_pid"])
    assert gate.send_signal(keeper, signal.SIGKILL, member=True)
    wait_until(lambda: not identity.is_alive(keeper), 5.0)
    time.sleep(0.5)  # the root has exited meanwhile: its status died with the keeper
    res = s.close()
    assert res.returncode is None and s.state == "closed"
