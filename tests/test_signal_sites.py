"""Every place in src/tether that sends a signal, listed from the source.

tether's promise is that it never touches a process that is not its own.
Every signal to a process it did not just spawn (and has not reaped) goes
through the gate, :func:`tether.gate.send_signal` (pid + start ticks +
boot id, pinned by a pidfd, and a :class:`~tether.gate.Proof`), or the
C keeper's and shell's equivalents. This test reads the source - Python by
its syntax tree, C by its text with comments removed - lists every call that
sends a signal (``os.kill``, ``os.killpg``, ``signal.pidfd_send_signal``,
``signal.pthread_kill``, ``signal.raise_signal``, C's ``kill``, ``killpg``,
``raise``, ``tgkill``, ``pidfd_send_signal``), and fails on one that is not in
the allow-list below, where each entry says why it is safe: the gate itself,
a process's own unreaped child, a thread of its own, or a probe that sends
nothing (signal 0). A new call site has to be argued for here, or go through
the gate.

It also lists the calls of the gate (``send_signal``) and of ``ending.end``
and fails on one that passes no Proof (issue 36: "every signal tether sends
to a process it did not just reap goes through the gate with a Proof - PTY
close and capture included"). A process's own unreaped child is proven by
``Proof.own_child()`` (its parent, read while pinned, is us); a tree found a
moment ago by ``Proof.tracking``; the rest by the job's cookie or cgroup.
"""

from __future__ import annotations

import ast
import os
import re

from procutil import SRC

PKG = os.path.join(SRC, "tether")

RAW_PY = {("os", "kill"), ("os", "killpg"), ("signal", "pidfd_send_signal"),
          ("_signal", "pidfd_send_signal"), ("signal", "pthread_kill"),
          ("_signal", "pthread_kill"), ("signal", "raise_signal"), ("_signal", "raise_signal"),
          ("os", "abort")}

# (file, enclosing function, call) -> why it may signal without the gate.
ALLOWED_PY = {
    # The gate itself: pinned by a pidfd, identity checked, proof checked.
    ("gate.py", "send_signal", "signal.pidfd_send_signal"): "the gate",
    ("gate.py", "send_signal", "os.kill"): "the gate (no pidfd: after the identity check)",
    # A kill loop's look at a child list: its own child, or pinned with its parent checked.
    ("gate.py", "signal_child", "os.kill"): "own unreaped child, or no pidfd after the parent check",
    ("gate.py", "signal_child", "signal.pidfd_send_signal"): "pinned, parent checked while pinned",
    # Probes: signal 0 sends nothing.
    ("keeper/_keeper.py", "owner_alive", "os.kill"): "signal 0: is the owner there",
    ("identity.py", "group_has_members", "os.killpg"): "signal 0: has the group a member",
    # The caller's own child, through the pidfd the keeper handed over (it
    # pins the child until it is reaped).
    ("keeper/posix_popen.py", "send_signal", "signal.pidfd_send_signal"): "own child's pidfd",
    # tether init: its own child CMD, which leads the group init made for it.
    ("init.py", "forward", "os.killpg"): "own child's group (CMD leads it: init made it so)",
    ("init.py", "forward", "os.kill"): "own unreaped child",
    # This process itself: it dies by the signal its command died by.
    ("shell.py", "_die_by", "signal.raise_signal"): "itself",
    # A thread of this process.
    ("runner.py", "wake", "signal.pthread_kill"): "a thread of this process",
    # cgroup.kill's fallback: each pid pinned by a pidfd, then checked still
    # in the cgroup, then signalled through that pidfd.
    ("cgroupfs.py", "_kill_each", "_signal.pidfd_send_signal"): "pinned, cgroup member checked",
}

C_CALL = re.compile(r"\b(kill|killpg|raise|tgkill|tkill|sigqueue|pidfd_signal_|"
                    r"SYS_pidfd_send_signal|SYS_tgkill|SYS_kill)\s*[(,]")
C_FUNC = re.compile(r"^(?:static\s+)?[A-Za-z_][\w\s\*]*?\b(\w+)\s*\([^;]*$")

