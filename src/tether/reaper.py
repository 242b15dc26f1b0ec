"""The orphan reaper: end what earlier runs left alive -- only what it can prove
is theirs -- and say what it ended and what it left alone.

Proof, in order (see docs/reaper.md):

1. A **run is over** when its owner, by identity (pid + kernel start ticks +
   boot id, from the ``owner`` field of its audit records), is gone: exited,
   a zombie, its pid now another process, or another boot. A run whose owner
   is alive is never touched, nor a run the caller excludes.
2. A **recorded process** (a ``spawn`` record of an over run) is ended only
   when the process now at that pid has the recorded start ticks and boot id
   (anything else is PID reuse), belongs to this user, and its record (or its
   job's ``job-open`` record) is not marked ``background`` or ``detached``.
3. Its **descendants** are found by one bounded capture of the process table,
   walking parent links from the recorded process and only through processes
   born after it; a descendant of another user, or marked background or
   detached, is left alone with everything below it.
4. A **stale cgroup** is tether's own run directory ``tether-<pid>-<start>``
   whose owner identity is gone: whatever is still in it was put there by the
   kernel because it descends from a job member, so it is ended (``cgroup.kill``)
   and the directory removed -- unless a member belongs to another user or is
   marked background/detached, in which case only this user's unprotected
   members are ended, one by one, and the directory stays.

Ending: SIGTERM (then SIGCONT, so a stopped process sees it) to every target,
deepest first; up to ``grace`` seconds for them to exit; then the survivors
are frozen with SIGSTOP (parents first) and the process table is read again
until no new descendant appears (so nothing forks its way out of the kill),
and SIGKILL goes to them deepest first, and ``cgroup.kill`` to stale cgroups.
Every signal goes through :func:`tether.identity.send_signal`, which checks the
identity again at the moment of sending. A zombie counts as dead.

Limits: an escapee that double-forked away from a process group/subreaper job
and whose intermediate parent has exited is linked to its run by nothing the
kernel keeps (no parent, no cgroup); without a cgroup the reaper cannot prove
it is a leftover and does not look for it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import identity
from .audit import parse_pid, parse_start
from .errors import SignalRefused
from .identity import Identity
from .platform._linux_kill import procs_here as _cg_procs_here

__all__ = ["Ended", "Skipped", "ReapReport", "reap", "cli"]

_LINUX = sys.platform.startswith("linux")
RUN_DIR_RE = re.compile(r"^tether-(\d+)-(\d+)$")
PROBE_DIR_RE = re.compile(r"^tether-probe-(\d+)$")
# A job cgroup whose name ends so belongs to a background job (outlives its owner on purpose).
BACKGROUND_SUFFIX = ".bg"

# Skip reasons: stable strings (the JSON output documents them).
PID_REUSED = "pid reused"
OTHER_USER = "other user"
BACKGROUND = "background"
DETACHED = "detached"
OWNER_ALIVE = "owner alive"
EXCLUDED = "excluded run"
OWNER_UNKNOWN = "owner unknown"
NO_START = "no start recorded"
REFUSED = "refused"
SURVIVED = "could not end"
OWN_PROCESS = "own process or ancestor"

# Windows has no SIGKILL; os.kill with SIGTERM is TerminateProcess there.
_SIGKILL = getattr(signal, "SIGKILL", signal.SIGTERM)
_STOP_ROUNDS = 8  # freeze-and-rescan rounds before SIGKILL; one is usually enough
_FINAL_WAIT = 3.0  # seconds for SIGKILLed processes to be gone (a zombie counts as gone)


# --------------------------------------------------------------------------
# The report


@dataclass
class Ended:
    """A process the reaper ended (or, in a dry run, would end)."""

    pid: int
    run: str
    session: str | None
    job: str | None
    runtime_s: float  # how long it had been running when it was ended
    comm: str
    how: str  # "SIGTERM", "SIGKILL", "cgroup.kill", or "dry-run"
    start: str = ""  # its start token "ticks@bootid"
    via: int | None = None  # the recorded process it descends from; None: recorded itself
    cgroup: str | None = None  # the stale cgroup it was found in, if any


@dataclass
class Skipped:
    """A live process tied to a record or stale cgroup that was left alone, and why."""

    pid: int
    run: str
    reason: str  # one of the reason constants above
    detail: str = ""
    comm: str = ""
    session: str | None = None
    job: str | None = None


@dataclass
class ReapReport:
    """What one :func:`reap` ended, skipped and removed."""

    ended: list[Ended] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    cgroups_removed: list[str] = field(default_factory=list)
    log_stats: Any = None  # tether.audit.ReadStats of the audit log read
    dry_run: bool = False
    state_dir: str = ""
    runs_over: list[str] = field(default_factory=list)  # runs whose owner is gone
    runs_live: list[str] = field(default_factory=list)  # runs whose owner is alive
    notes: list[str] = field(default_factory=list)  # what limited the proof or the log
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        """False when something the reaper meant to end is still alive."""
        return not any(s.reason == SURVIVED for s in self.skipped)

    def to_dict(self) -> dict[str, Any]:
        """Stable JSON shape; see docs/reaper.md."""
        stats = self.log_stats
        if hasattr(stats, "as_dict"):
            stats = stats.as_dict()
        elif dataclasses.is_dataclass(stats) and not isinstance(stats, type):
            stats = dataclasses.asdict(stats)
        return {
            "version": 1,
            "dry_run": self.dry_run,
            "ok": self.ok,
            "state_dir": self.state_dir,
            "ended": [dataclasses.asdict(e) for e in self.ended],
            "skipped": [dataclasses.asdict(s) for s in self.skipped],
            "cgroups_removed": list(self.cgroups_removed),
            "runs": {"over": list(self.runs_over), "live": list(self.runs_live)},
            "log": stats,
            "notes": list(self.notes),
            "elapsed_s": round(self.elapsed_s, 4),
        }

    def __str__(self) -> str:
        out: list[str] = []
        st = self.log_stats
        head = f"audit log {self.state_dir or '(none)'}"
        if st is not None:
            head += f": {st.files} file(s), {st.records} record(s)"
            bad = st.corrupt + st.truncated + st.too_long
            if bad:
                head += f", {bad} unreadable line(s) skipped"
        out.append(head)
        out.append(f"runs over: {len(self.runs_over)}, live: {len(self.runs_live)}")
        verb = "would end" if self.dry_run else "ended"
        if self.ended:
            out.append(f"{verb} {len(self.ended)} process(es):")
            rows = [("PID", "RUN", "SESSION", "JOB", "RUNNING", "COMMAND", "HOW")]
            for e in self.ended:
                rows.append((str(e.pid), e.run, e.session or "-", e.job or "-",
                             _duration(e.runtime_s), e.comm or "?", e.how))
            out.extend(_table(rows))
        else:
            out.append(f"{verb} nothing")
        if self.skipped:
            out.append(f"left alone {len(self.skipped)} process(es):")
            rows = [("PID", "RUN", "COMMAND", "REASON")]
            for s in self.skipped:
                why = s.reason + (f" ({s.detail})" if s.detail else "")
                rows.append((str(s.pid), s.run, s.comm or "?", why))
            out.extend(_table(rows))
        if self.cgroups_removed:
            out.append(("would remove" if self.dry_run else "removed") + " cgroup(s):")
            out.extend(f"  {p}" for p in self.cgroups_removed)
        for n in self.notes:
            out.append(f"note: {n}")
        return "\n".join(out)


def _duration(s: float) -> str:
    s = max(0, int(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in rows]


# --------------------------------------------------------------------------
# What the audit log says


@dataclass
class _Proc:
    pid: int
    start: int
    job: str | None
    session: str | None
    background: bool
    detached: bool
    cgroup: str | None


@dataclass
class _Run:
    run: str
    owner: Identity | None = None
    owner_conflict: bool = False
    app: str | None = None
    end_ts: float | None = None  # ts of its run-end record, if any
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    procs: dict[tuple[int, int], _Proc] = field(default_factory=dict)
    cgroups: set[str] = field(default_factory=set)

    def job_flag(self, job: str | None, key: str) -> bool:
        return bool(job is not None and self.jobs.get(job, {}).get(key))

    def job_session(self, job: str | None) -> str | None:
        return self.jobs.get(job, {}).get("session") if job is not None else None


def _opt_str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _read_runs(state_dir: Path, stats: Any, notes: list[str]) -> dict[str, _Run]:
    from . import audit

    boot = identity.boot_id()
    runs: dict[str, _Run] = {}
    owners: dict[tuple[Any, Any], Identity | None] = {}  # a run repeats its owner in every record
    unusable = 0
    for rec in audit.read_records(state_dir, stats=stats):
        if rec.get("event") not in _SOURCES:
            continue  # reap/error records and unknown (newer) events prove nothing
        try:
            _absorb(rec, runs, boot, owners)
        except (TypeError, ValueError, KeyError, AttributeError):
            unusable += 1  # a well-formed line of the wrong shape: skip it, keep reading
    if unusable:
        notes.append(f"{unusable} audit record(s) had fields of the wrong type and were ignored")
    return runs


_SOURCES = frozenset(("spawn", "job-open", "job-close", "exit", "run-start", "run-end"))


def _owner_of(owner: Any, cache: dict[tuple[Any, Any], Identity | None]) -> Identity | None:
    if type(owner) is not dict:
        return None
    raw = (owner.get("pid"), owner.get("start"))
    try:
        return cache[raw]
    except KeyError:
        pass
    except TypeError:
        return None  # unhashable values: not an identity
    opid = parse_pid(raw[0])
    ot = parse_start(raw[1])
    ident = Identity(opid, ot[0], ot[1]) if opid is not None and ot is not None else None
    if len(cache) < 65536:
        cache[raw] = ident
    return ident


def _absorb(rec: dict[str, Any], runs: dict[str, _Run], boot: str,
            owners: dict[tuple[Any, Any], Identity | None]) -> None:
    event = rec["event"]
    otok = _owner_of(rec.get("owner"), owners)
    run_id = rec.get("run")
    if type(run_id) is not str:
        if otok is None:
            return
        run_id = f"{otok.pid}-{otok.start}"
    if otok is not None and otok.boot != boot:
        return  # an earlier boot: every process it knew is gone
    run = runs.get(run_id)
    if run is None:
        run = runs[run_id] = _Run(run_id)
    if otok is not None and run.owner is not otok:
        if run.owner is None:
            run.owner = otok
        elif not run.owner.same_process(otok):
            run.owner_conflict = True  # two owners claim one run id: trust neither
    if run.app is None:
        run.app = _opt_str(rec.get("app"))
    job = rec.get("job")
    if type(job) is not str:
        job = None
    cg = rec.get("cgroup")
    if cg and type(cg) is str and cg not in run.cgroups:
        run.cgroups.add(cg)
    if event == "spawn" or event == "exit":
        pid = parse_pid(rec.get("pid"))
        if pid is None:
            return
        tok = parse_start(rec.get("start"), rec.get("boot"))
        if tok is None:
            key = (pid, -1)  # no start, no identity: remembered only to be reported
        elif tok[1] != boot:
            return
        else:
            key = (pid, tok[0])
        if event == "exit":
            run.procs.pop(key, None)  # it exited on record; nothing to look for
            return
        prev = run.procs.get(key)
        session = rec.get("session")
        run.procs[key] = _Proc(
            pid,
            key[1],
            job,
            session if type(session) is str else (prev.session if prev else None),
            rec.get("background") is True or bool(prev and prev.background),
            rec.get("detached") is True or bool(prev and prev.detached),
            cg if type(cg) is str else None,
        )
    elif event == "run-end":
        ts = rec.get("ts")
        if isinstance(ts, (int, float)):
            run.end_ts = float(ts)
    elif (event == "job-open" or event == "job-close") and job is not None:
        info = run.jobs.setdefault(job, {})
        for key in ("background", "detached"):
            if rec.get(key) is True:
                info[key] = True
        sess = rec.get("session")
        if type(sess) is str:
            info.setdefault("session", sess)


# --------------------------------------------------------------------------
# Targets


@dataclass
class _Target:
    ident: Identity  # as read just now: real uid, comm, ppid
    run: str
    session: str | None
    job: str | None
    via: int | None = None
    cgroup: str | None = None
    how: str = ""
    ended_at: int = 0  # now_ticks() when it was seen gone

    @property
    def key(self) -> tuple[int, int]:
        return (self.ident.pid, self.ident.start)


class _Plan:
    """Targets (to end), protected identities (never to end), and the report."""

    def __init__(self, report: ReapReport) -> None:
        self.report = report
        self.targets: dict[tuple[int, int], _Target] = {}
        self.protected: dict[tuple[int, int], str] = {}  # identity -> why it is never ended
        self.skipped_keys: set[tuple[int, int]] = set()
        self.uid = os.getuid() if hasattr(os, "getuid") else None
        self.excluded_pids = identity.own_ancestors() | {os.getpid()}
        self._cap: identity.Capture | None = None

    def capture(self) -> identity.Capture:
        """The first full capture, shared by record lookup and the first descendant walk."""
        if self._cap is None:
            self._cap = identity.capture()
            if not self._cap.complete:
                self.report.notes.append(
                    f"process-table capture incomplete ({self._cap.reason}): "
                    "each record's pid is read one by one, descendants may be missed")
        return self._cap

    def skip(self, ident: Identity, run: str, reason: str, detail: str = "",
             session: str | None = None, job: str | None = None) -> None:
        key = (ident.pid, ident.start)
        if key in self.skipped_keys:
            return
        self.skipped_keys.add(key)
        self.report.skipped.append(Skipped(ident.pid, run, reason, detail, ident.comm, session, job))

    def foreign(self, ident: Identity) -> bool:
        return self.uid is not None and ident.uid != self.uid

    def add(self, t: _Target) -> bool:
        """Add a target unless it must be left alone (then report why)."""
        ident = t.ident
        if t.key in self.targets:
            return True
        why = self.protected.get(t.key)
        if why is not None:
            self.skip(ident, t.run, why, "another record protects it", t.session, t.job)
            return False
        if ident.pid in self.excluded_pids:
            self.skip(ident, t.run, OWN_PROCESS, session=t.session, job=t.job)
            return False
        if self.foreign(ident):
            self.skip(ident, t.run, OTHER_USER, f"uid {ident.uid}", t.session, t.job)
            return False
        self.targets[t.key] = t
        return True


def _ticks_at(ts: float) -> int:
    """A wall-clock epoch time as boot-clock ticks (approximate: the wall clock may step)."""
    return identity.now_ticks() - int((time.time() - ts) * identity.clock_ticks())


def _plan_records(runs: dict[str, _Run], plan: _Plan, *, app: str | None,
                  exclude_runs: Iterable[str]) -> list[_Target]:
    """Resolve every recorded process of every run; return the recorded targets."""
    report = plan.report
    excluded = set(exclude_runs)
    roots: list[_Target] = []
    cap = plan.capture() if any(r.procs for r in runs.values()) else None
    states: dict[str, str] = {}
    for run in runs.values():
        if app is not None and run.app != app:
            state = "other app"
        elif run.run in excluded:
            state = "excluded"
        elif run.owner is None or run.owner_conflict:
            state = "unknown"
        elif identity.is_alive(run.owner):
            state = "live"
        else:
            state = "over"
        states[run.run] = state
    # Protected identities first, across all runs: a descendant walk must stop
    # at a background or detached process, and at every process of a run that
    # is not being reaped (a live owner started from inside a leftover shell
    # descends from that leftover, yet its run must never be touched).
    for run in runs.values():
        state = states[run.run]
        if state == "live" and run.owner is not None:
            plan.protected[(run.owner.pid, run.owner.start)] = OWNER_ALIVE
        for p in run.procs.values():
            if p.start < 0:
                continue
            if p.detached or run.job_flag(p.job, "detached"):
                why = DETACHED
            elif p.background or run.job_flag(p.job, "background"):
                why = BACKGROUND
            elif state != "over":
                why = {"live": OWNER_ALIVE, "excluded": EXCLUDED, "unknown": OWNER_UNKNOWN}.get(
                    state, "another app's run")
            else:
                continue
            plan.protected.setdefault((p.pid, p.start), why)
    for run in runs.values():
        state = states[run.run]
        if state == "other app":
            continue
        if state == "live":
            report.runs_live.append(run.run)
        elif state == "over":
            report.runs_over.append(run.run)
        end_ticks = _ticks_at(run.end_ts) if run.end_ts is not None else None
        for p in run.procs.values():
            session = p.session or run.job_session(p.job)
            # One capture answers "is anything at this pid" for the many records
            # whose process is long gone; what is there is then read afresh.
            seen = cap.get(p.pid) if cap is not None and cap.complete else identity.read(p.pid)
            if seen is None or seen.state in ("Z", "X", "x"):
                continue  # gone
            cur = identity.read(p.pid)
            if cur is None or cur.state in ("Z", "X", "x"):
                continue  # gone since
            if p.start < 0:
                if state == "over":
                    plan.skip(cur, run.run, NO_START, "its record has no start time: no identity "
                              "to prove it is the process started then", session, p.job)
                continue
            if cur.start != p.start:
                if state == "over":
                    if end_ticks is not None and cur.start > end_ticks:
                        detail = "the process there now started after its run ended"
                    else:
                        detail = "the process there now started at another time"
                    plan.skip(cur, run.run, PID_REUSED, detail, session, p.job)
                continue
            if state == "live":
                plan.skip(cur, run.run, OWNER_ALIVE, f"owner pid {run.owner.pid} is running",
                          session, p.job)
                continue
            if state == "excluded":
                plan.skip(cur, run.run, EXCLUDED, "", session, p.job)
                continue
            if state == "unknown":
                why = ("two owners claim this run id" if run.owner_conflict
                       else "its records name no owner identity")
                plan.skip(cur, run.run, OWNER_UNKNOWN, why, session, p.job)
                continue
            if p.detached or run.job_flag(p.job, "detached"):
                plan.skip(cur, run.run, DETACHED, "launched to survive on purpose", session, p.job)
                continue
            if p.background or run.job_flag(p.job, "background"):
                plan.skip(cur, run.run, BACKGROUND, "meant to outlive its owner", session, p.job)
                continue
            t = _Target(cur, run.run, session, p.job)
            if plan.add(t):
                roots.append(t)
    return roots


def _walk(plan: _Plan, cap: identity.Capture, parent: _Target) -> list[_Target]:
    """Descendants of ``parent`` in ``cap`` that may be ended, breadth first.

    Stops below a protected process and below another user's process.
    """
    out: list[_Target] = []
    dropped: set[int] = set()
    via = parent.via if parent.via is not None else parent.ident.pid
    for d in cap.descendants([parent.ident.pid], born_after=parent.ident.start):
        why = plan.protected.get((d.pid, d.start))
        if d.ppid in dropped or why is not None:
            dropped.add(d.pid)
            if why is not None:
                plan.skip(d, parent.run, why, f"descends from leftover {via}", parent.session,
                          parent.job)
            continue
        if (d.pid, d.start) in plan.targets:
            continue
        cur = identity.read(d.pid)  # the capture's uid is the effective one; read the real one
        if cur is None or cur.start != d.start or cur.state in ("Z", "X", "x"):
            continue
        # cgroup stays None: only what cgroup.procs lists is ended by cgroup.kill.
        t = _Target(cur, parent.run, parent.session, parent.job, via)
        if plan.add(t):
            out.append(t)
        else:
            dropped.add(d.pid)
    return out


def _expand(plan: _Plan, parents: list[_Target], notes: list[str],
            cap: identity.Capture | None = None) -> list[_Target]:
    """One bounded capture (or ``cap``); add every eligible descendant of ``parents``."""
    if not parents:
        return []
    if cap is None:
        cap = identity.capture(born_after=min(t.ident.start for t in parents))
        if not cap.complete:
            notes.append(f"process-table capture incomplete ({cap.reason}): "
                         "descendants may be missed")
    added: list[_Target] = []
    for t in list(parents):
        added.extend(_walk(plan, cap, t))
    return added


# --------------------------------------------------------------------------
# Stale cgroups (Linux, cgroup v2)


@dataclass
class _StaleRun:
    path: str
    run: str
    jobs: list[str] = field(default_factory=list)  # job dirs to cgroup.kill and remove
    kept: bool = False  # some job dir must stay (protected or foreign members)




def _run_dir_of(path: str, mount: str) -> str | None:
    """The ``tether-<pid>-<start>`` directory at or above ``path`` inside ``mount``."""
    try:
        real = os.path.realpath(path)
    except OSError:
        return None
    mount = os.path.realpath(mount)
    if os.path.commonpath([real, mount]) != mount:
        return None
    p = real
    while p != mount and len(p) > len(mount):
        if RUN_DIR_RE.match(os.path.basename(p)):
            return p
        p = os.path.dirname(p)
    return None


def _cgroup_candidates(runs: dict[str, _Run], cgroup_dirs: Iterable[str] | None,
                       app: str | None, notes: list[str]) -> tuple[str | None, set[str], set[str]]:
    """(mount, run dirs to examine, stale probe dirs)."""
    from .platform import linux_cgroup as lc

    mount = lc.cgroup2_mount()
    if mount is None:
        return None, set(), set()
    dirs: set[str] = set()
    probes: set[str] = set()
    for run in runs.values():
        if app is not None and run.app != app:
            continue
        for cg in run.cgroups:
            rd = _run_dir_of(cg, mount)
            if rd is not None and os.path.isdir(rd):
                dirs.add(rd)
    if cgroup_dirs is None:
        own = lc.own_cgroup()
        cgroup_dirs = [os.path.join(mount, own.lstrip("/"))] if own is not None else []
    if app is not None:
        return mount, dirs, probes  # only the runs the audit ties to this app
    for base in cgroup_dirs:
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            full = os.path.join(base, name)
            if RUN_DIR_RE.match(name):
                rd = _run_dir_of(full, mount)
                if rd is not None:
                    dirs.add(rd)
            elif PROBE_DIR_RE.match(name):
                probes.add(full)
    return mount, dirs, probes


def _job_protection(run: _Run | None, job: str) -> str | None:
    """Why the job cgroup named ``job`` must be left alone, or None."""
    if run is not None and run.job_flag(job, "detached"):
        return DETACHED
    if job.endswith(BACKGROUND_SUFFIX) or (run is not None and run.job_flag(job, "background")):
        return BACKGROUND
    return None


def _plan_job_cgroup(plan: _Plan, run: _Run | None, run_id: str, jd: str) -> bool:
    """Plan one job cgroup of a stale run; True when it may be cgroup.kill'ed whole.

    Nested job cgroups (a job opened inside another) are judged one by one: a
    background or detached one protects everything in it, and then the outer
    job is not killed whole -- its other members are ended one by one.
    """
    whole = True
    protected_dirs: dict[str, str] = {}
    for dirpath, _dirs, _files in os.walk(jd):  # top-down: a parent before its children
        job = os.path.basename(dirpath)
        why = protected_dirs.get(os.path.dirname(dirpath)) or _job_protection(run, job)
        if why is not None:
            protected_dirs[dirpath] = why
            whole = False
        session = run.job_session(job) if run is not None else None
        for pid in _cg_procs_here(dirpath):
            cur = identity.read(pid)
            if cur is None or cur.state in ("Z", "X", "x"):
                continue
            key = (cur.pid, cur.start)
            if why is not None:
                plan.protected[key] = why
                plan.targets.pop(key, None)
                plan.skip(cur, run_id, why, f"in job cgroup {dirpath}", session, job)
                continue
            if key in plan.protected:
                whole = False
                plan.skip(cur, run_id, plan.protected[key], f"its record says so; in {dirpath}",
                          session, job)
                continue
            t = plan.targets.get(key) or _Target(cur, run_id, session, job)
            if plan.add(t):
                t.cgroup = dirpath
            else:
                whole = False
    return whole  # if not, its members are ended one by one (SIGKILL), the dir stays


def _plan_cgroups(runs: dict[str, _Run], plan: _Plan, *, app: str | None,
                  exclude_runs: Iterable[str], cgroup_dirs: Iterable[str] | None,
                  notes: list[str]) -> tuple[list[_StaleRun], list[str]]:
    from .platform import linux_cgroup as lc

    mount, dirs, probes = _cgroup_candidates(runs, cgroup_dirs, app, notes)
    if mount is None:
        return [], []
    excluded = set(exclude_runs)
    euid = os.geteuid()
    stale: list[_StaleRun] = []
    for rd in sorted(dirs):
        m = RUN_DIR_RE.match(os.path.basename(rd))
        if m is None:
            continue
        try:
            st = os.lstat(rd)
        except OSError:
            continue
        if st.st_uid != euid or not os.path.isdir(rd) or os.path.islink(rd):
            continue  # another user's (or not a real directory): never ours to judge
        run_id = f"{m.group(1)}-{m.group(2)}"
        owner = Identity(int(m.group(1)), int(m.group(2)), identity.boot_id())
        if run_id in excluded or identity.is_alive(owner):
            continue
        run = runs.get(run_id)
        if run_id not in plan.report.runs_over:
            plan.report.runs_over.append(run_id)
        sr = _StaleRun(rd, run_id)
        try:
            job_names = sorted(n for n in os.listdir(rd) if os.path.isdir(os.path.join(rd, n)))
        except OSError:
            continue
        for job in job_names:
            jd = os.path.join(rd, job)
            if _plan_job_cgroup(plan, run, run_id, jd):
                sr.jobs.append(jd)
            else:
                sr.kept = True
        stale.append(sr)
    # Probe directories are empty by construction; remove one only if empty
    # and no process has its pid (a probe that crashed between mkdir and rmdir).
    stale_probes = []
    for pd in sorted(probes):
        m = PROBE_DIR_RE.match(os.path.basename(pd))
        try:
            st = os.lstat(pd)
        except OSError:
            continue
        if (m and st.st_uid == euid and identity.read(int(m.group(1))) is None
                and not lc.populated(pd)):
            stale_probes.append(pd)
    return stale, stale_probes


# --------------------------------------------------------------------------
# Ending


def _depths(targets: Iterable[_Target]) -> dict[tuple[int, int], int]:
    """Depth of each target below the topmost target it descends from (by ppid)."""
    by_pid = {t.ident.pid: t for t in targets}
    depth: dict[tuple[int, int], int] = {}
    for t in by_pid.values():
        chain: list[_Target] = []
        seen: set[int] = set()
        cur: _Target | None = t
        while cur is not None and cur.key not in depth and cur.ident.pid not in seen:
            seen.add(cur.ident.pid)  # a torn snapshot can show a ppid loop
            chain.append(cur)
            cur = by_pid.get(cur.ident.ppid)
        base = depth[cur.key] if cur is not None and cur.key in depth else -1
        for c in reversed(chain):
            base += 1
            depth[c.key] = base
    return depth


def _order(targets: Iterable[_Target], deepest_first: bool) -> list[_Target]:
    ts = list(targets)
    d = _depths(ts)
    return sorted(ts, key=lambda t: d.get(t.key, 0), reverse=deepest_first)


def _send(plan: _Plan, t: _Target, sig: int) -> bool:
    try:
        return identity.send_signal(t.ident, sig)
    except SignalRefused as e:
        plan.targets.pop(t.key, None)
        plan.skip(t.ident, t.run, REFUSED, str(e), t.session, t.job)
        return False


def _alive(t: _Target) -> bool:
    return identity.is_alive(t.ident)


def _wait_gone(targets: list[_Target], timeout: float, how: Callable[[_Target], str]) -> list[_Target]:
    """Wait up to ``timeout`` for targets to go; stamp the gone ones; return the rest."""
    deadline = time.monotonic() + timeout
    left = list(targets)
    delay = 0.002
    while True:
        still = []
        for t in left:
            if _alive(t):
                still.append(t)
            elif not t.how:
                t.how = how(t)
                t.ended_at = identity.now_ticks()
        left = still
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 0.05)


def _end(plan: _Plan, stale: list[_StaleRun], grace: float, notes: list[str]) -> None:
    """SIGTERM all, grace, then SIGKILL (frozen first) or cgroup.kill the rest."""
    from .platform import linux_cgroup as lc

    cg_jobs = {jd for sr in stale for jd in sr.jobs}

    def pending() -> list[_Target]:
        return [t for t in plan.targets.values() if not t.how]

    def by_cgroup(t: _Target) -> bool:
        cg = t.cgroup
        return cg is not None and any(cg == jd or cg.startswith(jd + os.sep) for jd in cg_jobs)

    sigcont = getattr(signal, "SIGCONT", None)
    sigstop = getattr(signal, "SIGSTOP", None)
    stopped: list[_Target] = []
    try:
        if grace > 0 and plan.targets:
            for t in _order(plan.targets.values(), deepest_first=True):
                if _send(plan, t, signal.SIGTERM):
                    if sigcont is not None:
                        # A stopped process acts on SIGTERM only once continued.
                        _send(plan, t, sigcont)
                elif not _alive(t):
                    t.how = "gone"  # exited before we signalled it: not ours to claim
            _wait_gone(pending(), grace, lambda t: "SIGTERM")
        # What a stale cgroup holds is ended by cgroup.kill, atomically. The
        # rest is frozen, parents first, and the table rescanned until nothing
        # new appears: a frozen process cannot fork, so nothing escapes the kill.
        wave = [t for t in pending() if not by_cgroup(t)]
        for _ in range(_STOP_ROUNDS):
            if not wave or sigstop is None:
                break
            for t in _order(wave, deepest_first=False):
                if _send(plan, t, sigstop):
                    stopped.append(t)
            wave = _expand(plan, [t for t in wave if t.key in plan.targets], notes)
        for t in _order([t for t in pending() if not by_cgroup(t)], deepest_first=True):
            _send(plan, t, _SIGKILL)
        for jd in sorted(cg_jobs):
            if not lc.kill_cgroup(jd, timeout=_FINAL_WAIT):
                notes.append(f"{jd} still populated after cgroup.kill")
        left = _wait_gone(pending(), _FINAL_WAIT,
                          lambda t: "cgroup.kill" if by_cgroup(t) else "SIGKILL")
        for t in left:
            plan.targets.pop(t.key, None)
            cur = identity.read(t.ident.pid)
            state = cur.state if cur is not None else "?"
            plan.skip(t.ident, t.run, SURVIVED, f"still alive after SIGKILL (state {state})",
                      t.session, t.job)
    finally:
        # On an unexpected error, leave nothing frozen.
        if sigcont is not None:
            for t in stopped:
                if not t.how and _alive(t):
                    try:
                        identity.send_signal(t.ident, sigcont)
                    except SignalRefused:
                        pass


def _remove_cgroups(stale: list[_StaleRun], probes: list[str], report: ReapReport) -> None:
    from .platform import linux_cgroup as lc

    for sr in stale:
        for jd in sr.jobs:
            if os.path.isdir(jd) and lc.remove_tree(jd):
                report.cgroups_removed.append(jd)
        if not sr.kept:
            try:
                os.rmdir(sr.path)
                report.cgroups_removed.append(sr.path)
            except FileNotFoundError:
                pass  # its keeper, late, removed it
            except OSError as e:
                report.notes.append(f"could not remove {sr.path}: {e.strerror}")
    for pd in probes:
        try:
            os.rmdir(pd)
            report.cgroups_removed.append(pd)
        except OSError:
            pass


# --------------------------------------------------------------------------
# Public API


def reap(
    state_dir: str | os.PathLike[str] | None = None,
    *,
    app: str | None = None,
    dry_run: bool = False,
    grace: float = 2.0,
    exclude_runs: Iterable[str] = frozenset(),
    cgroups: bool = True,
    cgroup_dirs: Iterable[str] | None = None,
) -> ReapReport:
    """End the leftovers of earlier runs that the audit log in ``state_dir``
    proves are theirs; see the module doc for the rules.

    ``state_dir``: default :func:`tether.audit.default_state_dir`. ``app``: only
    runs whose records carry this app name (and only their cgroups).
    ``dry_run``: end and remove nothing; the report lists what would be ended
    (``how="dry-run"``). ``grace``: seconds between SIGTERM and SIGKILL.
    ``exclude_runs``: run ids never to touch (a host passes its own).
    ``cgroups``: also look for tether's stale cgroups (Linux, cgroup v2):
    the run directories the audit names, and every ``tether-*`` run directory
    directly inside each of ``cgroup_dirs`` (default: this process's own cgroup
    directory, where tether creates them).

    Raises :class:`tether.audit.AuditDirError` when ``state_dir`` is unsafe
    (a symlink, another user's, writable by others). A missing or empty log is
    not an error.
    """
    from . import audit

    if not grace >= 0:
        raise ValueError("grace must be >= 0")
    if isinstance(exclude_runs, str):
        exclude_runs = (exclude_runs,)  # one run id, not its characters
    t0 = time.monotonic()
    d = Path(state_dir) if state_dir is not None else audit.default_state_dir()
    report = ReapReport(dry_run=dry_run, state_dir=str(d), log_stats=audit.ReadStats())
    runs = _read_runs(d, report.log_stats, report.notes)
    plan = _Plan(report)
    excl = frozenset(exclude_runs)
    _plan_records(runs, plan, app=app, exclude_runs=excl)
    stale: list[_StaleRun] = []
    probes: list[str] = []
    if cgroups and _LINUX:
        stale, probes = _plan_cgroups(runs, plan, app=app, exclude_runs=excl,
                                      cgroup_dirs=cgroup_dirs, notes=report.notes)
    # Descendants of every recorded or cgroup-found target.
    if plan.targets:
        _expand(plan, list(plan.targets.values()), report.notes, plan.capture())

    if dry_run:
        now = identity.now_ticks()
        for t in _order(plan.targets.values(), deepest_first=True):
            report.ended.append(_ended(t, "dry-run", now))
        for sr in stale:
            report.cgroups_removed.extend(sr.jobs)
            if not sr.kept:
                report.cgroups_removed.append(sr.path)
        report.cgroups_removed.extend(probes)
        report.elapsed_s = time.monotonic() - t0
        return report

    _end(plan, stale, grace, report.notes)
    for t in _order(plan.targets.values(), deepest_first=True):
        if t.how and t.how != "gone":
            report.ended.append(_ended(t, t.how, t.ended_at or identity.now_ticks()))
    _remove_cgroups(stale, probes, report)
    if report.ended or report.cgroups_removed:
        _log(d, report, runs)
    report.elapsed_s = time.monotonic() - t0
    return report


def _ended(t: _Target, how: str, at: int) -> Ended:
    runtime = max(0, at - t.ident.start) / identity.clock_ticks()
    return Ended(t.ident.pid, t.run, t.session, t.job, round(runtime, 2), t.ident.comm, how,
                 t.ident.token(), t.via, t.cgroup)


def _log(state_dir: Path, report: ReapReport, runs: dict[str, _Run]) -> None:
    """One ``reap`` record per ended process and per removed cgroup."""
    from . import audit

    try:
        w = audit.AuditWriter(state_dir, on_loss=report.notes.append)
    except (audit.AuditDirError, OSError) as e:
        report.notes.append(f"reap not recorded in the audit log: {e}")
        return
    me = identity.read(os.getpid())
    by = {"pid": os.getpid(), "start": me.token() if me is not None else None}
    with w:
        for e in report.ended:
            run = runs.get(e.run)
            owner = run.owner if run is not None else None
            fields: dict[str, Any] = {
                "run": e.run, "pid": e.pid, "start": e.start, "boot": identity.boot_id(),
                "how": e.how, "runtime_s": e.runtime_s, "by": by,
            }
            if owner is not None:
                fields["owner"] = {"pid": owner.pid, "start": owner.token()}
            for k, v in (("job", e.job), ("session", e.session), ("via", e.via),
                         ("cgroup", e.cgroup), ("app", run.app if run else None)):
                if v is not None:
                    fields[k] = v
            w.write("reap", **fields)
        for path in report.cgroups_removed:
            m = RUN_DIR_RE.match(os.path.basename(path)) or RUN_DIR_RE.match(
                os.path.basename(os.path.dirname(path)))
            fields = {"cgroup": path, "how": "rmdir", "by": by}
            if m:
                fields["run"] = f"{m.group(1)}-{m.group(2)}"
            w.write("reap", **fields)


# --------------------------------------------------------------------------
# `tether reap`


def _nonneg(text: str) -> float:
    import argparse

    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {text!r}")
    return v


def cli(argv: list[str]) -> int:
    """``tether reap [--dry-run] [--json] [--state-dir D] [--grace S] [--app NAME] [--no-cgroups]``.

    Exit 0 when everything meant to be ended is gone (or in a dry run), 1 when
    something survived SIGKILL, 2 for bad arguments or an unsafe state dir.
    """
    import argparse
    import json

    from . import audit

    p = argparse.ArgumentParser(
        prog="tether reap",
        description="End what earlier runs left alive, only what the audit log and the kernel "
                    "prove is theirs (see docs/reaper.md).")
    p.add_argument("--dry-run", action="store_true", help="end nothing; list what would be ended")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--state-dir", metavar="D", default=None,
                   help="audit log directory (default: $TETHER_STATE_DIR, else "
                        "$XDG_STATE_HOME/tether or ~/.local/state/tether)")
    p.add_argument("--grace", type=_nonneg, default=2.0, metavar="S",
                   help="seconds between SIGTERM and SIGKILL (default 2)")
    p.add_argument("--app", default=None, metavar="NAME", help="only runs of this application")
    p.add_argument("--no-cgroups", action="store_true", help="do not look for stale cgroups")
    args = p.parse_args(argv)
    try:
        report = reap(args.state_dir, app=args.app, dry_run=args.dry_run, grace=args.grace,
                      cgroups=not args.no_cgroups)
    except audit.AuditDirError as e:
        print(f"tether reap: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, sort_keys=False))
    else:
        print(report)
    return 0 if report.ok else 1
