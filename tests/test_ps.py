"""``tether ps`` against real jobs held by a real owner in a child process.

The owner (a Python child of the test) opens a ``Job`` with the mechanism
under test, starts ``sleep 300`` and ``sh -c 'sleep 301 & sleep 302; wait'``
in it, prints the job id and pids, and holds the job until its stdin closes.
``tether ps`` runs as a separate process (``python -m tether.ps``), as a user
would run it. Every test ends the owner and every recorded process in a
fixture finalizer, by identity.

Controls: after the owner closes its job, the same query no longer lists it,
and a job whose owner and keeper were both SIGKILLed is listed with its dead
owner and surviving members: ps tells live from over, and shows leftovers.
"""

from __future__ import annotations

import functools
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time

import procutil
import pytest

from tether import gate, identity
from tether.errors import SignalRefused
from tether.identity import Identity
from tether.platform import probe

wait_until = functools.partial(procutil.wait_until, timeout=10.0, interval=0.02)

pytestmark = [
    pytest.mark.mechanism,  # also run as an unprivileged user in CI
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux mechanisms"),
    pytest.mark.timeout(60),
]

OWNER = r'''
import json, os, sys
from tether import Job
mech, sd = sys.argv[1], (sys.argv[2] if sys.argv[2] != "-" else None)
if os.environ.get("NAME_KEEPER") == "0":
    # Keepers name themselves "tether-keeper"; the control un-names this one
    # (as a keeper of an older tether would be) to show the name is the trace.
    # The native keeper is named by its program: only the Python one,
    # pgroup's, can be un-named.
    from tether.keeper import _keeper_socket
    _serve = _keeper_socket.SocketKeeper.serve
    def serve(self, ctl):
        with open("/proc/self/comm", "w") as f:
            f.write("python3")
        return _serve(self, ctl)
    _keeper_socket.SocketKeeper.serve = serve
job = Job(name="ps-test", mechanism=mech, state_dir=sd)
if os.environ.get("START") == "0":  # a job that has not started anything yet
    p = q = None
else:
    p = job.popen(["sleep", "300"]).pid
    q = job.popen(["sh", "-c", "sleep 301 & sleep 302; wait"]).pid
print(json.dumps({"job": job.id, "p": p, "q": q, "trace": job.trace()}), flush=True)
sys.stdin.read()
job.close()
print("closed", flush=True)
'''

MECHS = ["cgroup", "subreaper", "pgroup", "pidns"]



def readline(p: subprocess.Popen, timeout: float = 20.0) -> str:
    return procutil.read_line(p, timeout, "the owner")


class Owner:
    def __init__(self, proc: subprocess.Popen, born: int) -> None:
        self.proc = proc
        self.info: dict = {}
        self.born = born
        self.job = ""

    def members_by_tree(self) -> list[Identity]:
        """The owner's keeper and job processes, found by parentage among
        processes born after the owner (for the finalizer)."""
        cap = identity.capture(born_after=self.born)
        roots = [self.proc.pid, self.info.get("p"), self.info.get("q"),  # None when empty
                 self.info.get("trace", {}).get("keeper_pid")]
        roots = [r for r in roots if r]
        return [cap.get(r) for r in roots if cap.get(r)] + cap.descendants(roots, self.born)


@pytest.fixture
def owner_factory(tmp_path):
    owners: list[Owner] = []
    recorded: dict[tuple[int, int], Identity] = {}

    def start(mech: str, state_dir: str | None, name_keeper: bool = False,
              empty: bool = False) -> Owner:
        av = probe(mech)
        if not av.available:
            pytest.skip(f"{mech}: {av.reason}")
        born = identity.now_ticks()
        env = dict(os.environ, NAME_KEEPER="1" if name_keeper else "0",
                   START="0" if empty else "1")
        env.pop("TETHER_STATE_DIR", None)
        proc = subprocess.Popen([sys.executable, "-c", OWNER, mech, state_dir or "-"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                env=env)
        o = Owner(proc, born)
        owners.append(o)
        o.info = json.loads(readline(proc))
        o.job = o.info["job"]
        if not empty:  # sh has started both of its sleeps
            wait_until(lambda: len(identity.children(o.info["q"])) == 2)
        for i in o.members_by_tree():
            recorded[(i.pid, i.start)] = i
        return o

    yield start
    for o in owners:
        for i in o.members_by_tree():
            recorded[(i.pid, i.start)] = i
        if o.proc.poll() is None:
            o.proc.kill()
        o.proc.wait(timeout=10)
        o.proc.stdout.close()
        o.proc.stdin.close()
    deadline = time.monotonic() + 5
    for i in recorded.values():
        try:
            gate.send_signal(i, signal.SIGKILL)
        except SignalRefused:
            pass
    while any(identity.is_alive(i) for i in recorded.values()) and time.monotonic() < deadline:
        time.sleep(0.01)


def ps(*args: str, state_dir: str | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "tether.ps", *args]
    if state_dir is not None:
        cmd += ["--state-dir", state_dir]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30)


