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

Ending: SIGTERM to every target, parents first (then SIGCONT, so a stopped
process sees it); up to ``grace`` seconds for them to exit; then the survivors
are frozen with SIGSTOP (parents first) and the process table is read again
until no new descendant appears (so nothing forks its way out of the kill),
and SIGKILL goes to them deepest first, and ``cgroup.kill`` to stale cgroups.
Every signal goes through :func:`tether.gate.send_signal`, which checks the
identity again at the moment of sending. A zombie counts as dead.

5. A **cookie carrier**: a process of this user, born after an unclosed job
   of an over run opened, whose environment holds that job's cookie (every
   process a job starts carries it first, unless it clears its environment):
   what a double-forked daemon of a subreaper job is left with once its
   keeper was SIGKILLed (no parent link, no cgroup).

6. A **keeper left behind**: the keeper a ``job-open`` record of an over run
   names (pid + start ticks + boot, named ``tether-keeper``), still alive --
   stopped by a job's child, most likely -- is ended like a leftover.

Limits: an escapee that double-forked away from a process group/subreaper job,
whose intermediate parent has exited and that cleared its environment, is
linked to its run by nothing the kernel keeps (no parent, no cgroup, no
cookie); the reaper cannot prove it is a leftover and does not look for it.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import cgroupfs, gate, identity
from .ending import DEFAULT_GRACE, check_grace, depth_order, end, grace_arg
from .errors import UsageError
from .identity import Identity
from .runs import GAP_CHECKED, LIVE, OVER, Run, read_runs
from .stops import argv_label, format_duration, oneline

__all__ = ["Ended", "Skipped", "ReapReport", "reap", "cli"]

_LINUX = sys.platform.startswith("linux")

# Skip reasons: stable strings (the JSON output documents them).
PID_REUSED = "pid reused"
OTHER_USER = "other user"
OTHER_SESSION = "other session"
UNPROVEN = "identity not proven"
BACKGROUND = "background"
DETACHED = "detached"
OWNER_ALIVE = "owner alive"
EXCLUDED = "excluded run"
OWNER_UNKNOWN = "owner unknown"
NO_START = "no start recorded"
REFUSED = "refused"
SURVIVED = "could not end"
OWN_PROCESS = "own process or ancestor"
KEEPER = "tether's keeper of a live job"



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
    via: int | None = None  # the recorded process it descends from, if found so
    cgroup: str | None = None  # the stale cgroup it was found in, if any
    recorded: bool = False  # it has a spawn record of its own (the app started it)
    label: str | None = None  # the app's name for it, from its record


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
    session: str | None = None  # the one session key this reap was limited to
    notes: list[str] = field(default_factory=list)  # what limited the proof or the log
    elapsed_s: float = 0.0
    # Runs that are over whose records the log says were lost (audit-gap):
    # {"run": id or None (unknown), "lost": N}; their leftovers were looked
    # for only by the proofs that remain (stale cgroups, job cookies).
    gaps: list[dict[str, Any]] = field(default_factory=list)

    @property
    def survived(self) -> list[Skipped]:
        """What the reaper meant to end and is still alive."""
        return [s for s in self.skipped if s.reason == SURVIVED]

    @property
    def ok(self) -> bool:
        """False when something the reaper meant to end is still alive, or
        when records of a run that is over were lost (``gaps``): what they
        proved could not be checked, so "nothing left" cannot be said."""
        return not self.survived and not self.gaps

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
            "session": self.session,
            "ok": self.ok,
            "state_dir": self.state_dir,
            "ended": [dataclasses.asdict(e) for e in self.ended],
            "skipped": [dataclasses.asdict(s) for s in self.skipped],
            "cgroups_removed": list(self.cgroups_removed),
            "runs": {"over": list(self.runs_over), "live": list(self.runs_live)},
            "log": stats,
            "notes": list(self.notes),
            "gaps": [dict(g) for g in self.gaps],
            "elapsed_s": round(self.elapsed_s, 4),
        }

    def __str__(self) -> str:
        out: list[str] = []
        st = self.log_stats
        head = f"audit log {oneline(self.state_dir) or '(none)'}"
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
            rows: list[tuple[str, ...]] = [("PID", "RUN", "SESSION", "JOB", "RUNNING", "COMMAND", "HOW")]
            for e in self.ended:
                rows.append((str(e.pid), oneline(e.run), oneline(e.session or "-"),
                             oneline(e.job or "-"), format_duration(e.runtime_s),
                             oneline(e.comm) or "?", e.how))
            out.extend(_table(rows))
        else:
            out.append(f"{verb} nothing")
        if self.skipped:
            out.append(f"left alone {len(self.skipped)} process(es):")
            rows = [("PID", "RUN", "COMMAND", "REASON")]
            for s in self.skipped:
                why = s.reason + (f" ({oneline(s.detail)})" if s.detail else "")
                rows.append((str(s.pid), oneline(s.run), oneline(s.comm) or "?", why))
            out.extend(_table(rows))
        if self.cgroups_removed:
            out.append(("would remove" if self.dry_run else "removed") + " cgroup(s):")
            out.extend(f"  {oneline(p)}" for p in self.cgroups_removed)
        for g in self.gaps:
            out.append(f"audit gap: {g['lost']} record(s) of "
                       + (f"run {oneline(g['run'])}" if g["run"] else "an unknown run")
                       + " were lost (disk full?): leftovers they recorded were looked for only "
                       "by stale cgroups and job cookies")
        for n in self.notes:
            out.append(f"note: {oneline(n)}")
        return "\n".join(out)


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in rows]


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
    recorded: bool = False  # it has a spawn record of its own
    label: str | None = None
    how: str = ""
    proof: gate.Proof | None = None  # its job's cookie / cgroup, checked at every signal

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
        self.states: dict[str, str] = {}  # run id -> live/over/...: _plan_records decides
        # A take-over's live job cgroups and keepers: looked at again while the
        # ending runs (no cgroup.kill there: a fork during the grace must be found).
        self.watch_dirs: list[tuple[Run | None, str, str]] = []
        self.watch_keepers: list[_Target] = []

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
        if t.proof is not None:
            why = t.proof.check(ident.pid)
            if why is not None:
                # Same pid, same start tick, yet not its job's: a stranger that
                # was handed a leftover's pid within one clock tick.
                self.skip(ident, t.run, UNPROVEN, why, t.session, t.job)
                return False
        self.targets[t.key] = t
        return True


