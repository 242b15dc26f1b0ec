"""SIGKILL of a Wine owner's Linux process ends its job: driven from Linux.

The owner (``_owner.py``, Windows CPython under Wine) holds a job with a child
and a grandchild. Under Wine every Windows process is a Linux process, and the
owner's is the very process ``wine`` became (``Popen.pid``). SIGKILL gives it
no chance to run anything; wineserver sees it die, closes its handles, and
kill-on-close ends the job. The control runs the same tree with no job and
sees it survive.

Needs the lane's Wine set-up (scripts/windows-lane.sh exports
TETHER_WINE_PYTHON, WINEPREFIX...); without it these tests skip and say why.
They touch only processes whose command line carries the test's token and
that were born after the test began; every kill re-checks that identity.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from _linuxprocs import LinuxProcs

WINE_PYTHON = os.environ.get("TETHER_WINE_PYTHON", "")
HERE = os.path.dirname(os.path.abspath(__file__))
OWNER = os.path.join(HERE, "_owner.py")
CHILD = os.path.join(HERE, "_child.py")

pytestmark = [
    pytest.mark.wine,
    pytest.mark.skipif(
        not (WINE_PYTHON and os.path.exists(WINE_PYTHON) and os.environ.get("WINEPREFIX")),
        reason="needs the Wine lane: run scripts/windows-lane.sh",
    ),
]


def _start(linux_procs: LinuxProcs, argv: list[str], first_word: str, token: str):
    """Start a Wine process, wait for its tree (child + grandchild), say go."""
    owner = subprocess.Popen(
        ["wine", WINE_PYTHON, *argv],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        line = owner.stdout.readline().split()
        assert line[:1] == [first_word], line
        # `wine` became the Windows process: same Linux pid, Windows command line.
        linux_procs.adopt(owner.pid)
        deadline = time.monotonic() + 10
        while True:  # tether's own command line names _child.py too: not part of the tree
            tree = [p for p in linux_procs.find("_child.py") if p != owner.pid]
            if len(tree) >= 2 or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        assert len(tree) == 2, tree  # child and grandchild
        owner.stdin.write("go\n")
        owner.stdin.flush()
    except BaseException:
        linux_procs.kill(owner.pid)
        owner.wait(10)
        raise
    return owner, tree


def _start_owner(linux_procs: LinuxProcs, kind: str, token: str):
    return _start(linux_procs, ["-S", OWNER, kind, "wait", "default", token], "owner", token)


def _sigkill_owner(linux_procs: LinuxProcs, owner: subprocess.Popen) -> float:
    assert linux_procs.is_same(owner.pid)
    os.kill(owner.pid, signal.SIGKILL)
    t0 = time.monotonic()
    assert owner.wait(10) == -signal.SIGKILL
    for stream in (owner.stdin, owner.stdout):
        stream.close()
    return t0


def test_sigkill_of_the_owner_linux_process_ends_the_job(linux_procs, token):
    owner, tree = _start_owner(linux_procs, "job", token)
    assert all(linux_procs.alive(p) for p in tree)
    _sigkill_owner(linux_procs, owner)
    assert linux_procs.wait_gone(tree, 3.0) == []


def test_sigkill_of_tether_run_ends_the_job(linux_procs, token):
    """`tether run` under Wine, SIGKILLed from Linux: the job still ends."""
    argv = ["-m", "tether", "run", "--", WINE_PYTHON, "-S", CHILD, "tree", token]
    tether, tree = _start(linux_procs, argv, "pids", token)
    assert all(linux_procs.alive(p) for p in tree)
    _sigkill_owner(linux_procs, tether)
    assert linux_procs.wait_gone(tree, 3.0) == []


def test_control_sigkill_of_an_owner_without_a_job_leaves_the_tree(linux_procs, token):
    """The same check sees survivors when nothing holds the tree together."""
    owner, tree = _start_owner(linux_procs, "nojob", token)
    _sigkill_owner(linux_procs, owner)
    assert sorted(linux_procs.wait_gone(tree, 1.0)) == sorted(tree)
