"""The pytest leak detector (tether.pytest_plugin), run for real with pytester.

Each scenario runs an inner pytest session in a subprocess
(``runpytest_subprocess``). The inner tests leak real processes - ``sleep &``
from sh, a double-forked ``setsid`` daemon, a server from a function
fixture, a process from a module fixture that never ends it - and write the
identity (pid + start ticks + boot id) of every leaked process to a log.
The outer test then checks, by identity, that each one is dead.

Controls: the same inner session with the plugin off leaves every one of
those processes alive (the same check sees them), which proves the check can
see a survivor. Every recorded identity is ended in a fixture finalizer by
identity, whatever the test saw, so a failing test leaves nothing behind.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tether import gate, identity
from tether.errors import SignalRefused
from tether.identity import Identity

pytest_plugins = ["pytester"]

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc and prctl"),
    pytest.mark.timeout(90),
]

PR_GET_CHILD_SUBREAPER = 37

# The inner session. Every leaked process's identity goes to $LEAKLOG, one
# JSON object a line, before the plugin gets a chance to end it.
INNER = r'''
import json, os, subprocess, sys, time, ctypes
import pytest
from tether import gate, identity

LOG = os.environ["LEAKLOG"]

def record(tag, pid):
    ident = identity.read(pid)
    assert ident is not None, f"{tag}: pid {pid} already gone"
    with open(LOG, "a") as f:
        f.write(json.dumps({"tag": tag, **ident.to_dict()}) + "\n")

def wait_for_file(path, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path) or not open(path).read().strip():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)
    return open(path).read().strip()

def test_probe(request):
    # What the plugin did to this process: subreaper bit, detector registered.
    libc = ctypes.CDLL(None, use_errno=True)
    v = ctypes.c_int(-1)
    assert libc.prctl(37, ctypes.byref(v), 0, 0, 0) == 0
    det = request.config.pluginmanager.get_plugin("tether-leaks")
    with open(LOG, "a") as f:
        f.write(json.dumps({"tag": "probe", "subreaper": v.value,
                            "detector": det is not None}) + "\n")

def test_clean():
    subprocess.run(["true"], check=True)
    subprocess.run(["sh", "-c", "sleep 0.01 & wait"], check=True)

def zombie_children():
    me = os.getpid()
    out = {}
    for tid in os.listdir(f"/proc/{me}/task"):
        for c in open(f"/proc/{me}/task/{tid}/children").read().split():
            try:
                stat = open(f"/proc/{c}/stat").read()
            except OSError:
                continue
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                out[int(c)] = stat[stat.index("(") + 1:stat.rindex(")")]
    return out

def test_orphan_that_exits():
    # Not a leak: the orphan exits before the test ends. With the plugin on,
    # pytest (a subreaper) adopts it, and must reap it.
    subprocess.run(["sh", "-c", "sleep 0.05 >/dev/null 2>&1 &"], check=True)
    deadline = time.monotonic() + 3
    z = {}
    while time.monotonic() < deadline and "sleep" not in z.values():
        time.sleep(0.02)
        z = zombie_children()
    pids = [p for p, c in z.items() if c == "sleep"]
    with open(LOG, "a") as f:
        f.write(json.dumps({"tag": "orphan", "adopted": pids}) + "\n")

def test_orphan_was_reaped():
    with open(LOG, "a") as f:
        f.write(json.dumps({"tag": "orphan-after", "zombies": sorted(zombie_children())}) + "\n")

def test_sh_leak():
    out = subprocess.run(["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"],
                         capture_output=True, text=True, check=True).stdout
    record("sh", int(out))

DAEMON = """
import os, sys
if os.fork(): os._exit(0)
os.setsid()
if os.fork(): os._exit(0)
with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
os.execvp("sleep", ["sleep", "301"])
"""

def test_daemon_leak(tmp_path):
    pidfile = tmp_path / "daemon.pid"
    subprocess.run([sys.executable, "-c", DAEMON, str(pidfile)], check=True)
    record("daemon", int(wait_for_file(pidfile)))

@pytest.fixture
def http_server():
    # A real server the fixture never stops: the leak is the fixture's, and
    # so the test's.
    p = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "0"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    record("fixture", p.pid)
    yield p

def test_fixture_leak(http_server):
    assert http_server.poll() is None

@pytest.fixture
def tidy_server():
    p = subprocess.Popen(["sleep", "304"])
    yield p
    p.terminate()
    p.wait()

@pytest.fixture
def hasty_server():
    # Sends SIGTERM but does not wait: the process is on its way out, no leak.
    p = subprocess.Popen(["sleep", "305"])
    yield p
    p.terminate()

def test_tidy_fixtures(tidy_server, hasty_server):
    assert tidy_server.poll() is None and hasty_server.poll() is None

@pytest.fixture(scope="module")
def module_server():
    p = subprocess.Popen(["sleep", "306"])
    record("module", p.pid)
    yield p
    p.terminate()
    p.wait()

def test_module_a(module_server):
    assert module_server.poll() is None

def test_module_b(module_server):
    # Still the same live process: the first test's check left it alone.
    assert module_server.poll() is None
    assert identity.read(module_server.pid) is not None
'''

# A module fixture that never ends its process: reported at its own teardown
# (in the teardown of the last test that used it), never for a test before.
INNER_MODULE_LEAK = r'''
import json, os, subprocess
import pytest
from tether import gate, identity

@pytest.fixture(scope="module")
def forgotten():
    p = subprocess.Popen(["sleep", "307"])
    ident = identity.read(p.pid)
    with open(os.environ["LEAKLOG"], "a") as f:
        f.write(json.dumps({"tag": "module-leak", **ident.to_dict()}) + "\n")
    yield p

def test_first(forgotten):
    pass

def test_last(forgotten):
    pass
'''

INNER_XDIST = r'''
import json, os, subprocess, time
import pytest
from tether import gate, identity

LOG = os.environ["LEAKLOG"]
BARRIER = os.environ["BARRIER"]

def leak_and_meet(me, other):
    out = subprocess.run(["sh", "-c", "sleep 308 >/dev/null 2>&1 & echo $!"],
                         capture_output=True, text=True, check=True).stdout
    ident = identity.read(int(out))
    with open(LOG, "a") as f:
        f.write(json.dumps({"tag": me, "worker": os.environ.get("PYTEST_XDIST_WORKER"),
                            **ident.to_dict()}) + "\n")
    open(os.path.join(BARRIER, me), "w").close()
    # Both leaks are alive at once: whichever worker checks first sees the
    # other worker's leak alive, and must not report it.
    deadline = time.monotonic() + 20
    while not os.path.exists(os.path.join(BARRIER, other)):
        assert time.monotonic() < deadline, "the other test never ran concurrently"
        time.sleep(0.01)

def test_a():
    leak_and_meet("a", "b")

def test_b():
    leak_and_meet("b", "a")
'''


def _prctl_subreaper() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    v = ctypes.c_int(-1)
    assert libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(v), 0, 0, 0) == 0
    return v.value



class LeakLog:
    """Reads what the inner session recorded; ends every recorded process at
    teardown, by identity (the finalizer below)."""

    def __init__(self, path) -> None:
        self.path = path
        self.seen: dict[tuple[int, int], Identity] = {}

    def records(self) -> list[dict]:
        if not self.path.exists():
            return []
        out = [json.loads(line) for line in self.path.read_text().splitlines() if line]
        for r in out:
            if "pid" in r:
                i = Identity.from_dict(r)
                self.seen[(i.pid, i.start)] = i
        return out

    def leaked(self) -> dict[str, Identity]:
        return {r["tag"]: Identity.from_dict(r) for r in self.records() if "pid" in r}

    def probe(self) -> dict:
        return next(r for r in self.records() if r["tag"] == "probe")

    def end_all(self) -> None:
        self.records()
        for i in self.seen.values():
            try:
                gate.send_signal(i, signal.SIGKILL)
            except SignalRefused:
                pass
        deadline = time.monotonic() + 5
        while any(identity.is_alive(i) for i in self.seen.values()):
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)


@pytest.fixture
def leaklog(tmp_path, monkeypatch):
    log = LeakLog(tmp_path / "leaks.jsonl")
    monkeypatch.setenv("LEAKLOG", str(log.path))
    # The inner sessions must not inherit a setting from the outer run.
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    monkeypatch.delenv("_TETHER_LEAKS_PORTABLE", raising=False)
    yield log
    log.end_all()


def run_inner(pytester, *args: str):
    # hypothesis and pytest-benchmark cost ~1.5 s of CPU per inner start-up
    # and play no part here; blocking a plugin that is not installed is fine.
    # setsid: the inner pytest leads a session of its own, as one started from
    # a terminal does. The hint (--tether-leaks=off) names orphans of its own
    # session, and pytest-xdist runs every test of this run in one session:
    # another test's deliberately orphaned tree was named as this one's leak.
    basetemp = pytester.path / f"basetemp-{next(_INNER)}"
    return pytester.run(
        "setsid", "-w", sys.executable, "-mpytest", f"--basetemp={basetemp}",
        "-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:benchmark",
        *args, timeout=60)


_INNER = itertools.count()


def test_outer_session_matches_its_mode(request):
    # This very session has the plugin loaded by its entry point. Off (the
    # default), it left no trace: no detector, and this process is no
    # subreaper; on, both.
    from tether.pytest_plugin import leak_mode

    on = leak_mode(request.config) != "off"
    assert (request.config.pluginmanager.get_plugin("tether-leaks") is not None) is on
    assert _prctl_subreaper() == (1 if on else 0)


def test_fail_mode_reports_and_ends_every_leak(pytester, leaklog):
    pytester.makepyfile(test_inner=INNER)
    result = run_inner(pytester, "--tether-leaks=fail")
    out = result.stdout.str()
    leaked = leaklog.leaked()
    assert set(leaked) == {"sh", "daemon", "fixture", "module"}, out

    # Every process a test left running is dead now (a zombie counts as dead).
    for tag in ("sh", "daemon", "fixture"):
        assert not identity.is_alive(leaked[tag]), f"{tag} leak survived:\n{out}"
    # ... and the module fixture's process ended at its own teardown.
    assert not identity.is_alive(leaked["module"])

    # Exactly the three leaking tests fail, each with its own report.
    result.assert_outcomes(passed=10, errors=3)
    for name, tag, comm in (("test_sh_leak", "sh", "sleep"),
                            ("test_daemon_leak", "daemon", "sleep"),
                            ("test_fixture_leak", "fixture", "python")):
        m = re.search(rf"ERROR at teardown of {name} _+\ntether: test_inner.py::{name} left "
                      rf"1 process running:\n  pid (\d+) +(\S+)", out)
        assert m, f"no report for {name}:\n{out}"
        assert int(m.group(1)) == leaked[tag].pid
        assert m.group(2).startswith(comm)
    for clean in ("test_clean", "test_tidy_fixtures", "test_module_a", "test_module_b"):
        assert f"{clean} left" not in out, out
    assert "tether: 3 leaked processes in 3 tests, ended" in out
    assert leaklog.probe() == {"tag": "probe", "subreaper": 1, "detector": True}
    # An orphan that exited during a test was adopted by pytest (a zombie
    # child of it: the check below could see one) and reaped after the test.
    recs = {r["tag"]: r for r in leaklog.records()}
    assert len(recs["orphan"]["adopted"]) == 1
    assert recs["orphan"]["adopted"][0] not in recs["orphan-after"]["zombies"]


def test_control_plugin_off_leaves_the_same_leaks_alive(pytester, leaklog):
    # The same session without the plugin: the same check sees every leak
    # alive (the finalizer then ends them by their recorded identity).
    pytester.makepyfile(test_inner=INNER)
    result = run_inner(pytester)
    result.assert_outcomes(passed=10)
    leaked = leaklog.leaked()
    for tag in ("sh", "daemon", "fixture"):
        assert identity.is_alive(leaked[tag]), f"control: {tag} leak not alive"
    assert not identity.is_alive(leaked["module"])  # that fixture ends its process
    assert "leaked process" not in result.stdout.str()
    assert leaklog.probe() == {"tag": "probe", "subreaper": 0, "detector": False}
    # Off, the session's end still says that processes outlived it, and how to see which.
    assert re.search(r"tether: \d+ process(es)? started during this session (are|is) still "
                     r"running \(pid .*pytest --tether-leaks=warn", result.stdout.str())


def test_warn_mode_with_dash_p(pytester, leaklog):
    pytester.makepyfile(test_inner=INNER)
    result = run_inner(pytester, "-p", "tether")  # -p alone means warn
    result.assert_outcomes(passed=10, warnings=3)
    out = result.stdout.str()
    assert "TetherLeakWarning: tether: test_inner.py::test_sh_leak left 1 process" in out
    assert "tether: 3 leaked processes in 3 tests, ended" in out
    for tag, i in leaklog.leaked().items():
        assert not identity.is_alive(i), f"{tag} leak survived in warn mode"


def test_ini_option_and_module_fixture_leak(pytester, leaklog):
    pytester.makeini("[pytest]\ntether_leaks = fail\n")
    pytester.makepyfile(test_modleak=INNER_MODULE_LEAK)
    result = run_inner(pytester)
    out = result.stdout.str()
    leak = leaklog.leaked()["module-leak"]
    assert not identity.is_alive(leak)
    # Not reported for the first test (the fixture still held it), but at the
    # fixture's own teardown, which runs in the last test's teardown.
    result.assert_outcomes(passed=2, errors=1)
    assert "test_first left" not in out
    assert re.search(rf"test_modleak.py::test_last left 1 process running:\n  pid {leak.pid} +sleep"
                     r".*\[left by module-scoped fixture 'forgotten'\]", out), out


def test_control_module_fixture_leak_survives_without_plugin(pytester, leaklog):
    pytester.makepyfile(test_modleak=INNER_MODULE_LEAK)
    result = run_inner(pytester)
    result.assert_outcomes(passed=2)
    assert identity.is_alive(leaklog.leaked()["module-leak"])


def test_xdist_workers_report_only_their_own(pytester, leaklog, tmp_path, monkeypatch):
    pytest.importorskip("xdist")
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    monkeypatch.setenv("BARRIER", str(barrier))
    pytester.makepyfile(test_par=INNER_XDIST)
    result = run_inner(pytester, "-n", "2", "--tether-leaks=fail")
    out = result.stdout.str()
    recs = {r["tag"]: r for r in leaklog.records()}
    assert set(recs) == {"a", "b"}, out
    assert recs["a"]["worker"] != recs["b"]["worker"], "both tests ran on one worker"
    result.assert_outcomes(errors=2, passed=2)
    for me, other in (("a", "b"), ("b", "a")):
        m = re.search(rf"tether: test_par.py::test_{me} left (\d+) process(?:es)? running:\n"
                      rf"((?:  pid .*\n?)+)", out)
        assert m, out
        assert m.group(1) == "1", f"test_{me} reported another worker's process:\n{out}"
        assert f"pid {recs[me]['pid']} " in m.group(2)
        assert f"pid {recs[other]['pid']} " not in m.group(2)
    for tag in ("a", "b"):
        assert not identity.is_alive(Identity.from_dict(recs[tag]))


def test_portable_scan_catches_a_still_parented_leak(pytester, leaklog, monkeypatch):
    # The path macOS/BSD take (no subreaper): a bounded capture of the table.
    monkeypatch.setenv("_TETHER_LEAKS_PORTABLE", "1")
    pytester.makepyfile(test_inner=INNER)
    result = run_inner(pytester, "--tether-leaks=fail", "-k", "fixture_leak or tidy or probe")
    result.assert_outcomes(passed=3, errors=1)
    assert not identity.is_alive(leaklog.leaked()["fixture"])
    assert leaklog.probe()["subreaper"] == 0


# A multi-threaded owner's Python keepers come from its warden, a helper
# that lives as long as the pytest process: not a leak. A job left open is one.
WARDEN = r"""
import json, os, threading
from tether import Job, gate, identity
from tether.platform import own_helpers

