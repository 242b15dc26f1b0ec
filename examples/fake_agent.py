#!/usr/bin/env python3
"""A stand-in for an agent CLI (such as ``claude -p --output-format stream-json``).

It does what real agents do to their host: starts an MCP-server-like child
(that reads JSON-RPC from a pipe and never exits by itself), a shell, and a
background build that detaches into its own session - and it reports the
build on stdout as Claude Code stream-json ``system`` lines, including the
known quirk of a ``task_notification`` that fires *before* the build's
process has exited (anthropics/claude-code #74982), and again afterwards.

    fake_agent.py --session-id alpha --build 2.0 [--early-notify]
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
    print(json.dumps(line, separators=(",", ":")), flush=True)


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
    ap.add_argument("--mcp", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.mcp:
        mcp_server()
        return
    sid = a.session_id
    emit(type="system", subtype="init", session_id=sid, uuid=str(uuid.uuid4()))
    # Children stay referenced so they are not reaped behind the host's back.
    mcp = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--mcp"],
                           stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    shell = subprocess.Popen(["sh"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    time.sleep(a.think)  # the model thinks before it starts the build
    task_id = "b" + uuid.uuid4().hex[:8]
    tool_use = "toolu_" + uuid.uuid4().hex[:24]
    emit(type="system", subtype="task_started", task_id=task_id, tool_use_id=tool_use,
         description="npm run build", task_type="local_bash", session_id=sid,
         uuid=str(uuid.uuid4()))
    # The build detaches into its own session, as dev servers and builds often do.
    build = subprocess.Popen(["sh", "-c", f"sleep {a.build}; echo built"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    if a.early_notify:
        time.sleep(0.05)
        emit(type="system", subtype="task_notification", task_id=task_id, tool_use_id=tool_use,
             status="completed", output_file=f"/tmp/tasks/{task_id}.output",
             summary='Background command "npm run build" completed (exit code 0)',
             session_id=sid, uuid=str(uuid.uuid4()))
    build.wait()
    emit(type="system", subtype="task_notification", task_id=task_id, tool_use_id=tool_use,
         status="completed", output_file=f"/tmp/tasks/{task_id}.output",
         summary='Background command "npm run build" completed (exit code 0)',
         session_id=sid, uuid=str(uuid.uuid4()))
    while mcp.poll() is None and shell.poll() is None:
        time.sleep(0.5)


if __name__ == "__main__":
    main()