def ps_json(state_dir: str | None) -> dict:
    r = ps("--json", state_dir=state_dir)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def find(doc: dict, job_id: str) -> dict | None:
    return next((j for j in doc["jobs"] if j["job"] == job_id), None)


def flatten(nodes: list[dict]) -> list[dict]:
    out = []
    for n in nodes:
        out.append(n)
        out += flatten(n["children"])
    return out


@pytest.fixture
def state_dir(tmp_path):
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    return str(d)


@pytest.mark.parametrize("mech", MECHS)
def test_json_lists_the_job_and_its_member_tree(owner_factory, state_dir, mech):
    o = owner_factory(mech, state_dir)
    j = find(ps_json(state_dir), o.job)
    assert j is not None, f"job {o.job} not listed"
    assert j["mechanism"] == mech
    assert j["owner"]["pid"] == o.proc.pid and j["owner"]["alive"] is True
    assert j["owner"]["comm"].startswith("python")
    assert "audit" in j["sources"]
    assert j["age"] is not None and 0 <= j["age"] < 60
    # The tree: sleep 300 and sh at the top, sh's two sleeps below it.
    assert j["member_count"] == 4
    tops = {n["pid"]: n for n in j["members"]}
    assert set(tops) == {o.info["p"], o.info["q"]}
    assert tops[o.info["p"]]["cmdline"] == "sleep 300"
    kids = sorted(c["cmdline"] for c in tops[o.info["q"]]["children"])
    assert kids == ["sleep 301", "sleep 302"]
    assert j["keeper"]["pid"] == o.info["trace"]["keeper_pid"]
    if mech == "cgroup":
        assert j["cgroup"] == o.info["trace"]["cgroup_path"]

    # Control: once the owner closes the job, the same query no longer lists it.
    o.proc.stdin.close()
    assert readline(o.proc).strip() == "closed"
    o.proc.wait(timeout=10)
    assert find(ps_json(state_dir), o.job) is None


def test_cgroup_job_found_from_its_trace_alone(owner_factory):
    # No audit log at all: the cgroup directory is enough.
    o = owner_factory("cgroup", None)
    j = find(ps_json(None), o.job)
    assert j is not None
    assert "cgroup" in j["sources"] and "audit" not in j["sources"]
    assert j["mechanism"] == "cgroup" and j["owner"]["alive"] is True
    assert {n["pid"] for n in flatten(j["members"])} >= {o.info["p"], o.info["q"]}
    assert j["member_count"] == 4
    assert j["keeper"]["pid"] == o.info["trace"]["keeper_pid"]


@pytest.mark.parametrize("mech", ["subreaper", "pidns", "pgroup"])
def test_job_found_from_its_named_keeper_alone(owner_factory, mech):
    # No audit log, no cgroup: the keeper, named tether-keeper, is the trace.
    o = owner_factory(mech, None, name_keeper=True)
    assert identity.read(o.info["trace"]["keeper_pid"]).comm == "tether-keeper"
    doc = ps_json(None)
    j = next((j for j in doc["jobs"]
              if j["keeper"] and j["keeper"]["pid"] == o.info["trace"]["keeper_pid"]), None)
    assert j is not None, doc
    assert j["sources"] == ["keeper"]
    assert j["owner"]["pid"] == o.proc.pid and j["owner"]["alive"] is True
    assert j["member_count"] == 4
    assert {n["pid"] for n in j["members"]} == {o.info["p"], o.info["q"]}
    # Control: without the name (and without records or a cgroup), nothing
    # points at the job, and ps says so by not listing it (pgroup's: the
    # Python keeper, the one that can be un-named).
    o2 = owner_factory("pgroup", None, name_keeper=False)
    doc = ps_json(None)
    assert not any(j["keeper"] and j["keeper"]["pid"] == o2.info["trace"]["keeper_pid"]
                   for j in doc["jobs"])
    assert not any(j["owner"] and j["owner"]["pid"] == o2.proc.pid for j in doc["jobs"])


