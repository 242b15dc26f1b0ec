"""`tether run` on Windows, for real under Wine: ``python -m tether run -- CMD``.

Exit codes pass through (all 32 bits of them), a missing program is 127,
what the command leaves behind is ended when it exits, and if tether itself
is killed (TerminateProcess, as Task Manager's "End task") the kernel ends
the job. Each kill has a control: the same tree under a plain Python wrapper
survives the same kill. (SIGKILL of tether's Linux process: test_lane_sigkill.py.)
Ctrl+C cannot be sent under Wine 8 (GenerateConsoleCtrlEvent is not
implemented there); docs/windows.md says so.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.wine
PIPE = subprocess.PIPE
TETHER_RUN = [sys.executable, "-m", "tether", "run", "--"]
# The control: a wrapper that starts the command and waits, with no job.
PLAIN_RUN = [sys.executable, "-S", "-c",
             "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))"]


def _py(code: str) -> list[str]:
    return [sys.executable, "-S", "-c", code]


# (what the command passes to sys.exit, the exit code Windows reports): Python
# takes a signed 32-bit int; 0xC000013A is what a process ended by Ctrl+C returns.
# (0 is the leftovers test's exit code.)
@pytest.mark.parametrize("arg,code", [(3, 3), (300, 300), (-1073741510, 0xC000013A)])
def test_exit_code_passes_through(tracker, arg, code):
    p = tracker.popen(subprocess.Popen(
        TETHER_RUN + _py(f"import sys; print('out'); sys.exit({arg})"), stdout=PIPE, text=True,
    ))
    out, _ = p.communicate(timeout=60)
    assert out == "out\n"
    assert p.returncode == code


def test_missing_command_is_127(tracker):
    p = tracker.popen(subprocess.Popen(
        TETHER_RUN + [r"C:\no\such\program.exe"], stdout=PIPE, stderr=PIPE, text=True,
    ))
    _, err = p.communicate(timeout=60)
    assert p.returncode == 127 and "command not found" in err


@pytest.mark.parametrize("runner", ["tether", "plain"])
def test_leftovers_end_when_the_command_exits(tracker, child_cmd, token, runner):
    wrapper = TETHER_RUN if runner == "tether" else PLAIN_RUN
    p = tracker.popen(subprocess.Popen(wrapper + child_cmd("orphan", token), stdout=PIPE, text=True))
    _, child, grandchild = tracker.first_line(p).split()
    leftover = tracker.open(int(grandchild), token)
    assert p.wait(60) == 0
    if runner == "tether":
        assert tracker.wait_gone([leftover], 3.0) == []
    else:  # the control: without tether the grandchild outlives the command
        assert tracker.wait_gone([leftover], 1.0) == [leftover]


@pytest.mark.parametrize("runner", ["tether", "plain"])
def test_killing_tether_ends_the_job(tracker, api, child_cmd, token, runner):
    wrapper = TETHER_RUN if runner == "tether" else PLAIN_RUN
    p = tracker.popen(subprocess.Popen(wrapper + child_cmd("tree", token), stdout=PIPE, text=True))
    _, child, grandchild = tracker.first_line(p).split()
    tree = [tracker.open(int(child), token), tracker.open(int(grandchild), token)]
    api.TerminateProcess(int(p._handle), 9)  # what Task Manager's "End task" does
    assert p.wait(10) == 9
    if runner == "tether":
        assert tracker.wait_gone(tree, 3.0) == []
    else:
        assert tracker.wait_gone(tree, 1.0) == tree


def test_die_with_stdin_ends_the_job_when_the_writer_goes(tracker, child_cmd, token):
    run = [sys.executable, "-m", "tether", "run", "--die-with-stdin", "--grace", "0.2", "--"]
    p = tracker.popen(subprocess.Popen(run + child_cmd("tree", token), stdin=PIPE, stdout=PIPE,
                                       text=True))
    _, child, grandchild = tracker.first_line(p).split()
    tree = [tracker.open(int(child), token), tracker.open(int(grandchild), token)]
    assert tracker.wait_gone(tree, 0.5) == tree  # stdin still open: the job runs on
    p.stdin.close()
    assert p.wait(30) == 129  # as for SIGHUP on POSIX
    assert tracker.wait_gone(tree, 3.0) == []


@pytest.mark.parametrize("option,via", [("--die-with-parent", "python"), ("control", "python"),
                                        ("--die-with-parent", "tether.exe")])
def test_die_with_parent_ends_the_job_when_the_parent_is_killed(tracker, api, child_cmd, token,
                                                                option, via):
    """The app (here a Python parent) is killed (TerminateProcess): with
    --die-with-parent, tether ends the job; the control, without it, leaves
    tether and the tree running (tether was not killed, only its parent).
    Through pip's tether.exe the watched parent is the app, not the launcher."""
    import os

    exe = os.path.join(os.environ.get("TETHER_LANE_SCRIPTS", ""), "tether.exe")
    if via == "tether.exe" and not os.path.exists(exe):
        pytest.skip("no lane launcher (TETHER_LANE_SCRIPTS)")
    head = [exe] if via == "tether.exe" else [sys.executable, "-m", "tether"]
    run = [*head, "run", *([option] if option != "control" else []), "--"]
    app = _py("import subprocess, sys, time; subprocess.Popen(sys.argv[1:]); time.sleep(600)")
    p = tracker.popen(subprocess.Popen(app + run + child_cmd("tree", token), stdout=PIPE, text=True))
    _, child, grandchild = tracker.first_line(p).split()
    tree = [tracker.open(int(child), token), tracker.open(int(grandchild), token)]
    assert tracker.wait_gone(tree, 0.5) == tree  # the parent lives: the job runs on
    api.TerminateProcess(int(p._handle), 9)
    assert p.wait(10) == 9
    if option == "control":
        assert tracker.wait_gone(tree, 1.0) == tree
    else:
        assert tracker.wait_gone(tree, 5.0) == []


