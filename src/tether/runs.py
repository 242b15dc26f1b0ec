"""The one reader from the audit log to runs: who ran what, and what proves it.

``read_runs(state_dir)`` streams every rotated copy of the spawn-audit log
(``tether.audit.read_records``) into :class:`Run` objects: one per owner's
run, with its owner's identity, its jobs (name, mechanism, session, cgroup,
keeper, background/detached flags, opened and closed), and the processes it
recorded that may still be alive. The reaper (``tether reap`` and the host's
start and resume rule), ``tether ps`` and the host all read the log through
here, so they agree on what a record means.

What is kept, so memory follows what may still be alive rather than the
log's length:

* a ``spawn`` record only while its pid is among the processes that were
  running when the read began (a process that is gone never comes back; one
  whose pid was since reused is told apart later by its start ticks);
* an ``exit`` record removes its process;
* records of another boot are dropped (nothing of it is alive).

tether-shell writes ordinary audit records (``job-open`` + ``spawn`` at a
command's start, ``exit`` + ``job-close`` at its end, ``app`` =
``"tether-shell"``). The day files of an older tether-shell
(``shell-YYYY-MM-DD.jsonl`` beside the audit log) are still read, after the
audit log, until they age out (``tether.audit`` prunes them by its
``keep_days``): :func:`tether.records.legacy_shell_records` turns each of their
``start``/``exit`` records into the audit records a tether-shell writes now.
In scope ``caller`` a command's job (its cgroup below the caller's
``shell-scope``, or its lingering subreaper keeper) is owned by the caller,
and left open while what the command left may run; an older tether-shell's
records name the caller's one shared cgroup as the job.

Every app's runs are read, always: a run that is not being reaped still
protects its processes from a walk that starts at another run's leftover.

Proof is left to the callers, with the rules in one place each: a run is
over when its owner, by identity, is gone (:meth:`Run.state`); a recorded
process is the one recorded only if pid, start ticks and boot id match.
"""

from __future__ import annotations

import os
from typing import Any

from . import identity, proctree
from .identity import Identity
from .records import ident_of, legacy_shell_records, nonempty_str, parse_pid, parse_start

__all__ = ["Proc", "JobInfo", "Run", "read_runs", "shell_log_names", "SOURCES", "LIVE", "OVER",
           "UNKNOWN"]

#: The events that say something about runs (reap and error records prove nothing).
SOURCES = frozenset(("spawn", "job-open", "job-close", "exit", "run-start", "run-end", "tasks"))
MAX_TASKS = 256  # tasks kept of one ``tasks`` record (a record is at most 64 KiB anyway)
LIVE, OVER, UNKNOWN = "live", "over", "unknown"


class Proc:
    """A recorded process (a ``spawn`` record) that may still be alive."""

    __slots__ = ("pid", "start", "job", "session", "background", "detached", "cgroup", "argv",
                 "label", "ts")

    def __init__(self, pid: int, start: int, job: str | None, session: str | None,
                 background: bool, detached: bool, cgroup: str | None,
                 argv: list[str] | None, label: str | None, ts: float | None) -> None:
        self.pid = pid
        self.start = start  # kernel start ticks; -1 when the record has none
        self.job = job
        self.session = session
        self.background = background
        self.detached = detached
        self.cgroup = cgroup
        self.argv = argv  # only when the app opted in for that spawn
        self.label = label  # the app's name for it (popen(..., label=...))
        self.ts = ts

    @property
    def key(self) -> tuple[int, int]:
        return (self.pid, self.start)

    def __repr__(self) -> str:
        return f"<Proc {self.pid}@{self.start} job={self.job} session={self.session}>"


