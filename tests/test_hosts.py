"""Hosts in any language (docs/hosts.md): `tether run --die-with-parent` and
`--lifeline FD`, through the page's own Node snippets run by the real `node`,
for the native `tether` and the Python CLI; each kill test has its control
(the same tree spawned by Node without tether survives the same SIGKILL)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys

import pytest
from procutil import ROOT, SHELL_KINDS, SRC, native_cli, ptrace_hold, ptrace_kill, read_line

pytestmark = [pytest.mark.mechanism,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux: pidfds, real node")]

NODE = shutil.which("node")
PAGE = os.path.join(ROOT, "docs", "hosts.md")
BARE = os.path.join(ROOT, "tests", "node", "bare.js")
# The agent's tree: a plain child, a setsid escapee; it reads the prompt first
# and keeps running after stdin's EOF (an ACP agent's stdin is its channel).
TREE = ["sh", "-c", 'read line; echo "got $line"; sleep 300 & (setsid sleep 301 &); '
                    'sleep 0.2; echo ready; cat >/dev/null; wait']


def page_files(dest: str) -> None:
    """Write docs/hosts.md's ``<!-- file: NAME -->`` blocks into dest."""
    text = open(PAGE, encoding="utf-8").read()
    for name, body in re.findall(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", text, re.S):
        with open(os.path.join(dest, name), "w") as f:
            f.write(body)


@pytest.fixture(params=SHELL_KINDS)
def bindir(request, tmp_path) -> str:
    """A directory whose `tether` is the native program or the Python CLI."""
    d = tmp_path / "bin"
    d.mkdir()
    if request.param == "native":
        path = native_cli()
        if path is None:
            pytest.skip("no native tether here")
        os.symlink(path, d / "tether")
    else:
        (d / "tether").write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {SRC!r})\n"
                                  "from tether.cli import main\nsys.exit(main())\n")
        (d / "tether").chmod(0o755)
    return str(d)


@pytest.fixture
def snippets(tmp_path) -> str:
    if NODE is None:
        pytest.skip("no node here (CI installs Debian's nodejs)")
    if not os.path.exists(PAGE):  # scripts/unprivileged-tests.sh copies code and tests only
        pytest.skip("no docs/hosts.md in this copy of the tree")
    d = tmp_path / "js"
    d.mkdir()
    page_files(str(d))
    return str(d)


def _start(procs, bindir: str, script: str, env_extra=None) -> subprocess.Popen:
    env = procs.env(PATH=bindir + os.pathsep + os.environ["PATH"], **(env_extra or {}))
    return procs.popen([NODE, script, *TREE], stdout=subprocess.PIPE, env=env)


def _sigkill_node_tree_ends(procs, node: subprocess.Popen) -> None:
    assert read_line(node) == "got hello\n"
    assert read_line(node) == "ready\n"  # stdin's EOF came before: it ended nothing
    assert len(procs.wait_count(5)) >= 5  # node, sh, sleep, sleep (+ tether's)
    node.kill()
    node.wait(timeout=10)
    left = procs.wait_all_dead(3, exclude=frozenset({node.pid}))
    assert not left, left


def test_die_with_parent_node_app_sigkilled(procs, bindir, snippets):
    node = _start(procs, bindir, os.path.join(snippets, "app.js"))
    _sigkill_node_tree_ends(procs, node)


def test_lifeline_through_an_intermediary(procs, bindir, snippets):
    node = _start(procs, bindir, os.path.join(snippets, "via-shell.js"))
    _sigkill_node_tree_ends(procs, node)


def test_control_without_tether_the_tree_survives(procs, snippets):
    """The control: Node's own spawn, the app SIGKILLed - the tree lives on."""
    with procs.adopting_orphans():
        node = procs.popen([NODE, BARE, *TREE], stdout=subprocess.PIPE)
        assert read_line(node) == "got hello\n"
        assert read_line(node) == "ready\n"
        node.kill()
        node.wait(timeout=10)
        left = procs.wait_all_dead(1, exclude=frozenset({node.pid}))
        assert {i.comm for i in left} >= {"sh", "sleep"}, left


