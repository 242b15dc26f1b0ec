"""Issue 36, the log and state items: a stepped wall clock decides nothing the
reaper ends (4), a full disk loses no job-open record silently (5), state
directories are ours or refused (8), bad input is refused and names from
/proc are printed escaped (9), and bounded resources (10).

Every process here is one this test started (the ``procs`` fixture ends it);
audit records name only those.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_reaper import Log, _dead_owner, do_reap

from tether import identity, reaper
from tether.identity import Identity

pytestmark = [pytest.mark.timeout(60)]

IS_LINUX = sys.platform.startswith("linux")
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _sleep_with(procs, env: dict[str, str] | None = None, argv0: str = "sleep"
                ) -> tuple[subprocess.Popen, Identity]:
    p = procs.popen([argv0, "300"], stdin=subprocess.DEVNULL,
                    env={**os.environ, **(env or {})})
    ident = identity.read(p.pid)
    assert ident is not None
    return p, ident


def _next_tick() -> None:
    """Wait until the boot clock has moved on by a tick: what starts after
    this has a later start tick than what started before."""
    t = identity.now_ticks()
    deadline = time.monotonic() + 2
    while identity.now_ticks() <= t + 1 and time.monotonic() < deadline:
        time.sleep(0.005)


# --------------------------------------------------------------------------
# 4. A stepped wall clock decides nothing


@pytest.mark.skipif(not IS_LINUX, reason="start ticks of the boot clock: Linux")
@pytest.mark.parametrize("step_s", [30.0, -3600.0, 0.0],
                         ids=["clock-stepped-back", "clock-stepped-forward", "no-step"])
def test_cookie_window_does_not_follow_the_wall_clock(procs, tmp_path: Path,
                                                      step_s: float) -> None:
    """A job-open record as a stepped clock writes it: its ``ts`` is ahead of
    the wall clock now by ``step_s`` (the clock stepped back after the record
    was written) or behind by an hour (it stepped forward). The keeper was
    SIGKILLed; a leftover that carries the job's cookie and was born after
    the keeper must be ended, and a process that carries the same cookie but
    was born before the keeper (so not the job's) must not.

    On the old code (the window drawn from ``ts``) the stepped-back case
    missed the leftover and said ok, and the stepped-forward case ended the
    process born before the job."""
    state = tmp_path / "state"
    owner = _dead_owner(procs)
    cookie = f"{owner.pid}-{owner.start}:j1:{secrets.token_hex(8)}"
    _next_tick()
    _, before = _sleep_with(procs, {identity.COOKIE_VAR: cookie})  # born before the job
    _next_tick()
    keeper_p, keeper = _sleep_with(procs)
    keeper_p.kill()
    keeper_p.wait(timeout=5)
    _next_tick()
    _, leftover = _sleep_with(procs, {identity.COOKIE_VAR: cookie})
    assert before.start < keeper.start < leftover.start

    log = Log(state, owner)
    log.w.close()
    rec = {"v": 1, "ts": time.time() + step_s, "event": "job-open", "run": log.run,
           "owner": log.owner, "job": "j1", "mechanism": "subreaper", "name": "j",
           "cookie": cookie, "cookie_var": identity.COOKIE_VAR,
           "keeper": {"pid": keeper.pid, "start": keeper.token()}}
    import json

    with open(state / "audit.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")

    report = do_reap(state)

    assert [e.pid for e in report.ended] == [leftover.pid], str(report)
    assert not identity.is_alive(leftover)
    # Control: a process with the cookie that predates the job is no leftover.
    assert identity.is_alive(before)
    assert report.ok


# --------------------------------------------------------------------------
# 9. Bad input


def _tether(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tether", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("args", [
    ("shell", "--install", ""),
    ("shell", "--install", "  "),
    ("reap", "--session", ""),
    ("reap", "--session", " \t"),
    ("reap", "--app", ""),
    ("reap", "--state-dir", ""),
    ("ps", "--state-dir", " "),
])
def test_empty_or_blank_paths_and_keys_are_usage_errors(tmp_path: Path, args) -> None:
    r = _tether(*args, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.strip(), "a usage error says what is wrong"
    assert list(tmp_path.iterdir()) == [], "nothing written"


def test_empty_or_blank_keys_in_the_api_are_value_errors(tmp_path: Path) -> None:
    from tether import _shellinstall
    from tether.errors import UsageError

    for bad in ("", "  "):
        with pytest.raises(ValueError):
            reaper.reap(tmp_path / "s", session=bad)
        with pytest.raises(ValueError):
            reaper.reap(tmp_path / "s", app=bad)
        with pytest.raises(UsageError):
            _shellinstall.install(bad)
    assert not (tmp_path / "s").exists()
    # Control: a real key and directory are accepted.
    assert reaper.reap(tmp_path / "s", session="k", cgroups=False).ok
    made = _shellinstall.install(str(tmp_path / "bin"), ("sh",))
    assert made == [str(tmp_path / "bin" / "sh")]


def test_host_session_key_blank_is_a_value_error(tmp_path: Path) -> None:
    from tether.host import Host

    with Host("t-blank", state_dir=tmp_path / "s", allow_unprotected=True) as h:
        for bad in ("", " ", "\t\n"):
            with pytest.raises(ValueError):
                h.session(bad)
        assert h.session("k").key == "k"  # control


@pytest.mark.skipif(not IS_LINUX, reason="/proc names")
def test_reap_prints_proc_names_escaped(procs, tmp_path: Path) -> None:
    """A leftover whose name (comm, from /proc) holds a terminal escape: the
    report's table shows it cleaned, the JSON keeps it as data."""
    state = tmp_path / "state"
    evil = "\x1b]0;pwn\x07\x1b[2J"
    link = tmp_path / evil
    link.symlink_to("/bin/sleep")
    p, ident = _sleep_with(procs, argv0=str(link))
    assert "\x1b" in ident.comm  # control: the kernel keeps the raw name
    owner = _dead_owner(procs)
    log = Log(state, owner)
    log.spawn(ident)
    report = do_reap(state, dry_run=True)
    assert [e.pid for e in report.ended] == [p.pid]
    assert report.ended[0].comm == ident.comm
    text = str(report)
    assert not any(c in text for c in "\x1b\x07"), repr(text)
    assert "]0;pwn" in text  # the printable rest stays
    r = _tether("reap", "--dry-run", "--state-dir", str(state), "--no-cgroups", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert str(p.pid) in r.stdout
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout
    p.kill()
