"""Bad input gets one clear line and a documented exit status, and loses
nothing: empty or relative state directories, an unreadable one, a
TETHER_STATE_DIR that is relative, and running out of file descriptors
while listing a job's members (an error, never an empty list)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest
from procutil import POSIX_MECHS, SRC, available

from tether import Job

pytestmark = [pytest.mark.timeout(60)]
TETHER = [sys.executable, "-m", "tether"]


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("TETHER_STATE_DIR", None)
    env.update(extra)
    return env


@pytest.mark.parametrize("args,code,word", [
    (["reap", "--state-dir", ""], 2, "must not be empty"),
    (["reap", "--state-dir", "relative/dir"], 2, "absolute path"),
    (["ps", "--state-dir", ""], 2, "must not be empty"),
    (["ps", "--state-dir", "relative/dir"], 2, "absolute path"),
    (["run", "--state-dir", "", "--", "true"], 125, "must not be empty"),
    (["run", "--state-dir", "relative/dir", "--", "true"], 125, "absolute path"),
    (["run", "--grace", "inf", "--", "true"], 125, "grace"),
    (["reap", "--grace", "1e308"], 2, "grace"),
])
def test_bad_state_dirs_and_graces_are_usage_errors(tmp_path, args, code, word):
    r = subprocess.run(TETHER + args, capture_output=True, text=True, timeout=30, cwd=tmp_path,
                       env=_env())
    assert r.returncode == code, (r.stdout, r.stderr)
    assert word in r.stderr
    assert os.listdir(tmp_path) == []  # nothing written where the user happened to be


@pytest.mark.parametrize("cmd,code", [(["reap"], 2), (["ps"], 2), (["run", "--", "true"], 125)])
def test_a_relative_tether_state_dir_is_a_usage_error(tmp_path, cmd, code):
    r = subprocess.run(TETHER + cmd, capture_output=True, text=True, timeout=30, cwd=tmp_path,
                       env=_env(TETHER_STATE_DIR="rel"))
    assert r.returncode == code and "TETHER_STATE_DIR" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and os.listdir(tmp_path) == []
    # Control: an absolute one is used.
    good = tmp_path / "good"
    r = subprocess.run(TETHER + cmd, capture_output=True, text=True, timeout=30, cwd=tmp_path,
                       env=_env(TETHER_STATE_DIR=str(good)))
    assert r.returncode == 0, r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user (nobody)")
def test_reap_of_an_unreadable_state_dir_is_exit_2_not_a_traceback(tmp_path):
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    import shutil

    runuser = shutil.which("runuser")
    if runuser is None:
        pytest.skip("util-linux runuser is not installed")
    r = subprocess.run([runuser, "-u", "nobody", "--", "/bin/sh", "-c",
                        'cd / && exec "$0" -m tether reap --state-dir "$1"', "/usr/bin/python3",
                        str(closed / "state")],
                       capture_output=True, text=True, timeout=30,
                       env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"})
    if "No module named" in r.stderr:
        pytest.skip("the checkout is not readable by nobody")
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "cannot read the audit log" in r.stderr


@pytest.mark.mechanism
@pytest.mark.parametrize("mech", POSIX_MECHS)
def test_fd_exhaustion_is_an_error_not_an_empty_member_list(mech):
    if not available(mech):
        pytest.skip(f"{mech} not available here")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with Job(mechanism=mech) as job:
        p = job.popen(["sleep", "30"], stdin=subprocess.DEVNULL)
        assert [m.pid for m in job.members()] == [p.pid]  # control: listed
        hog: list[int] = []
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 256), hard))
            try:
                while True:
                    hog.append(os.open("/dev/null", os.O_RDONLY))
            except OSError:
                pass
            with pytest.raises(OSError) as err:
                job.members()
            assert err.value.errno in (23, 24)
        finally:
            for fd in hog:
                os.close(fd)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert [m.pid for m in job.members()] == [p.pid]