def test_control_plain_tether_run_survives_its_parent(procs, bindir):
    """Without --die-with-parent, a SIGKILLed parent leaves `tether run` and its tree running."""
    with procs.adopting_orphans():
        parent = procs.popen(["sh", "-c", 'tether run -- sh -c "sleep 300 & wait" & wait'],
                             env=procs.env(PATH=bindir + os.pathsep + os.environ["PATH"]))
        assert len(procs.wait_count(4)) >= 4
        parent.kill()
        parent.wait(timeout=10)
        left = procs.wait_all_dead(1, exclude=frozenset({parent.pid}))
        assert "sleep" in {i.comm for i in left}, left


def test_die_with_parent_shell_parent_sigkilled(procs, bindir):
    """Any parent, however it dies: here a shell, SIGKILLed."""
    parent = procs.popen(["sh", "-c", 'tether run --die-with-parent -- sh -c "sleep 300 & '
                          '(setsid sleep 301 &); wait" & wait'],
                         env=procs.env(PATH=bindir + os.pathsep + os.environ["PATH"]))
    assert len(procs.wait_count(5)) >= 5
    parent.kill()
    parent.wait(timeout=10)
    left = procs.wait_all_dead(3, exclude=frozenset({parent.pid}))
    assert not left, left


def test_stdin_eof_and_exit_status_pass_through(procs, bindir):
    env = procs.env(PATH=bindir + os.pathsep + os.environ["PATH"])
    r = subprocess.run(["tether", "run", "--die-with-parent", "--", "sh", "-c",
                        "cat; sleep 0.3; echo after-eof; exit 7"],
                       input=b"prompt\n", capture_output=True, env=env, timeout=30)
    assert (r.returncode, r.stdout, r.stderr) == (7, b"prompt\nafter-eof\n", b"")


def test_lifeline_data_means_nothing_eof_ends(procs, bindir):
    """What the app writes into its lifeline is read away; only EOF ends the job."""
    env = procs.env(PATH=bindir + os.pathsep + os.environ["PATH"])
    mine, theirs = socket.socketpair()
    p = procs.popen(["tether", "run", "--lifeline", str(theirs.fileno()), "--",
                     "sh", "-c", "sleep 300 & (setsid sleep 301 &); wait"],
                    env=env, pass_fds=(theirs.fileno(),))
    theirs.close()
    assert len(procs.wait_count(4)) >= 4
    mine.sendall(b"x" * 100_000)
    import time

    time.sleep(0.5)
    assert p.poll() is None and len(procs.alive()) >= 4, "data ended the job"
    mine.close()
    assert p.wait(timeout=10) == 128 + signal.SIGKILL
    assert not procs.wait_all_dead(3)


def test_lifeline_pipe_eof_ends(procs, bindir):
    env = procs.env(PATH=bindir + os.pathsep + os.environ["PATH"])
    r, w = os.pipe()
    p = procs.popen(["tether", "run", "--lifeline", str(r), "--", "sh", "-c", "sleep 300 & wait"],
                    env=env, pass_fds=(r,))
    os.close(r)
    assert len(procs.wait_count(3)) >= 3
    assert p.poll() is None
    os.close(w)
    assert p.wait(timeout=10) == 128 + signal.SIGKILL
    assert not procs.wait_all_dead(3)


