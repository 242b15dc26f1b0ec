"""``tether.Job`` on Windows (the public API over the Job Object backend), under Wine."""

from __future__ import annotations

import subprocess

import pytest

from tether import Job

pytestmark = pytest.mark.wine
PIPE = subprocess.PIPE


def test_job_picks_the_job_object_and_is_kernel_enforced():
    with Job(name="api") as job:
        assert job.mechanism == "jobobject"
        assert job.guarantee.kernel_enforced and job.guarantee.disabled is None


def test_leaving_the_block_ends_child_and_grandchild(tracker, child_cmd, token):
    with Job(name="api", grace=0.5) as job:
        p = tracker.popen(job.popen(child_cmd("tree", token), stdout=PIPE, text=True))
        _, child, grandchild = tracker.first_line(p).split()
        tree = [tracker.open(int(child), token), tracker.open(int(grandchild), token)]
        assert sorted(job._backend.member_pids()) == sorted([int(child), int(grandchild)])
    assert tracker.wait_gone(tree, 3.0) == []


def test_members_are_identities_of_the_tree(tracker, child_cmd, token):
    with Job(name="api", grace=0.5) as job:
        p = tracker.popen(job.popen(child_cmd("tree", token), stdout=PIPE, text=True))
        _, child, grandchild = tracker.first_line(p).split()
        tracker.open(int(child), token)
        tracker.open(int(grandchild), token)
        assert sorted(i.pid for i in job.members()) == sorted([int(child), int(grandchild)])


def test_run_captures_output_and_return_code(child_cmd, token):
    with Job(name="api") as job:
        done = job.run(child_cmd("echo", token, "4"), input="abc", capture_output=True, text=True,
                       timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (4, "ABC", "err")


def test_tether_run_timeout_ends_the_whole_tree(tracker, child_cmd, token, tmp_path):
    import threading
    import time

    import tether

    out = tmp_path / "out.txt"
    raised: list[BaseException] = []

    def call() -> None:
        with open(out, "w") as f:
            try:
                tether.run(child_cmd("tree", token), stdout=f, timeout=8)
            except BaseException as exc:  # noqa: BLE001 - checked below
                raised.append(exc)

    t = threading.Thread(target=call)
    t.start()
    deadline = time.monotonic() + 30
    while not (out.exists() and out.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    _, child, grandchild = out.read_text().split()
    tree = [tracker.open(int(child), token), tracker.open(int(grandchild), token)]
    assert all(tracker.alive(h) for h in tree)  # held open while it runs: the check can see it
    t.join(60)
    assert len(raised) == 1 and isinstance(raised[0], subprocess.TimeoutExpired), raised
    assert tracker.wait_gone(tree, 3.0) == []


def test_tether_popen_with_block_ends_what_the_command_left(tracker, child_cmd, token):
    import tether

    with tether.Popen(child_cmd("orphan", token), stdout=PIPE, text=True, grace=0.5) as p:
        _, child, grandchild = tracker.first_line(p).split()
        left = tracker.open(int(grandchild), token)
        assert p.wait(timeout=30) == 0
        assert int(grandchild) in p.job._backend.member_pids()  # wait() was the command's only
    assert p.job.closed
    assert tracker.wait_gone([left], 3.0) == []