def _ticks_at(ts: float) -> int:
    """A wall-clock epoch time as boot-clock ticks (approximate: the wall clock
    may step) -- only for what a report says, never for what is ended."""
    return identity.now_ticks() - int((time.time() - ts) * identity.clock_ticks())


def _plan_records(runs: dict[str, Run], plan: _Plan, *, app: str | None,
                  exclude_runs: Iterable[str], session: str | None,
                  take_over: str | None = None) -> list[_Target]:
    """Resolve every recorded process of every run; return the recorded targets."""
    report = plan.report
    excluded = set(exclude_runs)
    roots: list[_Target] = []
    cap = plan.capture() if any(r.procs for r in runs.values()) else None
    states: dict[str, str] = {}
    taken: set[str] = set()
    for run in runs.values():
        if app is not None and run.app != app:
            state = "other app"
        elif run.run in excluded:
            state = "excluded"
        else:
            state = run.state()
            if run.run == take_over and state == LIVE and session is not None:
                taken.add(run.run)
                # Its copy of this one session is ended as if it were over; the
                # owner and every keeper of the run stay protected.
                state = OVER
                if run.owner is not None:
                    plan.protected[(run.owner.pid, run.owner.start)] = OWNER_ALIVE
                for info in run.jobs.values():
                    if info.keeper is not None:
                        plan.protected[(info.keeper.pid, info.keeper.start)] = KEEPER
        states[run.run] = state
    # Protected identities first, across all runs: a descendant walk must stop
    # at a background or detached process, at every process of a run that is
    # not being reaped (a live owner started from inside a leftover shell
    # descends from that leftover, yet its run must never be touched), and,
    # when one session is reaped, at every other session's process.
    for run in runs.values():
        state = states[run.run]
        if state == LIVE and run.owner is not None:
            plan.protected[(run.owner.pid, run.owner.start)] = OWNER_ALIVE
        for p in run.procs.values():
            if p.start < 0:
                continue
            if p.detached or run.job_flag(p.job, "detached"):
                why = DETACHED
            elif p.background or run.job_flag(p.job, "background"):
                why = BACKGROUND
            elif state != OVER:
                why = {LIVE: OWNER_ALIVE, "excluded": EXCLUDED, "unknown": OWNER_UNKNOWN}.get(
                    state, "another app's run")
            elif session is not None and run.session_of(p) != session:
                why = OTHER_SESSION
            else:
                continue
            plan.protected.setdefault((p.pid, p.start), why)
    for run in runs.values():
        state = states[run.run]
        if state == "other app":
            continue
        if state == LIVE or run.run in taken:
            report.runs_live.append(run.run)
        elif state == OVER:
            report.runs_over.append(run.run)
        end_ticks = _ticks_at(run.end_ts) if run.end_ts is not None else None
        for p in run.procs.values():
            p_session = run.session_of(p)
            if session is not None and p_session != session:
                continue  # another session's: not this reap's to report
            # One capture answers "is anything at this pid" for the many records
            # whose process is long gone; what is there is then read afresh.
            seen = cap.get(p.pid) if cap is not None and cap.complete else identity.read(p.pid)
            if seen is None or seen.state in ("Z", "X", "x"):
                continue  # gone
            cur = identity.read(p.pid)
            if cur is None or cur.state in ("Z", "X", "x"):
                continue  # gone since
            if p.start < 0:
                if state == OVER:
                    plan.skip(cur, run.run, NO_START, "its record has no start time: no identity "
                              "to prove it is the process started then", p_session, p.job)
                continue
            if cur.start != p.start:
                if state == OVER:
                    if end_ticks is not None and cur.start > end_ticks:
                        detail = "the process there now started after its run ended"
                    else:
                        detail = "the process there now started at another time"
                    plan.skip(cur, run.run, PID_REUSED, detail, p_session, p.job)
                continue
            if state == LIVE:
                plan.skip(cur, run.run, OWNER_ALIVE, f"owner pid {run.owner.pid if run.owner else '?'} is running",
                          p_session, p.job)
                continue
            if state == "excluded":
                plan.skip(cur, run.run, EXCLUDED, "", p_session, p.job)
                continue
            if state == "unknown":
                why = ("two owners claim this run id" if run.owner_conflict
                       else "its records name no owner identity")
                plan.skip(cur, run.run, OWNER_UNKNOWN, why, p_session, p.job)
                continue
            if p.detached or run.job_flag(p.job, "detached"):
                plan.skip(cur, run.run, DETACHED, "launched to survive on purpose", p_session,
                          p.job)
                continue
            if p.background or run.job_flag(p.job, "background"):
                plan.skip(cur, run.run, BACKGROUND, "meant to outlive its owner", p_session,
                          p.job)
                continue
            label = p.label or (argv_label(p.argv) if p.argv else None)
            t = _Target(cur, run.run, p_session, p.job, recorded=True, label=label,
                        proof=_proof(run, p.job, p.cgroup))
            if plan.add(t):
                roots.append(t)
    plan.states = states
    return roots


