"""The keeper protocol of docs/protocol.md: framing on a stream socket, the
hello, shared constants (one source: tether/_constants.py), and a host in
another language (Node, tests/node/keeper_client.js) that follows the
document alone."""

from __future__ import annotations

import json
import os
import runpy
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from procutil import poll_until

from tether import _constants, cgroupfs, ending, identity
from tether.keeper import _proto, native

pytestmark = [
    pytest.mark.mechanism,  # (run again with the sanitizer build of the keeper in CI)
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only"),
    pytest.mark.timeout(120),
]
needs_keeper = pytest.mark.skipif(not native.built(), reason="the native keeper is not built")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLIENT = os.path.join(ROOT, "tests", "node", "keeper_client.js")
NODE = shutil.which("node")


def start_keeper(*extra: str, pass_fds: tuple[int, ...] = ()) -> tuple[subprocess.Popen, socket.socket]:
    """A subreaper keeper on a stream socketpair, started as docs/protocol.md
    says (no pidfd: -1), and its socket, its hello read."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = theirs.fileno()
    p = subprocess.Popen([native.HELPER, "serve", "subreaper", str(fd), str(os.getpid()), "-1",
                          *extra], pass_fds=(fd, *pass_fds), stdin=subprocess.DEVNULL)
    theirs.close()
    mine.settimeout(10)
    return p, mine


def end_keeper(p: subprocess.Popen, sock: socket.socket) -> None:
    sock.close()  # EOF: the keeper ends its job and leaves
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()  # our own child, not yet reaped
        p.wait()


def test_the_header_is_what_constants_generates():
    # setup.py writes it before each build; committed for direct builds
    # (scripts/_sanitized.sh). Control: c_header really lists the values.
    text = runpy.run_path(os.path.join(ROOT, "src", "tether", "_constants.py"))["c_header"]()
    with open(os.path.join(ROOT, "src", "tether", "_native", "tether_constants.h")) as f:
        assert f.read() == text
    assert '#define TETHER_COOKIE_VAR "TETHER_JOB"' in text
    assert f"#define TETHER_MAX_GRACE {_constants.MAX_GRACE!r}" in text


def test_python_modules_use_the_one_definition():
    assert ending.MAX_GRACE is _constants.MAX_GRACE
    assert ending.DEFAULT_GRACE is _constants.DEFAULT_GRACE
    assert ending.KILL_BOUND is _constants.KILL_BOUND
    assert identity.COOKIE_VAR is _constants.COOKIE_VAR
    assert cgroupfs.PIN_DIR is _constants.PIN_DIR
    assert _proto.MAX_MSG == _constants.MAX_MSG


@needs_keeper
def test_the_hello_says_the_protocol_version_and_the_same_constants():
    p, sock = start_keeper()
    try:
        hello, fds = _proto.recv(sock)
        assert not fds
        assert hello["ready"] is True and hello["keeper"] == p.pid
        assert hello["protocol"] == _constants.PROTOCOL_VERSION
        # every shared constant, as the C side was built with it
        assert hello["constants"] == _constants.SHARED, hello["constants"]
    finally:
        end_keeper(p, sock)


@needs_keeper
def test_version_names_the_protocol():
    out = subprocess.run([native.HELPER, "--version"], capture_output=True, text=True, timeout=10)
    assert f"protocol {_constants.PROTOCOL_VERSION}" in out.stdout and "CBOR" in out.stdout


EXITS: dict[int, int] = {}  # exit reports that came before a reply


def _ask(sock: socket.socket, msg: dict) -> dict:
    _proto.send(sock, msg)
    while True:
        reply, fds = _proto.recv(sock)
        for fd in fds:  # a spawn's reply carries the child's pidfd
            os.close(fd)
        assert reply is not None
        if "exit" not in reply:
            return reply
        EXITS[reply["exit"]] = reply["status"]


@needs_keeper
def test_frames_split_byte_by_byte_or_sent_together_are_each_served():
    p, sock = start_keeper()
    try:
        _proto.recv(sock)
        ping = _proto.frame(_proto.encode({"op": "ping"}))
        for b in ping:  # one byte per write, with pauses: the keeper waits for the rest
            sock.send(bytes([b]))
            time.sleep(0.002)
        assert _proto.recv(sock)[0] == {"ok": True, "keeper": p.pid}
        sock.sendall(ping * 3)  # three in one write: three replies
        assert [_proto.recv(sock)[0]["ok"] for _ in range(3)] == [True] * 3
    finally:
        end_keeper(p, sock)


@needs_keeper
def test_an_oversized_frame_is_dropped_whole_and_the_stream_goes_on():
    p, sock = start_keeper()
    try:
        _proto.recv(sock)
        size = _constants.MAX_MSG + 1
        sock.sendall(size.to_bytes(4, "big") + b"\xa0" * size + _proto.frame(_proto.encode({"op": "ping"})))
        reply, _ = _proto.recv(sock)
        assert reply["ok"] is False and "larger" in reply["strerror"], reply
        assert _proto.recv(sock)[0] == {"ok": True, "keeper": p.pid}  # the next frame, whole
    finally:
        end_keeper(p, sock)


@needs_keeper
def test_half_a_frame_on_one_channel_holds_only_that_channel():
    p, sock = start_keeper()
    try:
        _proto.recv(sock)
        mine, theirs = _proto.socketpair()
        _proto.send(sock, {"op": "channel"}, [theirs.fileno()])
        theirs.close()
        mine.settimeout(10)
        assert _proto.recv(mine)[0] == {"ok": True}
        mine.sendall((100).to_bytes(4, "big") + b"\xbf")  # a frame of 100 bytes, 1 sent
        # Control of the claim: the owner's channel is served meanwhile.
        assert _ask(sock, {"op": "ping"}) == {"ok": True, "keeper": p.pid}
        mine.sendall(b"\xff" + b"\x00" * 98)  # the rest: a map and junk after it
        reply = _proto.recv(mine)[0]
        assert reply["ok"] is False and reply["kind"] == "ValueError", reply
        assert _ask(mine, {"op": "ping"}) == {"ok": True, "keeper": p.pid}
        mine.close()
    finally:
        end_keeper(p, sock)


@needs_keeper
def test_spawn_from_kept_fds_and_opened_paths(tmp_path):
    """A peer that cannot pass fds: "inherit" names fds the keeper got at
    start (keep=), "open" paths it opens; the fdmap indexes them after the
    passed ones."""
    r, w = os.pipe()
    out = tmp_path / "out"
    p, sock = start_keeper(f"keep={w}", pass_fds=(w,))
    os.close(w)
    try:
        _proto.recv(sock)
        reply = _ask(sock, {"op": "spawn", "argv": ["/bin/sh", "-c", "echo to-pipe; echo to-file >&3"],
                            "executable": "/bin/sh", "env": {"PATH": "/bin"}, "cwd": "/",
                            "path": ["/bin"], "pgroup": 0, "umask": 0o22, "ignored": [],
                            "sigmask": [], "rlimits": [], "inherit": [w],
                            "open": [[str(out), "w"]], "fdmap": {1: 0, 3: 1}})
        assert reply["ok"] is True, reply
        status = _ask(sock, {"op": "wait", "pid": reply["pid"]})["status"]
        assert (status if status is not None else EXITS.pop(reply["pid"])) == 0
        with os.fdopen(r, "rb") as f:
            os.set_blocking(r, False)
            assert f.read() == b"to-pipe\n"
        assert out.read_text() == "to-file\n"
        # Control: an fd the keeper was not given is refused, and no file opened.
        bad = _ask(sock, {"op": "spawn", "argv": ["/bin/true"], "executable": "/bin/true",
                          "inherit": [0], "fdmap": {}})
        assert bad["ok"] is False and "keep=" in bad["strerror"], bad
        missing = _ask(sock, {"op": "spawn", "argv": ["/bin/true"], "executable": "/bin/true",
                              "open": [[str(tmp_path / "no" / "such"), "r"]], "fdmap": {}})
        assert missing["ok"] is False and missing["errno"] == 2 and missing["filename"].endswith("such")
    finally:
        end_keeper(p, sock)


def test_codec_round_trip_and_shapes():
    msg = {"op": "spawn", "argv": [b"\xff\x00raw", "t\u00e9xt"], "fdmap": {0: 1, 5: 2}, "n": -1,
           "big": 2**40, "neg": -(2**40), "f": 1.5, "t": True, "no": None, "nested": {"l": [[]]}}
    assert _proto.decode(_proto.encode(msg)) == msg
    # a str that is no UTF-8 (surrogateescape) goes as its bytes
    assert _proto.decode(_proto.encode({"p": os.fsdecode(b"/tmp/\xff")})) == {"p": b"/tmp/\xff"}
    # what other encoders write: half and single floats, indefinite maps and arrays
    assert _proto.decode(b"\xbf\x61a\xf9\x3e\x00\x61b\xfa\x3f\xc0\x00\x00\x61c\x9f\x01\xff\xff") == {
        "a": 1.5, "b": 1.5, "c": [1]}
    for bad in (b"", b"\xa1", b"\xc1\x00", b"\x7f\xff", b"\xa0\x00", b"\x81" * 40 + b"\xf6", b"\xf7"):
        with pytest.raises(ValueError):
            _proto.decode(bad)


# -- a host in another language ----------------------------------------------

needs_node = pytest.mark.skipif(NODE is None, reason="node is not installed")


@needs_keeper
@needs_node
def test_a_node_host_drives_the_keeper_by_the_document(procs):
    out = subprocess.run([NODE, CLIENT, native.HELPER, "basic"], capture_output=True, text=True,
                         timeout=60, env=procs.env())
    assert out.returncode == 0, out.stderr
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    got = {next(iter(line)): line for line in lines}  # by each line's first key
    got = {k: (v if len(v) > 1 else v[k]) for k, v in got.items()}
    assert got["hello"]["protocol"] == _constants.PROTOCOL_VERSION
    assert got["hello"]["constants"]["MAX_MSG"] == _constants.MAX_MSG
    pid = got["spawned"]["pid"]
    assert got["spawned"]["ok"] is True and got["spawned"]["ident"][0] == pid
    assert got["stdout"] == f"hello from {pid}"  # the child's stdout, on the kept pipe
    st = got["signalled"]["status"]  # a wait status, from the pushed exit report
    assert got["signalled"]["signalled"] == pid and os.WIFSIGNALED(st) \
        and os.WTERMSIG(st) == signal.SIGTERM
    st = got["waited"]["status"]  # from the wait request (or a report before it)
    assert os.WIFEXITED(st) and os.WEXITSTATUS(st) == 3
    assert got["bad"]["ok"] is False and got["bad"]["kind"] == "ValueError"
    assert got["nofile"] == {"ok": False, "kind": "os", "errno": 2, "strerror": None,
                             "filename": "/nonexistent/x"}
    assert got["closed"]["ok"] is True
    assert got["keeper_exit"] == [0, None]


@needs_keeper
@needs_node
def test_a_sigkilled_node_owner_takes_its_child_along_and_without_a_keeper_it_stays(procs):
    for mode, expect_dead in (("owner", True), ("control", False)):
        node = procs.popen([NODE, CLIENT, native.HELPER if mode == "owner" else "-", mode],
                           stdout=subprocess.PIPE, text=True)
        line = node.stdout.readline()
        assert line, f"{mode}: node said nothing"
        child = identity.read(json.loads(line)["child"])
        assert child is not None and child.start >= procs.born and identity.is_alive(child)
        node.send_signal(signal.SIGKILL)
        node.wait(timeout=10)
        if expect_dead:
            assert poll_until(lambda c=child: not identity.is_alive(c), 3.0), \
                f"the child of a SIGKILLed Node owner outlived it: {child}"
        else:
            # Control: the same child, no keeper: it outlives Node (cleanup ends it).
            time.sleep(1.0)
            assert identity.is_alive(child), "control: the child died without a keeper"


# -- random streams from any peer ----------------------------------------------

@pytest.fixture(scope="module", params=["native", "python"])
def fuzz_keeper(request):
    if request.param == "native" and not native.built():
        pytest.skip("the native keeper is not built")
    from test_native import Keeper

    k = Keeper(python=request.param == "python")
    yield k
    k.close()


def _channel(k) -> socket.socket:
    mine, theirs = _proto.socketpair()
    _proto.send(k.sock, {"op": "channel"}, [theirs.fileno()])
    theirs.close()
    mine.settimeout(10)
    reply, _ = _proto.recv(mine)
    assert reply == {"ok": True}, reply
    return mine


def _frames(draw_bytes: bytes, lengths: list[int]) -> bytes:
    """Random bodies behind plausible lengths: some frames whole, the last
    one perhaps cut short, lengths up to past MAX_MSG."""
    out = b""
    pos = 0
    for n in lengths:
        body = draw_bytes[pos:pos + n]
        pos += n
        out += n.to_bytes(4, "big") + body
    return out


@settings(max_examples=60, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(
    st.binary(max_size=400),  # anything at all, its first 4 bytes a length
    st.builds(_frames, st.binary(min_size=0, max_size=600),
              st.lists(st.sampled_from([0, 1, 2, 7, 30, 200, _constants.MAX_MSG + 1, 2**32 - 1]),
                       max_size=4))))
def test_a_random_stream_on_a_channel_never_takes_the_keeper_down(fuzz_keeper, data):
    """A forked child's channel that sends garbage, or frames with random
    bodies, or half a frame, and closes: the keeper answers what it can
    (errors), drops the channel, and serves its owner on."""
    chan = _channel(fuzz_keeper)
    try:
        chan.sendall(data)
        chan.shutdown(socket.SHUT_WR)  # the peer is done: an end of file mid-frame, maybe
        chan.settimeout(10)
        while True:  # replies until the keeper drops the channel (never a hang: bounded)
            try:
                reply, fds = _proto.recv(chan)
            except _proto.Malformed:
                pytest.fail("the keeper sent a malformed frame")
            for fd in fds:
                os.close(fd)
            if reply is None:
                break
            assert reply.get("ok") in (True, False) or "exit" in reply, reply
    finally:
        chan.close()
    assert fuzz_keeper.alive()