LOG = os.environ["LEAKLOG"]
OPEN = []

def record(tag, pid):
    with open(LOG, "a") as f:
        f.write(json.dumps({"tag": tag, **identity.read(pid).to_dict()}) + "\n")

def threaded_job(tag, close):
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        job = Job(mechanism="pgroup")  # the Python keeper's: the native one needs no warden
        record(tag, job.popen(["sleep", "300"]).pid)
        (warden,) = own_helpers()
        record("warden", warden)
        if close:
            job.close()
        else:
            OPEN.append(job)
    finally:
        stop.set()
        t.join()

def test_closes_its_job():
    threaded_job("closed", close=True)

def test_leaves_its_job_open():
    threaded_job("open", close=False)
"""


@pytest.mark.parametrize("mode", ["fail", "off"])
def test_the_owners_warden_is_no_leak_and_an_open_job_still_is(pytester, leaklog, mode):
    pytester.makepyfile(test_inner=WARDEN)
    clean = run_inner(pytester, f"--tether-leaks={mode}", "-k", "closes")
    clean.assert_outcomes(passed=1)
    assert "tether:" not in clean.stdout.str(), clean.stdout.str()  # nor the hint when off
    # The control: a job left open is reported (fail) or named by the hint (off).
    leaky = run_inner(pytester, f"--tether-leaks={mode}")
    out = leaky.stdout.str()
    member = leaklog.leaked()["open"]
    if mode == "fail":
        leaky.assert_outcomes(passed=2, errors=1)
        assert "test_leaves_its_job_open" in out and f"pid {member.pid} " in out, out
        assert not identity.is_alive(member)
    else:
        leaky.assert_outcomes(passed=2)
        assert "still running" in out, out
    warden = leaklog.leaked()["warden"]
    assert f"pid {warden.pid} " not in out and f"{warden.pid} tether-warden" not in out, out


# -- option values, one report per leak, the hint when off --------------------------------

LEAK_ONE = r"""
import subprocess
def test_leaks():
    subprocess.run(["sh", "-c", "sleep 300 >/dev/null 2>&1 &"], check=True)