def _plan_cookies(runs: dict[str, Run], plan: _Plan, states: dict[str, str],
                  session: str | None) -> list[_Target]:
    """The members of over runs' unclosed jobs that nothing links to a record
    any more - a double-forked daemon whose subreaper keeper was SIGKILLed
    first - found by the cookie every process of a job carries: processes of
    this user born after the job's keeper (else its owner) started, whose
    environment holds it. One
    capture, and one read of each candidate's environment for all cookies."""
    want: dict[tuple[bytes, bytes], tuple[Run, Any, int]] = {}
    for run in runs.values():
        if states.get(run.run) != OVER:
            continue
        for info in run.jobs.values():
            if (info.closed or not info.cookie or info.background
                    or info.detached or (session is not None and info.session != session)):
                continue
            born = _born_bound(run, info)
            if born is None:
                continue
            var = (info.cookie_var or identity.COOKIE_VAR).encode()
            want[(var, info.cookie.encode())] = (run, info, born)
    if not want:
        return []
    names = {var for var, _ in want}
    cap = identity.capture(born_after=min(b for _, _, b in want.values()))
    if not cap.complete:
        plan.report.notes.append(f"process-table capture incomplete ({cap.reason}): "
                                 "job cookies were looked for in part of it only")
    found: list[_Target] = []
    for seen in cap.procs.values():
        if seen.pid <= 2 or seen.state in ("Z", "X", "x") or seen.pid in plan.excluded_pids:
            continue
        for var in names:
            hit = want.get((var, identity.environ_value(seen.pid, var) or b""))
            if hit is None or seen.start < hit[2]:
                continue
            run, info, _born = hit
            cur = identity.read(seen.pid)
            if cur is None or cur.start != seen.start or cur.state in ("Z", "X", "x"):
                break
            entry = var + b"=" + info.cookie.encode()
            t = _Target(cur, run.run, info.session, info.job,
                        proof=gate.Proof(entry, info.cgroup))
            if plan.add(t):
                found.append(t)
            break
    return found


def _born_bound(run: Run, info: Any) -> int | None:
    """Start ticks no process of the job can predate, from the kernel's clock
    alone: its keeper's start (the keeper starts every member), else its
    owner's (which opened the job). Never the records' wall-clock ``ts``: the
    wall clock may have stepped since (NTP, a user), and a window drawn from
    it would miss a leftover born before the step or take in one born long
    before the job."""
    for who in (info.keeper, run.owner):
        if who is not None and who.boot == identity.boot_id():
            return who.start
    return None


