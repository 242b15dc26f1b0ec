"""The sparse capture (issue 35, item 5): the walks a close makes give what a
full capture gives, while reading only what they reach.

One real tree, built to use every link a walk follows: a child and a
grandchild (parentage), a process in a group of its own, an escapee that left
parentage, group and session (double fork + setsid: found as an adopter's
orphan), and, beside it, unrelated processes of the same user born after the
tree, in a session of their own. Each walk is made on a full capture and on a
sparse one and compared, on this test's own processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tether import identity, sparse_capture

pytestmark = [
    pytest.mark.mechanism,  # also as an unprivileged user: other users' lists and sessions
    pytest.mark.skipif(
        not identity.has_children_lists(),
        reason="a sparse capture needs /proc and the kernel's children lists (CONFIG_PROC_CHILDREN)"),
]

GROUP = "import os, sys; os.setpgid(0, 0); os.execvp('sleep', ['sleep', '60'])"
TREE = ("sleep 60 & (sleep 60 & wait) & setsid sh -c 'sleep 60 & wait' & "
        f'"$PY" -c "{GROUP}" & '  # a group of its own
        "(setsid sh -c 'sleep 60 & exit 0' &); "  # the escapee: its parents exit at once
        "echo READY; wait")
UNRELATED = 30


def _wait_sleeps(procs, n: int) -> list[identity.Identity]:
    deadline = time.monotonic() + 15
    while True:
        got = [i for i in procs.alive() if i.comm == "sleep"]
        if len(got) >= n or time.monotonic() > deadline:
            return got
        time.sleep(0.02)


@pytest.fixture
def tree(procs):
    root = procs.popen(["/bin/sh", "-c", TREE], stdout=subprocess.PIPE,
                       env=procs.env(PY=sys.executable))
    assert root.stdout.readline() == b"READY\n"
    sleeps = _wait_sleeps(procs, 5)
    assert len(sleeps) == 5, sleeps
    # Same user, born after the tree, no mark: another session's.
    unrelated = procs.popen(["/bin/sh", "-c", f"for i in $(seq {UNRELATED}); do sleep 60 & done; "
                             "echo READY; wait"], stdout=subprocess.PIPE,
                            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    assert unrelated.stdout.readline() == b"READY\n"
    for p in (root, unrelated):
        p.stdout.close()
    kids = identity.descendants([unrelated.pid], born_after=procs.born)
    assert len(kids) == UNRELATED
    for i in kids:
        procs.track(i)  # (unmarked: ended at cleanup by identity)
    return root, unrelated


def _walks(cap: identity.Capture, root: int, born: int) -> dict[str, set[int]]:
    """What a close asks of a capture, as pid sets."""
    ids = {i.pid for i in cap.descendants([root], born_after=born)}
    groups = {i.pgid for i in map(cap.get, ids) if i is not None}
    return {
        "descendants": ids,
        "session": {i.pid for i in cap.by_session(root, born)},
        "groups": {i.pid for g in groups for i in cap.by_pgid(g, born)},
        "adopted": {i.pid for i in cap.adopted(identity.own_ancestors())},
    }


def test_sparse_walks_match_a_full_capture_and_skip_the_unrelated(procs, tree) -> None:
    root, unrelated = tree
    ours = {i.pid for i in procs.alive()} | {root.pid}
    full = identity.capture(born_after=procs.born)
    sparse = sparse_capture.capture(born_after=procs.born)
    assert isinstance(sparse, sparse_capture.SparseCapture)
    a, b = _walks(full, root.pid, procs.born), _walks(sparse, root.pid, procs.born)
    for name in a:
        assert a[name] & ours == b[name] & ours, name
    # The walks reach the whole tree: 4 sleeps by parentage (in a subshell,
    # a new session, a group of its own)...
    sleeps = [i for i in procs.alive() if i.comm == "sleep"]
    assert len([i for i in sleeps if i.pid in b["descendants"]]) == 4
    # ...and the escapee, whose parents are gone, as an adopter's orphan.
    escaped = [i for i in sleeps if i.pid not in b["descendants"]]
    assert len(escaped) == 1 and escaped[0].pid in b["adopted"]
    # What was read: the sparse capture never read the unrelated sleeps; the
    # full one (the control: the check can fail) read every one of them.
    kids = {i.pid for i in full.descendants([unrelated.pid], born_after=procs.born)}
    assert len(kids) == UNRELATED
    assert kids <= set(full.procs)
    assert not kids & set(sparse.procs)
    assert sparse.complete


def test_sparse_time_cap_marks_it_incomplete(procs, tree) -> None:
    root, _ = tree
    sparse = sparse_capture.SparseCapture(time_cap=0.0, born_after=procs.born)
    time.sleep(0.001)
    assert sparse.descendants([root.pid], born_after=procs.born) == []
    assert not sparse.complete and "time cap" in sparse.reason