def test_parent_already_gone_refuses(procs, bindir, tmp_path):
    """Its parent exited before it started: refused, 125, nothing run. It is
    re-parented to this test (a subreaper here), which takes its status."""
    from procutil import wait_until

    out, pidf = tmp_path / "out", tmp_path / "pid"
    inner = (f"sleep 0.3; echo $$ >{pidf}; exec tether run --die-with-parent -- "
             f"touch {tmp_path}/ran 2>{out}")
    with procs.adopting_orphans():
        subprocess.run(["sh", "-c", 'sh -c "$1" & exit 0', "sh", inner],
                       env=procs.env(PATH=bindir + os.pathsep + os.environ["PATH"]),
                       timeout=30, start_new_session=True)
        pid = int(wait_until(lambda: pidf.exists() and pidf.read_text().strip(), 10))
        status = wait_until(lambda: os.waitpid(pid, os.WNOHANG)[1] or None, 10)
    assert os.waitstatus_to_exitcode(status) == 125
    assert out.read_text() == ("tether: --die-with-parent: the process that started tether run is "
                               "already gone; nothing was run\n")
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("setup,words", [
    ("2", "expected a file descriptor number of 3 or more"),
    ("x", "expected a file descriptor number of 3 or more"),
    ("closed", "not an open file descriptor"),
    ("file", "not a pipe or socket"),
])
def test_lifeline_bad_input(procs, bindir, tmp_path, setup, words):
    env = procs.env(PATH=bindir + os.pathsep + os.environ["PATH"])
    kw = {}
    if setup == "closed":
        arg = "97"
    elif setup == "file":
        f = open(tmp_path / "f", "w")
        arg = str(f.fileno())
        kw["pass_fds"] = (f.fileno(),)
    else:
        arg = setup
    r = subprocess.run(["tether", "run", "--lifeline", arg, "--", "touch", str(tmp_path / "ran")],
                       capture_output=True, env=env, timeout=30, **kw)
    assert r.returncode == 125
    err = r.stderr.decode()
    if setup != "x" or "python" not in bindir:  # argparse's own words for a non-number
        assert err.count("\n") == 1 and words in err, err
    assert not (tmp_path / "ran").exists()


# -- the host layer's session rules from the command line ----------------------------

def _session(bindir: str, state: str, key: str = "chat-1", *extra: str) -> list[str]:
    return ["tether", "run", "--state-dir", state, "--app", "myapp", "--session", key, *extra]


def _senv(procs, bindir):
    return procs.env(PATH=bindir + os.pathsep + os.environ["PATH"])


def _log_state(state) -> tuple:
    """The audit log's bytes and the session lock files: what a refusal must not change."""
    files = {}
    for root, _dirs, names in os.walk(state):
        for n in names:
            p = os.path.join(root, n)
            with open(p, "rb") as f:
                files[os.path.relpath(p, state)] = f.read()
    return tuple(sorted(files.items()))


@pytest.fixture
def state(tmp_path) -> str:
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    return str(d)


def test_session_running_copy_refuses_the_next(procs, bindir, state, tmp_path):
    first = procs.popen(_session(bindir, state, "chat-1", "--", "sh", "-c", "echo up; sleep 300"),
                        env=_senv(procs, bindir), stdout=subprocess.PIPE)
    assert read_line(first) == "up\n"
    locks = [f for f in _log_state(state) if f[0].startswith("sessions")]
    r = procs.popen(_session(bindir, state, "chat-1", "--", "touch", str(tmp_path / "ran")),
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_senv(procs, bindir))
    _out, err = r.communicate(timeout=60)
    assert r.returncode == 125
    err = err.decode()
    assert err.count("\n") == 1 and f"pid {first.pid}, started " in err and "nothing was run" in err, err
    assert not (tmp_path / "ran").exists()
    # nothing written: no record of the refused run (the first copy may still
    # be writing its own), the lock files byte for byte as they were
    log = open(os.path.join(state, "audit.jsonl"), "rb").read()
    assert f'"pid":{r.pid},'.encode() not in log
    assert [f for f in _log_state(state) if f[0].startswith("sessions")] == locks
    # another key of the same app, or the same key of another app, runs
    r = subprocess.run(_session(bindir, state, "chat-2", "--", "true"), env=_senv(procs, bindir),
                       timeout=60)
    assert r.returncode == 0
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=20) == 128 + signal.SIGTERM


def test_session_take_over_ends_the_running_copy(procs, bindir, state, tmp_path):
    rep1, rep2 = tmp_path / "r1.json", tmp_path / "r2.json"
    first = procs.popen(_session(bindir, state, "chat-1", "--label", "build", "--report", str(rep1),
                                 "--", "sh", "-c", "sleep 300 & (setsid sleep 301 &); echo up; wait"),
                        env=_senv(procs, bindir), stdout=subprocess.PIPE)
    assert read_line(first) == "up\n"
    r = subprocess.run(_session(bindir, state, "chat-1", "--take-over", "--report", str(rep2), "--",
                                "sh", "-c", "echo second"),
                       capture_output=True, env=_senv(procs, bindir), timeout=60)
    assert (r.returncode, r.stdout) == (0, b"second\n"), r.stderr
    lines = r.stderr.decode().splitlines()
    assert len(lines) == 3, lines  # sh, sleep, sleep: one line each
    assert all(re.fullmatch(rf"tether: took over chat-1 from pid {first.pid}: ended pid \d+ "
                            r"\((sh|sleep)\), ran \d+s", ln) for ln in lines), lines
    assert first.wait(timeout=20) > 128
    assert not procs.wait_all_dead(3, exclude=frozenset({first.pid}))
    import json

    one, two = json.loads(rep1.read_text()), json.loads(rep2.read_text())
    assert (one["reason"], one["label"]) == ("take over", "build"), one
    assert isinstance(one["taken_over_by"], int) and one["taken_over_by"] != first.pid
    assert two["resumed"]["reason"] == "take over" and two["resumed"]["holder"] == first.pid
    assert sorted(p["name"] for p in two["resumed"]["ended"]) == ["sh", "sleep", "sleep"]
    assert (two["reason"], two["exit"], two["ended"]) == ("session closed", 0, [])


