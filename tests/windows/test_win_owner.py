"""The owner dies, the job's processes die: for real, under Wine.

An owner process (``_owner.py``) starts a child that starts a grandchild, in
a job, then ends by ``os._exit`` or by ``TerminateProcess`` on itself. Nothing
of tether's runs after that: the kernel (wineserver) closes the owner's
handles, and with the last job handle gone, kill-on-close ends the job. The
controls run the same tree with no job, and in a background job, and see it
survive. (SIGKILL of the owner's Linux process is in test_lane_sigkill.py,
which drives Wine from Linux.)
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tether.platform import windows as W

pytestmark = pytest.mark.wine
OWNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_owner.py")


def _start_owner(tracker, kind: str, ending: str, strategy: str, token: str):
    p = tracker.popen(subprocess.Popen(
        [sys.executable, "-S", OWNER, kind, ending, strategy, token],
        stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True,
    ))
    line = tracker.first_line(p).split()
    if line[:1] != ["owner"]:
        p.stdin.close()
        rest = p.communicate(timeout=30)[0]
        pytest.fail(f"owner said {line!r} then {rest!r}, exit code {p.returncode}")
    _, child, grandchild = map(int, line[1:])
    tree = [tracker.open(child, token), tracker.open(grandchild, token)]
    assert all(tracker.alive(h) for h in tree)
    p.stdin.write("go\n")
    p.stdin.flush()
    return p, tree


@pytest.mark.parametrize(
    "kind,ending,strategy,code",
    [("job", "exit", s, 0) for s in W.STRATEGIES]
    + [("job", "terminate", "default", 7), ("nested", "exit", "default", 0)],
)
def test_owner_death_ends_child_and_grandchild(tracker, token, kind, ending, strategy, code):
    owner, tree = _start_owner(tracker, kind, ending, strategy, token)
    assert owner.wait(30) == code
    assert tracker.wait_gone(tree, 3.0) == []


@pytest.mark.parametrize("kind", ["nojob", "background"])
def test_control_tree_outside_a_kill_on_close_job_survives(tracker, token, kind):
    """The check above can see survivors: without kill-on-close the tree outlives its owner."""
    owner, tree = _start_owner(tracker, kind, "exit", "default", token)
    assert owner.wait(30) == 0
    assert tracker.wait_gone(tree, 1.0) == tree
