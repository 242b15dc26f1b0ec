"""The docs' examples, run: a fenced block marked runnable must still do what
the page says, so the docs cannot drift from the code again.

Markers are HTML comments on the line before a fence (invisible on a
rendered page):

``<!-- file: NAME -->``
    the block is a file the page's later examples use: written to NAME.
``<!-- run -->``
    run the block (``python`` blocks with Python, ``sh``/``console`` with
    bash); it must exit 0. Options, comma-separated: ``exit=N``,
    ``args=...`` (for a python block), ``expect=TEXT`` (must appear in the
    output; repeatable).
``<!-- run: output -->``
    run the python block and compare what it prints with the fenced block
    that follows it.
``<!-- run: name=NAME, ... -->`` and ``<!-- output: NAME -->``
    the fenced block under ``output: NAME`` (anywhere on the page) is what
    the run block named NAME prints, compared as above.
``<!-- shown: WHERE -->``
    an output that cannot be made on this machine (another OS, a systemd
    desktop): WHERE says where it was run. Every other example whose output
    a page shows (a ``$ `` transcript, a python block followed by an output
    block) must be run: ``test_every_shown_output_is_run``.
``<!-- run: console -->``
    a transcript: every ``$ `` line is run, in order, in one bash (variables,
    the working directory and background jobs carry over); what each printed
    is compared with the lines under it. ``unordered``: compare the whole
    transcript's lines as a multiset (for background output). ``tty``: its
    output goes to a terminal (a PTY, 100 columns), as a user's would (a
    command that draws differently on one, like ``tether ps``). ``alone``: it
    runs as on a machine where nothing else runs - in PID, cgroup, mount and
    network namespaces of its own (the cgroup v2 hierarchy mounted anew where
    it was, rooted at the test's own cgroup), so a machine-wide view such as
    ``tether ps`` shows only this transcript's jobs, not those of the tests
    beside it; when the namespaces leave, the kernel ends all it started.
    Needs root; elsewhere the page is skipped.

Comparison is loose only where output must vary: each run of digits matches
any run of digits (pids, times), a UUID any UUID (a boot id) and the
directories above an installed ``tether/`` package any directories - but an exit status (``exit=N``, ``exit N``,
``status N``) must match exactly -, runs of blanks are one blank, and a line
``...`` in the page matches any number of lines. Every page runs in a fresh temporary
directory, which a transcript's output names as ``/tmp/demo``, with ``tether`` and ``tether-shell`` on PATH from this checkout;
every process carries the test's mark, so the ``procs`` fixture ends any
leftover.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
import uuid

import pytest
from procutil import ROOT, SRC

from tether import cgroupfs, identity

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the docs' examples are Linux transcripts")

DOCS = os.path.join(ROOT, "docs")
# A copy of the tree without its docs (scripts/unprivileged-tests.sh copies
# the code and tests only) has nothing to run: the tests below skip.
_NAMES = sorted(os.listdir(DOCS)) if os.path.isdir(DOCS) else []
PAGES = [p for p in ("README.md", *(f"docs/{n}" for n in _NAMES if n.endswith(".md")))
         if os.path.exists(os.path.join(ROOT, p))]
MARK = re.compile(r"^<!--\s*(run|file|output|shown)(?::\s*(.*?))?\s*-->\s*$")
FENCE = re.compile(r"^(```+)\s*(\S*)")


class Block:
    def __init__(self, page: str, line: int, kind: str, opts: str, lang: str, text: str,
                 after: str | None) -> None:
        self.page, self.line, self.kind, self.lang, self.text, self.after = (
            page, line, kind, lang, text, after)
        self.name = (opts or "").strip()  # a file block's file name
        self.opts: dict[str, list[str]] = {}
        for part in _split_opts(opts or "") if kind == "run" else ():
            k, _, v = part.partition("=")
            self.opts.setdefault(k.strip(), []).append(v.strip().strip('"'))

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def _split_opts(text: str) -> list[str]:
    out, cur, quoted = [], "", False
    for ch in text:
        if ch == '"':
            quoted = not quoted
        if ch == "," and not quoted:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur)
    return [o.strip() for o in out if o.strip()]


def _fences(lines: list[str], i: int) -> tuple[str, str, int] | None:
    """The fenced block starting at line ``i``: (lang, text, index after it)."""
    m = FENCE.match(lines[i]) if i < len(lines) else None
    if not m:
        return None
    fence, lang = m.group(1), m.group(2)
    body = []
    j = i + 1
    while j < len(lines) and not lines[j].startswith(fence):
        body.append(lines[j])
        j += 1
    return lang, "\n".join(body) + "\n", j + 1


def blocks(page: str) -> list[Block]:
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        lines = f.read().splitlines()
    out = []
    for i, line in enumerate(lines):
        m = MARK.match(line)
        if not m:
            continue
        first = _fences(lines, i + 1)
        assert first, f"{page}:{i + 1}: a marker must stand right above a fenced block"
        lang, text, nxt = first
        after = None
        while nxt < len(lines) and not lines[nxt].strip():
            nxt += 1
        follow = _fences(lines, nxt)
        if follow:
            after = follow[1]
        out.append(Block(page, i + 1, m.group(1), m.group(2) or "", lang, text, after))
    return out


_UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
_INSTALLED = re.compile(r"(?:/[^\s/()'\"]+)+/(?=tether/)")
_EXACT = re.compile(r"(?<=exit=)\d+|(?<=exit )\d+|(?<=status )\d+|(?<=\$\? = )\d+")


def _norm(line: str) -> str:
    # Exit statuses stay exact (spelt as letters, out of the digits' way).
    line = _EXACT.sub(lambda m: "#" + "".join(chr(97 + int(c)) for c in m.group(0)), line)
    line = _UUID.sub("<uuid>", line)  # a boot id
    line = _INSTALLED.sub("<dir>/", line)  # where tether is installed (a checkout, a venv)
    return re.sub(r"[ \t]+", " ", re.sub(r"\d+", "0", line)).strip()


def _matches(want: list[str], got: list[str]) -> bool:
    """``want`` (the page's lines) against ``got``; ``...`` matches any lines."""
    w = [_norm(x) for x in want]
    g = [_norm(x) for x in got]

    def go(i: int, j: int) -> bool:
        if i == len(w):
            return j == len(g)
        if w[i] == "...":
            return any(go(i + 1, k) for k in range(j, len(g) + 1))
        return j < len(g) and w[i] == g[j] and go(i + 1, j + 1)

    return go(0, 0)


@pytest.fixture
def sandbox(tmp_path, procs):
    """A working directory, and an environment with this checkout's tether on PATH."""
    bin_dir = tmp_path / ".bin"
    bin_dir.mkdir()
    # Scripts as pip installs them (a #! Python script named tether), so the
    # process is called "tether" as on a user's machine; PYTHONPATH: this tree.
    for name, mod in (("tether", "tether.cli"), ("tether-shell", "tether.shell")):
        p = bin_dir / name
        p.write_text(f"#!{sys.executable}\nimport sys\nfrom {mod} import main\nsys.exit(main())\n")
        p.chmod(0o755)
    env = procs.env(PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONPATH=SRC,
                    PYTHONDONTWRITEBYTECODE="1")
    for k in list(env):  # as a user's shell: not inside this test run's pytest-xdist worker
        if k.startswith(("PYTEST_", "TETHER_STATE_DIR")):
            del env[k]
    work = tmp_path / "work"
    work.mkdir()
    cg = _own_cgroup()
    _CGROUP[:] = [cg] if cg else []
    yield work, env
    _CGROUP[:] = []
    if cg:  # what the examples left in it is theirs (this test's) alone
        cgroupfs.kill(cg, 5.0)
        assert cgroupfs.remove_tree(cg), f"the examples' cgroup was left behind: {cg}"


#: The cgroup the current test's examples run in, if any (see _own_cgroup).
_CGROUP: list[str] = []


def _own_cgroup() -> str | None:
    """A fresh cgroup of this test's, inside ours, where we may make one (root
    here): the examples run in it, so their jobs' run directories are made
    there, and an example's `tether reap` - whose stale-cgroup search looks in
    its own cgroup - sees only this test's. Without it, a reap in a docs
    example ended other tests' deliberately stale cgroups (their controls)
    running beside it under pytest-xdist."""
    base = cgroupfs.own_dir()
    if base is None or not os.access(os.path.join(base, "cgroup.procs"), os.W_OK):
        return None
    path = os.path.join(base, f"doctest-{uuid.uuid4().hex[:12]}")
    try:
        os.mkdir(path)
    except OSError:
        return None
    return path


def _run(args: list[str], cwd, env, timeout: float = 120, *,
         tty: bool = False) -> subprocess.CompletedProcess[str]:
    if _CGROUP:
        args = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', _CGROUP[0], *args]
    if tty:
        r = _run_on_tty(args, cwd, env, timeout)
    else:
        r = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True,
                           timeout=timeout, stdin=subprocess.DEVNULL)
    if _CGROUP:  # the page shows the cgroup a user's shell is in: ours
        r.stdout = r.stdout.replace(_CGROUP[0], os.path.dirname(_CGROUP[0]))
        r.stderr = r.stderr.replace(_CGROUP[0], os.path.dirname(_CGROUP[0]))
    return r