ALLOWED_C = {
    ("keeper.c", "pidfd_signal_", "pidfd_signal_"): "the definition (a pidfd: pins the process)",
    ("keeper.c", "pidfd_signal_", "SYS_pidfd_send_signal"): "the definition",
    ("keeper.c", "kill_pid", "kill"): "own unreaped child (parent == 0)",
    ("keeper.c", "kill_pid", "pidfd_signal_"): "pinned, parent checked while pinned",
    ("keeper.c", "cg_kill_each_in", "pidfd_signal_"): "pinned, cgroup member checked",
    ("keeper.c", "serve", "kill"): "signal 0: is the owner there",
    ("keeper.c", "main", "kill"): "signal 0: is the owner there",
    ("keeper.c", "owner_execd", "kill"): "signal 0: is the owner there (exec or exit)",
    ("oneshot.c", "signal_if_still", "pidfd_signal_"): "pinned, start ticks (and cgroup) checked",
    ("shell.c", "wait_orphaned_command", "pidfd_signal_"): "own unreaped child's pidfd",
    ("shell.c", "die_by", "raise"): "itself (dies by the signal its command died by)",
}

# Gate calls that must carry a Proof: every module's. A call without one has
# to be argued for here: (file, enclosing function, call) -> why.
ALLOWED_UNPROVED: dict[tuple[str, str, str], str] = {}


def _py_files():
    for d, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                yield os.path.relpath(path, PKG).replace(os.sep, "/"), path


class _Calls(ast.NodeVisitor):
    def __init__(self) -> None:
        self.imported: set[str] = set()  # signal functions imported by name (from os import kill)
        self.gates: set[str] = set()  # the gate and ending.end, imported by name
        self.func: list[str] = ["<module>"]
        self.shadow: list[set[str]] = [set()]  # parameter names of the enclosing functions
        self.raw: list[tuple[str, str, int]] = []
        self.gate: list[tuple[str, str, bool, int]] = []

    def visit_FunctionDef(self, node) -> None:
        self.func.append(node.name)
        a = node.args
        self.shadow.append({x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]})
        self.generic_visit(node)
        self.shadow.pop()
        self.func.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for a in node.names:
            if (node.module or "", a.name) in RAW_PY:
                self.imported.add(a.asname or a.name)
            mod = (node.module or "").rsplit(".", 1)[-1]
            if (mod, a.name) in (("ending", "end"), ("gate", "send_signal")):
                self.gates.add(a.asname or a.name)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        name = None
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            name = f"{f.value.id}.{f.attr}"
            if (f.value.id, f.attr) in RAW_PY:
                self.raw.append((self.func[-1], name, node.lineno))
        elif isinstance(f, ast.Name) and f.id in self.imported:
            self.raw.append((self.func[-1], f.id, node.lineno))  # imported by name
        # A name bound to the gate (not a parameter of the same name: a
        # caller's own ``end`` callback is no gate call).
        by_name = isinstance(f, ast.Name) and f.id in self.gates \
            and not any(f.id in s for s in self.shadow)
        if name in ("gate.send_signal", "ending.end") or by_name:
            proved = any(k.arg == "proof" and not (isinstance(k.value, ast.Constant)
                                                   and k.value.value is None)
                         for k in node.keywords)
            self.gate.append((self.func[-1], name or f.id, proved, node.lineno))
        self.generic_visit(node)


def _scan_py():
    raw, gate = [], []
    for rel, path in _py_files():
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), path)
        v = _Calls()
        v.visit(tree)
        raw += [(rel, fn, call, line) for fn, call, line in v.raw]
        gate += [(rel, fn, call, proved, line) for fn, call, proved, line in v.gate]
    return raw, gate


def _strip_c_comments(text: str) -> str:
    # keep the line count: a comment becomes as many newlines as it had
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)  # and string literals


def _scan_c():
    out = []
    native = os.path.join(PKG, "_native")
    for f in sorted(os.listdir(native)):
        if not f.endswith(".c"):
            continue
        with open(os.path.join(native, f), encoding="utf-8") as fh:
            text = _strip_c_comments(fh.read())
        fn = "<file>"
        for n, line in enumerate(text.splitlines(), 1):
            m = C_FUNC.match(line)
            if m and not line[:1].isspace() and not line.startswith("#"):
                fn = m.group(1)
            for call in C_CALL.findall(line):
                out.append((f, fn, call, n))
    return out