def _proof(run: Run | None, job: str | None, cgroup: str | None) -> gate.Proof | None:
    """What proves a process is its job's, from the records: the job's cookie
    (every process it started carries it) and the job's cgroup. None for a
    record of an older tether that wrote neither."""
    info = run.jobs.get(job) if run is not None and job is not None else None
    cookie = info.cookie_entry() if info is not None else None
    cg = cgroup or (info.cgroup if info is not None else None)
    if cookie is None and cg is None:
        return None
    return gate.Proof(cookie, cg)


def _plan_keepers(runs: dict[str, Run], plan: _Plan, take_over: str, session: str) -> None:
    """A live run's copy of one session: what each of its session jobs' live
    keepers started (a subreaper or process-group keeper is the parent of its
    members and of their orphans), the keeper itself left alone."""
    run = runs.get(take_over)
    if run is None or run.state() != LIVE:
        return
    for job, info in run.jobs.items():
        if (info.session != session or info.keeper is None or info.background
                or info.detached or info.closed):
            continue
        cur = identity.read(info.keeper.pid)
        if cur is None or cur.start != info.keeper.start or cur.state in ("Z", "X", "x"):
            continue
        keeper = _Target(cur, run.run, session, job)
        _walk(plan, plan.capture(), keeper)
        plan.watch_keepers.append(keeper)


def _plan_orphan_keepers(runs: dict[str, Run], plan: _Plan, session: str | None,
                         take_over: str | None) -> None:
    """The keepers of runs that are over that are still alive: a keeper whose
    owner died should have ended its job and itself within milliseconds; one
    still here was stopped (a job's child can ``kill -STOP`` it) or hangs,
    and would stay for ever. It is ended like a leftover (SIGTERM + SIGCONT,
    then SIGKILL), and what it still keeps with it. Proven by the identity its
    job-open record names (pid + start ticks + boot) and its name."""
    from .ps import KEEPER_COMM

    seen: set[tuple[int, int]] = set()
    # A keeper whose parent is a live owner is that owner's (a pid and start
    # tick handed on within one clock tick): never ended here.
    live_owners = {pid for (pid, _s), why in plan.protected.items() if why == OWNER_ALIVE}
    for run in runs.values():
        if plan.states.get(run.run) != OVER or run.run == take_over:
            continue
        for job, info in run.jobs.items():
            k = info.keeper
            if k is None or (k.pid, k.start) in seen or info.background or info.detached \
                    or (session is not None and info.session != session):
                continue
            seen.add((k.pid, k.start))
            cur = identity.read(k.pid)
            if (cur is None or cur.start != k.start or cur.boot != k.boot
                    or cur.state in ("Z", "X", "x") or cur.comm != KEEPER_COMM
                    or cur.ppid in live_owners):
                continue
            why = "stopped" if cur.state in ("T", "t") else "alive"
            plan.add(_Target(cur, run.run, info.session, job,
                             label=f"tether keeper ({why}, owner gone)"))


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
        if d.ppid == parent.ident.pid and cgroupfs.is_pin(d.pid):
            continue  # a keeper's pin (cgroupfs.PIN_DIR): it dies with its keeper
        cur = identity.read(d.pid)  # the capture's uid is the effective one; read the real one
        if cur is None or cur.start != d.start or cur.state in ("Z", "X", "x"):
            continue
        # cgroup stays None: only what cgroup.procs lists is ended by cgroup.kill.
        t = _Target(cur, parent.run, parent.session, parent.job, via, proof=parent.proof)
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




def _cgroup_candidates(runs: dict[str, Run], cgroup_dirs: Iterable[str] | None,
                       app: str | None, session: str | None,
                       gap_runs: set[str | None] = frozenset()  # type: ignore[assignment]
                       ) -> tuple[str | None, set[str], set[str]]:
    """(mount, run dirs to examine, probe dirs to examine)."""
    mount = cgroupfs.mount()
    if mount is None:
        return None, set(), set()
    dirs: set[str] = set()
    probes: set[str] = set()
    for run in runs.values():
        if app is not None and run.app != app:
            continue
        for cg in run.cgroups:
            rd = cgroupfs.run_dir_of(cg, mount)
            if rd is not None and os.path.isdir(rd):
                dirs.add(rd)
    if (app is not None or session is not None) and not gap_runs:
        return mount, dirs, probes  # only the runs the audit ties to this app or session
    if cgroup_dirs is None:
        own = cgroupfs.own_dir()
        cgroup_dirs = [own] if own is not None else []
    for base in cgroup_dirs:
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            full = os.path.join(base, name)
            parsed = cgroupfs.parse_run_dir(name)
            if (app is not None or session is not None) and (
                    parsed is None or f"{parsed[0]}-{parsed[1]}" not in gap_runs):
                continue  # limited: only the run dirs of runs with lost records
            if parsed is not None:
                rd = cgroupfs.run_dir_of(full, mount)
                if rd is not None:
                    dirs.add(rd)
            elif cgroupfs.parse_probe_dir(name) is not None:
                probes.add(full)
    return mount, dirs, probes


