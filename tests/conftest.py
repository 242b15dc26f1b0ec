"""Shared fixtures for tests that start real processes.

Every process a test starts carries ``TETHER_TEST_MARK=<unique id>`` in its
environment. The ``procs`` fixture's finalizer ends every live process that
was born after the test began *and* carries that test's mark - nothing else,
ever - so a failing test leaves nothing running, escapees included.
The helpers live in ``procutil`` (a unique module name: tests/windows has a
conftest of its own).
"""

from __future__ import annotations

import pytest
from procutil import Procs


@pytest.fixture
def procs():
    p = Procs()
    yield p
    p.cleanup()
