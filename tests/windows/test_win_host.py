"""A host's background job when the host itself runs inside a Job Object, under Wine.

What a host starts is in the job the host runs in (``tether run``'s, pip's
launcher's, a CI runner's), and ends with it. A background job promises to
outlive its owner, so its processes must leave that job - or the background
job is refused and says why. Each case runs ``_host.py`` (a real
``tether.Host``) inside such a job, with the host's plain child as the
control that stays in the enclosing job.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

import pytest

from tether.platform import _winapi as w

pytestmark = pytest.mark.wine
PIPE = subprocess.PIPE
HERE = os.path.dirname(os.path.abspath(__file__))
HOST = os.path.join(HERE, "_host.py")
PY = sys.executable
KILL = w.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE


@pytest.fixture
def jobs(api):
    """``jobs(flags)``: a Job Object with these limit flags (closed at teardown:
    with kill-on-close that ends whatever is still in it)."""
    made: list[int] = []

    def make(flags: int) -> int:
        job = api.CreateJobObjectW(None, None)
        made.append(job)
        limits = w.JOBOBJECT_EXTENDED_LIMIT_INFORMATION()
        limits.BasicLimitInformation.LimitFlags = flags
        api.SetInformationJobObject(job, w.JobObjectExtendedLimitInformation,
                                    ctypes.byref(limits), ctypes.sizeof(limits))
        return job

    def close(job: int) -> None:
        made.remove(job)
        api.CloseHandle(job)

    make.close = close  # type: ignore[attr-defined]
    yield make
    for job in made:
        api.CloseHandle(job)


def _host(tracker, api, token, state, enclosing=(), argv_prefix=()):
    """Start _host.py (in the given jobs, outermost first); return (Popen, its report)."""
    flags = w.CREATE_SUSPENDED if enclosing else 0
    p = tracker.popen(subprocess.Popen([*argv_prefix, PY, "-S", HOST, token, str(state)],
                                       stdin=PIPE, stdout=PIPE, text=True, creationflags=flags))
    if enclosing:
        for job in enclosing:
            api.AssignProcessToJobObject(job, int(p._handle))
        assert api.NtResumeProcess(int(p._handle)) == 0
    line = tracker.first_line(p)
    assert line.startswith("{"), line
    return p, json.loads(line)


def test_under_tether_run_the_background_job_is_refused_and_says_why(tracker, api, token, tmp_path):
    """tether run's job forbids breakaway: nothing could outlive it, so nothing starts."""
    p, out = _host(tracker, api, token, tmp_path, argv_prefix=(PY, "-m", "tether", "run", "--"))
    assert out["enclosing_job"] is True and "background" not in out
    assert "would end with that Job Object instead of outliving their owner" in out["disabled"]
    assert out["disabled"] in out["refused"]  # popen's JobRefused gives the same reason
    plain = tracker.open(out["plain"], token)  # the host did run; its plain child is in tether run's job
    p.stdin.close()
    assert p.wait(30) == 0
    assert tracker.wait_gone([plain], 3.0) == []


def test_without_an_enclosing_job_the_background_job_outlives_the_host(tracker, api, token,
                                                                      tmp_path):
    p, out = _host(tracker, api, token, tmp_path)
    assert out["enclosing_job"] is False and out["leave"] is None and out["disabled"] is None
    assert out["ends_job"].startswith("nobody: a background job outlives its owner on purpose")
    bg = tracker.open(out["background"], token)
    # The host's plain child is in no job here: it outlives the host too, and
    # only the tracker's handle ends it (it was left running for 60 s).
    plain = tracker.open(out["plain"], token)
    api.TerminateProcess(int(p._handle), 9)
    assert p.wait(10) == 9
    assert tracker.wait_gone([bg], 1.0) == [bg]
    assert tracker.alive(plain)


@pytest.mark.parametrize("allow", ["BREAKAWAY_OK", "SILENT_BREAKAWAY_OK"])
def test_where_the_enclosing_job_lets_go_the_background_job_outlives_it(tracker, api, jobs, token,
                                                                        tmp_path, allow):
    """BREAKAWAY_OK (``CREATE_BREAKAWAY_FROM_JOB``) or SILENT_BREAKAWAY_OK (the
    flags pip's launcher sets): the background child leaves; closing the
    enclosing kill-on-close job ends the host - and, for BREAKAWAY_OK, the
    host's plain child (the control) - but not the background child."""
    flag = {"BREAKAWAY_OK": w.JOB_OBJECT_LIMIT_BREAKAWAY_OK,
            "SILENT_BREAKAWAY_OK": w.JOB_OBJECT_LIMIT_SILENT_BREAKAWAY_OK}[allow]
    job = jobs(KILL | flag)
    p, out = _host(tracker, api, token, tmp_path, enclosing=[job])
    assert out["enclosing_job"] is True and out["disabled"] is None, out
    assert "leave the Job Object the owner runs in" in out["leave"]
    assert out["leave"] in out["not_covered"]
    bg = tracker.open(out["background"], token)
    plain = tracker.open(out["plain"], token)
    jobs.close(job)  # kill-on-close: the enclosing job ends
    assert p.wait(10) is not None
    if allow == "BREAKAWAY_OK":  # a child that does not ask to leave stays, and ends with it
        assert tracker.wait_gone([plain], 3.0) == []
    assert tracker.wait_gone([bg], 1.0) == [bg]


def test_a_job_further_out_that_keeps_children_refuses_the_background_job(tracker, api, jobs,
                                                                         token, tmp_path):
    """The nearest job allows breakaway, the one around it does not: the child
    would leave only the inner one. IsProcessInJob tells, and tether refuses."""
    outer = jobs(KILL)
    inner = jobs(KILL | w.JOB_OBJECT_LIMIT_BREAKAWAY_OK)
    p, out = _host(tracker, api, token, tmp_path, enclosing=[outer, inner])
    assert "background" not in out and "the child stayed in a job" in out["disabled"], out
    plain = tracker.open(out["plain"], token)
    jobs.close(inner)
    jobs.close(outer)
    assert p.wait(10) is not None
    assert tracker.wait_gone([plain], 3.0) == []
