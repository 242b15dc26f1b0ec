"""``tether ps``: the live jobs on this machine that tether knows of.

Sources, merged into one list of jobs:

* the **audit log** in the state directory (``job-open``/``spawn``/
  ``job-close`` records): job id, name, mechanism, owner identity, when it
  opened, what it spawned, its cgroup;
* **cgroup traces**: tether's run directories ``tether-<ownerpid>-<start>``
  anywhere in the cgroup v2 hierarchy (a bounded walk), one sub-directory per
  job, whose ``cgroup.procs`` list the members exactly, escapees included;
* tether-shell's **records** (in the audit log; an older one's day files too,
  ``tether.runs``): a
  command's job, or a caller's scope (``TETHER_SHELL_SCOPE=caller``), whose
  owner is the caller - the agent CLI - so it is listed with it;
* **keepers**: the process that holds each job (found from a record, as the
  parent of a recorded child, or by its name ``tether-keeper`` where the
  keeper sets it); for subreaper, PID-namespace and process-group jobs the
  members are the keeper's descendants.

A job is listed when its owner is alive and it was not closed, or when any
member is still alive (an owner that died and left members is exactly what a
user wants to see). Every process is named by identity (pid + kernel start
ticks + boot id): a record whose pid now names another process is not shown
as a member.

Output: a tree per job, drawn with box characters on a terminal; plain text
(indentation, ``key=value`` job lines) when piped; ``--json`` for tools
(schema version 1, documented in docs/ps.md). Reads only; never signals.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from . import capture, cgroupfs, identity, proctree
from ._constants import SHELL_JOB, SHELL_SCOPE_JOB
from .identity import Identity
from .stops import format_duration, oneline

__all__ = ["PsJob", "Member", "collect", "render_tree", "render_plain", "to_json", "cli",
           "SCHEMA_VERSION"]

SCHEMA_VERSION = 1
KEEPER_COMM = "tether-keeper"
_CG_MAX_DIRS = 20_000  # bound on the cgroup hierarchy walk
_CG_MAX_DEPTH = 12
_CG_TIME_CAP = 0.5
_MAX_SPAWNS = 4096  # recorded children remembered per job (the newest)


@dataclass
class Member:
    """One live process of a job, with the members it is the parent of."""

    ident: Identity
    cmdline: str = ""
    children: list[Member] = field(default_factory=list)

    def to_dict(self, now: int, hz: int) -> dict[str, Any]:
        i = self.ident
        return {
            "pid": i.pid,
            "ppid": i.ppid,
            "start": i.token(),
            "comm": i.comm,
            "cmdline": self.cmdline,
            "state": i.state,
            "age": round(max(0, now - i.start) / hz, 2),
            "children": [c.to_dict(now, hz) for c in self.children],
        }


@dataclass
class PsJob:
    """One job as ``tether ps`` sees it."""

    job: str | None = None
    name: str | None = None
    run: str | None = None
    mechanism: str | None = None
    owner: Identity | None = None
    owner_alive: bool | None = None
    owner_comm: str = ""
    opened: float | None = None  # epoch seconds, from the job-open record
    started_ticks: int | None = None  # kernel ticks, from a trace, when no record says
    closed: bool = False
    background: bool = False
    session: str | None = None
    app: str | None = None  # the host's application (a record's "app")
    cgroup: str | None = None
    keeper: Identity | None = None
    parent_job: str | None = None
    sources: set[str] = field(default_factory=set)
    spawned: dict[tuple[int, int], None] = field(default_factory=dict)
    members: list[Member] = field(default_factory=list)  # roots of the member tree
    member_count: int = 0

    def age(self, now_wall: float, now_ticks: int, hz: int) -> float | None:
        if self.opened is not None:
            return max(0.0, now_wall - self.opened)
        if self.started_ticks is not None:
            return max(0.0, (now_ticks - self.started_ticks) / hz)
        return None

    def to_dict(self, now_wall: float, now_ticks: int, hz: int) -> dict[str, Any]:
        age = self.age(now_wall, now_ticks, hz)
        return {
            "job": self.job,
            "name": self.name,
            "run": self.run,
            "mechanism": self.mechanism,
            "owner": None if self.owner is None else {
                "pid": self.owner.pid,
                "start": self.owner.token(),
                "alive": self.owner_alive,
                "comm": self.owner_comm,
            },
            "age": None if age is None else round(age, 2),
            "opened": self.opened,
            "closed": self.closed,
            "background": self.background,
            "session": self.session,
            "cgroup": self.cgroup,
            "keeper": None if self.keeper is None else {
                "pid": self.keeper.pid, "start": self.keeper.token()},
            "parent_job": self.parent_job,
            "sources": sorted(self.sources),
            "member_count": self.member_count,
            "members": [m.to_dict(now_ticks, hz) for m in self.members],
        }


# ---------------------------------------------------------------------------
# Gathering


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


class _Book:
    """Jobs by key, merged from every source."""

    def __init__(self) -> None:
        self.jobs: dict[tuple, PsJob] = {}
        self.by_cgroup: dict[str, PsJob] = {}

    def get(self, run: str | None, job: str | None) -> PsJob:
        key = ("job", run, job)
        j = self.jobs.get(key)
        if j is None:
            j = self.jobs[key] = PsJob(job=job, run=run)
        return j

    def add(self, key: tuple, j: PsJob) -> PsJob:
        self.jobs[key] = j
        return j


def _read_audit(book: _Book, state_dir: str | os.PathLike[str], notes: list[str]) -> None:
    from . import audit
    from .runs import read_runs

    try:
        runs = read_runs(state_dir, notes=notes)
    except (audit.AuditDirError, OSError) as e:
        notes.append(f"audit log not read: {e}")
        return
    for run in runs.values():
        live_jobs = {p.job for p in run.procs.values()}
        for info in run.jobs.values():
            if info.closed and info.job not in live_jobs and not (
                    info.cgroup and os.path.isdir(info.cgroup)):
                continue  # closed, and nothing of it may be alive: not listed anyway
            j = book.get(run.run, info.job)
            j.sources.add("audit")
            j.owner = j.owner or run.owner
            j.name, j.mechanism, j.session = info.name, info.mechanism, info.session
            j.app = run.app
            j.background = info.background
            j.opened, j.closed = info.opened, info.closed
            if info.keeper is not None:
                j.keeper = info.keeper
            if info.cgroup is not None:
                j.cgroup = info.cgroup
                book.by_cgroup[os.path.normpath(info.cgroup)] = j
        for proc in run.procs.values():
            if proc.job is not None and proc.start >= 0:
                j = book.get(run.run, proc.job)
                j.spawned[proc.key] = None
                if len(j.spawned) > _MAX_SPAWNS:
                    j.spawned.pop(next(iter(j.spawned)))


def _cgroup_run_dirs(notes: list[str]) -> tuple[str | None, list[str]]:
    """Every ``tether-<pid>-<start>`` directory in the cgroup v2 hierarchy (bounded)."""
    if not sys.platform.startswith("linux"):
        return None, []
    mount = cgroupfs.mount()
    if mount is None:
        return None, []
    found: list[str] = []
    deadline = time.monotonic() + _CG_TIME_CAP
    stack = [(mount, 0)]
    seen = 0
    while stack:
        path, depth = stack.pop()
        try:
            it = os.scandir(path)
        except OSError:
            continue
        with it:
            for e in it:
                if not e.is_dir(follow_symlinks=False):
                    continue
                seen += 1
                if cgroupfs.parse_run_dir(e.name) is not None:
                    found.append(e.path)  # its job directories are read as jobs
                elif depth + 1 < _CG_MAX_DEPTH:
                    stack.append((e.path, depth + 1))
        if seen > _CG_MAX_DIRS or time.monotonic() > deadline:
            notes.append(f"cgroup hierarchy walk stopped after {seen} directories")
            break
    return mount, sorted(found)


def _read_cgroups(book: _Book, notes: list[str]) -> None:
    """Jobs from cgroup run directories (one sub-directory per job)."""
    boot = identity.boot_id()
    _mount, run_dirs = _cgroup_run_dirs(notes)
    for rd in run_dirs:
        parsed = cgroupfs.parse_run_dir(os.path.basename(rd))
        assert parsed is not None
        owner = Identity(parsed[0], parsed[1], boot)
        run = f"{owner.pid}-{owner.start}"
        for dirpath, dirs, _files in cgroupfs.walk(rd):  # (a job's pin is no job)
            dirs.sort()
            if dirpath == rd:
                continue
            job_id = os.path.basename(dirpath)
            parent = os.path.dirname(dirpath)
            # a caller's cgroup (tether-shell's scope caller) holds its commands'
            # jobs, not processes (an older tether-shell's held them itself)
            in_scope = os.path.basename(parent) == cgroupfs.SHELL_SCOPE_DIR
            if job_id == cgroupfs.SHELL_SCOPE_DIR and not cgroupfs.procs_here(dirpath):
                continue
            norm = os.path.normpath(dirpath)
            j = book.by_cgroup.get(norm)
            if j is None:
                j = book.get(run, job_id)
                j.cgroup = dirpath
                book.by_cgroup[norm] = j
            j.sources.add("cgroup")
            if j.mechanism is None:
                j.mechanism = "cgroup"
            if j.name is None and (in_scope or job_id == cgroupfs.SHELL_SCOPE_DIR):
                j.name = SHELL_SCOPE_JOB  # its owner (the run dir's) is the caller
            if j.owner is None:
                j.owner = owner
            if j.opened is None:
                try:  # cgroupfs keeps the directory's creation time
                    j.opened = os.stat(dirpath).st_ctime or None
                except OSError:
                    pass
            if parent != rd and not in_scope:
                j.parent_job = os.path.basename(parent)


def _looks_like_keeper(k: Identity, owner: Identity) -> bool:
    """Whether ``k``, the parent of a recorded child, is that job's keeper:
    named so, or a child of the owner (or of its warden), or the init of a
    PID namespace holding a pidfd on the owner (a pidns keeper is re-parented
    away from the owner when its intermediate exits); never older than the
    owner."""
    if k.pid <= 1 or k.pid == owner.pid or k.start < owner.start:
        return False
    if k.comm == KEEPER_COMM or k.ppid == owner.pid:
        return True
    parent = identity.read(k.ppid)
    if parent is not None and parent.ppid == owner.pid and parent.comm == "tether-warden":
        return True
    # A pidns keeper's parent is gone, but it watches the owner by pidfd.
    return _is_ns_init(k.pid) and owner.pid in identity.pidfd_targets(k.pid)


def _is_ns_init(pid: int) -> bool:
    ids = identity.nspid(pid)
    return len(ids) > 1 and ids[-1] == 1


def _owner_of_keeper(k: Identity) -> Identity | None:
    """A keeper's owner: the process it watches through a pidfd (exact, and
    the only way for a PID-namespace keeper, whose parent is gone); else its
    parent, or its parent's parent when the parent is the owner's warden."""
    for target in identity.pidfd_targets(k.pid):
        cur = identity.read(target)
        if cur is not None and cur.start <= k.start:
            return cur
    parent = identity.read(k.ppid)
    if parent is None or parent.pid <= 1:
        return None
    if parent.comm == "tether-warden":
        return identity.read(parent.ppid)
    return parent


def _keepers_by_name(notes: list[str]) -> list[Identity]:
    """Processes named ``tether-keeper`` (one bounded capture of the table)."""
    cap = capture.capture()
    if not cap.complete:
        notes.append(f"keeper search incomplete: {cap.reason}")
    # Not a zombie: a PID-namespace keeper's intermediate is one for a moment.
    return [i for i in cap.procs.values() if i.comm == KEEPER_COMM and i.state not in "ZXx"]


def _native_cgroup(k: Identity) -> str | None:
    """The job cgroup a native keeper serves (it lives outside it): its
    ``cgroup=`` argument, believed only when the run directory above it
    names the owner the keeper watches."""
    path = next((a[len("cgroup="):] for a in identity.argv(k.pid)[2:]
                 if a.startswith("cgroup=")), None)
    if not path:
        return None
    path = os.path.normpath(path)
    run, up = None, os.path.dirname(path)  # a nested job's run directory is further up
    for _ in range(32):
        run = cgroupfs.parse_run_dir(os.path.basename(up))
        if run is not None or up == os.path.dirname(up):
            break
        up = os.path.dirname(up)
    owner = _owner_of_keeper(k)
    if run is None or owner is None or (owner.pid, owner.start) != run:
        return None
    return path


def _job_of_keeper(book: _Book, k: Identity) -> PsJob | None:
    """The job a keeper found by name belongs to: the one whose record names
    it, or the cgroup job it lives in or whose members it is the parent of."""
    for j in book.jobs.values():
        if j.keeper is not None and j.keeper.same_process(k):
            return j
    home = cgroupfs.own_dir(k.pid)
    if home is not None:
        by_home = book.by_cgroup.get(os.path.normpath(home))
        if by_home is not None:
            return by_home
    served = _native_cgroup(k)
    if served is not None:
        by_served = book.by_cgroup.get(served)
        if by_served is not None:
            return by_served
    for j in book.by_cgroup.values():
        if j.keeper is None and j.cgroup is not None:
            for pid in cgroupfs.procs_here(j.cgroup):
                cur = identity.read(pid)
                if cur is not None and cur.ppid == k.pid and cur.start >= k.start:
                    return j
    return None


def collect(state_dir: str | os.PathLike[str] | None = None, *,
            notes: list[str] | None = None) -> list[PsJob]:
    """Every live job tether knows of, each once, with its member tree."""
    notes = notes if notes is not None else []
    book = _Book()
    if state_dir is None:
        from .audit import default_state_dir

        state_dir = default_state_dir()
    _read_audit(book, state_dir, notes)
    _read_cgroups(book, notes)
    boot = identity.boot_id()

    # Keepers found by name (where the keeper names itself): each joins the
    # job it keeps, or is a job of its own (no record, no cgroup).
    keepers = _keepers_by_name(notes)
    for ident in keepers:
        j = _job_of_keeper(book, ident)
        if j is None:
            j = book.add(("keeper", ident.pid, ident.start), PsJob(owner=_owner_of_keeper(ident)))
            j.started_ticks = ident.start
        j.keeper = ident
        j.sources.add("keeper")
    # tether's own processes are never a job's members: a recorded keeper only
    # while it is that very process (its pid may now name a member elsewhere).
    helpers = {k.pid for k in keepers} | {j.keeper.pid for j in book.jobs.values()
                                          if j.keeper is not None
                                          and identity.is_alive(j.keeper)}

    out: list[PsJob] = []
    for j in book.jobs.values():
        # Owner: alive only if the very process (pid + start + boot) still runs.
        if j.owner is not None:
            j.owner_alive = identity.is_alive(j.owner)
            if j.owner_alive:
                cur = identity.read(j.owner.pid)
                j.owner_comm = cur.comm if cur is not None else ""
        # Keeper: confirm a recorded one, or find it as the parent of a member.
        if j.keeper is not None and not identity.is_alive(j.keeper):
            j.keeper = None
        live_spawned = []
        for pid, start in j.spawned:
            cur = identity.read(pid)
            if cur is not None and cur.start == start and cur.boot == boot \
                    and cur.state not in ("Z", "X"):
                live_spawned.append(cur)
        if j.keeper is None and j.owner is not None and j.owner_alive:
            candidates = live_spawned
            if j.cgroup is not None:
                candidates = [c for c in map(identity.read, cgroupfs.procs_here(j.cgroup)) if c]
            for c in candidates:
                k = identity.read(c.ppid)
                if k is not None and _looks_like_keeper(k, j.owner):
                    j.keeper = k
                    j.sources.add("keeper")
                    helpers.add(k.pid)
                    break
        if j.keeper is not None and j.started_ticks is None:
            j.started_ticks = j.keeper.start
        # Members.
        found: list[Identity] = []
        if j.cgroup is not None and os.path.isdir(j.cgroup):
            found = [i for i in map(identity.read, cgroupfs.procs_here(j.cgroup)) if i]
        elif j.keeper is not None:
            found = proctree.descendants([j.keeper.pid], born_after=j.keeper.start)
        else:
            for c in live_spawned:
                found.append(c)
                found.extend(proctree.descendants([c.pid], born_after=c.start))
        idents = {i.pid: i for i in found
                  if i.pid not in helpers and i.state not in ("Z", "X")}
        j.member_count = len(idents)
        j.members = _tree(sorted(idents.values(), key=lambda i: i.pid))
        if j.member_count == 0 and (j.closed or not j.owner_alive
                                    or j.name in (SHELL_JOB, SHELL_SCOPE_JOB)):
            continue  # over: nothing of it is alive (a shell job is, once empty)
        out.append(j)
    out.sort(key=lambda x: (x.owner.pid if x.owner else 0, x.job or "", x.cgroup or ""))
    return out


def _tree(idents: list[Identity]) -> list[Member]:
    nodes = {i.pid: Member(i, identity.cmdline(i.pid)) for i in idents}
    roots = []
    for pid in sorted(nodes):
        m = nodes[pid]
        parent = nodes.get(m.ident.ppid)
        if parent is not None and parent is not m:
            parent.children.append(m)
        else:
            roots.append(m)
    return roots


# ---------------------------------------------------------------------------
# Rendering

_oneline = oneline  # (tether.stops.oneline: the one cleaner)


def _owner_text(j: PsJob) -> str:
    if j.owner is None:
        return "owner unknown"
    state = "alive" if j.owner_alive else "DEAD"
    comm = f" {_oneline(j.owner_comm)}" if j.owner_comm else ""
    return f"owner {j.owner.pid}{comm} ({state})"


def _clock() -> tuple[float, int, int]:
    return time.time(), identity.now_ticks(), identity.clock_ticks()


def render_tree(jobs: list[PsJob], width: int = 100) -> str:
    """The terminal view: one header per job and its member tree, box-drawn."""
    now_wall, now_ticks, hz = _clock()
    if not jobs:
        return "no live tether jobs\n"
    lines: list[str] = []
    for j in jobs:
        name = f" {_oneline(j.name)!r}" if j.name else ""
        flags = "".join(f" [{f}]" for f, on in (("closed", j.closed), ("background", j.background),
                                                  ("nested in " + (j.parent_job or ""),
                                                   j.parent_job is not None)) if on)
        n = j.member_count
        lines.append(f"{j.job or '?'}{name}  {j.mechanism or '?'}  {_owner_text(j)}  "
                     f"age {format_duration(j.age(now_wall, now_ticks, hz))}  "
                     f"{n} member{'s' if n != 1 else ''}{flags}")
        extra = []
        if j.keeper is not None:
            extra.append(f"keeper {j.keeper.pid}")
        if j.cgroup:
            extra.append(f"cgroup {j.cgroup}")
        if extra:
            lines.append("│ " + ", ".join(extra))

        def walk(ms: list[Member], prefix: str) -> None:
            for idx, m in enumerate(ms):
                last = idx == len(ms) - 1
                head = prefix + ("└─ " if last else "├─ ")
                age = format_duration((now_ticks - m.ident.start) / hz)
                text = f"{head}{m.ident.pid} {_oneline(m.cmdline or m.ident.comm)}"
                tail = f"  {age}"
                if len(text) + len(tail) > width:
                    text = text[: max(len(head) + 8, width - len(tail) - 1)] + "…"
                lines.append(text + tail)
                walk(m.children, prefix + ("   " if last else "│  "))

        walk(j.members, "")
        lines.append("")
    return "\n".join(lines)


#: The first line of the plain view (when there is a job): what its two
#: kinds of line hold, and in which units.
PLAIN_HEADER = ("# job lines: job= mechanism= owner= owner_alive= age= members= [name= keeper= "
                "cgroup= closed= background= parent=]; member lines below each job, indented "
                "two spaces per level: PID COMM AGE CMDLINE; ages in seconds (s)")


def render_plain(jobs: list[PsJob]) -> str:
    """The piped view: a ``#`` header line, then ``key=value`` job lines,
    members indented two spaces a level; ages carry their unit (``12.5s``)."""
    now_wall, now_ticks, hz = _clock()
    lines: list[str] = [PLAIN_HEADER] if jobs else []
    for j in jobs:
        age = j.age(now_wall, now_ticks, hz)
        fields = [
            f"job={j.job or '?'}",
            f"mechanism={j.mechanism or '?'}",
            f"owner={j.owner.pid if j.owner else '?'}",
            "owner_alive=" + ("?" if j.owner_alive is None else "yes" if j.owner_alive else "no"),
            f"age={age:.1f}s" if age is not None else "age=?",
            f"members={j.member_count}",
        ]
        if j.name:
            fields.append(f"name={'_'.join(_oneline(j.name).split())}")
        if j.keeper is not None:
            fields.append(f"keeper={j.keeper.pid}")
        if j.cgroup:
            fields.append(f"cgroup={j.cgroup}")
        if j.closed:
            fields.append("closed=yes")
        if j.background:
            fields.append("background=yes")
        if j.parent_job:
            fields.append(f"parent={j.parent_job}")
        lines.append(" ".join(fields))

        def walk(ms: list[Member], depth: int) -> None:
            for m in ms:
                age = (now_ticks - m.ident.start) / hz
                lines.append(f"{'  ' * depth}{m.ident.pid} {_oneline(m.ident.comm)} {age:.1f}s "
                             f"{_oneline(m.cmdline)}".rstrip())
                walk(m.children, depth + 1)

        walk(j.members, 1)
    return "\n".join(lines) + ("\n" if lines else "")


def to_json(jobs: list[PsJob], state_dir: str | None = None,
            notes: list[str] | None = None) -> dict[str, Any]:
    now_wall, now_ticks, hz = _clock()
    return {
        "version": SCHEMA_VERSION,
        "boot": identity.boot_id(),
        "state_dir": state_dir,
        "jobs": [j.to_dict(now_wall, now_ticks, hz) for j in jobs],
        "notes": list(notes or []),
    }


def _flat(members: list[Member]) -> list[Identity]:
    out: list[Identity] = []
    todo = list(members)
    while todo:
        m = todo.pop()
        out.append(m.ident)
        todo.extend(m.children)
    return out


def sessions(jobs: list[PsJob], app: str, key: str | None = None) -> list[dict[str, Any]]:
    """The live sessions of a host ``app`` (``tether run --session`` or
    ``tether.Host``; one ``key`` or all), each with the live work groups its
    agent started (``tether.ledger.live_work``: every process group apart from
    the agent's own), longest-running first."""
    from .ledger import live_work

    now_wall, now_ticks, hz = _clock()
    boot = identity.boot_id()
    out = []
    for j in jobs:
        if j.app != app or j.session is None or (key is not None and j.session != key) \
                or j.closed or not j.owner_alive:
            continue
        members = _flat(j.members)
        agent = [i for i in members if (i.pid, i.start) in j.spawned and i.boot == boot]
        work = live_work(members, agent)
        age = j.age(now_wall, now_ticks, hz)
        out.append({
            "session": j.session, "job": j.job, "run": j.run,
            "owner": None if j.owner is None else {"pid": j.owner.pid, "start": j.owner.token()},
            "age": None if age is None else round(age, 2),
            "member_count": j.member_count,
            "agent": [{"pid": i.pid, "comm": i.comm} for i in sorted(agent, key=lambda i: i.start)],
            "work": [w.to_dict() for w in work],
        })
    out.sort(key=lambda d: (d["session"], d["run"] or ""))
    return out


def cli(argv: list[str]) -> int:
    """``tether ps [--json] [--plain] [--state-dir DIR]``; exit 0, 2 on bad arguments."""
    import argparse

    p = argparse.ArgumentParser(
        prog="tether ps",
        description="List the live jobs tether knows of on this machine (audit log, cgroups, "
                    "keepers), each with its mechanism, owner, age and member tree.")
    p.add_argument("--json", action="store_true", help="JSON for tools (see docs/ps.md)")
    p.add_argument("--plain", action="store_true",
                   help="plain text even on a terminal (the default when piped)")
    p.add_argument("--state-dir", metavar="DIR", default=None,
                   help="audit log directory (default: $TETHER_STATE_DIR, else "
                        "$XDG_STATE_HOME/tether or ~/.local/state/tether)")
    p.add_argument("--app", metavar="APP", default=None,
                   help="list this host application's live sessions and their live work groups")
    p.add_argument("--session", metavar="KEY", default=None, help="with --app: only this session")
    try:
        args = p.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    if args.session is not None and args.app is None:
        print("tether ps: --session needs --app APP", file=sys.stderr)
        return 2
    from .audit import default_state_dir, state_dir_arg
    from .errors import UsageError

    try:
        state_dir = str(state_dir_arg(args.state_dir) if args.state_dir is not None
                        else default_state_dir())
    except UsageError as e:
        print(f"tether ps: {e}", file=sys.stderr)
        return 2
    notes: list[str] = []
    jobs = collect(state_dir, notes=notes)
    out = sys.stdout
    if args.app is not None:
        return _print_sessions(sessions(jobs, args.app, args.session), args, state_dir, notes)
    if args.json:
        import json

        out.write(json.dumps(to_json(jobs, state_dir, notes), indent=2) + "\n")
    elif args.plain or not out.isatty():
        out.write(render_plain(jobs))
    else:
        import shutil

        out.write(render_tree(jobs, shutil.get_terminal_size((100, 24)).columns))
    out.flush()
    if not args.json:  # what limited the view is said in every form (JSON: "notes")
        for n in notes:
            print(f"note: {n}", file=sys.stderr)
    return 0


def _print_sessions(found: list[dict[str, Any]], args: Any, state_dir: str, notes: list[str]) -> int:
    from .stops import format_duration

    if args.json:
        import json

        doc = {"version": SCHEMA_VERSION, "boot": identity.boot_id(), "state_dir": state_dir,
               "app": args.app, "sessions": found, "notes": list(notes)}
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return 0
    for s in found:
        owner = s["owner"]["pid"] if s["owner"] else "?"
        sys.stdout.write(f"{s['session']}  owner {owner}  {format_duration(s['age'])}  "
                         f"{s['member_count']} processes, {len(s['work'])} work groups\n")
        for w in s["work"]:
            sys.stdout.write(f"  {w['label'] or w['pgid']}  {format_duration(w['runtime_s'])}  "
                             f"{w['members']} processes\n")
    for n in notes:
        print(f"note: {n}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