@pytest.mark.parametrize("mech", ["cgroup", "subreaper"])
def test_leftovers_of_a_dead_owner_are_listed(owner_factory, state_dir, mech):
    # Keeper SIGKILLed first, then the owner: nothing ends the job (the
    # guarantee says so) and ps must show it, owner dead, members alive.
    o = owner_factory(mech, state_dir)
    keeper = identity.read(o.info["trace"]["keeper_pid"])
    assert keeper is not None
    assert gate.send_signal(keeper, signal.SIGKILL)
    wait_until(lambda: not identity.is_alive(keeper))
    o.proc.kill()
    o.proc.wait(timeout=10)
    j = find(ps_json(state_dir), o.job)
    assert j is not None, "a job whose members survive must be listed"
    assert j["owner"]["alive"] is False
    pids = {n["pid"] for n in flatten(j["members"])}
    assert {o.info["p"], o.info["q"]} <= pids
    assert j["member_count"] == 4
    r = ps("--plain", state_dir=state_dir)
    assert f"job={o.job} " in r.stdout and "owner_alive=no" in r.stdout


def test_plain_when_piped_tree_on_a_terminal(owner_factory, state_dir):
    o = owner_factory("subreaper", state_dir)
    # Piped: key=value job line, members indented by two spaces, no box drawing.
    r = ps(state_dir=state_dir)
    assert r.returncode == 0
    block = r.stdout.split(f"job={o.job} ", 1)[1].split("\njob=", 1)[0]
    lines = block.splitlines()
    assert "mechanism=subreaper" in lines[0] and "owner_alive=yes" in lines[0]
    assert "members=4" in lines[0]
    assert any(ln.startswith(f"  {o.info['p']} sleep ") for ln in lines[1:])
    # A header says what the lines hold; ages carry their unit.
    assert r.stdout.startswith("# job lines: job= mechanism= owner=")
    assert "PID COMM AGE CMDLINE" in r.stdout.splitlines()[0]
    assert re.search(r" age=\d+\.\ds ", lines[0]), lines[0]
    assert any(re.fullmatch(rf"  {o.info['p']} sleep \d+\.\ds sleep 300", ln) for ln in lines), lines
    assert any(ln.startswith("    ") and ln.endswith("sleep 301") for ln in lines[1:])
    assert "─" not in r.stdout and "│" not in r.stdout

    # On a terminal: a box-drawn tree.
    master, slave = pty.openpty()
    try:
        p = subprocess.Popen([sys.executable, "-m", "tether.ps", "--state-dir", state_dir],
                             stdin=slave, stdout=slave, stderr=slave, close_fds=True)
        os.close(slave)
        slave = -1
        out = b""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            r_, _, _ = select.select([master], [], [], 0.5)
            if r_:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the other side closed
                    break
                if not chunk:
                    break
                out += chunk
            elif p.poll() is not None:
                break
        p.wait(timeout=10)
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    text = out.decode("utf-8", "replace").replace("\r\n", "\n")
    head = next(ln for ln in text.splitlines() if ln.startswith(o.job))
    assert "subreaper" in head and f"owner {o.proc.pid} python" in head and "(alive)" in head
    assert f"├─ {o.info['p']} sleep 300" in text
    assert f"└─ {o.info['q']} sh -c sleep 301 & sleep 302; wait" in text
    assert "   ├─ " in text and "   └─ " in text


def _jobs_of(doc: dict, o: Owner) -> list[dict]:
    """Every listed job that belongs to this owner, by owner or by keeper."""
    keeper = o.info["trace"]["keeper_pid"]
    return [j for j in doc["jobs"] if (j["owner"] and j["owner"]["pid"] == o.proc.pid)
            or (j["keeper"] and j["keeper"]["pid"] == keeper)]