def test_die_with_parent_and_lifeline_bad_input(tracker):
    for args, words in ((["--lifeline", "2"], "3 or more"), (["--lifeline", "97"], "not an open")):
        p = tracker.popen(subprocess.Popen([sys.executable, "-m", "tether", "run", *args, "--",
                                            "cmd", "/c", "exit 0"], stderr=PIPE, text=True))
        _, err = p.communicate(timeout=60)
        assert p.returncode == 125 and words in err and err.count("\n") == 1, err


# tether with the read end of a pipe as its C runtime fd 3 (as Node's stdio[3]
# makes it): Python's subprocess passes no fd past 2 on Windows, so the handle
# goes through the handle list and the launcher makes it fd 3 itself, in
# tether's own process, before tether's CLI reads its arguments.
_LIFELINE_LAUNCHER = (
    "import msvcrt, os, sys\n"
    "fd = msvcrt.open_osfhandle(int(sys.argv[1]), os.O_RDONLY)\n"
    "if fd != 3:\n"
    "    os.dup2(fd, 3, inheritable=False)\n"
    "    os.close(fd)\n"
    "from tether.cli import main\n"
    "sys.exit(main(sys.argv[2:]))\n"
)


def test_lifeline_pipe_closed_ends_the_job(tracker, child_cmd, token):
    """--lifeline 3: while the app holds the pipe's write end the job runs on
    (the control: the same check, seen alive); the app closes it, tether ends
    the job: the command's tree is gone, exit 137 (as for SIGKILL on POSIX)."""
    import msvcrt
    import os

    r, w = os.pipe()
    handle = msvcrt.get_osfhandle(r)
    os.set_handle_inheritable(handle, True)
    si = subprocess.STARTUPINFO(lpAttributeList={"handle_list": [handle]})
    try:
        p = tracker.popen(subprocess.Popen(
            [sys.executable, "-c", _LIFELINE_LAUNCHER, str(handle), "run", "--lifeline", "3",
             "--", *child_cmd("tree", token)], stdout=PIPE, text=True, startupinfo=si))
    finally:
        os.close(r)  # the app keeps only the write end
    _, child, grandchild = tracker.first_line(p).split()
    tree = [tracker.open(int(child), token), tracker.open(int(grandchild), token)]
    assert tracker.wait_gone(tree, 1.0) == tree  # the write end held: the job runs on
    assert p.poll() is None
    os.close(w)
    assert p.wait(30) == 128 + 9
    assert tracker.wait_gone(tree, 3.0) == []


def test_first_line_fails_in_bounded_time_and_names_stderr(tracker):
    """The control of ``tracker.first_line``: a command that never prints a
    line fails the test within its bound, with its stderr in the message
    (what pytest-wine.ini's rerun rule reads), instead of hanging the run."""
    import time

    quiet = _py("import sys, time; sys.stderr.write('said on stderr\\n'); sys.stderr.flush();"
                " time.sleep(60)")
    p = tracker.popen(subprocess.Popen(quiet, stdout=PIPE, text=True))
    t0 = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="no line in 8.0 s.*said on stderr"):
        tracker.first_line(p, timeout=8.0)
    assert time.monotonic() - t0 < 30
    p.kill()
    p.wait(10)
    with pytest.raises(pytest.fail.Exception, match="end of output"):
        tracker.first_line(p, timeout=5.0)
