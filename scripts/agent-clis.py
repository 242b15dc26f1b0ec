#!/usr/bin/env python3
"""tether-shell and `tether run` with the real agent CLIs, offline (issue 14).

OpenCode, Codex CLI and Gemini CLI (npm packages, installed beforehand into
--agents DIR: `npm install opencode-ai @openai/codex @google/gemini-cli`)
are driven by a fake model on 127.0.0.1 that answers each turn with the next
shell command of a scenario (OpenAI chat completions for OpenCode, the
Responses API for Codex, streamGenerateContent for Gemini), then "done".
Each scenario runs a CLI in a session of its own, optionally SIGKILLs it (or
its process group) once the scenario's `sleep` runs, and counts what is left
3 s later: processes born since the scenario began whose command line is one
the scenario made (`sleep 6NN`, each number used once) or that carry the
scenario's mark in their environment. Everything left is then ended by
identity (pid + start ticks), never by name. Not a CI test: it needs npm
packages; the wrapper behaviours it relies on are tested in tests/test_shell.py.

usage: python3 scripts/agent-clis.py --agents /tmp/agents [--only NAME...]
writes bench/results/agent_clis.json
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

SCRIPT: list[str] = []
SEEN: list[dict] = []


class Model(BaseHTTPRequestHandler):
    """The fake model: the next command of SCRIPT, for whichever API is asked."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        self._json({"data": [{"id": "m", "object": "model"}]})

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if "/chat/completions" in self.path:
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
            args = json.dumps({"command": SCRIPT[turn], "description": f"step {turn}",
                               "timeout": 900000})
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
                    "arguments": json.dumps({"cmd": SCRIPT[turn], "yield_time_ms": 900000})}
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
                                     "args": {"command": SCRIPT[turn], "description": "step"}}}
        else:
            part = {"text": "done" if names else '{"next_speaker": "user", "reasoning": "done"}'}
        SEEN.append({"api": "gemini", "turn": turn})
        self._sse([{"candidates": [{"content": {"role": "model", "parts": [part]},
                                    "finishReason": "STOP", "index": 0}],
                    "usageMetadata": {"promptTokenCount": 1, "candidatesTokenCount": 1,
                                      "totalTokenCount": 2}}], done=False)


# -- scenarios ----------------------------------------------------------------------

