"""`tether doctor` on Windows, for real under Wine: it prints the Job Object
backend's own guarantee (from the one mechanism table), not a hand-written one."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.wine
DOCTOR = [sys.executable, "-m", "tether", "doctor"]


def test_doctor_prints_the_backends_own_guarantee():
    from tether.platform import guarantee, windows

    own = windows.guarantee().to_dict()
    assert own == guarantee("jobobject").to_dict()  # the table points at the module
    r = subprocess.run(DOCTOR + ["--json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["auto"] == "jobobject" and doc["strict"] == "jobobject"
    row = next(m for m in doc["mechanisms"] if m["mechanism"] == "jobobject")
    assert row["available"] is True
    assert row["guarantee"] == own
    assert own["kernel_enforced"] is True and own["not_covered"] == list(windows.NOT_COVERED)
    # The text form says the same, and never offers breakaway (tether never allows it).
    r = subprocess.run(DOCTOR, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for line in own["not_covered"]:
        assert f"not covered: {line}" in r.stdout
    assert own["ends_job"] in r.stdout
    assert "breakaway" not in r.stdout.lower()
