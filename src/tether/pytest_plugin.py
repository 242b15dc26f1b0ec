"""pytest plugin: report, and end, the processes a test leaves running.

Loaded by every pytest run through the ``pytest11`` entry point, and inert
unless turned on (only ``pytest_addoption``, ``pytest_configure`` and, at the
very end, one bounded look at the process table run otherwise - a hint line
if processes born during the session outlived it; no process attribute
changes)::

    pytest --tether-leaks=warn     # report each leak as a warning, end it
    pytest --tether-leaks=fail     # the leaking test errors at teardown
    pytest -p tether               # same as --tether-leaks=warn
    [pytest] tether_leaks = fail   # in pytest.ini / pyproject / setup.cfg

When on, for every test: the processes started while the test ran - by the
test or by its function-scoped fixtures, and everything those started - that
are still alive after the function-scoped fixtures were torn down are
reported (pid, command name, age, test id) and ended (SIGTERM, a grace
period, SIGKILL; every signal identity-checked through
``tether.gate.send_signal``).

How a process is tied to the test, without looking at inherited stdout or
stderr (nextest's approach, which reports false leaks under load):

* Linux: the pytest process makes itself a child subreaper
  (``PR_SET_CHILD_SUBREAPER``), so a double-forked or ``setsid`` daemon is
  re-parented to it rather than to PID 1. Then "started by this test" is
  exact: a descendant of this pytest process (read from the kernel's
  ``/proc/PID/task/*/children``) born after the test began and not alive
  when it began. Under pytest-xdist every worker is its own pytest process
  and its own subreaper, so a worker only ever sees its own tests'
  processes. The walk is over this process's descendants only, so its cost
  does not grow with the machine's process count.
* Elsewhere (macOS, BSD, or if the prctl fails): one bounded capture of the
  process table; descendants born after the test began, plus processes born
  after it began that share a session or process group with one of those
  (but not pytest's own session or group, which xdist's workers share). A
  daemon whose parent exited and which left every such session and group
  cannot be tied to the test there; this is stated, not hidden.

Fixtures of wider scope (class, module, package, session) keep their
processes: whatever is born while such a fixture is being set up belongs to
it, with everything it starts later (by parentage, or by its own session or
process group), and is never reported for a test.

Side effect when on (Linux): orphans of the test run re-parent to the pytest
process instead of PID 1, so a test that asserts ``getppid() == 1`` for an
orphan sees pytest's pid instead. The plugin reaps such adopted orphans once
they have exited (but never a child a live ``subprocess.Popen`` or
``multiprocessing`` object still tracks).
"""

from __future__ import annotations

import os
import sys

# pytest is already imported whenever pytest loads this module; tether.identity
# and everything else are imported only when the detector is turned on.
import pytest

TYPE_CHECKING = False
if TYPE_CHECKING:  # pragma: no cover - typing only
    from tether.identity import Identity

MODES = ("off", "warn", "fail")
_DEFAULT_GRACE = 1.0
_MAX_WALK = 100_000  # bound on one walk of our own descendants
# A process still alive this long after its test ended is a leak; less, and
# it is most likely exiting already (a fixture sent SIGTERM without waiting).
_SETTLE = 0.25

