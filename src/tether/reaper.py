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

The proofs (1-6) are planned in :mod:`tether.reaper_plan` before anything is
signalled; this module ends what the plan holds, reports it and logs it.
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

# The plan's skip reasons, re-exported: callers and tests name them from here.
from .reaper_plan import BACKGROUND as BACKGROUND
from .reaper_plan import DETACHED as DETACHED
from .reaper_plan import EXCLUDED as EXCLUDED
from .reaper_plan import KEEPER as KEEPER
from .reaper_plan import NO_START as NO_START
from .reaper_plan import OTHER_SESSION as OTHER_SESSION
from .reaper_plan import OTHER_USER as OTHER_USER
from .reaper_plan import OWN_PROCESS as OWN_PROCESS
from .reaper_plan import OWNER_ALIVE as OWNER_ALIVE
from .reaper_plan import OWNER_UNKNOWN as OWNER_UNKNOWN
from .reaper_plan import PID_REUSED as PID_REUSED
from .reaper_plan import UNPROVEN as UNPROVEN
from .reaper_plan import (
    Skipped,
    _expand,
    _Plan,
    _plan_cgroups,
    _plan_cookies,
    _plan_job_cgroup,
    _plan_keepers,
    _plan_orphan_keepers,
    _plan_records,
    _StaleRun,
    _Target,
)
from .runs import GAP_CHECKED, LIVE, Run, read_runs
from .stops import format_duration, oneline

__all__ = ["Ended", "Skipped", "ReapReport", "reap", "cli"]

_LINUX = sys.platform.startswith("linux")

# Skip reasons: stable strings (the JSON output documents them); the plan's
# own (why a process is not provably a leftover) are in tether.reaper_plan.
REFUSED = "refused"
SURVIVED = "could not end"



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
