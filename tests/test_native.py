"""The native keeper (tether-keeper, C) itself: its protocol under bad
input, what it inherits, its settings. Its behaviour as a job's keeper is
tested by every mechanism test (again with a sanitizer build in CI:
scripts/native-tests.sh); the same protocol checks also run against the
Python keeper, pgroup's."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
import types

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tether import identity
from tether.keeper import _proto, native

pytestmark = [
    pytest.mark.mechanism,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only"),
    pytest.mark.skipif(not native.built(), reason="the native keeper is not built"),
    pytest.mark.timeout(120),
]


class Keeper:
    """A native subreaper keeper started by hand, with its socket; or, with
    ``python=True``, the Python keeper (a pgroup ``Job``'s), for the same
    checks."""

    def __init__(self, python: bool = False) -> None:
        self.job = None
        if python:
            from tether import Job

            self.job = Job(mechanism="pgroup")
            self.sock = self.job._backend._sock  # the test speaks the protocol itself
            self.pid = self.job.trace()["keeper_pid"]
            return
        self.sock, child = _proto.socketpair()
        # the test knob reaches a keeper through its job's params, as a Job's does
        mech = types.SimpleNamespace(name="subreaper",
                                     params={"no_owner_state": os.environ.get(native.NO_OWNER_STATE) == "1"},
                                     options=types.SimpleNamespace(background=False))
        fd = identity.open_pidfd(os.getpid())
        try:
            self.pid = native.start(mech, child.fileno(), os.getpid(), fd)
        finally:
            child.close()
            if fd is not None:
                os.close(fd)
        self.sock.settimeout(10)
        ready = self.recv()
        assert ready.get("ready") is True, ready
        assert ready["keeper"] == self.pid
        self.trace = ready.get("trace", {})

    def recv(self) -> dict:
        msg, fds = _proto.recv(self.sock)
        for fd in fds:
            os.close(fd)
        assert msg is not None, "the keeper closed its socket"
        return msg

    def raw(self, body: bytes, fds: tuple[int, ...] = ()) -> dict:
        data = _proto.frame(body)  # a whole frame: the body is what is under test
        if fds:
            import array

            self.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                        array.array("i", fds).tobytes())])
        else:
            self.sock.sendall(data)
        while True:
            reply = self.recv()
            if "exit" not in reply:
                return reply

    def ask(self, msg: dict, fds: tuple[int, ...] = ()) -> dict:
        return self.raw(_proto.encode(msg), fds)

    def alive(self) -> bool:
        reply = self.ask({"op": "ping"})
        return reply == {"ok": True, "keeper": self.pid}

    def fd_count(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def close(self) -> None:
        if self.job is not None:
            self.job.close()
            return
        try:  # (EOF alone is no end while the owner lives: it may have exec'd)
            _proto.send(self.sock, {"op": "close", "timeout": 5.0})
        except OSError:
            pass
        self.sock.close()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            done, _ = os.waitpid(self.pid, os.WNOHANG)
            if done:
                return
            time.sleep(0.01)
        os.kill(self.pid, 9)  # our own child, not yet reaped: the pid is its
        os.waitpid(self.pid, 0)


@pytest.fixture(params=["native", "python"])
def keeper(request):
    k = Keeper(python=request.param == "python")
    yield k
    k.close()


SPAWN = {"op": "spawn", "argv": [b"true"], "executable": b"/bin/true", "env": {b"A": b"1"},
         "cwd": "/", "path": ["/usr/bin", "/bin"], "fdmap": {}, "pgroup": -1, "setsid": False,
         "owner_pgid": os.getpgrp(), "umask": 0o22, "ignored": [], "sigmask": [],
         "rlimits": [], "ident": True, "timeout": 1.5}
GOOD = _proto.encode(SPAWN)
enc = _proto.encode

BAD = {
    "empty": b"",
    "not CBOR (a stray break)": b"\xff\x00garbage",
    "a bare int": enc(5),
    "a list, not a map": enc([1, 2]),
    "no op": enc({"pid": 3}),
    "unknown op": enc({"op": "format-disk"}),
    "op of the wrong type": enc({"op": 7}),
    "op a huge integer": b"\xa1" + enc("op") + b"\x1b" + b"\xff" * 8,
    "op as bytes": enc({"op": b"ping"}),
    "map without its last value": GOOD[:-1],
    "indefinite map without its break": b"\xbf" + enc("op") + enc("ping"),
    "a string longer than the message": b"\xa1\x7a" + (1 << 30).to_bytes(4, "big") + b"ab",
    "a list of 2**31-1 items": b"\x9a" + (2**31 - 1).to_bytes(4, "big") + b"\xf6",
    "a map of 2**64-1 pairs": b"\xbb" + b"\xff" * 8 + b"\xf6",
    "nesting too deep": b"\x81" * 200 + b"\xf6",
    "a tag": b"\xc1\x00",
    "reserved additional information": b"\xa1" + enc("op") + b"\x1c",
    "an indefinite-length string": b"\xa1\x7f\x62op\xff" + enc("ping"),
    "undefined": b"\xa1" + enc("op") + b"\xf7",
    "bytes after the map": enc({"op": "ping"}) + b"\xf6",
    "argv is not a list": enc({**SPAWN, "argv": b"true"}),
    "argv with a NUL": enc({**SPAWN, "argv": [b"tr\0ue"]}),
    "env with a NUL": enc({**SPAWN, "env": {b"A": b"x\0y"}}),
    "env name with =": enc({**SPAWN, "env": {b"A=B": b"1"}}),
    # (it ran the child in the keeper's own directory instead)
    "cwd with a NUL": enc({**SPAWN, "cwd": "/tmp/\0x"}),
    "no executable": enc({k: v for k, v in SPAWN.items() if k != "executable"}),
    "fd index out of range": enc({**SPAWN, "fdmap": {0: 5}}),
    "memfd without its fd": enc({"_memfd": 100}),
    "a channel that is no socket": enc({"op": "channel"}),  # (the fd: a pipe)
}


@pytest.mark.parametrize("name", list(BAD))
def test_a_malformed_request_is_an_error_reply_and_the_keeper_goes_on(keeper, name):
    before = keeper.fd_count()
    r, w = os.pipe()
    try:
        reply = keeper.raw(BAD[name], (r,))  # an fd rides along: it must be closed, not kept
    finally:
        os.close(r)
        os.close(w)
    assert reply["ok"] is False and reply.get("strerror"), reply
    assert keeper.alive()
    assert keeper.fd_count() == before


def test_every_truncation_of_a_good_request_is_an_error(keeper):
    # Control: the whole message spawns.
    full = keeper.raw(GOOD)
    assert full["ok"] is True and full["pid"] > 0 and full["ident"][0] == full["pid"]
    for n in range(len(GOOD) - 1):
        reply = keeper.raw(GOOD[:n])
        assert reply["ok"] is False, (n, reply)
    assert keeper.alive()


def test_a_memfd_shorter_than_it_says_is_an_error(keeper):
    payload = enc({"op": "ping"})
    fd = os.memfd_create("short", os.MFD_CLOEXEC)
    try:
        os.write(fd, payload)
        os.lseek(fd, 0, os.SEEK_SET)
        reply = keeper.raw(enc({"_memfd": len(payload) + 50}), (fd,))
    finally:
        os.close(fd)
    assert reply["ok"] is False and "truncated" in reply["strerror"]
    # Control: the right size is served.
    fd = os.memfd_create("right", os.MFD_CLOEXEC)
    try:
        os.write(fd, payload)
        os.lseek(fd, 0, os.SEEK_SET)
        assert keeper.raw(enc({"_memfd": len(payload)}), (fd,)) == {
            "ok": True, "keeper": keeper.pid}
    finally:
        os.close(fd)


def test_a_frame_larger_than_the_limit_is_refused_whole(keeper):
    big = enc({"op": "ping", "pad": b"x" * (_proto.MAX_MSG + 10)})
    reply = keeper.raw(big)
    assert reply["ok"] is False and "larger" in reply["strerror"]
    assert keeper.alive()


def test_env_same_reuses_the_environment_last_sent(keeper, tmp_path):
    out = tmp_path / "a"
    show = {**SPAWN, "argv": [b"sh", b"-c", b'printf %s "$A" > ' + os.fsencode(out)],
            "executable": b"/bin/sh"}
    del show["env"]

    def child_saw(**env) -> str:
        reply = keeper.ask({**show, **env})
        assert reply["ok"] is True, reply
        keeper.ask({"op": "wait", "pid": reply["pid"]})
        return out.read_text()

    # Before any environment was sent there is none to reuse: an error, no child.
    reply = keeper.ask({**show, "env_same": True})
    assert reply["ok"] is False and "no environment" in reply["strerror"], reply
    assert child_saw(env={b"A": b"one"}) == "one"
    assert child_saw(env_same=True) == "one"
    # Control: a request that carries an environment replaces the one kept.
    assert child_saw(env={b"A": b"two"}) == "two"
    assert child_saw(env_same=True) == "two"
    # Both at once is malformed.
    reply = keeper.ask({**show, "env": {b"A": b"3"}, "env_same": True})
    assert reply["ok"] is False
    assert keeper.alive()


def test_owner_state_is_read_by_the_keeper_or_refused_so_the_owner_sends_it(keeper, tmp_path):
    out = tmp_path / "umask"
    msg = {**SPAWN, "argv": [b"sh", b"-c", b"umask > " + os.fsencode(out)],
           "executable": b"/bin/sh", "umask": -1, "owner_state": True}
    del msg["ignored"], msg["rlimits"]
    old = os.umask(0o037)  # ours, read from our /proc by the keeper
    try:
        reply = keeper.ask(msg)
        assert reply["ok"] is True, reply
        keeper.ask({"op": "wait", "pid": reply["pid"]})
        assert out.read_text().strip() == "0037"
        # Control: an explicit umask wins over the owner's.
        reply = keeper.ask({**msg, "umask": 0o022})
        keeper.ask({"op": "wait", "pid": reply["pid"]})
        assert out.read_text().strip() == "0022"
    finally:
        os.umask(old)
    # owner_state and the state itself in one request is malformed.
    reply = keeper.ask({**msg, "ignored": []})
    assert reply["ok"] is False and reply["kind"] == "ValueError", reply
    assert keeper.alive()


def test_a_keeper_that_cannot_read_the_owners_state_says_so(monkeypatch):
    monkeypatch.setenv(native.NO_OWNER_STATE, "1")
    for python in (False, True):
        k = Keeper(python=python)
        try:
            reply = k.ask({**{n: v for n, v in SPAWN.items() if n not in ("ignored", "rlimits")},
                           "umask": -1, "owner_state": True})
            assert reply["ok"] is False and reply["kind"] == "owner_state", (python, reply)
            assert k.alive()
        finally:
            k.close()


@settings(max_examples=300, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(
    st.binary(max_size=300),
    st.tuples(st.integers(0, len(GOOD) - 1), st.integers(0, 255)).map(
        lambda t: GOOD[:t[0]] + bytes([t[1]]) + GOOD[t[0] + 1:])))
def test_random_bytes_never_crash_the_keeper(keeper, data):
    reply = keeper.raw(data)
    assert isinstance(reply, dict) and reply.get("ok") in (True, False)
    if reply.get("ok") and "pid" in reply:  # a mutation that still spawns: reap it
        keeper.ask({"op": "wait", "pid": reply["pid"]})
    assert keeper.alive()


def test_the_keeper_holds_nothing_of_the_owner_but_its_socket_and_pidfd(procs):
    r, w = os.pipe()
    os.set_inheritable(w, True)  # an fd any child of this process would get
    k = Keeper()
    try:
        fds = {int(n): os.readlink(f"/proc/{k.pid}/fd/{n}") for n in os.listdir(
            f"/proc/{k.pid}/fd")}
        assert all(fds[n] == "/dev/null" for n in (0, 1, 2)), fds
        mine = os.readlink(f"/proc/self/fd/{w}")
        assert mine not in fds.values(), fds  # the pipe the owner holds did not leak
        kinds = sorted(v.split(":")[0] for n, v in fds.items() if n > 2)
        # its socket, the owner's pidfd, and its own signalfd; with the
        # owner's beacon (_beacon) also its own pipe (both ends) and the
        # owner's /proc directory - and the beacon's page mapped, its memfd closed
        if k.trace.get("owner_watch") == "pidfd+beacon":
            assert kinds == ["/proc/" + str(os.getpid()), "anon_inode", "anon_inode",
                             "pipe", "pipe", "socket"], fds
            with open(f"/proc/{k.pid}/maps") as f:
                assert "/memfd:tether-beacon" in f.read()
        else:
            assert kinds == ["anon_inode", "anon_inode", "socket"], fds
        # Control: a plain child of this process does get the pipe.
        p = subprocess.Popen(["sleep", "5"], close_fds=False)
        try:
            seen = set()
            for n in os.listdir(f"/proc/{p.pid}/fd"):
                try:
                    seen.add(os.readlink(f"/proc/{p.pid}/fd/{n}"))
                except FileNotFoundError:
                    pass  # closed meanwhile: the dynamic loader's own, at sleep's start-up
            assert mine in seen
        finally:
            p.kill()
            p.wait()
    finally:
        k.close()
        os.close(r)
        os.close(w)


def test_a_closed_socket_alone_ends_nothing_while_the_owner_lives(procs):
    """The owner's end closed, the owner alive and not exiting: it exec'd
    (its sockets are close-on-exec), and the job lives as long as the
    process (tests/test_keeper_trust.py: the exec itself, and the owner's
    death then)."""
    keeper = Keeper()
    env = {k.encode(): v.encode() for k, v in procs.env().items()}  # marked: cleaned up
    reply = keeper.ask({**SPAWN, "argv": [b"sleep", b"300"], "executable": b"sleep", "env": env})
    assert reply["ok"] is True
    child = identity.Identity(*reply["ident"])
    assert identity.is_alive(child)
    keeper.sock.close()  # EOF
    try:
        time.sleep(1.0)
        assert identity.is_alive(child) and os.waitpid(keeper.pid, os.WNOHANG)[0] == 0
    finally:
        os.kill(keeper.pid, 9)  # our own child, not yet reaped: the pid is its
        os.waitpid(keeper.pid, 0)


def test_usage_errors_exit_2_with_a_line():
    for args in ([], ["serve"], ["serve", "cgroup", "x", "1", "2"],
                 ["serve", "nonsense", "3", "1", "-1"], ["serve", "subreaper", "3", "0", "-1"],
                 ["serve", "subreaper", "3", "1", "-1", "what=1"]):
        r = subprocess.run([native.HELPER, *args], capture_output=True, text=True, timeout=5)
        assert r.returncode == 2 and r.stderr.startswith("usage: tether-keeper"), (args, r)
    r = subprocess.run([native.HELPER, "--version"], capture_output=True, text=True, timeout=5)
    assert r.returncode == 0 and r.stdout.startswith("tether-keeper ")


def test_one_usage_errors_exit_2_with_a_line_and_run_nothing(tmp_path):
    """``tether-keeper one`` (the one-command driver the Python tether-shell
    execs) refuses a malformed invocation with its usage line, exit 2, and
    runs nothing; the control, well formed, runs the command and reports."""
    marker = tmp_path / "ran"
    cmd = ["--", "/bin/sh", "sh", "-c", f"touch {marker}"]
    rep_r, rep_w = os.pipe()
    ctl_r, ctl_w = os.pipe()
    me = os.pidfd_open(os.getpid())
    fds = [str(rep_w), str(ctl_r), str(me)]
    who = [str(os.getpid()), str(identity.start_ticks(os.getpid())), str(os.getpgrp())]
    good = ["one", *fds, *who, "subreaper", "500"]
    bad = [
        ["one"], good[:-1] + cmd, ["one", "x", *fds[1:], *who, "auto", "1"] + cmd,
        ["one", *fds[:2], "999", *who, "auto", "1"] + cmd,  # not an open fd
        ["one", *fds, "0", *who[1:], "auto", "1"] + cmd, ["one", *fds, *who, "pidns", "1"] + cmd,
        ["one", *fds, *who, "auto", "nan"] + cmd, ["one", *fds, *who, "auto", "0.5"] + cmd,
        ["one", *fds, *who, "auto", "1000000000"] + cmd, ["one", *fds, *who, "auto", "-1"] + cmd,
        ["one", *fds, *who, "cgroup", "1"] + cmd,  # cgroup without base=: the front end's
        good + ["what=1"] + cmd, good + ["caller=1:2"] + cmd, good + ["ign=zz"] + cmd,
        good + ["--", "sh", "sh"], good + ["--", "/bin/sh"], good,
        good + ["scope=caller"] + cmd, good + ["scope=agent"] + cmd,  # scope=caller: no caller=
    ]
    try:
        for args in bad:
            r = subprocess.run([native.HELPER, *args], capture_output=True, text=True, timeout=5,
                               pass_fds=(rep_w, ctl_r, me))
            assert r.returncode == 2 and r.stderr.startswith("usage: tether-keeper "), (args, r)
            assert "tether-keeper one REP_FD CTL_FD" in r.stderr, (args, r)
            assert not marker.exists(), args
        r = subprocess.run([native.HELPER, *good, *cmd], capture_output=True, text=True,
                           timeout=10, pass_fds=(rep_w, ctl_r, me))
        assert r.returncode == 0, r
        os.close(rep_w)
        rep_w = -1
        with os.fdopen(rep_r, "rb") as f:
            rep_r = -1
            lines = f.read().decode().splitlines()
        assert [ln.split()[0] for ln in lines] == ["P", "X"], lines
        assert lines[0].split()[2] == "subreaper" and lines[1] == "X 0 0", lines
        assert marker.exists()
    finally:
        for fd in (rep_r, rep_w, ctl_r, ctl_w, me):
            if fd >= 0:
                os.close(fd)


MISSING = r"""
import json, sys
from tether import Job, JobRefused
out = {}
for mech in sys.argv[1:]:
    try:
        with Job(mechanism=mech) as job:
            out[mech] = [job.trace().get("keeper"), job.run(["true"]).returncode]
    except JobRefused as exc:
        out[mech] = str(exc)
print(json.dumps(out))
"""


@pytest.mark.parametrize("missing", [True, False], ids=["missing", "control-built"])
def test_without_the_native_program_a_job_is_refused_with_the_fix(procs, missing):
    """No second implementation to fall back to: where the program is missing
    (a source tree never built), a job of every mechanism it keeps - auto
    too - is refused in one line that names the fix; pgroup, which the
    Python keeper keeps, still opens. Control: the same with the program."""
    from procutil import available

    mechs = ["auto", *(m for m in ("cgroup", "subreaper", "pidns", "pgroup") if available(m))]
    env = procs.env(_TETHER_NATIVE_HELPER="/nonexistent/tether-keeper" if missing else native.HELPER)
    r = subprocess.run([sys.executable, "-c", MISSING, *mechs], capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    for mech in mechs:
        if mech == "pgroup":
            assert got[mech] == ["python", 0]
        elif missing:
            assert "native keeper is not built (/nonexistent/tether-keeper is missing)" in got[mech]
            assert native.FIX in got[mech]
        else:
            assert got[mech] == ["native", 0]


def test_a_keeper_whose_owner_is_already_gone_ends_at_once():
    sock, child = _proto.socketpair()
    p = subprocess.Popen(["true"])
    p.wait()
    mech = types.SimpleNamespace(name="subreaper", params={},
                                 options=types.SimpleNamespace(background=False))
    try:
        pid = native.start(mech, child.fileno(), p.pid, None)  # a dead owner, no pidfd
    finally:
        child.close()
    try:
        r, _, _ = select.select([sock], [], [], 5)
        assert r
        assert sock.recv(100) == b""  # no "ready": it left
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        sock.close()