def test_every_python_signal_call_goes_through_the_gate_or_is_argued_for():
    raw, _ = _scan_py()
    found = {(rel, fn, call) for rel, fn, call, _ in raw}
    unexplained = [r for r in raw if r[:3] not in ALLOWED_PY]
    assert unexplained == [], (
        "signal calls that bypass gate.send_signal (route them through the gate, or add "
        f"them to ALLOWED_PY with the reason): {unexplained}")
    # The scan sees what it must (the gate itself): it can fail.
    assert ("gate.py", "send_signal", "signal.pidfd_send_signal") in found
    stale = set(ALLOWED_PY) - found
    assert stale == set(), f"allow-list entries no longer in the source: {stale}"


def test_every_native_signal_call_is_argued_for():
    calls = _scan_c()
    found = {c[:3] for c in calls}
    unexplained = [c for c in calls if c[:3] not in ALLOWED_C]
    assert unexplained == [], f"signal calls in the C programs not in ALLOWED_C: {unexplained}"
    assert ("keeper.c", "kill_pid", "kill") in found
    stale = set(ALLOWED_C) - found
    assert stale == set(), f"allow-list entries no longer in the source: {stale}"


def test_every_gate_call_carries_a_proof():
    _, gate = _scan_py()
    found = {g[:3] for g in gate}
    # The scan sees the PTY close's and pgroup's (it can find what it checks).
    assert {g[0] for g in gate} >= {"pty.py", "platform/posix_pgroup.py", "job.py",
                                    "keeper/posix.py", "init.py"}, found
    unproved = [g for g in gate if not g[3] and g[:3] not in ALLOWED_UNPROVED]
    assert unproved == [], (
        "gate calls (gate.send_signal, ending.end) without a Proof: give each the proof "
        f"it has (cookie, cgroup, Proof.tracking, Proof.own_child) or argue for it: {unproved}")
    stale = set(ALLOWED_UNPROVED) - found
    assert stale == set(), f"allow-list entries no longer in the source: {stale}"


def test_the_scan_sees_a_bypass(tmp_path):
    """Control: a raw os.kill in a function, and a C kill() outside the
    allow-list, are reported."""
    v = _Calls()
    v.visit(ast.parse("import os\nfrom os import killpg as kp\ndef rogue(pid):\n"
                      "    os.kill(pid, 9)\n    kp(pid, 9)\n"))
    assert v.raw == [("rogue", "os.kill", 4), ("rogue", "kp", 5)]
    text = _strip_c_comments("/* kill(pid, sig) in a comment */\nstatic void rogue(void)\n{\n"
                             "    kill(pid, SIGKILL);\n}\n")
    fn, hits = "<file>", []
    for n, line in enumerate(text.splitlines(), 1):
        m = C_FUNC.match(line)
        if m and not line[:1].isspace():
            fn = m.group(1)
        hits += [(fn, c, n) for c in C_CALL.findall(line)]
    assert hits == [("rogue", "kill", 4)]


def test_the_scan_sees_a_gate_call_without_a_proof():
    """Control: ``end`` and ``send_signal`` imported from the gate's modules
    are gate calls (with ``proof=None`` as without one); a parameter named
    ``end`` (a caller's callback) is not."""
    v = _Calls()
    v.visit(ast.parse(
        "from .ending import end\nfrom . import gate\n"
        "def bare(find):\n    end(find, born_after=0)\n"
        "def none(find):\n    end(find, born_after=0, proof=None)\n"
        "def good(i, p):\n    gate.send_signal(i, 9, proof=p)\n"
        "def bad(i):\n    gate.send_signal(i, 9, member=True)\n"
        "def callback(end, p):\n    end(p)\n"))
    assert v.gate == [("bare", "end", False, 4), ("none", "end", False, 6),
                      ("good", "gate.send_signal", True, 8),
                      ("bad", "gate.send_signal", False, 10)]