def test_session_report_on_a_stop_says_what_it_ended(procs, bindir, state, tmp_path):
    rep = tmp_path / "r.json"
    p = procs.popen(_session(bindir, state, "chat-1", "--label", "agent", "--report", str(rep), "--",
                             "sh", "-c", "sleep 300 & echo up; wait"),
                    env=_senv(procs, bindir), stdout=subprocess.PIPE)
    assert read_line(p) == "up\n"
    from procutil import wait_until

    wait_until(lambda: "sleep" in {i.comm for i in procs.alive()}, 10)  # forked, and exec'd
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 128 + signal.SIGTERM
    import json

    out = json.loads(rep.read_text())
    assert out["reason"] == "user request" and out["exit"] == 128 + signal.SIGTERM
    names = sorted((e["name"], e["agent"]) for e in out["ended"])
    assert names == [("sh", True), ("sleep", False)], out
    assert all(e["runtime_s"] >= 0 and e["pid"] > 1 for e in out["ended"])
    assert out["text"].startswith("Stopped (user request): ended `agent` after ")


def test_session_resume_ends_a_dead_copys_leftovers(procs, bindir, state, tmp_path):
    """Owner and keepers SIGKILLed: the tree is left behind (the control: seen
    alive); the next run of the key ends exactly it, saying so, then runs."""
    from tether import gate, identity

    first = procs.popen(_session(bindir, state, "chat-1", "--label", "build", "--",
                                 "sh", "-c", "sleep 300 & echo up; wait"),
                        env=_senv(procs, bindir), stdout=subprocess.PIPE)
    assert read_line(first) == "up\n"
    tree = [i for i in procs.wait_count(4) if i.comm in ("sh", "sleep")]
    assert len(tree) == 2
    keepers = [identity.read(c) for c in identity.children(first.pid)]
    keepers = [k for k in keepers if k is not None and k.comm == "tether-keeper"]
    assert keepers
    # the spawn's record is written once the command runs: wait for it (it is the proof)
    from procutil import wait_until

    log = os.path.join(state, "audit.jsonl")
    sh = [i for i in tree if i.comm == "sh"][0]
    wait_until(lambda: f'"event":"spawn","pid":{sh.pid},'.encode() in open(log, "rb").read(), 10)
    # stopped first, all of them: none may end the job when another dies. The
    # owner by ptrace, not SIGSTOP (see procutil.ptrace_hold: the keeper's
    # death would orphan its stopped process group, and the kernel would
    # resume it and hang up the tree); the keepers, each in a group of its
    # own with the held owner as its parent, by SIGSTOP.
    held = ptrace_hold(first.pid)
    for k in keepers:
        gate.send_signal(k, signal.SIGSTOP, member=True)
    for k in keepers:
        gate.send_signal(k, signal.SIGKILL, member=True)
    ptrace_kill(first, held)
    assert all(identity.is_alive(i) for i in tree)  # control: left behind
    r = subprocess.run(_session(bindir, state, "chat-1", "--", "sh", "-c", "echo second"),
                       capture_output=True, env=_senv(procs, bindir), timeout=60)
    assert (r.returncode, r.stdout) == (0, b"second\n"), r.stderr
    lines = r.stderr.decode().splitlines()
    assert sorted(re.sub(r"ran \d+s$", "ran Ts", re.sub(r"pid \d+", "pid N", ln)) for ln in lines) == [
        "tether: resumed chat-1: ended pid N (sh), ran Ts",
        "tether: resumed chat-1: ended pid N (sleep), ran Ts"], lines
    assert {int(re.search(r"ended pid (\d+)", ln).group(1)) for ln in lines} == {i.pid for i in tree}
    assert not any(identity.is_alive(i) for i in tree)


