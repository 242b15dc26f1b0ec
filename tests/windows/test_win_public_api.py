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
        _, child, grandchild = p.stdout.readline().split()
        tree = [tracker.open(int(child), token), tracker.open(int(grandchild), token)]
        assert sorted(job._backend.member_pids()) == sorted([int(child), int(grandchild)])
    assert tracker.wait_gone(tree, 3.0) == []


def test_members_are_identities_of_the_tree(tracker, child_cmd, token):
    with Job(name="api", grace=0.5) as job:
        p = tracker.popen(job.popen(child_cmd("tree", token), stdout=PIPE, text=True))
        _, child, grandchild = p.stdout.readline().split()
        tracker.open(int(child), token)
        tracker.open(int(grandchild), token)
        assert sorted(i.pid for i in job.members()) == sorted([int(child), int(grandchild)])


def test_run_captures_output_and_return_code(child_cmd, token):
    with Job(name="api") as job:
        done = job.run(child_cmd("echo", token, "4"), input="abc", capture_output=True, text=True,
                       timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (4, "ABC", "err")