def _job_protection(run: Run | None, job: str) -> str | None:
    """Why the job cgroup named ``job`` must be left alone, or None."""
    if run is not None and run.job_flag(job, "detached"):
        return DETACHED
    if job.endswith(cgroupfs.BACKGROUND_SUFFIX) or (run is not None
                                                    and run.job_flag(job, "background")):
        return BACKGROUND
    return None


def _plan_job_cgroup(plan: _Plan, run: Run | None, run_id: str, jd: str) -> bool:
    """Plan one job cgroup of a stale run; True when it may be cgroup.kill'ed whole.

    Nested job cgroups (a job opened inside another) are judged one by one: a
    background or detached one protects everything in it, and then the outer
    job is not killed whole -- its other members are ended one by one.
    """
    whole = True
    protected_dirs: dict[str, str] = {}
    # top-down, a parent before its children; never a job's pin (it dies with its keeper)
    for dirpath, _dirs, _files in cgroupfs.walk(jd):
        job = os.path.basename(dirpath)
        why = protected_dirs.get(os.path.dirname(dirpath)) or _job_protection(run, job)
        if why is not None:
            protected_dirs[dirpath] = why
            whole = False
        session = run.job_session(job) if run is not None else None
        for pid in cgroupfs.procs_here(dirpath):
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
            t = plan.targets.get(key) or _Target(cur, run_id, session, job,
                                                 proof=gate.Proof(None, dirpath))
            if plan.add(t):
                t.cgroup = dirpath
            else:
                whole = False
    return whole  # if not, its members are ended one by one (SIGKILL), the dir stays


def _session_job_dirs(run: Run | None, rd: str, session: str) -> list[str]:
    """The job directories of ``session`` in run directory ``rd`` (outermost)."""
    out = []
    for dirpath, dirs, _files in cgroupfs.walk(rd):
        if dirpath == rd:
            continue
        job = os.path.basename(dirpath)
        if run is not None and run.job_session(job) == session:
            out.append(dirpath)
            dirs[:] = []  # its nested jobs are its own
    return out


def _plan_cgroups(runs: dict[str, Run], plan: _Plan, *, app: str | None,
                  exclude_runs: Iterable[str], cgroup_dirs: Iterable[str] | None,
                  session: str | None, notes: list[str], take_over: str | None = None,
                  gap_runs: set[str | None] = frozenset()  # type: ignore[assignment]
                  ) -> tuple[list[_StaleRun], list[str]]:
    mount, dirs, probes = _cgroup_candidates(runs, cgroup_dirs, app, session, gap_runs)
    if mount is None:
        return [], []
    excluded = set(exclude_runs)
    stale: list[_StaleRun] = []
    for rd in sorted(dirs):
        parsed = cgroupfs.parse_run_dir(os.path.basename(rd))
        if parsed is None:
            continue
        run_id = f"{parsed[0]}-{parsed[1]}"
        if run_id in excluded:
            continue
        if run_id == take_over and session is not None:
            # A live run's copy of one session: its members are ended one by one
            # (never cgroup.kill: its keepers live there), the directories stay.
            for jd in _session_job_dirs(runs.get(run_id), rd, session):
                _plan_job_cgroup(plan, runs.get(run_id), run_id, jd)
                plan.watch_dirs.append((runs.get(run_id), run_id, jd))
            continue
        why = cgroupfs.prove_stale(rd)  # the one check before any cgroup.kill of it
        if why is not None:
            continue
        run = runs.get(run_id)
        if run_id not in plan.report.runs_over:
            plan.report.runs_over.append(run_id)
        sr = _StaleRun(rd, run_id)
        if session is not None:
            job_dirs = _session_job_dirs(run, rd, session)
            sr.kept = True  # the rest of the run is not this reap's to judge
        else:
            try:
                job_dirs = sorted(os.path.join(rd, n) for n in os.listdir(rd)
                                  if os.path.isdir(os.path.join(rd, n)))
            except OSError:
                continue
        for jd in job_dirs:
            if _plan_job_cgroup(plan, run, run_id, jd):
                sr.jobs.append(jd)
            else:
                sr.kept = True
        stale.append(sr)
    # Probe directories are empty by construction; remove one only if empty
    # and no process has its pid (a probe that crashed between mkdir and rmdir).
    euid = os.geteuid()
    stale_probes = []
    for pd in sorted(probes):
        pid = cgroupfs.parse_probe_dir(os.path.basename(pd))
        try:
            st = os.lstat(pd)
        except OSError:
            continue
        if (pid is not None and st.st_uid == euid and identity.read(pid) is None
                and not cgroupfs.populated(pd)):
            stale_probes.append(pd)
    return stale, stale_probes