def test_session_concurrent_take_overs_one_runs(procs, bindir, state, tmp_path):
    first = procs.popen(_session(bindir, state, "chat-1", "--", "sh", "-c", "echo up; sleep 300"),
                        env=_senv(procs, bindir), stdout=subprocess.PIPE)
    assert read_line(first) == "up\n"
    takers = [procs.popen(_session(bindir, state, "chat-1", "--take-over", "--",
                                   "sh", "-c", f"echo ran-{n}; sleep 1"),
                          env=_senv(procs, bindir), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
              for n in (1, 2)]
    outs = [t.communicate(timeout=60) for t in takers]
    codes = sorted(t.returncode for t in takers)
    assert codes == [0, 125], (codes, outs)
    ran = [o for o, t in zip(outs, takers, strict=True) if t.returncode == 0][0][0]
    assert ran in (b"ran-1\n", b"ran-2\n")
    refused = [o for o, t in zip(outs, takers, strict=True) if t.returncode == 125][0]
    assert refused[0] == b"" and b"nothing was run" in refused[1], refused
    first.wait(timeout=20)
    assert not procs.wait_all_dead(3)  # nothing of any copy left running


@pytest.mark.parametrize("args,words", [
    (["--session", "k", "--app", "a"], "--session needs --state-dir DIR and --app APP"),
    (["--session", "k", "--state-dir", "STATE"], "--session needs --state-dir DIR and --app APP"),
    (["--session", "k", "--app", "a", "--state-dir", "STATE/nope"], "no such directory"),
    (["--session", "a\nb", "--app", "a", "--state-dir", "STATE"], "--session must be one non-empty line"),
    (["--session", "k" * 257, "--app", "a", "--state-dir", "STATE"], "at most 256 bytes"),
    (["--session", "k", "--app", "a", "--state-dir", "STATE", "--report", "STATE/nodir/r.json"],
     "cannot write there"),
    (["--session", "k", "--app", "a", "--state-dir", "STATE", "--report-fd", "97"],
     "not an open file descriptor"),
    (["--take-over"], "--take-over needs --session KEY"),
    (["--app", "a"], "--app needs --session KEY"),
])
def test_session_bad_input(procs, bindir, state, tmp_path, args, words):
    args = [a.replace("STATE", state) for a in args]
    before = _log_state(state)
    r = subprocess.run(["tether", "run", *args, "--", "touch", str(tmp_path / "ran")],
                       capture_output=True, env=_senv(procs, bindir), timeout=60)
    assert r.returncode == 125
    err = r.stderr.decode()
    assert err.count("\n") == 1 and words in err, err
    assert not (tmp_path / "ran").exists()
    assert _log_state(state) == before == ()


def test_ps_json_lists_live_sessions_and_their_work(procs, bindir, state):
    import json

    p = procs.popen(_session(bindir, state, "chat-1", "--label", "agent", "--",
                             "sh", "-c", "sleep 300 & (setsid sh -c 'sleep 301 & wait' &); "
                                         "echo up; wait"),
                    env=_senv(procs, bindir), stdout=subprocess.PIPE)
    assert read_line(p) == "up\n"

    def ps(*extra: str) -> dict:
        r = subprocess.run([sys.executable, "-m", "tether", "ps", "--json", "--state-dir", state,
                            *extra], capture_output=True, env=procs.env(), timeout=60)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    from procutil import wait_until

    doc = wait_until(lambda: (d := ps("--app", "myapp", "--session", "chat-1"))["sessions"]
                     and d["sessions"][0]["work"] and d, 10)
    (s,) = doc["sessions"]
    assert (s["session"], s["owner"]["pid"]) == ("chat-1", p.pid)
    assert [a["comm"] for a in s["agent"]] == ["sh"]
    (w,) = s["work"]  # the setsid'd group; `sleep 300 &` is in the agent's own group
    assert w["label"] == "sh -c sleep 301 & wait" and w["members"] == 2 and w["outlived"]
    assert ps("--app", "myapp", "--session", "other")["sessions"] == []
    assert ps("--app", "otherapp")["sessions"] == []
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=20)
    assert ps("--app", "myapp")["sessions"] == []  # over: not listed


