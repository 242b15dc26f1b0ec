"""Shared fixtures for tests that start real processes.

Every process a test starts carries ``TETHER_TEST_MARK=<unique id>`` in its
environment. The ``procs`` fixture's finalizer ends every live process that
was born after the test began *and* carries that test's mark - nothing else,
ever - so a failing test leaves nothing running, escapees included.
The helpers live in ``procutil`` (a unique module name: tests/windows has a
conftest of its own).
"""

from __future__ import annotations

import os
import signal

import pytest
from procutil import Procs

# pytest-xdist workers start with SIGINT ignored, and an ignored signal is
# inherited across exec: every process a test started would ignore Ctrl+C.
# tether keeps what its caller ignores (on purpose), so tests about SIGINT
# need the runner to be an ordinary program: Python's default handler here.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _tether_settings_unchanged():
    """A test leaves tether's settings (TETHER_*, _TETHER_*) as it found
    them: a run that sets one for every worker (the sanitized keeper's
    _TETHER_NATIVE_HELPER) must keep it for every test."""
    def settings() -> dict:
        return {k: v for k, v in os.environ.items() if k.startswith(("TETHER_", "_TETHER_"))}

    before = settings()
    yield
    after = settings()
    if after != before:
        os.environ.update(before)
        for k in set(after) - set(before):
            del os.environ[k]
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        pytest.fail(f"the test changed tether's settings and left them so: {changed}")


@pytest.fixture
def procs():
    p = Procs()
    yield p
    p.cleanup()


def pytest_sessionfinish(session, exitstatus):
    """Tests that SIGKILL an owner and then its keeper (finalizers do, to
    leave nothing running) leave that job's emptied cgroup directories behind,
    which the next job opened under the same cgroup removes: after the last
    test, remove them the same way (empty, and proven stale: only ever
    directories of owners that are gone)."""
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        from tether import cgroupfs

        base, _why = cgroupfs.base_dir()
        if base is not None:
            cgroupfs.remove_stale_run_dirs(base)
    except Exception:  # noqa: BLE001 - tidying must never fail a run
        pass