@pytest.mark.parametrize("with_audit", [True, False], ids=["audit", "no-audit"])
@pytest.mark.parametrize("mech", ["cgroup", "subreaper", "pidns"])
def test_each_job_is_listed_once_with_its_real_members(owner_factory, state_dir, mech,
                                                       with_audit):
    o = owner_factory(mech, state_dir if with_audit else None, name_keeper=True)
    mine = _jobs_of(ps_json(state_dir if with_audit else None), o)
    assert len(mine) == 1, mine  # once: not also as a keeper-only "job=?" entry
    j = mine[0]
    assert j["job"] in (o.job, None) and j["mechanism"] in (mech, None)
    if mech == "cgroup" or with_audit:
        assert j["job"] == o.job and j["mechanism"] == mech
    pids = {n["pid"] for n in flatten(j["members"])}
    tree = [(i.pid, i.ppid, i.comm, i.state) for i in o.members_by_tree()]
    assert j["member_count"] == 4 and {o.info["p"], o.info["q"]} <= pids, (j, o.info, tree)
    assert o.info["trace"]["keeper_pid"] not in pids  # the keeper is tether's, not a member
    assert j["keeper"]["pid"] == o.info["trace"]["keeper_pid"]


@pytest.mark.parametrize("mech", ["cgroup", "subreaper"])
def test_a_job_that_started_nothing_has_no_members(owner_factory, state_dir, mech):
    o = owner_factory(mech, None, name_keeper=True, empty=True)
    mine = _jobs_of(ps_json(None), o)
    assert len(mine) == 1, mine
    assert mine[0]["member_count"] == 0 and mine[0]["members"] == []
    assert mine[0]["keeper"]["pid"] == o.info["trace"]["keeper_pid"]


def test_what_limited_the_view_is_said_in_every_form(tmp_path):
    # A state directory that is a file: the audit log cannot be read. JSON
    # carries it in "notes"; plain text and the tree say it on stderr (plain
    # text used to drop it: an empty list, exit 0, nothing said).
    bad = tmp_path / "file"
    bad.write_text("")
    doc = ps_json(str(bad))
    assert any("audit log not read" in n and "not a directory" in n for n in doc["notes"]), doc
    r = ps("--plain", state_dir=str(bad))
    assert r.returncode == 0
    assert "note: audit log not read" in r.stderr and "not a directory" in r.stderr, r.stderr
    # the control: a readable one says nothing of the kind
    good = tmp_path / "state"
    good.mkdir(mode=0o700)
    r = ps("--plain", state_dir=str(good))
    assert r.returncode == 0 and "audit log not read" not in r.stderr, r.stderr


@pytest.mark.parametrize("mech", [m for m in MECHS if m in ("subreaper", "cgroup")])
def test_a_gone_keepers_reused_pid_hides_no_member(owner_factory, state_dir, mech):
    # The audit log names the keeper of a run that is over; that keeper is
    # gone and its pid now names a member of a live job (pids are reused; in
    # a fresh PID namespace, often). The member is still listed: only a
    # keeper that is still the same process is tether's own, not a member.
    o = owner_factory(mech, state_dir)
    p = identity.read(o.info["p"])
    assert p is not None
    boot = identity.boot_id()
    gone = {"pid": p.pid, "start": f"{p.start - 1}@{boot}"}  # not the process at that pid now
    rec = {"v": 1, "ts": time.time() - 60, "event": "job-open", "run": f"{p.pid}-{p.start - 2}",
           "owner": {"pid": p.pid, "start": f"{p.start - 2}@{boot}"}, "job": "j0-1",
           "mechanism": mech, "name": "over", "keeper": gone}
    with open(os.path.join(state_dir, "audit.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")
    doc = ps_json(state_dir)
    j = find(doc, o.job)
    assert j is not None and j["member_count"] == 4, j
    assert p.pid in {m["pid"] for m in flatten(j["members"])}
    # The record was read (the check can fail): the run it names is in the log.
    from tether.runs import read_runs
    assert f"{p.pid}-{p.start - 2}" in read_runs(state_dir)
