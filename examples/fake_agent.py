#!/usr/bin/env python3
"""A stand-in for an agent CLI (such as ``claude -p --output-format stream-json``).

It does what real agents do to their host: starts an MCP-server-like child
(that reads JSON-RPC from a pipe and never exits by itself), a shell, and a
background build in a session of its own (as every agent CLI starts its tool
calls) - and it reports the build on stdout as Claude Code stream-json
``system`` lines: ``task_started``, ``task_updated`` with
``is_backgrounded``, ``background_tasks_changed`` snapshots of the live
background set, and the known quirk of a ``task_notification`` that fires
*before* the build's process has exited (anthropics/claude-code #74982), and
again afterwards. ``--watcher`` adds an *ambient* task (the CLI's own file
watcher, which a host must never wait for).

    fake_agent.py --session-id alpha --build 2.0 [--early-notify] [--watcher]
    fake_agent.py --mcp        (the MCP-server-like child; used by the agent)

Runs until it is killed (it is the host's job to end it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid


def emit(**line: object) -> None:
    line.setdefault("uuid", str(uuid.uuid4()))
    try:
        print(json.dumps(line, separators=(",", ":")), flush=True)
    except BrokenPipeError:  # the host stopped reading (it crashed): keep working, as agents do
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the rest of this process


def mcp_server() -> None:
    # An MCP server speaks JSON-RPC on stdin/stdout until its client goes away.
    for _line in sys.stdin:
        pass
    while True:  # like many real ones, it outlives EOF on stdin
        time.sleep(3600)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--session-id", default=str(uuid.uuid4()))
    ap.add_argument("--build", type=float, default=2.0, help="seconds the background build runs")
    ap.add_argument("--think", type=float, default=0.7, help="seconds before the build starts")
    ap.add_argument("--early-notify", action="store_true",
                    help="report the build finished before its process exits")
    ap.add_argument("--watcher", action="store_true", help="also run an ambient file watcher")
    ap.add_argument("--mcp", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.mcp:
        mcp_server()
        return
    sid = a.session_id
    emit(type="system", subtype="init", session_id=sid)
    # Children stay referenced so they are not reaped behind the host's back.
    mcp = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--mcp"],
                           stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    shell = subprocess.Popen(["sh"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    live: list[dict[str, object]] = []
    kids = []
    time.sleep(a.think)  # the model thinks before it starts anything
    if a.watcher:
        watch = {"task_id": "w" + uuid.uuid4().hex[:8], "task_type": "local_bash",
                 "description": "Watching for file changes", "ambient": True}
        emit(type="system", subtype="task_started", is_backgrounded=True, session_id=sid, **watch)
        live.append(watch)
        time.sleep(0.3)
        kids.append(subprocess.Popen(["sh", "-c", "while :; do sleep 1; done"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True))
    task_id = "b" + uuid.uuid4().hex[:8]
    tool_use = "toolu_" + uuid.uuid4().hex[:24]
    emit(type="system", subtype="task_started", task_id=task_id, tool_use_id=tool_use,
         description="npm run build", task_type="local_bash", is_backgrounded=False,
         session_id=sid)
    # The build runs in a session of its own, as every agent CLI starts its tool calls.
    build = subprocess.Popen(["sh", "-c", f"sleep {a.build}; echo built"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    emit(type="system", subtype="task_updated", task_id=task_id,
         patch={"is_backgrounded": True}, session_id=sid)
    live.append({"task_id": task_id, "task_type": "local_bash", "description": "npm run build"})
    emit(type="system", subtype="background_tasks_changed", tasks=live, session_id=sid)
    done = {"type": "system", "subtype": "task_notification", "task_id": task_id,
            "tool_use_id": tool_use, "status": "completed",
            "output_file": f"/tmp/tasks/{task_id}.output",
            "summary": 'Background command "npm run build" completed (exit code 0)',
            "session_id": sid}
    if a.early_notify:
        time.sleep(0.05)
        emit(**done)
    build.wait()
    emit(**done)
    emit(type="system", subtype="background_tasks_changed", tasks=live[:-1], session_id=sid)
    while mcp.poll() is None and shell.poll() is None:
        time.sleep(0.5)


if __name__ == "__main__":
    main()