def test_clean():
    pass
"""


@pytest.mark.parametrize("ini, expect", [
    ("tether_leaks_grace = 1.0    # seconds between SIGTERM and SIGKILL",
     "ERROR: tether_leaks_grace = '1.0    # seconds between SIGTERM and SIGKILL': "),
    ("tether_leaks_grace = -1", "ERROR: tether_leaks_grace = '-1': tether_leaks_grace must be"),
    ("tether_leaks_grace = nan", "ERROR: tether_leaks_grace = 'nan': "),
    ("tether_leaks = loud", "ERROR: tether_leaks = 'loud': choose one of off, warn, fail"),
])
def test_bad_ini_values_are_one_clean_error_line(pytester, ini, expect):
    pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile(test_x="def test_x(): pass\n")
    result = run_inner(pytester, "--tether-leaks=off")  # validated even when overridden
    err = result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, err
    assert expect in err, err
    assert "Traceback" not in err and "INTERNALERROR" not in err + result.stdout.str()
    if "#" in ini:
        assert "inline comment?" in err


@pytest.mark.parametrize("value", ["abc", "-2", "inf"])
def test_bad_grace_option_is_a_usage_error(pytester, value):
    pytester.makepyfile(test_x="def test_x(): pass\n")
    result = run_inner(pytester, f"--tether-leaks-grace={value}")
    err = result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, err
    assert "argument --tether-leaks-grace:" in err and "Traceback" not in err, err


def test_documented_ini_snippet_works(pytester, leaklog):
    # docs/pytest.md's snippet, as it stands there now.
    pytester.makeini("[pytest]\ntether_leaks = fail\n"
                     "# seconds between SIGTERM and SIGKILL (default 1)\n"
                     "tether_leaks_grace = 1.0\n")
    pytester.makepyfile(test_x=LEAK_ONE)
    result = run_inner(pytester)
    result.assert_outcomes(passed=2, errors=1)


@pytest.mark.parametrize("ci", [False, True], ids=["terminal", "CI"])
@pytest.mark.parametrize("mode, extra", [("fail", ()), ("warn", ()), ("fail", ("--tb=no",)),
                                         ("warn", ("--disable-warnings",))])
def test_each_leak_is_reported_once(pytester, leaklog, monkeypatch, mode, extra, ci):
    # Under CI pytest does not trim the short summary to one line.
    if ci:
        monkeypatch.setenv("CI", "true")
    else:
        monkeypatch.delenv("CI", raising=False)
        monkeypatch.delenv("BUILD_NUMBER", raising=False)
    pytester.makepyfile(test_x=LEAK_ONE)
    result = run_inner(pytester, f"--tether-leaks={mode}", *extra)
    out = result.stdout.str()
    assert len(re.findall(r"^ *pid \d+ +sleep ", out, re.M)) == 1, out
    assert len(re.findall(r"test_x.py::test_leaks left 1 process running:", out)) == 1, out
    assert "tether: 1 leaked process in 1 test, ended" in out


def _session(tmp_path, body: str) -> subprocess.CompletedProcess[str]:
    """A pytest session of its own, in a session of its own (setsid): no other
    test's process can share its session, so the hint counts only its own."""
    (tmp_path / "test_s.py").write_text(body)
    env = dict(os.environ)
    for k in ("PYTEST_ADDOPTS", "_TETHER_LEAKS_PORTABLE"):
        env.pop(k, None)
    return subprocess.run(["setsid", sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:hypothesispytest", "-p", "no:xdist", "test_s.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_off_hint_names_survivors_and_how_to_see_them(tmp_path, procs):
    # The leak is exec'd by the time Popen returns (a `sh -c 'sleep &'` child
    # could still be named sh, between its fork and its exec, when the hint
    # reads it: seen once under load).
    leaky = ("import subprocess\n"
             f"ENV = {procs.env()!r}\n"
             "def test_leak():\n"
             "    subprocess.Popen(['sleep', '300'], env=ENV, stdout=subprocess.DEVNULL,\n"
             "                     stderr=subprocess.DEVNULL)\n")
    r = _session(tmp_path, leaky)
    assert r.returncode == 0, r.stdout + r.stderr
    assert procs.wait_count(1), "the leak should be alive: the plugin is off"
    pid = procs.alive()[0].pid
    assert (f"tether: 1 process started during this session is still running (pid {pid} sleep); "
            "pytest --tether-leaks=warn") in r.stdout, r.stdout
    # Control: a clean session says nothing.
    clean = _session(tmp_path, "def test_ok():\n    pass\n")
    assert clean.returncode == 0 and "tether:" not in clean.stdout, clean.stdout
