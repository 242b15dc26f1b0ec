#!/usr/bin/env python3
"""tether with the real agent CLIs, offline (issues 14 and 35).

Five CLIs from npm, pinned (PINS; install them into --agents DIR with
`npm install --prefix DIR <PINS...>`, `python3 scripts/agent-clis.py --pins`
prints them): Claude Code, OMP (on bun from npm), OpenCode, Codex CLI and
Gemini CLI. One driver per CLI says how to start it and which scenarios it
has; one runner plays every scenario under every set-up:

* the fake model on 127.0.0.1 answers each turn with the next step of the
  scenario (Anthropic Messages for Claude Code, OpenAI chat completions for
  OpenCode, the Responses API for Codex, streamGenerateContent for Gemini),
  then "done"; OMP needs no model: its `!` commands are typed on its
  terminal (a real pty);
* scenarios: a normal finish after a command left something behind, a
  SIGKILL of the CLI mid-command, a background task, an MCP server's and a
  hook's leftover, the CLI's own tool timeout (each where the CLI has it);
* set-ups: nothing (the control: it must leave something), `tether run --
  CLI`, and the launcher (`tether shell --install DIR`, `SHELL=DIR/bash` or
  `DIR/zsh`) where the CLI honours $SHELL; for Claude Code also a bare
  `SHELL=tether-shell` (ignored by it: the table shows it), for OMP also a
  `PtySession` around the session;
* "left" counts the scenario's own processes alive 3 s after the CLI ended:
  born since the scenario began and carrying its mark in their environment,
  or with the command line of one of its `sleep 7NNN` (numbers used once).
  Everything left is then ended by identity (pid + start ticks), never by
  name.

Not a CI test (it needs the npm packages and takes minutes: scripts/README.md).
usage: python3 scripts/agent-clis.py --agents DIR [--only CLI...] [--table]
writes bench/results/agent_clis.json and prints the table docs/shell.md shows
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "src"))
from tether import identity  # noqa: E402

PINS = {"claude": "@anthropic-ai/claude-code@2.1.197", "omp": "@oh-my-pi/pi-coding-agent@18.1.20",
        "bun": "bun@1.4.5", "opencode": "opencode-ai@1.18.33", "codex": "@openai/codex@0.171.0",
        "gemini": "@google/gemini-cli@0.61.0"}

# The steps of the scenario being played: {"command": CMD} and, for the
# CLIs that have them, "background": True (a background task) or
# "timeout_ms" (the tool call's own timeout).
SCRIPT: list[dict] = []
SEEN: list[dict] = []


class Model(BaseHTTPRequestHandler):
    """The fake model: the next step of SCRIPT, for whichever API is asked."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        self._json({"data": [{"id": "m", "object": "model"}]})

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if "/messages/count_tokens" in self.path:
            self._json({"input_tokens": 1})
        elif "/messages" in self.path:
            self._anthropic(req)
        elif "/chat/completions" in self.path:
            self._chat(req)
        elif "/responses" in self.path:
            self._codex(req)
        elif "enerateContent" in self.path:
            self._gemini(req)
        else:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

    def _json(self, obj):
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _sse(self, events, done=True):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for ev in events + (["[DONE]"] if done else []):
            if isinstance(ev, tuple):
                data = f"event: {ev[0]}\ndata: {json.dumps(ev[1])}\n\n"
            else:
                data = f"data: {ev if ev == '[DONE]' else json.dumps(ev)}\n\n"
            b = data.encode()
            self.wfile.write(f"{len(b):x}\r\n".encode() + b + b"\r\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _anthropic(self, req):  # Claude Code: the Messages API, streamed
        names = [t.get("name") for t in req.get("tools", [])]
        turn = sum(1 for m in req.get("messages", []) if m.get("role") == "user"
                   and isinstance(m.get("content"), list)
                   for b in m["content"] if b.get("type") == "tool_result")
        if "Bash" in names:
            SEEN.append({"api": "messages", "turn": turn, "outputs": [
                b.get("content") for m in req["messages"] if isinstance(m.get("content"), list)
                for b in m["content"] if b.get("type") == "tool_result"]})
        if "Bash" in names and turn < len(SCRIPT):
            step = SCRIPT[turn]
            inp = {"command": step["command"], "description": f"step {turn}"}
            if step.get("background"):
                inp["run_in_background"] = True
            if step.get("timeout_ms"):
                inp["timeout"] = step["timeout_ms"]
            block = {"type": "tool_use", "id": f"toolu_{turn}_{uuid.uuid4().hex[:8]}",
                     "name": "Bash", "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(inp)}
            stop = "tool_use"
        else:
            block = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": "done"}
            stop = "end_turn"
        msg = {"id": f"msg_{uuid.uuid4().hex[:12]}", "type": "message", "role": "assistant",
               "model": req.get("model", "m"), "content": [], "stop_reason": None,
               "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}}
        if not req.get("stream"):
            full = dict(block)
            if block["type"] == "text":
                full["text"] = "done"
            else:
                full["input"] = json.loads(delta["partial_json"])
            self._json(dict(msg, content=[full], stop_reason=stop))
            return
        self._sse([("message_start", {"type": "message_start", "message": msg}),
                   ("content_block_start", {"type": "content_block_start", "index": 0,
                                            "content_block": block}),
                   ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                            "delta": delta}),
                   ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                   ("message_delta", {"type": "message_delta",
                                      "delta": {"stop_reason": stop, "stop_sequence": None},
                                      "usage": {"output_tokens": 1}}),
                   ("message_stop", {"type": "message_stop"})], done=False)

    def _chat(self, req):  # OpenCode
        tools = {t.get("function", {}).get("name"): t.get("function", {})
                 for t in req.get("tools", [])}
        turn = sum(1 for m in req.get("messages", []) if m.get("role") == "tool")
        if "bash" in tools:
            shell = [ln.strip() for ln in tools["bash"].get("description", "").splitlines()
                     if "Shell:" in ln]
            SEEN.append({"api": "chat", "turn": turn, "shell_line": shell[:1],
                         "outputs": [m.get("content") for m in req["messages"]
                                     if m.get("role") == "tool"]})
        base = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
        if "bash" not in tools or turn >= len(SCRIPT):
            delta = {"role": "assistant", "content": "done" if tools else "title"}
            fin = "stop"
        else:
            args = json.dumps({"command": SCRIPT[turn]["command"], "description": f"step {turn}",
                               "timeout": SCRIPT[turn].get("timeout_ms", 900000)})
            delta = {"role": "assistant", "tool_calls": [{"index": 0, "id": f"call{turn}",
                     "type": "function", "function": {"name": "bash", "arguments": args}}]}
            fin = "tool_calls"
        self._sse([dict(base, choices=[{"index": 0, "delta": delta, "finish_reason": None}]),
                   dict(base, choices=[{"index": 0, "delta": {}, "finish_reason": fin}],
                        usage={"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2})])

    def _codex(self, req):  # Codex: the Responses API
        items = [i for i in req.get("input", []) if isinstance(i, dict)]
        outs = [i.get("output") for i in items if i.get("type", "").endswith("call_output")]
        turn = len(outs)
        SEEN.append({"api": "responses", "turn": turn, "outputs": outs})
        if turn >= len(SCRIPT):
            item = {"type": "message", "role": "assistant", "id": "msg", "status": "completed",
                    "content": [{"type": "output_text", "text": "done", "annotations": []}]}
        else:
            item = {"type": "function_call", "id": f"fc{turn}", "status": "completed",
                    "call_id": f"call{turn}", "name": "exec_command",
                    "arguments": json.dumps({"cmd": SCRIPT[turn]["command"], "yield_time_ms": 900000})}
        resp = {"id": f"r{turn}", "object": "response", "created_at": 0, "status": "completed",
                "model": "m", "output": [item],
                "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2,
                          "input_tokens_details": {"cached_tokens": 0},
                          "output_tokens_details": {"reasoning_tokens": 0}}}
        self._sse([("response.created", {"type": "response.created",
                                         "response": dict(resp, status="in_progress", output=[])}),
                   ("response.output_item.done", {"type": "response.output_item.done",
                                                  "output_index": 0, "item": item}),
                   ("response.completed", {"type": "response.completed", "response": resp})],
                  done=False)

    def _gemini(self, req):  # Gemini CLI
        names = [d.get("name") for t in req.get("tools", []) for d in t.get("functionDeclarations", [])]
        turn = sum(1 for c in req.get("contents", []) for p in c.get("parts", [])
                   if "functionResponse" in p)
        if "run_shell_command" in names and turn < len(SCRIPT):
            part = {"functionCall": {"name": "run_shell_command",
                                     "args": {"command": SCRIPT[turn]["command"], "description": "step"}}}
        else:
            part = {"text": "done" if names else '{"next_speaker": "user", "reasoning": "done"}'}
        SEEN.append({"api": "gemini", "turn": turn})
        self._sse([{"candidates": [{"content": {"role": "model", "parts": [part]},
                                    "finishReason": "STOP", "index": 0}],
                    "usageMetadata": {"promptTokenCount": 1, "candidatesTokenCount": 1,
                                      "totalTokenCount": 2}}], done=False)


# -- an MCP server that leaves something behind ----------------------------------------

MCP_SERVER = r'''
import json, os, subprocess, sys
# a daemon of the server's own, in a session of its own (as a language server's
# watcher would be): what a CLI's end does not reach
subprocess.Popen(["sleep", sys.argv[1]], start_new_session=True, stdin=subprocess.DEVNULL,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
for line in sys.stdin:
    try:
        req = json.loads(line)
    except ValueError:
        continue
    if "id" not in req:
        continue
    if req.get("method") == "initialize":
        res = {"protocolVersion": req.get("params", {}).get("protocolVersion", "2024-11-05"),
               "capabilities": {"tools": {}}, "serverInfo": {"name": "leftover", "version": "1"}}
    elif req.get("method") == "tools/list":
        res = {"tools": []}
    else:
        res = {}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": req["id"], "result": res}) + "\n")
    sys.stdout.flush()
'''


# -- the lab: homes, set-ups, one run ------------------------------------------------------

class Lab:
    def __init__(self, agents: str, port: int) -> None:
        self.agents = agents
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.tmp = tempfile.mkdtemp(prefix="tether-agent-clis-")
        self.work = os.path.join(self.tmp, "work")
        os.makedirs(self.work)
        self.ts = shutil.which("tether-shell") or os.path.join(os.path.dirname(sys.executable),
                                                               "tether-shell")
        self.install = os.path.join(self.tmp, "tbin")
        subprocess.run([sys.executable, "-m", "tether", "shell", "--install", self.install],
                       check=True, capture_output=True, env=self.env({}))
        self.mcp = os.path.join(self.tmp, "mcp_leftover.py")
        with open(self.mcp, "w") as f:
            f.write(MCP_SERVER)
        self.n = 7300

    def bin(self, name: str) -> str:
        return os.path.join(self.agents, "node_modules", ".bin", name)

    def env(self, extra: dict) -> dict:
        e = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
        e["PYTHONPATH"] = os.path.join(REPO, "src")
        e["XDG_STATE_HOME"] = os.path.join(self.tmp, "state")
        e["PATH"] = os.path.join(self.agents, "node_modules", ".bin") + os.pathsep + e["PATH"]
        e.update(extra)
        return e

    def home(self, name: str) -> str:
        path = os.path.join(self.tmp, "home-" + name + "-" + uuid.uuid4().hex[:6])
        os.makedirs(path)
        return path

    def sleep(self) -> str:
        self.n += 1
        return f"sleep {self.n}"

    def wrap(self, argv: list[str], env: dict, setup: str, shell: str = "bash") -> list[str]:
        """Apply a set-up to a CLI's argv and environment."""
        if setup == "launcher":
            env.update(SHELL=os.path.join(self.install, shell),
                       PATH=self.install + os.pathsep + env["PATH"])
        elif setup == "tether-shell":
            env["SHELL"] = self.ts
        elif setup == "launcher, scope caller":
            env.update(SHELL=os.path.join(self.install, shell), TETHER_SHELL_SCOPE="caller",
                       PATH=self.install + os.pathsep + env["PATH"])
        else:
            env["SHELL"] = shutil.which(shell) or "/bin/" + shell
        if setup == "tether run":
            argv = [sys.executable, "-m", "tether", "run", "--", *argv]
        return argv

    def ours(self, born: int, mark: str, sleeps: set[str]) -> list:
        entry = f"AGENT_CLIS_MARK={mark}".encode()
        found = []
        for i in identity.capture(born_after=born).procs.values():
            if i.state in "ZXx" or i.pid <= 2 or i.pid == os.getpid():
                continue
            if identity.cmdline(i.pid) in sleeps or identity.environ_has(i.pid, entry):
                found.append(i)
        return found

    def wait_for(self, born: int, mark: str, cmd: str, p, timeout: float) -> float | None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout and p.poll() is None:
            if any(identity.cmdline(i.pid) == cmd for i in self.ours(born, mark, {cmd})):
                return round(time.monotonic() - t0, 2)
            time.sleep(0.1)
        return None

    def settle(self, born: int, mark: str, sleeps: set[str]) -> tuple[list[str], list[str]]:
        """What is left 3 s after the CLI ended: the scenario's sleeps, and the
        rest of its marked processes; all of it then ended by identity."""
        time.sleep(3.0)
        left = self.ours(born, mark, sleeps)
        names = {i: identity.cmdline(i.pid) or i.comm for i in left}
        cmds = [i for i in left if names[i] in sleeps]
        for i in left:
            try:
                identity.send_signal(i, signal.SIGKILL, member=True)
            except Exception:  # noqa: BLE001
                pass
        return ([names[i] for i in cmds], sorted({i.comm for i in left if i not in cmds}))


class Scenario:
    """What the model (or the user, for OMP) does, and what the harness does."""

    def __init__(self, name: str, steps: list[dict], sleeps: set[str], kill: str | None = None,
                 wait_for: str | None = None, mcp: str | None = None, hook: str | None = None,
                 close: str | None = None) -> None:
        self.name, self.steps, self.sleeps = name, steps, sleeps
        self.kill, self.wait_for, self.mcp, self.hook, self.close = kill, wait_for, mcp, hook, close


def scenario(lab: Lab, what: str) -> Scenario:
    s1, s2 = lab.sleep(), lab.sleep()
    quiet = ">/dev/null 2>&1"
    if what == "finish":  # a command returned leaving two things behind; the CLI ends
        return Scenario(what, [{"command": f"{s1} {quiet} & echo started"},
                               {"command": f"nohup setsid {s2} {quiet} & echo ok"}], {s1, s2})
    if what == "SIGKILL":  # the CLI SIGKILLed while a command runs
        return Scenario(what, [{"command": s1}], {s1}, kill="cli", wait_for=s1)
    if what == "background":  # a background task with a double-forked escapee
        return Scenario(what, [{"command": f"(setsid {s1} {quiet} &); {s2}", "background": True},
                               {"command": "sleep 2; echo next"}], {s1, s2})
    if what == "MCP server":
        return Scenario(what, [{"command": "echo hi"}], {s1}, mcp=s1.split()[1])
    if what == "hook":
        return Scenario(what, [{"command": "echo hi"}], {s1},
                        hook=f"nohup setsid {s1} {quiet} &")
    if what == "timeout":  # the CLI's own tool timeout (2 s) ends the call
        return Scenario(what, [{"command": f"(setsid {s1} {quiet} &); {s2}", "timeout_ms": 2000}],
                        {s1, s2})
    if what.startswith("dev server"):  # a server started in one call, asked in the next
        lab.n += 1
        port = lab.port + 100 + lab.n % 1000
        server = f"python3 -m http.server {port} --bind 127.0.0.1"
        ask = f"sleep 1; curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/; echo"
        first = ({"command": f"{server} {quiet}", "background": True} if "background" in what
                 else {"command": f"{server} {quiet} & echo started"})
        return Scenario(what, [first, {"command": ask}], {server})
    raise ValueError(what)


# -- one driver per CLI --------------------------------------------------------------------

class Driver:
    name = ""
    scenarios: tuple[str, ...] = ("finish", "SIGKILL")
    setups: tuple[str, ...] = ("nothing", "tether run")
    extra: dict[str, tuple[str, ...]] = {}  # set-ups of one scenario only

    def setups_for(self, what: str) -> tuple[str, ...]:
        return self.setups + self.extra.get(what, ())

    def command(self, lab: Lab, sc: Scenario) -> tuple[list[str], dict]:
        raise NotImplementedError

    def run(self, lab: Lab, sc: Scenario, setup: str, timeout: float = 60) -> dict:
        SCRIPT[:] = sc.steps
        SEEN.clear()
        mark = uuid.uuid4().hex
        argv, env = self.command(lab, sc)
        argv = lab.wrap(argv, env, setup)
        env["AGENT_CLIS_MARK"] = mark
        born = identity.now_ticks()
        t0 = time.monotonic()
        p = subprocess.Popen(argv, env=env, cwd=lab.work, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
        out: list[bytes] = []
        threading.Thread(target=lambda: out.append(p.stdout.read()), daemon=True).start()
        waited = lab.wait_for(born, mark, sc.wait_for, p, timeout) if sc.wait_for else None
        if sc.kill and p.poll() is None:
            time.sleep(0.3)
            p.kill()
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
        wall = round(time.monotonic() - t0, 2)
        left, other = lab.settle(born, mark, sc.sleeps)
        return {"rc": rc, "wall_s": wall, "running_after_s": waited, "left_commands": left,
                "left_other": other, "output_tail": (out[0] if out else b"")[-300:].decode(
                    "utf-8", "replace"), "model_saw": list(SEEN)}


class Claude(Driver):
    name = "claude"
    scenarios = ("finish", "SIGKILL", "background", "MCP server", "hook", "timeout",
                 "dev server", "dev server (run_in_background)")
    setups = ("nothing", "tether run", "launcher", "tether-shell")
    extra = {"dev server": ("launcher, scope caller",)}

    def command(self, lab, sc):
        home = lab.home("claude")
        argv = [lab.bin("claude"), "-p", "go", "--allowedTools", "Bash", "--model",
                "claude-sonnet-4-5", "--dangerously-skip-permissions"]
        if sc.mcp:
            cfg = os.path.join(home, "mcp.json")
            with open(cfg, "w") as f:
                json.dump({"mcpServers": {"leftover": {"type": "stdio", "command": sys.executable,
                                                       "args": [lab.mcp, sc.mcp]}}}, f)
            argv += ["--mcp-config", cfg]
        if sc.hook:
            cfg = os.path.join(home, "settings.json")
            with open(cfg, "w") as f:
                json.dump({"hooks": {"PreToolUse": [{"matcher": "Bash", "hooks": [
                    {"type": "command", "command": sc.hook}]}]}}, f)
            argv += ["--settings", cfg]
        return argv, lab.env({"HOME": home, "ANTHROPIC_BASE_URL": lab.url,
                              "ANTHROPIC_API_KEY": "x", "DISABLE_AUTOUPDATER": "1",
                              "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                              "DISABLE_TELEMETRY": "1", "IS_SANDBOX": "1"})


class OpenCode(Driver):
    name = "opencode"
    scenarios = ("finish", "SIGKILL", "timeout", "dev server")
    setups = ("nothing", "tether run", "launcher")
    extra = {"dev server": ("launcher, scope caller",)}

    def command(self, lab, sc):
        home = lab.home("opencode")
        oc = os.path.join(home, ".config", "opencode")
        os.makedirs(oc)
        with open(os.path.join(oc, "opencode.json"), "w") as f:
            json.dump({"provider": {"fake": {"npm": "@ai-sdk/openai-compatible", "name": "Fake",
                                             "options": {"baseURL": lab.url + "/v1", "apiKey": "x"},
                                             "models": {"m": {"name": "m", "tool_call": True}}}},
                       "model": "fake/m", "small_model": "fake/m", "autoupdate": False,
                       "share": "disabled",
                       "permission": {"bash": "allow", "external_directory": "allow"}}, f)
        return [lab.bin("opencode"), "run", "go"], lab.env({"HOME": home})


class Codex(Driver):
    name = "codex"

    def command(self, lab, sc):
        home = lab.home("codex")
        cx = os.path.join(home, ".codex")
        os.makedirs(cx)
        with open(os.path.join(cx, "config.toml"), "w") as f:
            f.write('model = "m"\nmodel_provider = "fake"\napproval_policy = "never"\n'
                    'sandbox_mode = "danger-full-access"\n[model_providers.fake]\nname = "fake"\n'
                    f'base_url = "{lab.url}/v1"\nwire_api = "responses"\nenv_key = "FAKE_KEY"\n')
        return ([lab.bin("codex"), "exec", "--skip-git-repo-check", "go"],
                lab.env({"HOME": home, "FAKE_KEY": "x", "CODEX_HOME": cx}))


class Gemini(Driver):
    name = "gemini"

    def command(self, lab, sc):
        home = lab.home("gemini")
        gm = os.path.join(home, ".gemini")
        os.makedirs(gm)
        with open(os.path.join(gm, "settings.json"), "w") as f:
            json.dump({"security": {"auth": {"selectedType": "gemini-api-key"}},
                       "general": {"disableAutoUpdate": True},
                       "privacy": {"usageStatisticsEnabled": False}}, f)
        return ([lab.bin("gemini"), "-p", "go", "--yolo", "-m", "m"],
                lab.env({"HOME": home, "GEMINI_API_KEY": "x", "GOOGLE_GEMINI_BASE_URL": lab.url,
                         "GEMINI_CLI_TRUST_WORKSPACE": "true"}))


class Omp(Driver):
    """OMP on its own terminal (a real pty), no model: the user types `!CMD`.
    A bash user's commands run in OMP's embedded shell ($SHELL, the launcher
    included, unused); a zsh user's as `$SHELL -i -c CMD`."""

    name = "omp (bash user)"
    scenarios = ("finish", "SIGKILL", "terminal closed")
    setups = ("nothing", "tether run", "PtySession", "launcher")

    def run(self, lab, sc, setup, timeout=60):
        shell = "zsh" if self.zsh else "bash"
        home = lab.home("omp")
        mark = uuid.uuid4().hex
        env = lab.env({"HOME": home, "OMP_SKIP_SETUP": "1", "TERM": "xterm-256color",
                       "AGENT_CLIS_MARK": mark})
        argv = lab.wrap([lab.bin("omp")], env, "nothing" if setup == "PtySession" else setup,
                        shell)
        born = identity.now_ticks()
        t0 = time.monotonic()
        out = bytearray()
        if setup == "PtySession":
            from tether import PtySession

            sess = PtySession(argv, env=env, cwd=lab.work, rows=40, cols=120)
            write, alive = sess.write, (lambda: sess.returncode is None)

            def read():
                try:
                    out.extend(sess.read(timeout=0.2))
                except Exception:  # noqa: BLE001 - the end of the output
                    time.sleep(0.2)
            pid = None
        else:
            master, slave = os.openpty()
            p = subprocess.Popen(["setsid", "-c", *argv], env=env, cwd=lab.work, stdin=slave,
                                 stdout=slave, stderr=slave, close_fds=True)
            os.close(slave)
            os.set_blocking(master, False)
            pid = p.pid

            def write(b):
                os.write(master, b if isinstance(b, bytes) else b.encode())

            def alive():
                return p.poll() is None

            def read():
                try:
                    out.extend(os.read(master, 65536))
                except (BlockingIOError, OSError):
                    time.sleep(0.1)
        deadline = time.monotonic() + 20  # the TUI drawn, then quiet
        while time.monotonic() < deadline and len(out) < 200:
            read()
        end = time.monotonic() + 3
        while time.monotonic() < end:
            read()
        for step in sc.steps:
            for ch in "!" + step["command"]:
                write(ch.encode())
                time.sleep(0.01)
            time.sleep(0.3)
            write(b"\r")
            time.sleep(2)
            read()
        waited = None
        if sc.wait_for:
            until = time.monotonic() + 20
            while time.monotonic() < until and waited is None:
                if self.ours_cmd(lab, born, mark, sc.wait_for):
                    waited = round(time.monotonic() - t0, 2)
                read()
        how = sc.close or ("kill" if sc.kill else "exit")
        if setup == "PtySession":
            if how == "exit":
                self.quit(write, alive, read)
            elif how == "kill":  # the CLI SIGKILLed; its host then closes the session
                me = identity.read(sess.pid)
                if me is not None:
                    identity.send_signal(me, signal.SIGKILL)
            until = time.monotonic() + 15
            while time.monotonic() < until and alive() and how != "terminal closed":
                read()
            res = sess.close("immediate")
            rc = sess.returncode
            closed = {"ok": getattr(res, "ok", None), "mode": getattr(res, "mode", None)}
        else:
            closed = None
            if how == "kill":
                p.kill()
            elif how == "exit":
                self.quit(write, alive, read)
            os.close(master) if how == "terminal closed" else None
            until = time.monotonic() + 15
            while time.monotonic() < until and alive():
                if how != "terminal closed":
                    read()
                else:
                    time.sleep(0.1)
            if alive():  # what a relay does last: SIGKILL the CLI
                p.kill()
            rc = p.wait(timeout=15)
            if how != "terminal closed":
                os.close(master)
        wall = round(time.monotonic() - t0, 2)
        left, other = lab.settle(born, mark, sc.sleeps)
        ran = (any(f"ran-{x[6:]}".encode() in out for x in sc.sleeps)  # its echo, on the TUI
               if sc.name == "finish" else None)
        return {"rc": rc, "wall_s": wall, "running_after_s": waited, "left_commands": left,
                "left_other": other, "user_shell": shell, "pid": pid, "close": closed, "ran": ran,
                "output_tail": bytes(out[-400:]).decode("utf-8", "replace")}

    zsh = False

    @staticmethod
    def quit(write, alive, read) -> None:
        """/exit typed as a user types it; Ctrl+C twice and Ctrl+D if OMP is
        still there 8 s later (under load it can miss a first /exit)."""
        for keys in ("/exit", "\x03\x03", "\x04"):
            for ch in keys:
                write(ch.encode())
                time.sleep(0.02)
            time.sleep(0.3)
            if keys == "/exit":
                write(b"\r")
            until = time.monotonic() + 8
            while time.monotonic() < until and alive():
                read()
            if not alive():
                return

    @staticmethod
    def ours_cmd(lab, born, mark, cmd):
        return [i for i in lab.ours(born, mark, {cmd}) if identity.cmdline(i.pid) == cmd]


class OmpZsh(Omp):
    name = "omp (zsh user)"
    zsh = True
    setups = ("nothing", "tether run", "launcher")


DRIVERS = [Claude(), Omp(), OmpZsh(), OpenCode(), Codex(), Gemini()]


def omp_scenario(lab: Lab, what: str) -> Scenario:
    s1 = lab.sleep()
    if what == "finish":  # a command left something behind; the user quits OMP
        return Scenario(what, [{"command": f"nohup setsid {s1} >/dev/null 2>&1 & echo ran-{s1[6:]}"}],
                        {s1})
    # nohup'd, as a server or a build that outlives its terminal: for a zsh
    # user the command runs on OMP's pty, whose hangup alone ends a plain sleep;
    # `env`: a bash user's embedded shell runs `sleep` and `nohup` as builtins
    held = f"nohup env {s1} >/dev/null 2>&1"
    if what == "SIGKILL":
        return Scenario(what, [{"command": held}], {s1}, kill="cli", wait_for=s1)
    return Scenario(what, [{"command": held}], {s1}, wait_for=s1, close="terminal closed")


# -- the table -----------------------------------------------------------------------------

def cell(r: dict | None) -> str:
    if r is None:
        return "—"
    n = len(r["left_commands"])
    text = f"{n} left"
    if r["scenario"].startswith("dev server"):  # what the next call's curl got
        outs = (r.get("model_saw") or [{}])[-1].get("outputs") or [""]
        text = f"`{str(outs[-1]).strip()[:12]}`, {text}"
    if (r.get("running_after_s") is None and r["scenario"] in ("SIGKILL", "terminal closed")) \
            or r.get("ran") is False:
        text += " (never ran)"
    if r["scenario"] == "finish" and isinstance(r.get("rc"), int) and r["rc"] < 0:
        text += " (the CLI did not end: SIGKILLed)"
    return text


def table(results: list[dict]) -> str:
    lines = []
    for d in DRIVERS:
        rows = [r for r in results if r["cli"] == d.name]
        if not rows:
            continue
        every = [s for what in d.scenarios for s in d.setups_for(what)]
        setups = [s for s in dict.fromkeys(every) if any(r["setup"] == s for r in rows)]
        lines.append(f"| {d.name} | " + " | ".join(setups) + " |")
        lines.append("|---" * (len(setups) + 1) + "|")
        for sc in d.scenarios:
            got = {r["setup"]: r for r in rows if r["scenario"] == sc}
            if got:
                lines.append(f"| {sc} | " + " | ".join(cell(got.get(s)) for s in setups) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", help="the directory npm installed the CLIs into")
    ap.add_argument("--port", type=int, default=18901)
    ap.add_argument("--only", nargs="*", default=[], help="CLI names (claude omp opencode ...)")
    ap.add_argument("--pins", action="store_true", help="print the npm packages to install")
    ap.add_argument("--table", action="store_true", help="print the table of the last results")
    a = ap.parse_args()
    path = os.path.join(REPO, "bench", "results", "agent_clis.json")
    if a.pins:
        print(" ".join(PINS.values()))
        return 0
    if a.table:
        with open(path) as f:
            print(table(json.load(f)["results"]))
        return 0
    if not a.agents:
        ap.error("--agents DIR is required")
    srv = ThreadingHTTPServer(("127.0.0.1", a.port), Model)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    lab = Lab(os.path.abspath(a.agents), a.port)
    res = []
    for d in DRIVERS:
        if a.only and d.name.split()[0] not in a.only:  # "omp": both users
            continue
        for what in d.scenarios:
            for setup in d.setups_for(what):
                sc = omp_scenario(lab, what) if isinstance(d, Omp) else scenario(lab, what)
                r = {"scenario": what, "cli": d.name, "setup": setup, **d.run(lab, sc, setup)}
                print(f"{d.name:<15} {what:<16} {setup:<14} rc={r['rc']!s:<4} "
                      f"wall={r['wall_s']:<6} left={r['left_commands']} other={r['left_other']}",
                      flush=True)
                res.append(r)
    try:  # runs of the CLIs not run now are kept
        with open(path) as f:
            ran = {r["cli"].split()[0] for r in res}
            kept = [r for r in json.load(f)["results"] if r["cli"].split()[0] not in ran]
    except (OSError, ValueError, KeyError):
        kept = []
    with open(path, "w") as f:
        json.dump({"bench": "agent_clis", "versions": PINS, "results": kept + res}, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.relpath(path, REPO)}\n")
    print(table(kept + res))
    shutil.rmtree(lab.tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
