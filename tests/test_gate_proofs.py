"""The proofs the gate's callers now pass (issue 36, "every signal ... goes
through the gate with a Proof"), against a stranger handed a dead process's
pid within the same clock tick - the case pid + start ticks + boot id cannot
tell apart.

``Proof.own_child()`` (a process's own unreaped child: ``_keeper_socket``'s
spawn that could not be given its limits) and ``Proof.tracking`` (a tree
found a moment ago: ``tether init``, the ``none`` mechanism, ``Job.terminate``,
the keeper's end, ``_bgwatch``, the owner's end after its keeper died) each
spare the stranger - a child of another process - and still prove what they
must (a live child of ours; a child of a process the last look found). The
control: the same stale identity with no proof, and the stranger is killed.

Runs inside a new PID namespace with its own /proc, where ``ns_last_pid`` is
writable (as tests/test_same_tick.py).
"""

from __future__ import annotations

import sys

import pytest
from procutil import run_in_pidns

pytestmark = [
    pytest.mark.mechanism,
    pytest.mark.timeout(180),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PID namespaces, Linux"),
]

SCRIPT = r"""
import json, os, signal, subprocess, sys
if os.getpid() == 1:  # PID 1 of the namespace: a parent 1 proves nothing - run below it
    sys.exit(subprocess.call([sys.executable, "-c", os.environ["GATE_SCRIPT"], *sys.argv[1:]]))
from tether import gate, identity
from tether.ending import end
from tether.errors import SignalRefused

WANT, BUDGET = int(sys.argv[1]), int(sys.argv[2])
MODES = ("own_child", "own_child_control", "tracking", "tracking_control")
out = {m: {"same_tick": 0, "stranger_killed": 0} for m in MODES}
out["tries"] = 0

def trial(mode):
    # M: another process, waiting to fork the stranger S on a line of input.
    m = subprocess.Popen(["sh", "-c", "read x; sleep 300 & echo $!; wait"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    si = None
    try:
        # L: our own child, killed and reaped; S gets its pid in the same tick.
        L = subprocess.Popen(["sleep", "300"])
        li = identity.read(L.pid)
        L.kill(); L.wait()
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(li.pid - 1))
        m.stdin.write(b"x\n"); m.stdin.flush()
        spid = int(m.stdout.readline())
        si = identity.read(spid)
        if si is None or si.pid != li.pid or si.start != li.start or si.ppid != m.pid:
            return None  # not the same tick: no ambiguity to test
        if mode.startswith("own_child"):
            proof = None if mode.endswith("control") else gate.Proof.own_child()
            try:
                gate.send_signal(li, signal.SIGKILL, member=True, proof=proof)
            except SignalRefused:
                pass
        else:
            p = gate.Proof()
            find = p.tracking(lambda: [li], roots=[os.getpid()])
            if mode.endswith("control"):
                end(lambda: [li], born_after=li.start, grace=0, bound=2)
            else:
                end(find, born_after=li.start, grace=0, bound=2, proof=lambda _i: p)
        for _ in range(100):  # a SIGKILL lands at once; give it 0.1 s
            if not identity.is_alive(si):
                break
            __import__("time").sleep(0.001)
        return not identity.is_alive(si)
    finally:
        if si is not None and identity.is_alive(si):
            gate.send_signal(si, signal.SIGKILL, member=True)
        m.stdin.close()
        try:
            m.wait(timeout=5)
        except subprocess.TimeoutExpired:
            m.kill(); m.wait()

i = 0
while any(out[m]["same_tick"] < WANT for m in MODES) and i < BUDGET:
    mode = MODES[i % len(MODES)]
    i += 1
    if out[mode]["same_tick"] >= WANT:
        continue
    killed = trial(mode)
    if killed is None:
        continue
    out[mode]["same_tick"] += 1
    out[mode]["stranger_killed"] += int(killed)
out["tries"] = i

# What the proofs must still prove: a live child of ours (own_child), and a
# process whose parent the last look found (tracking). As a keeper and tether
# init are, this process is the subreaper its tree's orphans come to (a
# grandchild whose parent was killed first is then a child of a root).
import ctypes
assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
c = subprocess.Popen(["sleep", "300"])
ci = identity.read(c.pid)
out["own_child_live"] = gate.send_signal(ci, signal.SIGKILL, member=True,
                                         proof=gate.Proof.own_child())
c.wait(timeout=5)
m = subprocess.Popen(["sh", "-c", "sleep 300 & echo $!; wait"], stdout=subprocess.PIPE)
gi = identity.read(int(m.stdout.readline()))
mi = identity.read(m.pid)
p = gate.Proof()
ended = end(p.tracking(lambda: [x for x in (mi, gi) if identity.is_alive(x)],
                       roots=[os.getpid()]), born_after=mi.start, grace=0, bound=10,
            proof=lambda _i: p)
m.wait(timeout=5)
out["tracking_ended"] = sorted(x.pid for x in ended.identities())
out["tracking_tree"] = out["tracking_ended"] == sorted([mi.pid, gi.pid])
out["tracking_refused"] = [why for _i, why in ended.refused]
print(json.dumps(out))
"""


def test_own_child_and_tracking_proofs_spare_a_same_tick_stranger():
    out = run_in_pidns(SCRIPT, "25", "3000", timeout=170, env={"GATE_SCRIPT": SCRIPT})
    for mode in ("own_child", "tracking", "own_child_control", "tracking_control"):
        assert out[mode]["same_tick"] == 25, out  # enough same-tick cases to mean something
    assert out["own_child"]["stranger_killed"] == 0, out
    assert out["tracking"]["stranger_killed"] == 0, out
    # Control: the same stale identity without a proof -> the stranger is killed.
    assert out["own_child_control"]["stranger_killed"] == 25, out
    assert out["tracking_control"]["stranger_killed"] == 25, out
    # And the proofs still prove what they must.
    assert out["own_child_live"] is True, out
    tree = {k: out[k] for k in ("tracking_tree", "tracking_ended", "tracking_refused")}
    assert out["tracking_tree"] is True and out["tracking_refused"] == [], tree
