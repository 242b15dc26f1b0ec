#!/usr/bin/env python3
"""An app that hosts agent sessions with tether.Host - every feature in one run.

    python examples/agent_host.py            # a few seconds; leaves nothing running

1. An earlier run of the app "crashes" so hard that tether's guardians die
   with it (think: the whole machine's OOM killer): its session "alpha" -
   agent, MCP server, shell, build - is left running.
2. This run starts: the reaper ends that leftover; ``host.session("alpha")``
   reports what of alpha's earlier copy was ended (the resume rule).
3. Two sessions run examples/fake_agent.py; the agent's stream-json feeds the
   live-task ledger. Its build's "finished" notification comes early - the
   ledger keeps the build live while its process runs, so an idle release is
   skipped, then waits for the build and proceeds.
4. A person stops "beta": it goes through at once, announced before it ends.
5. A background job outlives the app on purpose, at low priority, until its
   own timeout; a detached launch is left alone by everyone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from tether import Host  # noqa: E402
from tether.ledger import StreamAdapter  # noqa: E402

APP = "agent-host-example"
AGENT = [sys.executable, str(Path(__file__).with_name("fake_agent.py"))]


def start_agent(session, build: float) -> subprocess.Popen:
    p = session.popen(AGENT + ["--session-id", session.key, "--build", str(build),
                               "--early-notify"],
                      stdout=subprocess.PIPE, text=True, label="fake_agent.py")
    StreamAdapter(session.tasks).follow_in_thread(p.stdout)
    return p


def crash_run(state_dir: str) -> None:
    """Phase 1 (in a child process): start alpha, then die with the guardians."""
    host = Host(APP, state_dir=state_dir)
    alpha = host.session("alpha")
    alpha.popen(AGENT + ["--session-id", "alpha", "--build", "60", "--think", "0"],
                stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 5
    while len(alpha.members()) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    print(json.dumps([m.pid for m in alpha.members()]), flush=True)
    # Our own keepers (forked children of this process, by recorded pid).
    for job in (alpha.job, host.job):
        os.kill(job.trace()["keeper_pid"], signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--crash-run":
        crash_run(sys.argv[2])
        return
    state_dir = tempfile.mkdtemp(prefix="tether-example-")
    # Not subprocess.run(capture_output=True): what the crash leaves behind
    # would hold its pipes open; read the one line, then wait for the crash.
    crash = subprocess.Popen([sys.executable, __file__, "--crash-run", state_dir],
                             stdout=subprocess.PIPE, text=True)
    left = json.loads(crash.stdout.readline())
    crash.wait(10)
    crash.stdout.close()
    print(f"earlier run crashed with its guardians; left running: {len(left)} processes")

    with Host(APP, state_dir=state_dir, grace=1.0, task_cap=10.0,
              announce=lambda plan: print("   announced:", plan.announcement())) as host:
        print("protected by:", host.guarantee.mechanism,
              "(kernel-enforced)" if host.guarantee.kernel_enforced else "(guardian-enforced)")
        print(f"reaper on start ended {len(host.reap_report.ended)} leftover(s)")
        alpha = host.session("alpha")
        print(f"resume rule, alpha: ended {len(alpha.resumed.processes)} process(es) "
              "of its earlier copy")
        beta = host.session("beta")
        start_agent(alpha, build=1.0)
        start_agent(beta, build=60)

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(
                t.notifications for t in alpha.tasks.tasks()):
            time.sleep(0.05)
        task = alpha.tasks.tasks()[0]
        print(f"alpha: `{task.label}` said {task.status!r} early; still live: "
              f"{task in alpha.tasks.live()}")
        r = alpha.stop("idle release", optional=True)
        print("alpha:", r.note)
        r = alpha.stop("idle release", optional=True, wait=True)
        print("alpha:", r or "(idle release ended nothing)")
        print("beta:", beta.stop("user request"))

        bg = host.background_job("thumbnails", cpu_percent=25, timeout=1.0)
        bg.popen(["sleep", "30"])
        print("background job:", ", ".join(bg.limits))
        ed = host.launch_detached(["sleep", "0.2"])
    # The host is closed; the background job is still running on purpose.
    print("after the app: background job alive:", bool(bg.members()))
    print("background job ended by its own timeout:", bg.wait(5))
    ed.wait(5)
    print("detached launch exited by itself:", ed.returncode == 0)


if __name__ == "__main__":
    main()