class JobInfo:
    """What the log says of one job."""

    __slots__ = ("job", "name", "mechanism", "session", "background", "detached", "cgroup",
                 "keeper", "opened", "closed", "label", "cookie", "cookie_var", "tasks")

    def __init__(self, job: str) -> None:
        self.job = job
        self.name: str | None = None
        self.mechanism: str | None = None
        self.session: str | None = None
        self.background = False
        self.detached = False
        self.cgroup: str | None = None
        self.keeper: Identity | None = None
        self.opened: float | None = None  # ts of its job-open record
        self.closed = False
        self.label: str | None = None
        self.cookie: str | None = None  # what every process of the job carries ...
        self.cookie_var: str | None = None  # ... in its environment, under this name
        self.tasks: list[dict[str, Any]] | None = None  # the last ``tasks`` record's live tasks

    def cookie_entry(self) -> bytes | None:
        """The whole environment entry ``NAME=value`` of the job's cookie, if recorded."""
        if not self.cookie:
            return None
        return f"{self.cookie_var or identity.COOKIE_VAR}={self.cookie}".encode()


class Run:
    """One owner's run: its owner's identity, its jobs, its recorded processes."""

    __slots__ = ("run", "owner", "owner_conflict", "app", "end_ts", "jobs", "procs", "cgroups",
                 "lost", "lost_checked")

    def __init__(self, run: str) -> None:
        self.run = run
        self.owner: Identity | None = None
        self.owner_conflict = False  # two owners claim one run id: trust neither
        self.app: str | None = None
        self.end_ts: float | None = None  # ts of its run-end record, if any
        self.jobs: dict[str, JobInfo] = {}
        self.procs: dict[tuple[int, int], Proc] = {}
        self.cgroups: set[str] = set()
        self.lost = 0  # records of this run ``audit-gap`` records say were lost
        self.lost_checked = 0  # ... of which a reap already fell back to other proof for

    def job_flag(self, job: str | None, key: str) -> bool:
        info = self.jobs.get(job) if job is not None else None
        return bool(info is not None and getattr(info, key))

    def job_session(self, job: str | None) -> str | None:
        info = self.jobs.get(job) if job is not None else None
        return info.session if info is not None else None

    def session_of(self, p: Proc) -> str | None:
        return p.session or self.job_session(p.job)

    def state(self) -> str:
        """``live`` (its owner, by identity, runs), ``over`` (gone: exited, a
        zombie, its pid now another process, another boot) or ``unknown``
        (no owner identity, or two)."""
        if self.owner is None or self.owner_conflict:
            return UNKNOWN
        return LIVE if identity.is_alive(self.owner) else OVER

    def __repr__(self) -> str:
        return f"<Run {self.run} app={self.app} jobs={len(self.jobs)} procs={len(self.procs)}>"