def _run_on_tty(args: list[str], cwd, env, timeout: float) -> subprocess.CompletedProcess[str]:
    """``args`` with stdout and stderr on a fresh PTY of 100 columns; what it
    printed, its line ends as a file's."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    try:
        p = subprocess.Popen(args, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=slave,
                             stderr=slave)
    finally:
        os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([master], [], [], left)[0]:
                p.kill()
                raise subprocess.TimeoutExpired(args, timeout)
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the last writer closed the terminal
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
    code = p.wait(timeout=10)
    out = b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")
    return subprocess.CompletedProcess(args, code, out, "")


def _alone(args: list[str]) -> list[str]:
    """``args`` in PID, cgroup, mount and network namespaces of their own
    (see ``alone`` above). Run from the test's cgroup, which becomes the root
    of the hierarchy mounted anew inside."""
    if os.geteuid() != 0 or not _CGROUP:
        pytest.skip("an `alone` transcript needs root and a cgroup of the test's own")
    mount = cgroupfs.mount()
    assert mount is not None
    setup = f'umount -l {shlex.quote(mount)} && mount -t cgroup2 none {shlex.quote(mount)} && exec "$@"'
    return ["unshare", "--pid", "--fork", "--mount-proc", "--cgroup", "--mount", "--net",
            "--propagation", "private", "sh", "-c", setup, "sh", *args]


def _console(block: Block, cwd, env) -> None:
    cmds: list[str] = []
    want: list[list[str]] = []
    for line in block.text.splitlines():
        if line.startswith("$ "):
            cmds.append(line[2:])
            want.append([])
        elif cmds:
            want[-1].append(line)
    assert cmds, f"{block.id}: a console block without a $ line"
    script = ["exec 2>&1"]
    for n, cmd in enumerate(cmds):
        script += [f"echo '@@tether-doc {n}'", cmd]
    args = ["bash", "-c", "\n".join(script)]
    r = _run(_alone(args) if "alone" in block.opts else args, cwd, env, tty="tty" in block.opts)
    parts = re.split(r"^@@tether-doc \d+\n", r.stdout.replace(str(cwd), "/tmp/demo"),
                     flags=re.M)[1:]
    assert len(parts) == len(cmds), f"{block.id}: the transcript stopped early:\n{r.stdout}"
    if "unordered" in block.opts:
        wanted = sorted(_norm(x) for w in want for x in w)
        got = sorted(_norm(x) for p in parts for x in p.splitlines())
        assert wanted == got, f"{block.id}: output differs\n--- page\n{wanted}\n--- now\n{got}"
        return
    for cmd, w, got in zip(cmds, want, parts, strict=True):
        while w and not w[-1].strip():  # a blank line between commands is layout
            w = w[:-1]
        assert _matches(w, got.rstrip("\n").splitlines() if got.strip() else []), (
            f"{block.id}: `{cmd}` printed\n{got}--- the page says\n" + "\n".join(w))


def _python(block: Block, cwd, env) -> subprocess.CompletedProcess[str]:
    path = cwd / f"doc_{block.line}.py"
    path.write_text(block.text)
    args = shlex.split(" ".join(block.opts.get("args", [])))
    return _run([sys.executable, str(path), *args], cwd, env)


def _check(block: Block, r: subprocess.CompletedProcess[str]) -> None:
    code = int(block.opts.get("exit", ["0"])[0])
    out = r.stdout + r.stderr
    assert r.returncode == code, f"{block.id}: exit {r.returncode}, not {code}:\n{out}"
    for text in block.opts.get("expect", []):
        assert _norm(text) in _norm(out), f"{block.id}: no {text!r} in:\n{out}"


def run_page(page: str, cwd, env) -> int:
    ran = 0
    printed: dict[str, str] = {}  # what each named run block printed
    for block in blocks(page):
        if block.kind == "file":
            (cwd / block.name).write_text(block.text)
            continue
        if block.kind in ("output", "shown"):
            continue
        if "console" in block.opts:
            _console(block, cwd, env)
        elif block.lang == "python":
            r = _python(block, cwd, env)
            if "output" in block.opts:
                assert block.after is not None, f"{block.id}: no output block follows"
                assert r.returncode == 0, f"{block.id}: exit {r.returncode}:\n{r.stderr}"
                assert _matches(block.after.splitlines(), r.stdout.splitlines()), (
                    f"{block.id}: printed\n{r.stdout}--- the page says\n{block.after}")
            else:
                _check(block, r)
            if "name" in block.opts:
                printed[block.opts["name"][0]] = r.stdout
        else:
            _check(block, _run(["bash", "-c", block.text], cwd, env))
        ran += 1
    for block in blocks(page):
        if block.kind == "output":
            assert block.name in printed, f"{block.id}: no run block named {block.name!r}"
            got = printed[block.name]
            assert _matches(block.text.splitlines(), got.splitlines()), (
                f"{block.id}: {block.name} printed\n{got}--- the page says\n{block.text}")
    return ran


def shown_outputs(page: str) -> list[tuple[int, str, str]]:
    """The examples ``page`` shows the output of: (line, marker above it or
    ``""``, what must run it) for each fence holding a ``$ `` transcript line
    (``console``) and each python/sh block that an unlabelled block, its
    output, follows with only blank lines between (``output``)."""
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        lines = f.read().splitlines()
    fences = []
    i = 0
    while i < len(lines):
        found = _fences(lines, i)
        if found is None:
            i += 1
            continue
        lang, text, nxt = found
        fences.append((i, lang, text, nxt))
        i = nxt
    out = []
    for n, (i, lang, text, nxt) in enumerate(fences):
        mark = lines[i - 1] if i and MARK.match(lines[i - 1]) else ""
        follower = fences[n + 1] if n + 1 < len(fences) else None
        output_follows = (follower is not None and follower[1] in ("", "text")
                          and not any(ln.strip() for ln in lines[nxt:follower[0]]))
        if any(ln.startswith("$ ") for ln in text.splitlines()):
            out.append((i + 1, mark, "console"))
        elif lang in ("python", "sh", "bash", "console") and output_follows:
            out.append((i + 1, mark, "output"))
    return out


RUNNABLE = [p for p in PAGES if any(b.kind == "run" for b in blocks(p))]


needs_docs = pytest.mark.skipif(not os.path.isdir(DOCS), reason=f"no docs in this tree ({DOCS})")


@needs_docs
def test_the_runner_sees_a_broken_example(sandbox, tmp_path):
    # The control: a page whose example drifted fails the run.
    page = tmp_path / "drift.md"
    page.write_text("<!-- run: console -->\n```\n$ tether run -- sh -c 'exit 3'; echo \"exit=$?\"\n"
                    "exit=4\n```\n")
    rel = os.path.relpath(page, ROOT)
    with pytest.raises(AssertionError, match="the page says"):
        run_page(rel, *sandbox)


@needs_docs
def test_alone_and_tty_are_what_they_say(sandbox, tmp_path):
    # The controls for ``alone`` and ``tty``: a job running outside the
    # transcript is seen by `tether ps` in a plain transcript and not in an
    # ``alone`` one; stdout is a terminal only with ``tty``. Each page that
    # says the other answer fails (the check can fail).
    if os.geteuid() != 0 or not _CGROUP:
        pytest.skip("an `alone` transcript needs root and a cgroup of the test's own")
    cwd, env = sandbox
    outside = subprocess.Popen(["tether", "run", "--", "sleep", "300"], env=env,
                               stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not any(i.comm == "sleep" for i in identity.descendants([outside.pid])):
            assert time.monotonic() < deadline and outside.poll() is None, "no job outside"
            time.sleep(0.05)
        cmds = (f"tether ps | grep -q 'owner={outside.pid} ' && echo seen || echo unseen",
                "[ -t 1 ] && echo terminal || echo pipe")
        for opts, right, wrong in (("", ("seen", "pipe"), ("unseen", "terminal")),
                                   (", tty, alone", ("unseen", "terminal"), ("seen", "pipe"))):
            for answers, fails in ((right, False), ((right[0], wrong[1]), True),
                                   ((wrong[0], right[1]), True)):
                page = tmp_path / "alone.md"
                page.write_text(f"<!-- run: console{opts} -->\n```\n$ {cmds[0]}\n{answers[0]}\n"
                                f"$ {cmds[1]}\n{answers[1]}\n```\n")
                if fails:
                    with pytest.raises(AssertionError, match="the page says"):
                        run_page(os.path.relpath(page, ROOT), cwd, env)
                else:
                    run_page(os.path.relpath(page, ROOT), cwd, env)
    finally:
        outside.kill()
        outside.wait(timeout=10)


@pytest.mark.parametrize("page", RUNNABLE)
def test_page_examples_run(page, sandbox):
    assert run_page(page, *sandbox) > 0


@needs_docs
@pytest.mark.parametrize("page", PAGES)
def test_every_shown_output_is_run(page):
    """An output on a page comes from a run that test_page_examples_run
    repeats, or says where it was made (``shown: WHERE``): none can go stale
    unseen."""
    unrun = [f"{page}:{line}" for line, mark, how in shown_outputs(page)
             if not re.match(rf"<!--\s*(run:.*\b{how}\b|shown:\s*\S)", mark)]
    assert not unrun, f"outputs shown but never run (mark them run, or shown: WHERE): {unrun}"


def test_the_check_sees_an_unrun_output(tmp_path):
    # The control: a page showing an unmarked transcript is caught.
    page = tmp_path / "unrun.md"
    page.write_text("```\n$ tether run -- true\n```\n\n<!-- run: console -->\n```\n$ true\n```\n")
    assert shown_outputs(os.path.relpath(page, ROOT)) == [(1, "", "console"),
                                                          (6, "<!-- run: console -->", "console")]


@needs_docs
def test_every_page_with_examples_marks_some():
    # Pages whose examples can run here: each must carry markers.
    for page in ("README.md", "docs/quickstart.md", "docs/api.md", "docs/cli.md",
                 "docs/init.md", "docs/limits.md", "docs/pytest.md", "docs/guarantees.md"):
        assert page in RUNNABLE, f"{page} has no runnable example"
