"""Type checkers see tether's public API (PEP 561 ``py.typed``), typed like
typeshed's ``subprocess``: ``mypy --strict`` on a small user program is clean,
and the same checker flags misuse (the control: a check that reports nothing
for a broken program would prove nothing).

tether is found as an installed, typed package (through PYTHONPATH, as mypy
finds packages on the interpreter's path): errors inside tether's own modules
are not the user's and are not reported, as for any library.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from procutil import ROOT, SRC

pytest.importorskip("mypy", reason="mypy is in the test extras: pip install -e '.[test]'")

DATA = os.path.join(ROOT, "tests", "data", "typed")


def mypy(path: str, tmp_path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=SRC)
    return subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-error-summary",
                           "--cache-dir", str(tmp_path / "cache"), path],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)


def test_py_typed_ships_with_the_package():
    assert os.path.isfile(os.path.join(SRC, "tether", "py.typed"))
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        text = f.read()
    # [tool.setuptools.package-data]: tether = [..., "py.typed", ...]
    assert re.search(r'^tether = \[[^\]]*"py\.typed"', text, re.M), text


def test_mypy_strict_is_clean_on_a_user_program(tmp_path):
    r = mypy(os.path.join(DATA, "user_program.py"), tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_flags_each_misuse(tmp_path):
    path = os.path.join(DATA, "misuse.py")
    with open(path) as f:
        want = {i for i, line in enumerate(f, 1) if "# error:" in line}
    r = mypy(path, tmp_path)
    got = {int(m.group(1)) for m in re.finditer(r"misuse\.py:(\d+): error:", r.stdout)}
    assert r.returncode == 1, r.stdout + r.stderr
    assert got == want, r.stdout


def test_mypy_is_clean_on_tethers_own_source(tmp_path):
    # The gate CI's lint step runs ([tool.mypy] in pyproject.toml: src/tether,
    # as Linux sees it, against Python 3.10; the public API modules with
    # --strict's checks). test_mypy_flags_each_misuse shows the checker reports.
    r = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache")],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Success: no issues found" in r.stdout


def test_mypy_config_makes_the_public_api_modules_strict():
    tomllib = pytest.importorskip("tomllib", reason="tomllib: Python 3.11+")

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        cfg = tomllib.load(f)["tool"]["mypy"]
    strict = [o for o in cfg["overrides"] if o.get("disallow_untyped_defs")]
    assert len(strict) == 1
    assert {"tether", "tether.job", "tether.errors", "tether.host"} <= set(strict[0]["module"])
    for flag in ("disallow_any_generics", "disallow_untyped_calls", "disallow_incomplete_defs",
                 "warn_return_any", "no_implicit_reexport", "strict_equality"):
        assert strict[0][flag] is True, flag
    assert cfg["files"] == ["src/tether"] and cfg["python_version"] == "3.10"