def test_node_sessions_snippet(procs, bindir, snippets, state):
    """docs/hosts.md's sessions.js: a stop's report; a second copy of the key
    refused; the app SIGKILLed ends its session's tree, and the next start of
    the key runs."""
    script = os.path.join(snippets, "sessions.js")
    env = _senv(procs, bindir)
    tree = ["sh", "-c", "sleep 300 & echo up; wait"]
    app = procs.popen([NODE, script, state, "chat-1", *tree], stdin=subprocess.PIPE,
                      stdout=subprocess.PIPE, env=env)
    assert read_line(app) == "up\n"
    other = subprocess.run([NODE, script, state, "chat-1", "true"], capture_output=True, env=env,
                           timeout=60)
    assert re.fullmatch(rb"not started: tether: session 'chat-1' of 'my-app' is held by a live run "
                        rb"\(pid \d+, started [-\d]+ [:\d]+\); --take-over ends that copy; nothing "
                        rb"was run\n", other.stdout), other.stdout
    app.stdin.write(b"stop\n")
    app.stdin.flush()
    assert re.fullmatch(r"user request: Stopped \(user request\): ended `sh` after \d+s and 1 other "
                        r"process\n", read_line(app))
    assert app.wait(timeout=20) == 0
    # the app SIGKILLed: its session's tree ends with it (--die-with-parent)
    app = procs.popen([NODE, script, state, "chat-1", *tree], stdin=subprocess.PIPE,
                      stdout=subprocess.PIPE, env=env)
    assert read_line(app) == "up\n"
    app.kill()
    app.wait(timeout=10)
    assert not procs.wait_all_dead(3, exclude=frozenset({app.pid}))
    r = subprocess.run([NODE, script, state, "chat-1", "sh", "-c", "echo again"], capture_output=True,
                       env=env, timeout=60)
    assert r.stdout == b"again\nsession closed: nothing left to end\n", r


def test_session_run_costs_at_most_one_record_more_than_a_plain_run(procs, bindir, tmp_path):
    """Issue 33, cost: `--session` adds at most one audit record to what
    `tether run --state-dir` writes (no host job, no run-start/run-end of its
    own), and the records it writes still name the app, the key and the label."""
    import json

    counts = {}
    for kind, extra in (("plain", []), ("session", ["--app", "myapp", "--session", "chat-1",
                                                    "--label", "agent"])):
        d = tmp_path / kind
        d.mkdir(mode=0o700)
        r = subprocess.run(["tether", "run", "--state-dir", str(d), *extra, "--", "true"],
                           env=_senv(procs, bindir), capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr
        recs = [json.loads(ln) for ln in (d / "audit.jsonl").read_text().splitlines()]
        counts[kind] = len(recs)
        if kind == "session":
            assert all(rec.get("app") == "myapp" for rec in recs), recs
            assert [rec["event"] for rec in recs if rec.get("session") == "chat-1"] == \
                ["job-open", "spawn", "job-close"], recs
            assert [rec.get("label") for rec in recs if rec["event"] == "spawn"] == ["agent"], recs
    assert counts["plain"] >= 3 and counts["session"] <= counts["plain"] + 1, counts


def test_session_report_when_the_command_cannot_start(procs, bindir, state, tmp_path):
    import json

    rep = tmp_path / "r.json"
    r = subprocess.run(_session(bindir, state, "chat-1", "--report", str(rep), "--",
                                "no-such-command-tether"),
                       capture_output=True, env=_senv(procs, bindir), timeout=60)
    assert r.returncode == 127 and r.stderr == b"tether: no-such-command-tether: command not found\n"
    out = json.loads(rep.read_text())
    assert (out["exit"], out["reason"], out["ended"]) == (127, "session closed", [])
    # the key was released: the next run of it is not refused
    assert subprocess.run(_session(bindir, state, "chat-1", "--", "true"), env=_senv(procs, bindir),
                          timeout=60).returncode == 0