__all__ = ["MODES", "TetherLeakWarning", "LeakDetector", "leak_mode"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tether", "tether: leaked-process detection")
    group.addoption(
        "--tether-leaks",
        choices=MODES,
        default=None,
        dest="tether_leaks",
        help="report (warn) or fail a test that leaves processes running; they are "
        "ended either way. Default: the tether_leaks ini value, else off "
        "(warn when loaded with -p tether).",
    )
    group.addoption(
        "--tether-leaks-grace",
        type=_grace_arg,
        default=None,
        dest="tether_leaks_grace",
        metavar="SECONDS",
        help=f"seconds between SIGTERM and SIGKILL for leaked processes (default {_DEFAULT_GRACE:g})",
    )
    parser.addini("tether_leaks", "tether leaked-process detection: off, warn or fail", default="")
    parser.addini(
        "tether_leaks_grace",
        "seconds between SIGTERM and SIGKILL for leaked processes",
        default="",
    )


def _grace_arg(text: str) -> float:
    """``--tether-leaks-grace``: a clean usage error for a bad value."""
    import argparse

    from tether.ending import check_grace

    try:
        return check_grace(float(text), "--tether-leaks-grace")
    except ValueError as exc:  # float() and check_grace both say ValueError
        raise argparse.ArgumentTypeError(str(exc)) from None


def _ini(config: pytest.Config, name: str) -> str:
    return str(config.getini(name) or "").strip()


def _bad_ini(name: str, value: str, why: str) -> pytest.UsageError:
    hint = ""
    if "#" in value or ";" in value:
        hint = " (an inline comment? ini values run to the end of the line: put it on a line of its own)"
    return pytest.UsageError(f"{name} = {value!r}: {why}{hint}")


def leak_mode(config: pytest.Config) -> str:
    """The mode in force: the command line, else the ini value, else ``warn``
    when loaded explicitly with ``-p tether``, else ``off``. A bad ini value
    is a ``pytest.UsageError`` (pytest prints one ``ERROR:`` line), even when
    the command line overrides it."""
    ini = _ini(config, "tether_leaks").lower()
    if ini and ini not in MODES:
        raise _bad_ini("tether_leaks", ini, f"choose one of {', '.join(MODES)}")
    opt = config.getoption("tether_leaks", None)
    if opt:
        return opt
    if ini:
        return ini
    # The entry point loads this module in every run, so being loaded says
    # nothing; an explicit -p does.
    plugins = config.getoption("plugins", None) or []
    if any(p in ("tether", "tether.pytest_plugin") for p in plugins):
        return "warn"
    return "off"


def _grace(config: pytest.Config) -> float:
    """The grace in force (the command line, else the ini value); a bad ini
    value is a ``pytest.UsageError``."""
    ini = _ini(config, "tether_leaks_grace")
    ini_grace = None
    if ini:
        from tether.ending import check_grace

        try:
            ini_grace = check_grace(float(ini), "tether_leaks_grace")
        except ValueError as exc:
            raise _bad_ini("tether_leaks_grace", ini, str(exc)) from None
    g = config.getoption("tether_leaks_grace", None)
    if g is not None:
        return g
    return ini_grace if ini_grace is not None else _DEFAULT_GRACE


def pytest_configure(config: pytest.Config) -> None:
    mode = leak_mode(config)
    grace = _grace(config)
    if mode != "off":
        config.pluginmanager.register(LeakDetector(config, mode, grace), "tether-leaks")
    elif not hasattr(config, "workerinput"):
        # Off (the default): no per-test hook, nothing changed in this
        # process; only the end of the session looks once (an xdist worker
        # leaves that to the controller, which prints the summary).
        config.pluginmanager.register(_OffHint(), "tether-leaks-hint")


class _OffHint:
    """When the detector is off: one line at the end of a session whose
    processes outlived it, saying how to turn the detector on.

    One bounded capture of the process table (``tether.capture.capture``),
    of the processes born after this pytest process: those still below it,
    and those in its session or process group that were orphaned (their
    topmost new ancestor hangs under PID 1 or a subreaper above us - not under
    our own parent, where a sibling command of the same shell would). A
    daemon that left the session too cannot be told from a stranger's, and
    is not counted: the detector, when on, sees it.
    """

    def pytest_terminal_summary(self, terminalreporter) -> None:  # noqa: ANN001
        try:
            left = outliving_processes()
        except (OSError, ValueError):  # no /proc, no psutil: nothing to say
            return
        if not left:
            return
        n = len(left)
        from .stops import oneline

        pids = ", ".join(f"{i.pid} {oneline(i.comm)}" for i in left[:5]) + (
            ", ..." if n > 5 else "")
        terminalreporter.write_line(
            f"tether: {n} process{'es' if n != 1 else ''} started during this session "
            f"{'are' if n != 1 else 'is'} still running (pid {pids}); "
            "pytest --tether-leaks=warn (or tether_leaks = warn in the ini file) "
            "names the test that started each, and ends it.", yellow=True)


def outliving_processes(settle: float = 0.25) -> list[Identity]:
    """Processes born after this one that outlive it (see ``_OffHint``):
    still alive ``settle`` seconds after a first look."""
    import time

    from tether import capture, identity

    me = os.getpid()
    start = identity.start_ticks("self")
    if start is None:
        return []
    cap = capture.capture(time_cap=0.5, born_after=start)
    found = {i.pid: i for i in cap.descendants([me], born_after=start)}
    ancestors = identity.own_ancestors()
    # Windows has no sessions or process groups: there, only descendants.
    mine = {os.getsid(0), os.getpgrp()} - {0, 1} if hasattr(os, "getsid") else set()
    for ident in cap.procs.values():
        # Strictly later than us (a pipeline's other commands start in the
        # same clock tick), never an ancestor (a wrapper such as `timeout`).
        if ident.pid in found or ident.pid in ancestors or ident.start <= start \
                or not ({ident.sid, ident.pgid} & mine):
            continue
        top, seen = ident, 0
        while seen < 4096 and top.ppid in cap.procs and top.ppid != me:
            top, seen = cap.procs[top.ppid], seen + 1
        if top.ppid == 1 or (top.ppid in ancestors and top.ppid not in (me, os.getppid())):
            found[ident.pid] = ident
    from tether.platform import own_helpers

    helpers = own_helpers()
    left = [i for i in found.values()
            if i.state not in ("Z", "X", "x") and i.pid != me and i.pid not in helpers]
    if left:
        time.sleep(settle)  # an xdist worker or a killed child may be on its way out
        left = [i for i in left if identity.is_alive(i)]
    return sorted(left, key=lambda i: i.pid)


class TetherLeakWarning(pytest.PytestWarning):
    """A test left processes running (tether ended them)."""


# ---------------------------------------------------------------------------
# Finding our processes


class _Proc:
    """One process seen in a walk, and the process it hangs under."""

    __slots__ = ("ident", "parent")

    def __init__(self, ident: Identity, parent: int) -> None:
        self.ident = ident
        self.parent = parent


class _Owner:
    """A wider-scoped fixture's processes (keys are ``(pid, start)``)."""

    __slots__ = ("label", "keys", "groups")

    def __init__(self, label: str) -> None:
        self.label = label
        self.keys: set[tuple[int, int]] = set()
        self.groups: set[int] = set()  # sessions / process groups its processes lead


def _key(ident: Identity) -> tuple[int, int]:
    return (ident.pid, ident.start)


class LeakDetector:
    """The per-test machinery; registered by ``pytest_configure`` only when on."""

    def __init__(self, config: pytest.Config, mode: str, grace: float,
                 settle: float = _SETTLE) -> None:
        from tether import identity

        self._id = identity
        self.config = config
        self.mode = mode
        self.grace = grace
        self.settle = settle
        self.me = os.getpid()
        self._subreaper: bool | None = None  # decided at the first test
        self._t0 = 0
        self._before: set[tuple[int, int]] = set()
        self._owners: dict[int, _Owner] = {}  # id(fixturedef) -> its processes
        self._released: list[_Owner] = []  # torn down since the last check
        self._leaks_key = pytest.StashKey[list]()
        self._summary: list[tuple[str, list[dict]]] = []

    # -- finding ----------------------------------------------------------------
    def _setup_subreaper(self) -> None:
        if self._subreaper is not None:
            return
        self._subreaper = False
        if os.environ.get("_TETHER_LEAKS_PORTABLE") == "1":
            return  # test knob: exercise the portable scan on Linux
        if sys.platform.startswith("linux"):
            try:
                from tether._prctl import set_subreaper

                set_subreaper()
                self._subreaper = True
            except OSError:
                self._subreaper = False

    def _walk(self) -> list[_Proc]:
        """Every process below this one, parents before children."""
        from tether import capture, proctree

        me = self.me
        if self._subreaper:
            return [_Proc(i, i.ppid) for i in proctree.descendants([me], limit=_MAX_WALK)]
        # Portable: one bounded capture; descendants, plus processes born
        # after the test began in a session or group one of those is in.
        cap = capture.capture()
        out = [_Proc(i, i.ppid) for i in cap.descendants([me])]
        seen = {p.ident.pid for p in out}
        mine = {os.getpgrp(), os.getsid(0)}
        groups = {
            g
            for p in out
            if p.ident.start >= self._t0
            for g in (p.ident.sid, p.ident.pgid)
            if g > 1 and g not in mine
        }
        for g in sorted(groups):
            for ident in cap.by_session(g, self._t0) + cap.by_pgid(g, self._t0):
                if ident.pid not in seen:
                    seen.add(ident.pid)
                    out.append(_Proc(ident, ident.ppid))
        return out

    def _classify(self, procs: list[_Proc]) -> list[tuple[Identity, str]]:
        """(process, whose) for every process the current test or a fixture
        torn down during it is answerable for; ``whose`` is ``""`` for the
        test itself, else the fixture's label."""
        held: set[int] = set()  # pids held by a live wider fixture
        released: dict[int, str] = {}  # pid -> label of a fixture torn down
        live_groups = set()
        for o in self._owners.values():
            live_groups |= o.groups
        rel_keys: dict[tuple[int, int], str] = {}
        rel_groups: dict[int, str] = {}
        for o in self._released:
            for k in o.keys:
                rel_keys[k] = o.label
            for g in o.groups:
                rel_groups[g] = o.label
        owned = set()
        for o in self._owners.values():
            owned |= o.keys
        from tether.platform import own_helpers

        out = []
        helpers = own_helpers()  # (not their children: a job's keeper left open is a leak)
        # Parents come first, so a parent's verdict is known for its children.
        for p in procs:
            ident = p.ident
            if ident.pid in helpers:
                continue
            k = _key(ident)
            if k in owned or p.parent in held or ident.sid in live_groups \
                    or ident.pgid in live_groups:
                held.add(ident.pid)
                continue
            label = rel_keys.get(k) or released.get(p.parent) \
                or rel_groups.get(ident.sid) or rel_groups.get(ident.pgid)
            if label:
                released[ident.pid] = label
                out.append((ident, label))
                continue
            if ident.start >= self._t0 and k not in self._before:
                out.append((ident, ""))
        return out

    def _born_since(self, t: int) -> set[tuple[int, int]]:
        return {_key(p.ident) for p in self._walk() if p.ident.start >= t}

    # -- hooks ------------------------------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        # tryfirst: before the runner's own implementation sets up fixtures.
        self._setup_subreaper()
        self._t0 = self._id.now_ticks()
        # A process born in the same clock tick just before the test began
        # has start == t0: remember those alive now, they are not the test's.
        self._before = self._born_since(self._t0)

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):  # noqa: ANN001, ANN201
        scope = getattr(fixturedef, "scope", "function")
        scope = getattr(scope, "value", scope)  # a Scope enum in some pytest versions
        if scope == "function" or self._subreaper is None:
            return (yield)
        # Wider fixtures are set up before every function-scoped one of the
        # test, so what is born now is the fixture's, not the test's.
        t = self._id.now_ticks()
        alive_before = self._born_since(t)
        try:
            return (yield)
        finally:
            owner = self._owners.setdefault(
                id(fixturedef), _Owner(f"{scope}-scoped fixture {fixturedef.argname!r}"))
            mine = (os.getpgrp(), os.getsid(0))
            for p in self._walk():
                k = _key(p.ident)
                if p.ident.start >= t and k not in alive_before and k not in self._before:
                    owner.keys.add(k)
                    # A session or group it leads marks its double-forked
                    # workers as its own too.
                    for g in (p.ident.sid, p.ident.pgid):
                        if g == p.ident.pid and g > 1 and g not in mine:
                            owner.groups.add(g)

    @pytest.hookimpl
    def pytest_fixture_post_finalizer(self, fixturedef, request) -> None:  # noqa: ANN001
        owner = self._owners.pop(id(fixturedef), None)
        if owner is not None and owner.keys:
            # Checked with the current test's leaks, at the end of its teardown.
            self._released.append(owner)

    # tryfirst makes this the outermost wrapper: its code after the yield runs
    # after every other teardown implementation (the fixtures' finalizers too).
    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None):  # noqa: ANN201
        try:
            return (yield)  # every function-scoped fixture is torn down in here
        finally:
            self._check(item)

    def _check(self, item: pytest.Item) -> None:
        if self._subreaper is None:
            return
        import time

        procs = self._walk()
        self._reap_adopted(procs)
        found = {_key(i): (i, whose) for i, whose in self._classify(procs)
                 if i.state not in ("Z", "X", "x")}
        # A process that was sent SIGTERM by a fixture that did not wait for
        # it is on its way out: give such processes a moment before calling
        # them leaked.
        waited = bool(found)
        deadline = time.monotonic() + self.settle
        delay = 0.001
        while found and time.monotonic() < deadline:
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
            found = {k: v for k, v in found.items() if self._id.is_alive(v[0])}
        if not found:
            if waited:
                self._reap_adopted(self._walk())  # those that exited meanwhile
            self._released.clear()
            return
        try:
            report = self._end(list(found.values()), item.nodeid)
        finally:
            self._released.clear()
        item.stash[self._leaks_key] = report
        if self.mode == "warn":
            import warnings

            # Attributed to the test's own line, not to this plugin.
            path, lineno, _ = item.location
            warnings.warn_explicit(TetherLeakWarning(format_leaks(item.nodeid, report)),
                                   TetherLeakWarning, str(self.config.rootpath / path),
                                   (lineno or 0) + 1)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call):  # noqa: ANN001, ANN201
        rep = yield
        if call.when != "teardown":
            return rep
        report = item.stash.get(self._leaks_key, None)
        if not report:
            return rep
        text = format_leaks(item.nodeid, report)
        # user_properties travel with the report to the xdist controller.
        rep.user_properties.append(("tether_leaks", report))
        if self.mode == "fail" and rep.outcome == "passed":
            rep.outcome = "failed"
            rep.longrepr = _leak_repr(text, item)
        return rep

    def pytest_runtest_logreport(self, report) -> None:  # noqa: ANN001
        if report.when != "teardown":
            return
        for name, value in getattr(report, "user_properties", ()):
            if name == "tether_leaks" and value:
                self._summary.append((report.nodeid, list(value)))

    def _shown_with_each_test(self) -> bool:
        """Whether pytest already showed each test's report: the teardown
        error (fail), the warnings summary (warn) - unless turned off."""
        cfg = self.config
        if self.mode == "fail":
            return cfg.getoption("tbstyle", "auto") != "no"
        return not cfg.getoption("disable_warnings", False) \
            and cfg.pluginmanager.has_plugin("warnings")

    def pytest_terminal_summary(self, terminalreporter) -> None:  # noqa: ANN001
        if not self._summary:
            return
        n = sum(len(r) for _, r in self._summary)
        t = len(self._summary)
        shown = self._shown_with_each_test()
        where = "warnings summary" if self.mode == "warn" else "teardown errors"
        terminalreporter.write_sep(
            "=",
            f"tether: {n} leaked process{'es' if n != 1 else ''} in {t} "
            f"test{'s' if t != 1 else ''}, ended" + (f" (each listed in the {where} above)"
                                                    if shown else ""),
            yellow=self.mode == "warn",
            red=self.mode == "fail",
        )
        if not shown:  # once each: here, since pytest did not show them with their test
            for nodeid, report in self._summary:
                terminalreporter.write_line(format_leaks(nodeid, report))

    # -- ending -----------------------------------------------------------------
    def _end(self, leaks: list[tuple[Identity, str]], nodeid: str) -> list[dict]:

        idm = self._id
        now = idm.now_ticks()
        hz = idm.clock_ticks()
        rows: dict[tuple[int, int], dict] = {}
        for i, whose in leaks:
            cur = idm.read(i.pid)  # fresh: the walk may have seen it before its exec
            rows[_key(i)] = {
                "pid": i.pid,
                "comm": cur.comm if cur is not None and cur.start == i.start else i.comm,
                "cmdline": idm.cmdline(i.pid, 512),
                "age": round(max(0, now - i.start) / hz, 2),
                "test": nodeid,
                "owner": whose or "test",
                "ended": None,
            }

        from tether.gate import Proof

        # What proves a target at the signal: the walk below this process, as
        # it was a moment ago - a child of this process or of a process it
        # found, or a member (not the leader) of a group or session it went
        # by; a stranger handed a leaked pid in the same tick is none of these.
        proof = Proof()
        mine = {os.getpgrp(), os.getsid(0)}

        def still() -> list[Identity]:
            # Found again each round: a leaked process may still be forking.
            # Released fixtures' processes stay targets until they are gone.
            walk = self._walk()
            proof.parents = frozenset({self.me, *(p.ident.pid for p in walk)})
            if not self._subreaper:
                proof.groups = frozenset(g for p in walk for g in (p.ident.sid, p.ident.pgid)
                                         if g > 1 and g not in mine)
            return [i for i, _ in self._classify(walk)]

        from tether.ending import end

        # born_after=None: a released wider fixture's processes are older than
        # the test; every target is proven by the walk below this process.
        ending = end(still, targets=[i for i, _ in leaks], born_after=None, grace=self.grace,
                     member=True, on_round=lambda: self._reap_adopted(self._walk()),
                     proof=lambda _i: proof)
        self._reap_adopted(self._walk())
        for ident, how in ending.ended:
            row = rows.get(_key(ident))
            if row is not None:
                row["ended"] = how
        for ident, why in ending.refused:
            row = rows.get(_key(ident))
            if row is not None:
                row["ended"] = f"refused: {why}"
        for ident in ending.survivors:
            row = rows.get(_key(ident))
            if row is not None:
                row["ended"] = f"STILL ALIVE ({row['ended'] or 'not signalled'})"
        for row in rows.values():
            if row["ended"] is None:
                row["ended"] = "exit"  # it went by itself during the grace
        return list(rows.values())

    def _reap_adopted(self, procs: list[_Proc]) -> None:
        """Reap our exited children born in this test that nothing else will wait for.

        A subreaper adopts orphans; when they exit they stay zombies until
        their new parent waits. Never reap a child a live Popen object
        tracks: its ``wait()`` would then report a wrong status.
        """
        me = self.me
        zombies = [
            p.ident.pid
            for p in procs
            if p.parent == me and p.ident.state == "Z" and p.ident.start >= self._t0
        ]
        if not zombies:
            return
        tracked = _tracked_children()
        for pid in zombies:
            if pid in tracked:
                continue
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def _tracked_children() -> set[int]:
    """Pids that a live subprocess.Popen / multiprocessing Popen will wait for."""
    import gc

    classes: list[type] = []
    sp = sys.modules.get("subprocess")
    if sp is not None:
        classes.append(sp.Popen)
    for name in ("multiprocessing.popen_fork", "multiprocessing.popen_forkserver",
                 "multiprocessing.popen_spawn_posix"):
        mod = sys.modules.get(name)
        if mod is not None:
            classes.append(mod.Popen)
    if not classes:
        return set()
    kinds = tuple(classes)
    out = set()
    for obj in gc.get_objects():
        if isinstance(obj, kinds) and getattr(obj, "returncode", None) is None:
            pid = getattr(obj, "pid", None)
            if isinstance(pid, int):
                out.add(pid)
    return out


