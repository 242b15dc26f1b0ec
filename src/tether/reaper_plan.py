"""The reaper's plan: which live processes are provably what earlier runs left,
and which must be left alone -- all decided before anything is signalled.

The reaper (:mod:`tether.reaper`) ends only what it can prove is its own: a
pid alone proves nothing, since the kernel hands it on once its process is
gone. So every target planned here is tied to an earlier run that is over
(its owner, by pid + start ticks + boot id, gone) by something the audit log
recorded *and* the kernel still shows:

- **its record**: a ``spawn`` record of a run that is over, and the process
  now at that pid has the recorded start ticks and boot id
  (:func:`_plan_records`); anything else there is PID reuse;
- **its parent links**: a descendant of such a process, found by walking one
  capture of the process table only through processes born after it
  (:func:`_walk`, :func:`_expand`);
- **its job's cookie**: a process of this user, born after the keeper (else
  the owner) of an unclosed job of a run that is over started, whose
  environment holds that job's cookie (:func:`_plan_cookies`);
- **its keeper's record**: the keeper a ``job-open`` record of a run that is
  over names, alive by that identity and by its name
  (:func:`_plan_orphan_keepers`); and, when a live run's copy of one session
  is taken over, what that session's keepers started (:func:`_plan_keepers`);
- **its cgroup**: a member of tether's own run directory whose owner is gone,
  proven stale by :func:`tether.cgroupfs.prove_stale` (:func:`_plan_cgroups`).

Protection comes first and beats every proof: a process marked background or
detached, one of a live, excluded or unknown run or of another session,
another user's, this process and its ancestors, one whose job's cookie or
cgroup does not match -- each is reported as a :class:`Skipped` with its
reason, and a walk stops below it. Each target keeps its job's cookie and
cgroup (:class:`tether.gate.Proof`), checked again at every signal of the
ending.

The result is a :class:`_Plan` (targets, protected identities, skips) and the
stale cgroups; :mod:`tether.reaper` ends them, reports and logs. The skip
reasons below, with the ending's ``REFUSED`` and ``SURVIVED``, are the stable
strings of the JSON report; all are importable from ``tether.reaper``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import capture, cgroupfs, environ, gate, identity
from .identity import Identity
from .runs import LIVE, OVER, Run
from .stops import argv_label

if TYPE_CHECKING:
    from .reaper import ReapReport  # the plan only writes into the reaper's report

# Skip reasons: stable strings (the JSON output documents them); the ending's
# REFUSED and SURVIVED are in tether.reaper.
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
OWN_PROCESS = "own process or ancestor"
KEEPER = "tether's keeper of a live job"


@dataclass
class Skipped:
    """A live process tied to a record or stale cgroup that was left alone, and why."""

    pid: int
    run: str
    reason: str  # one of the reason constants above, or tether.reaper's
    detail: str = ""
    comm: str = ""
    session: str | None = None
    job: str | None = None


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
        self._cap: capture.Capture | None = None
        self.states: dict[str, str] = {}  # run id -> live/over/...: _plan_records decides
        # A take-over's live job cgroups and keepers: looked at again while the
        # ending runs (no cgroup.kill there: a fork during the grace must be found).
        self.watch_dirs: list[tuple[Run | None, str, str]] = []
        self.watch_keepers: list[_Target] = []

    def capture(self) -> capture.Capture:
        """The first full capture, shared by record lookup and the first descendant walk."""
        if self._cap is None:
            self._cap = capture.capture()
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
    cap = capture.capture(born_after=min(b for _, _, b in want.values()))
    if not cap.complete:
        plan.report.notes.append(f"process-table capture incomplete ({cap.reason}): "
                                 "job cookies were looked for in part of it only")
    found: list[_Target] = []
    for seen in cap.procs.values():
        if seen.pid <= 2 or seen.state in ("Z", "X", "x") or seen.pid in plan.excluded_pids:
            continue
        for var in names:
            hit = want.get((var, environ.environ_value(seen.pid, var) or b""))
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


def _walk(plan: _Plan, cap: capture.Capture, parent: _Target) -> list[_Target]:
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
            cap: capture.Capture | None = None) -> list[_Target]:
    """One bounded capture (or ``cap``); add every eligible descendant of ``parents``."""
    if not parents:
        return []
    if cap is None:
        cap = capture.capture(born_after=min(t.ident.start for t in parents))
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