class Lab:
    def __init__(self, agents: str, port: int) -> None:
        self.agents = agents
        self.port = port
        self.tmp = tempfile.mkdtemp(prefix="tether-agent-clis-")
        self.work = os.path.join(self.tmp, "work")
        os.makedirs(self.work)
        self.ts = shutil.which("tether-shell") or os.path.join(os.path.dirname(sys.executable),
                                                               "tether-shell")
        self.install = os.path.join(self.tmp, "tbin")
        subprocess.run([sys.executable, "-m", "tether", "shell", "--install", self.install],
                       check=True, capture_output=True, env=self.env({}))
        self._homes()
        self.n = 600

    def env(self, extra: dict) -> dict:
        e = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
        e["PYTHONPATH"] = os.path.join(REPO, "src")
        e["XDG_STATE_HOME"] = os.path.join(self.tmp, "state")
        e.update(extra)
        return e

    def _homes(self) -> None:
        url = f"http://127.0.0.1:{self.port}"
        oc = os.path.join(self.tmp, "oc", ".config", "opencode")
        os.makedirs(oc)
        with open(os.path.join(oc, "opencode.json"), "w") as f:
            json.dump({"provider": {"fake": {"npm": "@ai-sdk/openai-compatible", "name": "Fake",
                                             "options": {"baseURL": url + "/v1", "apiKey": "x"},
                                             "models": {"m": {"name": "m", "tool_call": True}}}},
                       "model": "fake/m", "small_model": "fake/m", "autoupdate": False,
                       "share": "disabled",
                       "permission": {"bash": "allow", "external_directory": "allow"}}, f)
        cx = os.path.join(self.tmp, "cx", ".codex")
        os.makedirs(cx)
        with open(os.path.join(cx, "config.toml"), "w") as f:
            f.write('model = "m"\nmodel_provider = "fake"\napproval_policy = "never"\n'
                    'sandbox_mode = "danger-full-access"\n[model_providers.fake]\nname = "fake"\n'
                    f'base_url = "{url}/v1"\nwire_api = "responses"\nenv_key = "FAKE_KEY"\n')
        gm = os.path.join(self.tmp, "gm", ".gemini")
        os.makedirs(gm)
        with open(os.path.join(gm, "settings.json"), "w") as f:
            json.dump({"security": {"auth": {"selectedType": "gemini-api-key"}},
                       "general": {"disableAutoUpdate": True},
                       "privacy": {"usageStatisticsEnabled": False}}, f)

    def sleep(self) -> str:
        self.n += 1
        return f"sleep {self.n}"

    def cli(self, name: str, setup: str) -> tuple[list[str], dict]:
        bin_ = os.path.join(self.agents, "node_modules", ".bin", name)
        if name == "opencode":
            argv, extra = [bin_, "run", "go"], {"HOME": os.path.join(self.tmp, "oc")}
        elif name == "codex":
            argv = [bin_, "exec", "--skip-git-repo-check", "go"]
            extra = {"HOME": os.path.join(self.tmp, "cx"), "FAKE_KEY": "x",
                     "CODEX_HOME": os.path.join(self.tmp, "cx", ".codex")}
        else:
            argv = [bin_, "-p", "go", "--yolo", "-m", "m"]
            extra = {"HOME": os.path.join(self.tmp, "gm"), "GEMINI_API_KEY": "x",
                     "GOOGLE_GEMINI_BASE_URL": f"http://127.0.0.1:{self.port}",
                     "GEMINI_CLI_TRUST_WORKSPACE": "true"}
        if setup == "tether-shell":
            extra["SHELL"] = self.ts
        elif setup == "tether-shell caller":
            extra.update(SHELL=self.ts, TETHER_SHELL_SCOPE="caller")
        elif setup == "installed bash":
            extra.update(SHELL=os.path.join(self.install, "bash"),
                         PATH=self.install + os.pathsep + os.environ["PATH"])
        elif setup == "tether run":
            argv = [sys.executable, "-m", "tether", "run", "--", *argv]
        else:
            extra["SHELL"] = shutil.which("bash")
        return argv, self.env(extra)

    def run(self, name: str, setup: str, script: list[str], kill: str | None,
            wait_for: str | None, timeout: float = 90) -> dict:
        SCRIPT[:] = script
        SEEN.clear()
        mark = uuid.uuid4().hex
        argv, env = self.cli(name, setup)
        env["AGENT_CLIS_MARK"] = mark
        born = identity.now_ticks()
        t0 = time.monotonic()
        p = subprocess.Popen(argv, env=env, cwd=self.work, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
        out: list[bytes] = []
        threading.Thread(target=lambda: out.append(p.stdout.read()), daemon=True).start()
        waited = None
        if wait_for:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and p.poll() is None:
                if self._ours(born, mark, wait_for):
                    waited = round(time.monotonic() - t0, 2)
                    break
                time.sleep(0.05)
        if kill and p.poll() is None:
            time.sleep(0.3)
            if kill == "cli":
                p.kill()
            else:
                os.killpg(p.pid, signal.SIGKILL)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
        wall = round(time.monotonic() - t0, 2)
        time.sleep(3.0)
        left = self._ours(born, mark, None)
        names = {i: identity.cmdline(i.pid) or i.comm for i in left}
        cmds = [i for i in left if names[i].startswith("sleep 6") or "http.server" in names[i]]
        for i in left:  # end what is left, by identity
            try:
                identity.send_signal(i, signal.SIGKILL, member=True)
            except Exception:  # noqa: BLE001
                pass
        return {"cli": name, "setup": setup, "kill": kill or "none", "rc": rc, "wall_s": wall,
                "running_after_s": waited,
                "left_commands": [names[i] for i in cmds],
                "left_other": sorted({i.comm for i in left if i not in cmds}),
                "output_tail": (out[0] if out else b"")[-300:].decode("utf-8", "replace"),
                "model_saw": list(SEEN)}

    def _ours(self, born: int, mark: str, cmd: str | None) -> list:
        entry = f"AGENT_CLIS_MARK={mark}".encode()
        found = []
        for i in identity.capture(born_after=born).procs.values():
            if i.state in "ZXx" or i.pid == os.getpid():
                continue
            line = identity.cmdline(i.pid)
            if cmd is not None:
                if line == cmd:
                    found.append(i)
            elif identity.environ_has(i.pid, entry) or line.startswith("sleep 6"):
                found.append(i)
        return found


def scenarios(lab: Lab, only: list[str]) -> list[dict]:
    res = []
    port = lab.port + 1

    def go(what, name, setup, script, kill=None, wait_for=None):
        if only and name not in only:
            return
        r = {"scenario": what, **lab.run(name, setup, script, kill, wait_for)}
        print(f"{what:<10} {r['cli']:<9} {r['setup']:<20} kill={r['kill']:<6} rc={r['rc']:<4} "
              f"left={r['left_commands']} other={r['left_other']}", flush=True)
        res.append(r)

    for name in ("opencode", "codex", "gemini"):
        setups = (["bash", "tether-shell", "installed bash"] if name == "opencode"
                  else ["bash", "tether-shell", "tether run"])
        for setup in setups:
            # background work left by a command that returned, then a normal end
            s1, s2 = lab.sleep(), lab.sleep()
            go("background", name, setup, [f"{s1} & echo started", f"nohup setsid {s2} >/dev/null 2>&1 & "
                             "echo ok; ps -o comm= -p $PPID"])
            for kill in ("cli", "group"):  # a foreground command, the CLI SIGKILLed
                s = lab.sleep()
                go("foreground", name, setup, [s], kill=kill, wait_for=s)
    # OpenCode, scope caller: a dev server for the agent's lifetime
    for setup in ("tether-shell", "tether-shell caller"):
        port += 1
        server = f"python3 -m http.server {port} --bind 127.0.0.1 >/dev/null 2>&1 & echo started"
        ask = f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/; echo"
        go("dev-server", "opencode", setup, [server, "sleep 1; " + ask])
        s = lab.sleep()
        go("dev-server", "opencode", setup, [server.replace(str(port), str(port + 50)), "sleep 1; "
                               + ask.replace(str(port), str(port + 50)), s], kill="cli", wait_for=s)
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", required=True, help="the directory npm installed the CLIs into")
    ap.add_argument("--port", type=int, default=18901)
    ap.add_argument("--only", nargs="*", default=[])
    a = ap.parse_args()
    srv = ThreadingHTTPServer(("127.0.0.1", a.port), Model)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    lab = Lab(a.agents, a.port)
    res = scenarios(lab, a.only)
    path = os.path.join(REPO, "bench", "results", "agent_clis.json")
    try:  # runs of the CLIs not run now are kept
        with open(path) as f:
            kept = [r for r in json.load(f)["results"] if r["cli"] not in {r["cli"] for r in res}]
    except (OSError, ValueError, KeyError):
        kept = []
    with open(path, "w") as f:
        json.dump({"bench": "agent_clis", "results": kept + res}, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.relpath(path, REPO)}")
    shutil.rmtree(lab.tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
