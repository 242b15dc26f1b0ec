"""``tether.run`` / ``tether.Popen``: subprocess's functions, one job per call.

Every process the commands start carries the test's mark (``procs.env()``):
``procs.alive()`` is the check, and the fixture's finalizer ends whatever a
failed check left. Each kind of ending has its control: the same tree under
``subprocess`` (or ``Job.run``, which kills only the command, as subprocess
does) is seen alive by the same check.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time

import pytest

import tether
from tether import Job

pytestmark = [pytest.mark.mechanism,
              pytest.mark.skipif(sys.platform == "win32", reason="POSIX shells (Wine lane: own)")]

# A command that leaves a grandchild behind (it keeps stdout and stderr open).
TREE = "sleep 300 & echo started"
HANGS = "sleep 300 & sleep 300"


def test_run_returns_like_subprocess_and_ends_what_the_command_left(procs):
    r = tether.run(["sh", "-c", TREE], capture_output=True, text=True, env=procs.env(), grace=0.5)
    assert isinstance(r, subprocess.CompletedProcess)
    assert (r.returncode, r.stdout, r.stderr) == (0, "started\n", "")
    assert r.args == ["sh", "-c", TREE]
    assert not procs.seen_alive(), "the leftover outlived tether.run"
    # Control: subprocess.run returns as soon as the command did (the leftover
    # does not hold its output: not captured), and the leftover lives on.
    subprocess.run(["sh", "-c", TREE], stdout=subprocess.DEVNULL, env=procs.env(), check=True)
    assert procs.wait_count(1), "control: the leftover should be alive under subprocess.run"


def test_run_does_not_wait_for_a_leftover_holding_the_pipes(procs):
    t0 = time.monotonic()
    r = tether.run(["sh", "-c", TREE], capture_output=True, env=procs.env(), grace=0.2)
    assert r.stdout == b"started\n"
    assert time.monotonic() - t0 < 10
    assert not procs.seen_alive()
    # Control: subprocess.run waits for the pipes' end, which the leftover holds.
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run(["sh", "-c", TREE], capture_output=True, env=procs.env(), timeout=1)


def test_run_timeout_ends_the_whole_tree(procs):
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as ei:
        tether.run(["sh", "-c", "echo partial; " + HANGS], capture_output=True, timeout=0.5,
                   env=procs.env())
    assert ei.value.timeout == 0.5
    assert ei.value.stdout == b"partial\n"
    assert time.monotonic() - t0 < 10
    assert not procs.seen_alive(), "tether.run's timeout left part of the tree"


def test_job_run_timeout_kills_only_the_command_as_documented(procs):
    # What Job.run (and subprocess.run) do: the control for the test above.
    with Job(mechanism="auto", grace=0) as job:
        t0 = time.monotonic()
        with pytest.raises(subprocess.TimeoutExpired):
            job.run(["sh", "-c", HANGS], capture_output=True, timeout=0.5, env=procs.env())
        # Returned although the grandchild still holds the pipes (no hang).
        assert time.monotonic() - t0 < 10
        left = procs.alive()  # dash forks both sleeps; only sh, the command, was killed
        assert left and {i.comm for i in left} == {"sleep"}, "they stay until the job ends"
    assert not procs.wait_all_dead(), "the job's end ended it"


def test_run_check_and_errors_are_subprocess_s(procs):
    with pytest.raises(subprocess.CalledProcessError) as ei:
        tether.run(["sh", "-c", TREE + "; exit 3"], check=True, stdout=subprocess.DEVNULL,
                   env=procs.env())
    assert ei.value.returncode == 3
    assert not procs.seen_alive()
    with pytest.raises(FileNotFoundError):
        tether.run(["no-such-program-tether-17"])
    r = tether.run(["cat"], input="in", capture_output=True, text=True)
    assert r.stdout == "in"


def test_run_keyboard_interrupt_ends_the_whole_tree(procs):
    def interrupt(*_):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(KeyboardInterrupt):
            tether.run(["sh", "-c", HANGS], env=procs.env())
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert not procs.seen_alive()


def test_popen_is_a_popen_whose_with_block_ends_the_tree(procs):
    with tether.Popen(["sh", "-c", "echo $$; " + TREE], stdout=subprocess.PIPE, text=True,
                      env=procs.env(), grace=0.5) as p:
        assert isinstance(p, tether.Popen) and isinstance(p, subprocess.Popen)
        assert p.stdout.readline().strip() == str(p.pid)
        assert p.stdout.readline() == "started\n"
        assert p.wait(timeout=10) == 0
        assert len(p.job.members()) == 1  # the leftover: wait() concerns the command only
    assert p.job.closed
    assert not procs.seen_alive()
    # Control: subprocess.Popen's with block leaves the leftover running.
    with subprocess.Popen(["sh", "-c", TREE], stdout=subprocess.DEVNULL, env=procs.env()) as q:
        q.wait(timeout=10)
    assert procs.wait_count(1)


def test_popen_with_block_that_raises_ends_the_tree_at_once(procs):
    with pytest.raises(RuntimeError), tether.Popen(["sh", "-c", HANGS], env=procs.env()) as p:
        assert procs.wait_count(3)
        raise RuntimeError("boom")
    assert p.returncode is not None
    assert not procs.seen_alive()


def test_popen_generic_at_run_time_and_spawn_errors():
    assert tether.Popen[str] is not None
    with pytest.raises(FileNotFoundError):
        tether.Popen(["no-such-program-tether-17"])


def test_create_subprocess_shell(procs):
    async def main() -> tuple[bytes | None, int | None, int]:
        with Job() as job:
            proc = await job.create_subprocess_shell(
                "echo $((6*7)); sleep 300 >/dev/null &", stdout=asyncio.subprocess.PIPE,
                env=procs.env())
            out, _ = await proc.communicate()
            return out, proc.returncode, len(job.members())

    out, code, left = asyncio.run(main())
    assert (out, code, left) == (b"42\n", 0, 1)
    assert not procs.wait_all_dead()
