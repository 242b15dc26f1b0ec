#!/usr/bin/env python3
"""An app that hosts agent sessions with tether.Host - every promise in one run.

    python examples/agent_host.py            # a few seconds; leaves nothing running

1. An earlier run of the app crashes so hard that tether's guardians die with
   it: its session chat-42 - the agent (examples/fake_agent.py, labelled
   "claude"), its MCP server, its shell, a 60-second `npm run build` - is left
   running, proven by nothing but the audit log.
2. This run starts: the reaper ends that leftover and ``host.session("chat-42")``
   says what it ended, in the app's words (the label, the ledger's task).
3. Live work from the job alone (no stream adapter): the agent's build is a
   process group of its own. An idle release is skipped while it runs - never
   capped - and, asked to wait, waits for it and proceeds.
4. The stream adapter: the build's "finished" comes early, yet the task stays
   live while its process runs; the agent's ambient file watcher holds nothing.
5. One copy per session key: a second instance of the app is refused
   chat-7 (naming the holder), then takes it over; the first instance can no
   longer launch into it.
6. Fail closed: without process-tree ownership every agent launch is refused.
7. A state directory tether refuses turns auditing off, not the app.
8. A background job outlives the app on purpose, until its own timeout; a
   detached launch is left alone by everyone.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from tether import Host, JobRefused, SessionHeld  # noqa: E402
from tether.ledger import StreamAdapter  # noqa: E402

APP = "agent-host-example"
AGENT = [sys.executable, str(Path(__file__).with_name("fake_agent.py"))]
# The example prints what the host reports; the host's log lines (warnings on
# stderr when logging is not configured) would only repeat it.
logging.getLogger("tether").addHandler(logging.NullHandler())


def start_agent(session, build: float, *, stream: bool = True, **flags: bool):
    argv = AGENT + ["--session-id", session.key, "--build", str(build), "--think", "0.4"]
    argv += [f"--{k.replace('_', '-')}" for k, on in flags.items() if on]
    p = session.popen(argv, stdout=subprocess.PIPE, text=True, label="claude")
    if stream:
        StreamAdapter(session.tasks).follow_in_thread(p.stdout)
    else:  # no adapter: read and drop, so that the agent never blocks on a full pipe
        threading.Thread(target=p.stdout.read, daemon=True).start()
    return p


def until(pred, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return bool(pred())


def crash_run(state_dir: str) -> None:
    """Phase 1 (a child process): run chat-42, then die together with the guardians."""
    host = Host(APP, state_dir=state_dir)
    chat = host.session("chat-42")
    start_agent(chat, build=60)
    until(lambda: chat.tasks.live() and len(chat.tasks.live()[0].live_processes()) >= 2)
    print(json.dumps([m.pid for m in chat.members()]), flush=True)
    time.sleep(1.0)  # the build has been running a while
    for job in (chat.job, host.job):  # our own keepers, by the pid each job recorded
        os.kill(job.trace()["keeper_pid"], signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def second_instance(state_dir: str) -> None:
    """Phase 5 (a child process): another instance of the app wants chat-7."""
    with Host(APP, state_dir=state_dir, grace=0.5,
              announce=lambda plan: print("   announced:", plan.announcement())) as other:
        try:
            other.session("chat-7")
        except SessionHeld as exc:
            print("   refused:", exc)
        taken = other.session("chat-7", take_over=True)
        print("  ", taken.resumed)
        sys.stdout.flush()


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] in ("--crash-run", "--second-instance"):
        (crash_run if sys.argv[1] == "--crash-run" else second_instance)(sys.argv[2])
        return
    state_dir = tempfile.mkdtemp(prefix="tether-example-")
    t0 = time.monotonic()
    # Not subprocess.run(capture_output=True): what the crash leaves behind
    # would hold its pipes open; read the one line, then wait for the crash.
    crash = subprocess.Popen([sys.executable, __file__, "--crash-run", state_dir],
                             stdout=subprocess.PIPE, text=True)
    left = json.loads(crash.stdout.readline())
    crash.wait(10)
    crash.stdout.close()
    print(f"1. an earlier run crashed with its guardians: {len(left)} processes of chat-42 "
          "left running")

    with Host(APP, state_dir=state_dir, grace=0.5, task_cap=10.0,
              announce=lambda plan: print("   announced:", plan.announcement())) as host:
        g = host.guarantee
        print(f"2. this run is protected by {g.mechanism} "
              f"({'kernel' if g.kernel_enforced else 'guardian'}-enforced); "
              f"the reaper ended {len(host.reap_report.ended)} leftover(s)")
        chat = host.session("chat-42")
        print("  ", chat.resumed)

        start_agent(chat, build=1.5, stream=False)
        # (both of the build's processes: the shell, and its sleep - a group
        # seen between the agent's fork and the shell's exec is not one yet)
        until(lambda: any(w.members >= 2 for w in chat.live_work()))
        for w in chat.live_work():
            print(f"3. live work, no adapter: `{w.label}` ({w.members} processes, running "
                  f"{w.runtime_s:.1f}s, tool call over: {w.outlived})")
        print("  ", chat.stop("idle release", optional=True).note)
        r = chat.stop("idle release", optional=True, wait=True)
        print("   waited, then:", r)

        seven = host.session("chat-7")
        start_agent(seven, build=60, early_notify=True, watcher=True)
        until(lambda: any(t.notifications for t in seven.tasks.tasks()))
        build = next(t for t in seven.tasks.tasks() if t.label == "npm run build")
        watcher = next(t for t in seven.tasks.tasks() if t.ambient)
        print(f"4. stream: `{build.label}` said {build.status!r} early; still live: "
              f"{build in seven.tasks.live()}; ambient `{watcher.label}` holds: "
              f"{watcher in seven.tasks.holding()}")
        print("  ", seven.stop("idle release", optional=True).note)

        print("5. a second instance of the app asks for chat-7:")
        other = subprocess.run([sys.executable, __file__, "--second-instance", state_dir],
                               stdout=subprocess.PIPE, text=True, timeout=30)
        print(other.stdout, end="")
        try:
            seven.popen(["true"])
        except SessionHeld as exc:
            print("   this instance, launching into chat-7 again:", exc)

        with Host(APP + "-bare", state_dir=state_dir, mechanism="jobobject") as bare:
            try:
                bare.session("chat-1").popen(AGENT)
            except JobRefused as exc:
                print("6.", exc)

        shared = tempfile.mkdtemp(prefix="tether-shared-")
        os.chmod(shared, 0o777)
        with warnings.catch_warnings(record=True), Host(APP, state_dir=shared) as loose:
            print("7. audit off, app running:", loose.audit_error.replace(shared, "<dir>"))
        shutil.rmtree(shared)

        bg = host.background_job("thumbnails", cpu_percent=25, timeout=1.0)
        bg.popen(["sleep", "30"])
        print("8. background job:", ", ".join(bg.limits))
        ed = host.launch_detached(["sleep", "0.2"])
    # The host is closed; the background job is still running on purpose.
    print("   after the app: background job alive:", bool(bg.members()), end="; ")
    print("ended by its own timeout:", bg.wait(5), end="; ")
    ed.wait(5)
    print("detached launch exited by itself:", ed.returncode == 0)
    shutil.rmtree(state_dir)
    print(f"done in {time.monotonic() - t0:.1f}s")


if __name__ == "__main__":
    main()
