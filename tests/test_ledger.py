"""The live-task ledger and its Claude Code stream-json adapter.

``tests/data/claude_stream_sample.jsonl`` holds stream lines in the shapes
Claude Code writes (see the mapping table in ``tether/ledger.py`` for the
sources): a background bash task whose notification fires twice, a sub-agent
with progress and a ``task_updated``, a killed dev server, a failed command, a
notification for a task never started, a ``result`` line and a broken line.

The real-process tests use a real ``Job`` as the ledger's source of members:
the ledger must believe those members over the stream. Every process carries
the ``procs`` fixture's mark and is ended by its finalizer.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from procutil import poll_until as wait_until

from tether import Job, gate, identity, ledger
from tether.ledger import STREAM_MAPPING, Ledger, StreamAdapter

SAMPLE = Path(__file__).parent / "data" / "claude_stream_sample.jsonl"
LINUX = sys.platform.startswith("linux")


def lines() -> list[str]:
    return SAMPLE.read_text().splitlines()



def started_line(task_id: str, description: str) -> str:
    return json.dumps({"type": "system", "subtype": "task_started", "task_id": task_id,
                       "tool_use_id": "toolu_01", "description": description,
                       "task_type": "local_bash", "session_id": "s"})


def notification_line(task_id: str, status: str = "completed") -> str:
    return json.dumps({"type": "system", "subtype": "task_notification", "task_id": task_id,
                       "tool_use_id": "toolu_01", "status": status,
                       "output_file": f"/tmp/{task_id}.output", "summary": "done",
                       "session_id": "s"})


# ---------------------------------------------------------------------------
# the mapping, from recorded lines (no processes: the stream alone)


def test_the_mapping_table_is_the_one_documented() -> None:
    # Issue 15: background_tasks_changed joined the table.
    assert set(STREAM_MAPPING) == {"task_started", "task_progress", "task_notification",
                                   "task_updated", "background_tasks_changed"}
    for subtype in STREAM_MAPPING:
        assert subtype in ledger.__doc__
    assert ledger.TERMINAL_STATUSES >= {"completed", "failed", "stopped", "killed"}


def test_sample_stream_maps_to_ledger_calls() -> None:
    led = Ledger()  # no members: the stream is all there is
    ad = StreamAdapter(led)
    seen = []
    for line in lines():
        task = ad.feed(line)
        seen.append(task.task_id if task is not None else None)
    assert seen == [
        None,  # init
        "buyj7z5o7",  # task_started (local_bash)
        "a3ae4e60e5d3e37a2",  # task_started (local_agent)
        "a3ae4e60e5d3e37a2",  # task_progress
        "buyj7z5o7",  # task_notification
        None,  # result
        "buyj7z5o7",  # task_notification again (claude-code #74982)
        None,  # task_updated, status running: not terminal
        "a3ae4e60e5d3e37a2",  # task_updated, completed
        "a3ae4e60e5d3e37a2",  # task_notification
        "bwfnw0614",  # task_started
        "bwfnw0614",  # task_updated, killed
        "bao4ntmse",  # task_started
        None,  # notification for a task never started
        "bao4ntmse",  # task_notification, failed
        None,  # not JSON
    ]
    assert (ad.lines, ad.used, ad.ignored, ad.malformed) == (16, 11, 4, 1)
    assert ad.session_id == "40746b0a-41c2-4f62-9ea6-d683612ad9ae"
    by_id = {t.task_id: t for t in led.tasks()}
    assert list(by_id) == ["buyj7z5o7", "a3ae4e60e5d3e37a2", "bwfnw0614", "bao4ntmse"]
    assert by_id["buyj7z5o7"].label == "Sleep 3 seconds then print bg_task_done"
    assert by_id["buyj7z5o7"].kind == "local_bash" and by_id["a3ae4e60e5d3e37a2"].kind == "local_agent"
    assert by_id["buyj7z5o7"].notifications == 2 and by_id["buyj7z5o7"].status == "completed"
    assert by_id["bwfnw0614"].status == "killed" and by_id["bao4ntmse"].status == "failed"
    assert led.live() == [] and led.idle()
    assert "zzz" not in by_id


def test_a_failing_on_change_callback_is_logged_and_the_ledger_goes_on(caplog) -> None:
    # It was swallowed without a word: an app never learnt its callback broke.
    def broken(task):
        raise RuntimeError("app bug")

    led = Ledger(on_change=broken)
    with caplog.at_level("ERROR", logger="tether.ledger"):
        led.started("t1", "npm test")
        led.finished("t1")
    assert [t.task_id for t in led.tasks()] == ["t1"]
    failed = [r for r in caplog.records if r.name == "tether.ledger"]
    assert len(failed) == 2 and "t1" in failed[0].getMessage() and failed[0].exc_info
    # the control: a callback that works logs nothing
    caplog.clear()
    seen = []
    Ledger(on_change=seen.append).started("t2")
    assert seen and not [r for r in caplog.records if r.name == "tether.ledger"]


def test_tasks_are_live_until_the_stream_says_otherwise() -> None:
    led = Ledger()
    ad = StreamAdapter(led)
    for line in lines()[:4]:
        ad.feed(line)
    assert [t.task_id for t in led.live()] == ["buyj7z5o7", "a3ae4e60e5d3e37a2"]
    ad.feed(lines()[4])
    assert [t.task_id for t in led.live()] == ["a3ae4e60e5d3e37a2"]
    assert len(led) == 1


def test_adapter_takes_bytes_and_survives_odd_lines() -> None:
    led = Ledger()
    ad = StreamAdapter(led)
    assert ad.feed(started_line("t1", "x").encode()) is not None
    for odd in ("", "   ", "[1, 2]", "{\"type\": \"system\"}", "{\"type\": \"system\", "
                "\"subtype\": \"task_started\", \"task_id\": [1]}", "\xff{"):
        assert ad.feed(odd) is None
    assert ad.feed(b"\xff\xfe") is None  # undecodable bytes: replaced, then not JSON
    # A progress line for a task whose start was missed opens it.
    t = ad.feed(json.dumps({"type": "system", "subtype": "task_progress", "task_id": "late",
                            "description": "Running tests"}))
    assert t is not None and t.label == "Running tests" and t.live
    # A notification without a status counts as completed.
    t = ad.feed(json.dumps({"type": "system", "subtype": "task_notification", "task_id": "t1"}))
    assert t.status == "completed"
    long = "x" * 500
    assert len(led.started("t2", long).label) == ledger.MAX_LABEL


def test_follow_reads_until_eof() -> None:
    import io

    led = Ledger()
    ad = StreamAdapter(led)
    ad.follow(io.StringIO("\n".join(lines()) + "\n"))
    assert ad.lines == 16 and len(led.tasks()) == 4


def test_stopped_and_repeated_notifications() -> None:
    led = Ledger()
    led.started("a", "A")
    led.started("b", "B")
    assert led.finished("nope") is None
    assert led.finished("a").notifications == 1
    assert led.finished("a").notifications == 2
    ended = led.stopped("user request")
    assert [t.task_id for t in ended] == ["b"] and ended[0].status == "user request"
    assert led.idle() and led.stopped() == []
    # Started again under the same id: a fresh, live task.
    assert led.started("a", "A again").live and len(led) == 1


# ---------------------------------------------------------------------------
# members over the stream: real processes


@pytest.fixture
def job(procs):
    j = Job(name="ledger-test", grace=0.2)
    yield j
    j.close()


linux_only = pytest.mark.skipif(not LINUX, reason="real processes, Linux")


@linux_only
def test_early_notification_does_not_end_a_task_whose_process_runs(procs, job) -> None:
    led = Ledger(job.members)
    ad = StreamAdapter(led)
    agent = job.popen(["sleep", "300"], stdin=subprocess.DEVNULL, env=procs.env())
    time.sleep(0.4)  # the agent is older than the task's window
    ad.feed(started_line("b1", "npm run build"))
    build = job.popen(["/bin/sh", "-c", "sleep 300 & wait"], stdin=subprocess.DEVNULL,
                      env=procs.env())
    assert wait_until(lambda: len(job.members()) >= 3)
    ad.feed(notification_line("b1"))  # fires before the process exited
    live = led.live()
    assert [t.task_id for t in live] == ["b1"]
    owned = {i.pid for i in live[0].live_processes()}
    assert build.pid in owned and len(owned) == 2  # the shell and its child (rule 1)
    assert agent.pid not in owned
    build.kill()
    for i in live[0].live_processes():
        if i.pid != build.pid:
            gate.send_signal(i, 9, member=True)
    assert wait_until(led.idle, 3)
    assert led.get("b1").finished is not None
    assert agent.poll() is None  # the agent was never the task's


@linux_only
def test_not_a_task_and_explicit_pids(procs, job) -> None:
    led = Ledger(job.members)
    a = job.popen(["sleep", "300"], stdin=subprocess.DEVNULL, env=procs.env())
    led.not_a_task(identity.read(a.pid))
    led.started("t", "window task")  # the agent is born inside the window, yet not a task's
    b = job.popen(["sleep", "300"], stdin=subprocess.DEVNULL, env=procs.env())
    assert wait_until(lambda: len(job.members()) >= 2)
    led.live()
    assert set(led.get("t").processes) == {b.pid}
    c = job.popen(["sleep", "300"], stdin=subprocess.DEVNULL, env=procs.env())
    led.started("e", "explicit", pids=[c.pid])
    d = job.popen(["sleep", "300"], stdin=subprocess.DEVNULL, env=procs.env())
    assert wait_until(lambda: len(job.members()) >= 4)
    led.live()
    assert set(led.get("e").processes) == {c.pid}  # no window claims for an explicit task
    assert d.pid in led.get("t").processes
    led.finished("e")
    assert led.get("e") in led.live()
    c.kill()
    c.wait(3)
    assert wait_until(lambda: led.get("e") not in led.live())


def test_two_tasks_started_in_one_tick_the_later_one_claims(procs, job) -> None:
    """A process born after two tasks started within the same clock tick
    belongs to the later one (the test of a host's ambient watcher met it:
    a build went to the watcher, about one run in two of CI's Python-keeper
    pass). Both orders: the old rule gave it to whichever was started first."""
    for later in ("b", "a"):
        led = Ledger(job.members)
        first, second = ("a", "b") if later == "b" else ("b", "a")
        led.started(first, "earlier")
        led.started(second, "later")
        tick = led.get("a").started_ticks
        led.get("b").started_ticks = tick  # one tick, as on a fast machine
        p = job.popen(["sleep", "300"], stdin=subprocess.DEVNULL, env=procs.env())
        assert wait_until(lambda p=p: any(m.pid == p.pid for m in job.members()))
        led.live()
        assert p.pid in led.get(later).processes, later
        assert p.pid not in led.get("b" if later == "a" else "a").processes
        p.kill()
        p.wait(5)


@linux_only
def test_wait_idle_is_bounded_and_wakes_on_exit(procs, job) -> None:
    led = Ledger(job.members)
    led.started("b", "build")
    p = job.popen(["sleep", "300"], stdin=subprocess.DEVNULL, env=procs.env())
    assert wait_until(lambda: len(job.members()) == 1)
    led.finished("b")
    t0 = time.monotonic()
    assert led.wait_idle(0.3) is False
    assert 0.25 <= time.monotonic() - t0 < 2
    threading.Timer(0.2, p.kill).start()
    t0 = time.monotonic()
    assert led.wait_idle(5) is True
    assert time.monotonic() - t0 < 3


@linux_only
def test_a_closed_job_has_nothing_to_hold(procs) -> None:
    j = Job(name="ledger-closed", grace=0.1)
    led = Ledger(j.members)
    led.started("b", "build")
    j.popen(["sleep", "300"], stdin=subprocess.DEVNULL, env=procs.env())
    assert wait_until(lambda: len(j.members()) == 1)
    led.finished("b")
    assert not led.idle()
    j.close()
    assert wait_until(led.idle)


# ---------------------------------------------------------------------------
# the live background set, backgrounding and ambient tasks (newer Claude Code streams)

BACKGROUND = Path(__file__).parent / "data" / "claude_stream_background.jsonl"


def test_background_set_backgrounding_and_ambient_from_recorded_lines() -> None:
    led = Ledger()
    ad = StreamAdapter(led)
    got = [ad.feed(line) for line in BACKGROUND.read_text().splitlines()]
    assert ad.malformed == 0 and ad.sets == 3
    assert got[0] is None and got[-1] is not None  # the empty set still retired the watcher
    by_id = {t.task_id: t for t in led.tasks()}
    dev, watch, review, fg = (by_id[k] for k in ("bk3m9x2a1", "amb7w4t0q", "a9f8e7d6c5b4a3921",
                                                  "fg0n1o2p3"))
    assert dev.backgrounded and not dev.ambient and dev.status == ledger.UNLISTED
    assert watch.ambient and watch.backgrounded and watch.status == ledger.UNLISTED
    # Listed before its task_started (the set is not ordered against it): the start
    # that follows updates the same task, it does not replace it.
    assert review.label == "Review the diff" and review.kind == "local_agent"
    assert review.status == "completed" and review.notifications == 1
    # A foreground task is never judged by the background set.
    assert fg.live and fg.said_finished is None and not fg.backgrounded
    assert [t.task_id for t in led.live()] == ["fg0n1o2p3"] and led.holding() == [fg]


def test_ambient_tasks_are_live_but_never_hold() -> None:
    led = Ledger()
    ad = StreamAdapter(led)
    ad.feed(json.dumps({"type": "system", "subtype": "task_started", "task_id": "w",
                        "description": "watch", "ambient": True, "session_id": "s"}))
    assert [t.task_id for t in led.live()] == ["w"] and led.holding() == []
    ad.feed(notification_line("w"))
    assert not led.live()  # said finished, no process: over
    led.started("x", "x")
    led.set_ambient("x", True)
    assert led.holding() == [] and led.live()[0].ambient


def test_snapshot_round_trips_through_restore_and_assign() -> None:
    from tether.identity import Identity

    led = Ledger(claim_slack=0.0)
    t = led.started("b", "npm run build", kind="local_bash")
    t.processes[4242] = Identity(4242, t.started_ticks + 5, "boot")
    led.started("a", "watch", ambient=True).started_ticks = t.started_ticks + 100
    snap = led.snapshot()
    assert [r["id"] for r in snap] == ["b", "a"] and snap[1]["ambient"] is True
    json.dumps(snap)
    back = Ledger.restore(snap, "boot", claim_slack=0.0)
    (b, a) = back.tasks()
    assert (b.label, b.kind, a.ambient) == ("npm run build", "local_bash", True)
    assert abs(b.started - t.started) < 1e-6 and b.runtime_s >= 0
    # Owned by record, by parent (rule 1), by the window (rule 2, the latest task).
    owned = Identity(4242, t.started_ticks + 5, "boot")
    child = Identity(4243, t.started_ticks + 6, "boot", ppid=4242)
    late = Identity(5000, a.started_ticks + 10, "boot", ppid=1)
    before = Identity(6000, 0, "boot", ppid=1)
    got = back.assign([owned, child, late, before])
    assert got[(4242, owned.start)] is b and got[(4243, child.start)] is b
    assert got[(5000, late.start)] is a and (6000, 0) not in got