def read_runs(state_dir: str | os.PathLike[str], *, stats: Any = None,
              notes: list[str] | None = None, gaps: dict[str | None, int] | None = None,
              since: float | None = None) -> dict[str, Run]:
    """Every run the log in ``state_dir`` records, by run id (see the module doc).

    ``stats``: a ``tether.audit.ReadStats`` to fill. ``notes``: a list that
    gets one line per thing that limited the reading. ``gaps``: a dict that
    gets, per run id, the records ``audit-gap`` records say were lost and no
    reap has yet fallen back for (``Run.lost`` - ``Run.lost_checked``), and
    under ``None`` those of no known run. Raises
    ``tether.audit.AuditDirError`` for an unsafe directory; a missing or
    empty log gives ``{}``. ``since``: only the files written since then
    (``tether.audit.read_records``): the runs of that time, bounded.
    """
    from . import audit

    if stats is None:
        stats = audit.ReadStats()
    boot = identity.boot_id()
    alive = proctree.pids()
    runs: dict[str, Run] = {}
    cache: dict = {}
    unusable = 0
    lost = 0
    gap_lost: dict[str | None, int] = {}
    checked: dict[str | None, int] = {}
    for rec in audit.read_records(state_dir, stats=stats, since=since):
        if rec.get("event") not in SOURCES:
            if rec.get("event") == "error" and rec.get("error") == "audit-carry-loss":
                n = rec.get("lost")
                lost += n if type(n) is int and n > 0 else 0
            elif rec.get("event") == "error" and rec.get("error") == "audit-gap":
                _gap(rec, gap_lost)
            elif rec.get("event") == "reap" and rec.get("how") == GAP_CHECKED:
                run_id, n = nonempty_str(rec.get("run")), rec.get("lost")
                if type(n) is int and n > 0:
                    checked[run_id] = checked.get(run_id, 0) + n
            continue
        try:
            if not _absorb(rec, runs, boot, cache, alive):
                unusable += 1
        except (TypeError, ValueError, KeyError, AttributeError):
            unusable += 1  # a well-formed line of the wrong shape: skip it, keep reading
    for name in shell_log_names(state_dir):
        for rec in audit.read_records(state_dir, filename=name, stats=stats, since=since):
            try:
                for r in legacy_shell_records(rec):
                    if not _absorb(r, runs, boot, cache, alive):
                        unusable += 1
            except (TypeError, ValueError, KeyError, AttributeError):
                unusable += 1
    for run_id, n in gap_lost.items():
        run = runs.get(run_id) if run_id is not None else None
        if run is not None:
            run.lost += n
            run.lost_checked = min(run.lost, checked.get(run_id, 0))
        net = n - checked.get(run_id, 0)
        if gaps is not None and net > 0:
            gaps[run_id] = net
    if notes is not None:
        if unusable:
            notes.append(f"{unusable} audit record(s) had fields of the wrong type and were ignored")
        for why in getattr(stats, "refusals", ()):
            notes.append(f"audit file refused, not read: {why}")
        if lost:
            notes.append(f"the audit log's size cap dropped {lost} record(s) a rotation would "
                         "have carried forward: what they proved cannot be proven now")
        if gaps is None:  # (a caller that takes the gaps reports them itself)
            for run_id, n in sorted(gap_lost.items(), key=lambda kv: kv[0] or ""):
                net = n - checked.get(run_id, 0)
                if net > 0:
                    notes.append(f"the audit log lost {net} record(s) of run "
                                 f"{run_id or '(unknown)'} (audit-gap: a full disk?): what "
                                 "they recorded is not known")
    return runs


#: ``how`` of the ``reap`` record a reap writes once it fell back to the
#: proofs it still has for a run with lost records (so later reaps do not
#: report that gap again).
GAP_CHECKED = "gap-checked"


def _gap(rec: dict[str, Any], out: dict[str | None, int]) -> None:
    """Count one ``audit-gap`` record: its lost records, by the runs it names
    (each named run may have lost them all), or under None."""
    n = rec.get("lost")
    if type(n) is not int or n <= 0:
        return  # nothing lost for good (``kept`` records were written late)
    runs = rec.get("runs")
    names: list[str | None] = [r for r in runs[:64] if type(r) is str and r] \
        if type(runs) is list else []
    for r in names or [None]:
        out[r] = out.get(r, 0) + n


def shell_log_names(state_dir: str | os.PathLike[str]) -> list[str]:
    """An older tether-shell's day files in ``state_dir``
    (``shell-YYYY-MM-DD.jsonl``), oldest first."""
    from .audit import _legacy_shell_file

    try:
        names = os.listdir(state_dir)
    except OSError:
        return []
    return sorted(n for n in names if _legacy_shell_file(n))