# --------------------------------------------------------------------------
# Ending


def _end(plan: _Plan, stale: list[_StaleRun], grace: float, notes: list[str]) -> None:
    """End every target through the engine: SIGTERM (+SIGCONT), grace, then
    frozen and found again until nothing new appears, then ``cgroup.kill``
    for what stale cgroups hold and SIGKILL for the rest."""
    cg_jobs = sorted({jd for sr in stale for jd in sr.jobs})

    def in_stale_cgroup(t: _Target | None) -> bool:
        cg = t.cgroup if t is not None else None
        return cg is not None and any(cg == jd or cg.startswith(jd + os.sep) for jd in cg_jobs)

    def find() -> list[Identity]:
        # What the walks add while it runs (a fork during the grace) joins in.
        _expand(plan, list(plan.targets.values()) + plan.watch_keepers, notes)
        for run, run_id, jd in plan.watch_dirs:
            _plan_job_cgroup(plan, run, run_id, jd)
        return [t.ident for t in plan.targets.values()]

    def kill() -> None:
        for jd in cg_jobs:
            if not cgroupfs.kill(jd, timeout=1.0):
                notes.append(f"{jd} still populated after cgroup.kill")

    def proof(i: Identity) -> gate.Proof | None:
        t = plan.targets.get((i.pid, i.start))
        return t.proof if t is not None else None

    ending = end(find, born_after=None, grace=grace, freeze=True, member=False, proof=proof,
                 kill=kill if cg_jobs else None, kill_name="cgroup.kill",
                 kill_covers=lambda i: in_stale_cgroup(plan.targets.get((i.pid, i.start))))
    for ident, why in ending.refused:
        t = plan.targets.pop((ident.pid, ident.start), None)
        if t is not None:
            plan.skip(t.ident, t.run, REFUSED, why, t.session, t.job)
    for ident, how in ending.ended:
        t = plan.targets.get((ident.pid, ident.start))
        if t is not None:
            t.how = "gone" if how == "exit" else how  # gone by itself: not ours to claim
    for ident in ending.survivors:
        t = plan.targets.pop((ident.pid, ident.start), None)
        if t is None:
            continue
        cur = identity.read(ident.pid)
        state = cur.state if cur is not None else "?"
        plan.skip(t.ident, t.run, SURVIVED, f"still alive after SIGKILL (state {state})",
                  t.session, t.job)