def _leak_repr(text: str, item: pytest.Item):  # noqa: ANN202
    """The teardown error: the whole listing where the error is shown, its
    first line alone in one-line summaries.

    A plain string would do on a terminal, where pytest trims the short
    summary to one line, but under CI (``CI`` set) pytest prints a string
    report whole there, and every process would be listed twice.  The
    listing is given as pytest's own "value" style report (what
    ``pytest.fail(pytrace=False)`` prints) with a one-line crash message;
    that also survives xdist's serialization.  Should a pytest release
    change these classes, the string is the fallback.
    """
    try:
        from _pytest._code.code import (
            ExceptionChainRepr,
            ReprEntry,
            ReprFileLocation,
            ReprTraceback,
        )

        path, lineno, _ = item.location
        entry = ReprEntry(text.split("\n"), None, None, None, "value")
        # The summary line names the test already.
        first = text.split("\n", 1)[0].replace(f" {item.nodeid} ", " ", 1).rstrip(":")
        crash = ReprFileLocation(path, (lineno or 0) + 1, first)
        return ExceptionChainRepr([(ReprTraceback([entry], None, "value"), crash, None)])
    except (ImportError, TypeError):
        return text


def format_leaks(nodeid: str, report: list[dict]) -> str:
    """The human report of one test's leaks."""
    n = len(report)
    lines = [f"tether: {nodeid} left {n} process{'es' if n != 1 else ''} running:"]
    for r in report:
        cmd = r.get("cmdline") or ""
        if len(cmd) > 60:
            cmd = cmd[:57] + "..."
        whose = r.get("owner") or "test"
        by = "" if whose == "test" else f"  [left by {whose}]"
        lines.append(
            f"  pid {r['pid']:<7} {r['comm'][:15]:<15} age {r['age']:>6.2f} s  "
            f"ended by {r['ended']:<7}  {cmd}{by}".rstrip()
        )
    return "\n".join(lines)