def _absorb(rec: dict[str, Any], runs: dict[str, Run], boot: str, cache: dict,
            alive: set[int] | None) -> bool:
    """Take one record in; False when its fields are of the wrong shape.

    A ``carried`` record is a copy of one older than every record read so far
    (a rotation moved it forward): it fills in what is missing, never
    overrides."""
    event = rec["event"]
    carried = rec.get("carried") is True
    owner = ident_of(rec.get("owner"), boot, cache)
    run_id = nonempty_str(rec.get("run"))
    if run_id is None:
        if owner is None:
            return False
        run_id = f"{owner.pid}-{owner.start}"
    if owner is not None and owner.boot != boot:
        return True  # an earlier boot: every process it knew is gone
    run = runs.get(run_id)
    if run is None:
        run = runs[run_id] = Run(run_id)
    if owner is not None and run.owner is not owner:
        if run.owner is None:
            run.owner = owner
        elif not run.owner.same_process(owner):
            run.owner_conflict = True
    if run.app is None:
        run.app = nonempty_str(rec.get("app"))
    job = nonempty_str(rec.get("job"))
    cg = nonempty_str(rec.get("cgroup"))
    if cg is not None:
        run.cgroups.add(cg)
    info = None
    if job is not None:
        info = run.jobs.get(job)
        if info is None:
            info = run.jobs[job] = JobInfo(job)
            if carried and event == "job-open":
                # A job known only from a carried copy: open only while its keeper
                # runs (its job-close, if any, may have been read and forgotten).
                keeper = ident_of(rec.get("keeper"), boot, cache)
                info.closed = keeper is None or not identity.is_alive(keeper)
        for attr in ("name", "mechanism", "session", "label", "cookie", "cookie_var"):
            v = nonempty_str(rec.get(attr))
            if v is not None and getattr(info, attr) is None:
                setattr(info, attr, v)
        if rec.get("background") is True and event != "spawn":
            info.background = True
        if rec.get("detached") is True and event != "spawn":
            info.detached = True
        if cg is not None:
            info.cgroup = cg
        keeper = ident_of(rec.get("keeper"), boot, cache)
        if keeper is not None and keeper.boot == boot:
            info.keeper = keeper
    if event == "spawn" or event == "exit":
        pid = parse_pid(rec.get("pid"))
        if pid is None:
            return False
        raw = rec.get("start")
        tok = parse_start(raw, rec.get("boot"))
        if tok is None:
            if raw is not None:
                return False  # a start of the wrong shape: no identity to prove anything
            key = (pid, -1)  # no start, no identity: remembered only to be reported
        elif tok[1] != boot:
            return True
        else:
            key = (pid, tok[0])
        if event == "exit":
            run.procs.pop(key, None)  # it exited on record; nothing to look for
            return True
        if alive is not None and pid not in alive:
            return True  # gone before this read began: it never comes back
        prev = run.procs.get(key)
        if carried and prev is not None:
            return True
        argv = rec.get("argv")
        argv = [a for a in argv if type(a) is str] if type(argv) is list else None
        ts = rec.get("ts")
        run.procs[key] = Proc(
            pid, key[1], job,
            nonempty_str(rec.get("session")) or (prev.session if prev else None),
            rec.get("background") is True or bool(prev and prev.background),
            rec.get("detached") is True or bool(prev and prev.detached),
            cg, argv or (prev.argv if prev else None),
            nonempty_str(rec.get("label")) or (prev.label if prev else None),
            float(ts) if isinstance(ts, (int, float)) and not isinstance(ts, bool) else None,
        )
    elif event == "run-end":
        ts = rec.get("ts")
        if isinstance(ts, (int, float)) and not isinstance(ts, bool):
            run.end_ts = float(ts)
    elif event == "job-open" and info is not None:
        ts = rec.get("ts")
        if isinstance(ts, (int, float)) and not isinstance(ts, bool) and not (
                carried and info.opened is not None):
            info.opened = float(ts)
        if not carried:
            info.closed = False
    elif event == "tasks" and info is not None:
        tasks = rec.get("tasks")
        if type(tasks) is not list:
            return False
        if not (carried and info.tasks is not None):
            info.tasks = [t for t in tasks[:MAX_TASKS] if type(t) is dict]
    elif event == "job-close" and info is not None and job is not None:
        info.closed = True
        # A closed job with nothing left that may be alive proves nothing
        # more: forgotten now, so memory follows what may still be alive.
        if not info.background and not info.detached \
                and not any(p.job == job for p in run.procs.values()) \
                and not (info.cgroup and os.path.isdir(info.cgroup)):
            del run.jobs[job]
    return True
