"""SIGKILL of tether-cmd.exe's Linux processes ends the command's tree: driven from Linux.

``wine .../Scripts/tether-cmd.exe /c python.exe -S _child.py tree TOKEN``:
the ``wine`` process becomes pip's launcher (the process a caller holds),
which runs the wrapper's Python in a kill-on-close job of its own; the
wrapper runs cmd.exe in tether's job, and cmd.exe the child that starts a
grandchild. SIGKILL of the launcher's or of the Python's Linux process gives
it no chance to run anything: wineserver closes its handles and kill-on-close
does the rest. The control SIGKILLs a plain ``wine cmd.exe`` running the same
tree and sees the tree survive.

Needs the lane (scripts/windows-lane.sh sets TETHER_LANE_SCRIPTS,
TETHER_WINE_PYTHON, WINEPREFIX); without it these tests skip and say why.
Only processes whose command line carries the test's token, born after the
test began, are looked at; every kill re-checks that identity.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

WINE_PYTHON = os.environ.get("TETHER_WINE_PYTHON", "")
SCRIPTS = os.environ.get("TETHER_LANE_SCRIPTS", "")
TETHER_CMD = os.path.join(SCRIPTS, "tether-cmd.exe")
HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = os.path.join(HERE, "_child.py")

pytestmark = [
    pytest.mark.wine,
    pytest.mark.skipif(
        not (WINE_PYTHON and os.path.exists(TETHER_CMD) and os.environ.get("WINEPREFIX")),
        reason="needs the Wine lane and tether-cmd.exe as pip installs it: "
               "run scripts/windows-lane.sh",
    ),
]


def _winpath(path: str) -> str:
    return "Z:" + path.replace("/", "\\")


def _start(linux_procs, comspec: str, token: str):
    """The wrapper (or cmd.exe) running the tree; returns (Popen, tree pids, all pids)."""
    # wine writes the Windows command line from its argv, quoting words with
    # spaces (`\"` inside): these paths have none, so cmd.exe gets plain words.
    words = [_winpath(WINE_PYTHON), "-S", _winpath(CHILD), "tree", token]
    assert not any(" " in w for w in words), words
    p = subprocess.Popen(["wine", comspec, "/c", *words], stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        words = p.stdout.readline().split()
        assert words[:1] == ["pids"], words
        linux_procs.adopt(p.pid)  # `wine` became the launcher (or cmd.exe): same Linux pid
        deadline = time.monotonic() + 10
        while True:
            mine = [q for q in linux_procs.find(token) if q != p.pid]
            # The tree: _child.py's own processes. cmd.exe, the launcher and the
            # wrapper's Python carry the same text inside their /c command line.
            tree = [q for q in mine if "cmd.exe" not in linux_procs.cmdline(q)]
            if len(tree) >= 2 or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        assert len(tree) == 2, [linux_procs.cmdline(q) for q in mine]
    except BaseException:
        linux_procs.kill(p.pid)
        p.wait(10)
        raise
    return p, tree, mine


def _python_of_the_wrapper(linux_procs, mine: list[int]) -> int:
    """The wrapper's Python: its command line runs the launcher file as a script."""
    found = [q for q in mine
             if linux_procs.cmdline(q).lstrip('"').lower().startswith(_winpath(WINE_PYTHON).lower())
             and "tether-cmd.exe" in linux_procs.cmdline(q)]
    assert len(found) == 1, [linux_procs.cmdline(q) for q in mine]
    return found[0]


@pytest.mark.parametrize("target", ["launcher", "wrapper-python"])
def test_sigkill_of_tether_cmd_ends_child_and_grandchild(linux_procs, token, target):
    p, tree, mine = _start(linux_procs, TETHER_CMD, token)
    victim = p.pid if target == "launcher" else _python_of_the_wrapper(linux_procs, mine)
    assert all(linux_procs.alive(q) for q in tree)
    assert linux_procs.is_same(victim)
    os.kill(victim, signal.SIGKILL)
    t0 = time.monotonic()
    assert linux_procs.wait_gone(tree, 3.0) == []
    assert time.monotonic() - t0 < 3.0
    p.wait(10)
    p.stdout.close()


def test_control_sigkill_of_cmd_exe_leaves_the_tree(linux_procs, token):
    # The full path: `wine cmd.exe` would run it through Wine's start.exe,
    # whose Linux command line does not carry the token whole.
    p, tree, _ = _start(linux_procs, "C:\\windows\\system32\\cmd.exe", token)
    assert linux_procs.is_same(p.pid)
    os.kill(p.pid, signal.SIGKILL)
    assert p.wait(10) == -signal.SIGKILL
    p.stdout.close()
    assert sorted(linux_procs.wait_gone(tree, 1.0)) == sorted(tree)