def _remove_cgroups(stale: list[_StaleRun], probes: list[str], report: ReapReport) -> None:
    from . import cgroupfs as lc

    # A proven-stale cgroup that is gone once its processes are is reported as
    # removed, whoever's rmdir came first: its keeper, late, or another job
    # opening beside it, which tidies the empty run dirs of dead owners.
    for sr in stale:
        for jd in sr.jobs:
            if not os.path.isdir(jd) or lc.remove_tree(jd):
                report.cgroups_removed.append(jd)
        if not sr.kept:
            try:
                os.rmdir(sr.path)
                report.cgroups_removed.append(sr.path)
            except FileNotFoundError:
                report.cgroups_removed.append(sr.path)
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
    session: str | None = None,
    dry_run: bool = False,
    grace: float = DEFAULT_GRACE,
    exclude_runs: Iterable[str] = frozenset(),
    cgroups: bool = True,
    cgroup_dirs: Iterable[str] | None = None,
    runs: dict[str, Run] | None = None,
    announce: Callable[[ReapReport], Any] | None = None,
    take_over: str | None = None,
) -> ReapReport:
    """End the leftovers of earlier runs that the audit log in ``state_dir``
    proves are theirs; see the module doc for the rules.

    ``state_dir``: default :func:`tether.audit.default_state_dir`. ``app``: only
    runs whose records carry this app name (and only their cgroups).
    ``session``: only the processes and job cgroups of that session key (the
    host's resume rule: ``reap(..., app=app, session=key)``); every other
    session's processes are protected from the walks.
    ``dry_run``: end and remove nothing; the report lists what would be ended
    (``how="dry-run"``). ``grace``: seconds between SIGTERM and SIGKILL.
    ``exclude_runs``: run ids never to touch (a host passes its own).
    ``cgroups``: also look for tether's stale cgroups (Linux, cgroup v2):
    the run directories the audit names, and every ``tether-*`` run directory
    directly inside each of ``cgroup_dirs`` (default: this process's own cgroup
    directory, where tether creates them), each proven by
    :func:`tether.cgroupfs.prove_stale` before anything in it is ended.
    ``runs``: the log as :func:`tether.runs.read_runs` read it, to share one
    read between several reaps (a host's start and its resumes); every proof
    is still checked against the live processes. ``announce(plan)``: called
    once the targets are known and before anything is signalled, with a
    dry-run report of what will be ended. ``take_over``: the run id of a
    *live* run whose copy of ``session`` is to be ended all the same (a
    host's ``session(key, take_over=True)``); its owner and keepers are never
    touched, its cgroups never ``cgroup.kill``'ed or removed.

    Raises :class:`tether.audit.AuditDirError` when ``state_dir`` is unsafe
    (a symlink, another user's, writable by others). A missing or empty log is
    not an error.
    """
    from . import audit

    grace = check_grace(grace)
    for what, value in (("session", session), ("app", app)):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ValueError(f"{what} must be a non-empty string, not {value!r}")
    if isinstance(exclude_runs, str):
        exclude_runs = (exclude_runs,)  # one run id, not its characters
    t0 = time.monotonic()
    d = Path(state_dir) if state_dir is not None else audit.default_state_dir()
    report = ReapReport(dry_run=dry_run, state_dir=str(d), log_stats=audit.ReadStats(),
                        session=session)
    gap_lost: dict[str | None, int] = {}
    if runs is None:
        runs = read_runs(d, stats=report.log_stats, notes=report.notes, gaps=gap_lost)
    else:
        gap_lost = {r.run: r.lost for r in runs.values() if r.lost}
    plan = _Plan(report)
    excl = frozenset(exclude_runs)
    report.gaps = _gaps(runs, gap_lost, app=app, session=session, exclude_runs=excl)
    if take_over is not None and session is None:
        raise ValueError("take_over needs a session key")
    _plan_records(runs, plan, app=app, exclude_runs=excl, session=session, take_over=take_over)
    if take_over is not None and session is not None:
        _plan_keepers(runs, plan, take_over, session)
    _plan_orphan_keepers(runs, plan, session, take_over)
    stale: list[_StaleRun] = []
    probes: list[str] = []
    if cgroups and _LINUX:
        stale, probes = _plan_cgroups(runs, plan, app=app, exclude_runs=excl,
                                      cgroup_dirs=cgroup_dirs, session=session,
                                      notes=report.notes, take_over=take_over,
                                      gap_runs={g["run"] for g in report.gaps})
    # Descendants of every recorded or cgroup-found target; then what only
    # its job's cookie still links to an over run, and its descendants.
    if plan.targets:
        _expand(plan, list(plan.targets.values()), report.notes, plan.capture())
    carriers = _plan_cookies(runs, plan, plan.states, session)
    if carriers:
        _expand(plan, carriers, report.notes)

    if dry_run:
        now = identity.now_ticks()
        for t in _report_order(plan):
            report.ended.append(_ended(t, "dry-run", now))
        for sr in stale:
            report.cgroups_removed.extend(sr.jobs)
            if not sr.kept:
                report.cgroups_removed.append(sr.path)
        report.cgroups_removed.extend(probes)
        report.elapsed_s = time.monotonic() - t0
        return report

    if announce is not None and plan.targets:
        now = identity.now_ticks()
        announce(ReapReport(ended=[_ended(t, "planned", now) for t in _report_order(plan)],
                            dry_run=True, state_dir=report.state_dir, session=session))
    _end(plan, stale, grace, report.notes)
    now = identity.now_ticks()
    for t in _report_order(plan):
        if t.how and t.how != "gone":
            report.ended.append(_ended(t, t.how, now))
    _remove_cgroups(stale, probes, report)
    if report.ended or report.cgroups_removed or report.gaps:
        _log(d, report, runs)
    report.elapsed_s = time.monotonic() - t0
    return report


