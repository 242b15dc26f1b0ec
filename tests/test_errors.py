"""Errors with a shape: one tree under TetherError, fields to act on, and bad
arguments raised as subprocess raises them."""

from __future__ import annotations

import subprocess
import sys

import pytest
from procutil import POSIX_MECHS, available

import tether
from tether import errors
from tether.job import Job

pytestmark = pytest.mark.timeout(60)


def test_every_tether_error_is_a_tether_error():
    names = [n for n in errors.__all__ if n != "TetherError"]
    assert names, "the tree is listed in errors.__all__"
    for name in names:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.TetherError), name
        assert getattr(tether, name) is cls  # and public
    from tether import _shellargs, audit, pty
    from tether.keeper import oneshot

    for cls in (_shellargs.UsageError, _shellargs.ShellNotFound, oneshot.Unavailable,
                audit.AuditDirError, pty.SessionClosing, pty.SessionClosed):
        assert issubclass(cls, errors.TetherError), cls
    assert errors.UsageError.code == 2 and errors.ShellNotFound.code == 127


def test_errors_carry_fields():
    e = errors.JobRefused("refused: no cgroup", reason="no cgroup", mechanism="cgroup", pid=7)
    assert (str(e), e.reason, e.mechanism, e.pid) == ("refused: no cgroup", "no cgroup", "cgroup", 7)
    assert errors.JobClosed("x").reason == "x" and errors.JobClosed("x").mechanism is None


def test_a_refused_mechanism_says_which_and_why():
    with pytest.raises(errors.JobRefused) as info:
        Job(mechanism="jobobject" if sys.platform != "win32" else "cgroup")
    assert info.value.mechanism in ("jobobject", "cgroup") and info.value.reason


@pytest.mark.skipif(not POSIX_MECHS, reason="POSIX mechanisms")
@pytest.mark.parametrize("mech", [m for m in POSIX_MECHS if available(m)])
def test_bad_arguments_raise_what_subprocess_raises(mech):
    cases = [
        (["echo", "a\0b"], {}),                        # ValueError: embedded null byte
        (["echo"], {"env": {"A=B": "1"}}),             # ValueError: illegal variable name
        ([], {}),                                      # IndexError in subprocess, as here
    ]
    with Job(mechanism=mech) as job:
        for args, kw in cases:
            with pytest.raises(Exception) as plain:
                subprocess.Popen(args, **kw)
            with pytest.raises(Exception) as ours:
                job.popen(args, **kw)
            assert type(ours.value) is type(plain.value), (args, kw, ours.value, plain.value)
            assert not isinstance(ours.value, errors.JobRefused)
        with pytest.raises(FileNotFoundError) as missing:
            job.popen(["/nonexistent/tether-test-program"])
        assert missing.value.filename == "/nonexistent/tether-test-program"
        assert isinstance(missing.value.filename, str)
        with pytest.raises(NotADirectoryError) as badcwd:
            job.popen(["true"], cwd="/etc/passwd")
        assert isinstance(badcwd.value.filename, str)
        # The job is unharmed: it still runs things.
        assert job.run(["true"]).returncode == 0


def test_a_closed_host_and_an_expired_job_have_their_own_types(tmp_path):
    assert not issubclass(errors.HostClosed, errors.JobRefused)
    assert not issubclass(errors.JobExpired, errors.JobRefused)
    if not sys.platform.startswith("linux"):
        pytest.skip("the host part needs a POSIX mechanism")
    h = tether.Host("errors-test", state_dir=tmp_path / "state", reap=False)
    h.close()
    with pytest.raises(errors.HostClosed):
        h.session("x")