def _gaps(runs: dict[str, Run], lost: dict[str | None, int], *, app: str | None,
          session: str | None, exclude_runs: frozenset[str]) -> list[dict[str, Any]]:
    """The lost records this reap must own up to: of runs that are over (a
    live owner's gap is its own to report), within ``app``, not excluded,
    not already fallen back for by an earlier reap; records of no known run
    only when the reap is not limited to an app or session."""
    out: list[dict[str, Any]] = []
    for run_id, n in sorted(lost.items(), key=lambda kv: kv[0] or ""):
        if run_id is None:
            if app is None and session is None:
                out.append({"run": None, "lost": n})
            continue
        if run_id in exclude_runs:
            continue
        run = runs.get(run_id)
        if run is not None:
            if (app is not None and run.app is not None and run.app != app) \
                    or run.state() == LIVE:
                continue
            n = run.lost - run.lost_checked
        elif _owner_alive(run_id):
            continue  # every record of it was lost, yet its owner runs
        if n > 0:
            out.append({"run": run_id, "lost": n})
    return out


def _owner_alive(run_id: str) -> bool:
    """Whether the owner a run id ``<pid>-<start ticks>`` names runs."""
    pid, _, start = run_id.partition("-")
    if not (pid.isdigit() and start.isdigit()):
        return False
    cur = identity.read(int(pid))
    return cur is not None and cur.start == int(start) and cur.state not in ("Z", "X", "x")


def _report_order(plan: _Plan) -> list[_Target]:
    """Targets deepest first (children before their parents), as they are ended."""
    order = depth_order([t.ident for t in plan.targets.values()], deepest_first=True)
    return [plan.targets[(i.pid, i.start)] for i in order]


def _ended(t: _Target, how: str, at: int) -> Ended:
    runtime = max(0, at - t.ident.start) / identity.clock_ticks()
    return Ended(t.ident.pid, t.run, t.session, t.job, round(runtime, 2), t.ident.comm, how,
                 t.ident.token(), t.via, t.cgroup, t.recorded, t.label)


def _log(state_dir: Path, report: ReapReport, runs: dict[str, Run]) -> None:
    """One ``reap`` record per ended process and per removed cgroup."""
    from . import audit

    try:
        w = audit.AuditWriter(state_dir, on_loss=report.notes.append)
    except (audit.AuditDirError, OSError) as exc:
        report.notes.append(f"reap not recorded in the audit log: {exc}")
        return
    me = identity.own()
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
            fields = {"cgroup": path, "how": "rmdir", "by": by}
            rd = cgroupfs.run_dir_of(path)
            parsed = cgroupfs.parse_run_dir(os.path.basename(rd)) if rd else None
            if parsed is not None:
                fields["run"] = f"{parsed[0]}-{parsed[1]}"
            w.write("reap", **fields)
        for g in report.gaps if report.session is None else ():
            # later reaps need not report this gap again
            if g["run"] is not None:
                w.write("reap", run=g["run"], how=GAP_CHECKED, lost=g["lost"], by=by)
            else:
                w.write("reap", how=GAP_CHECKED, lost=g["lost"], by=by)


# --------------------------------------------------------------------------
# `tether reap`


def _nonblank(value: str) -> str:
    """An argument that names something: empty or blank is a usage error (exit 2)."""
    import argparse

    if not value.strip():
        raise argparse.ArgumentTypeError(f"must not be empty or blank: {value!r}")
    return value


def cli(argv: list[str]) -> int:
    """``tether reap [--dry-run] [--json] [--state-dir D] [--grace S] [--app NAME]
    [--session KEY] [--no-cgroups]``.

    Exit 0 when everything meant to be ended is gone (or in a dry run), 1 when
    something survived SIGKILL or the log lost records of a run that is over
    (``report.gaps``, also in a dry run), 2 for bad arguments (empty or blank
    ones too) or an unsafe state dir.
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
    p.add_argument("--grace", type=grace_arg, default=DEFAULT_GRACE, metavar="S",
                   help=f"seconds between SIGTERM and SIGKILL (default {DEFAULT_GRACE:g})")
    p.add_argument("--app", default=None, metavar="NAME", type=_nonblank,
                   help="only runs of this application")
    p.add_argument("--session", default=None, metavar="KEY", type=_nonblank,
                   help="only the leftovers of this session key (what a host's resume does)")
    p.add_argument("--no-cgroups", action="store_true", help="do not look for stale cgroups")
    args = p.parse_args(argv)
    try:
        state = (audit.state_dir_arg(args.state_dir) if args.state_dir is not None
                 else audit.default_state_dir())
        report = reap(state, app=args.app, session=args.session,
                      dry_run=args.dry_run, grace=args.grace, cgroups=not args.no_cgroups)
    except (audit.AuditDirError, UsageError) as e:
        print(f"tether reap: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # an unreadable directory: not ours to read, not "survived"
        print(f"tether reap: cannot read the audit log: {e.strerror or e}: "
              f"{e.filename or args.state_dir}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, sort_keys=False))
    else:
        print(report)
    return 0 if report.ok else 1
