"""What an audit record says and proves, read back: the one place that knows.

The audit log's writer (:mod:`tether.audit`) and its reader
(:mod:`tether.runs`) both need it, so neither imports the other for it:

* a record's fields, taken only when usable (:func:`parse_pid`,
  :func:`parse_start`, :func:`nonempty_str`, :func:`ident_of`): a record may
  be corrupt, hostile or from another schema;
* the audit records a record of an older tether-shell's day file stands for
  (:func:`legacy_shell_records`);
* which records still prove a process that may be alive
  (:func:`still_needed`): what a rotation carries forward into the live file.

Imports only the process reader (``identity``, ``proctree``) and the shared
constants: the writer's prune path loads it, nothing on a spawn's path does.
So what a record holds when it is written (the schema, and the builders of a
run id, an owner and a spawn's fields, which a spawn's path calls) is not
here but in :mod:`tether.audit_fields`, standard library only.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from typing import Any

from . import identity, proctree
from ._constants import SHELL_JOB, SHELL_SCOPE_JOB
from .identity import Identity

__all__ = ["parse_start", "parse_pid", "nonempty_str", "ident_of", "legacy_shell_records",
           "still_needed"]


def parse_start(tok: Any, boot: Any = None) -> tuple[int, str] | None:
    """A record's ``start`` as ``(ticks, bootid)``, or None if unusable.

    ``"ticks@bootid"`` is the written form; a bare tick count (string or
    int) takes the record's separate ``boot`` field.
    """
    if isinstance(tok, int) and not isinstance(tok, bool):
        return (tok, boot) if isinstance(boot, str) and tok >= 0 else None
    if not isinstance(tok, str):
        return None
    ticks, sep, b = tok.partition("@")
    if not sep:
        b = boot if isinstance(boot, str) else ""
    if not b or not ticks.isdigit():
        return None
    return int(ticks), b


def parse_pid(v: Any) -> int | None:
    """A record's pid if it is a usable one (a positive int), else None."""
    return v if type(v) is int and v > 0 else None


def nonempty_str(v: Any) -> str | None:
    """``v`` if it is a non-empty string, else None (a field read back)."""
    return v if type(v) is str and v else None


def ident_of(v: Any, boot: str, cache: dict) -> Identity | None:
    """The identity an ``owner``/``keeper`` field names: ``{"pid", "start"}``."""
    if type(v) is not dict:
        return None
    raw = (v.get("pid"), v.get("start"))
    try:
        return cache[raw]
    except KeyError:
        pass
    except TypeError:
        return None  # unhashable values: not an identity
    pid = parse_pid(raw[0])
    tok = parse_start(raw[1])
    ident = Identity(pid, tok[0], tok[1]) if pid is not None and tok is not None else None
    if len(cache) < 65536:
        cache[raw] = ident
    return ident


def legacy_shell_records(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """The audit records a record of an older tether-shell's day file stands
    for (see tether.runs' module doc); ``[]`` for one that names no job (an ``error``,
    an even older wrapper's record, the generic path's)."""
    event = rec.get("event")
    run, job = nonempty_str(rec.get("run")), nonempty_str(rec.get("job"))
    if event not in ("start", "exit") or run is None or job is None:
        return []
    boot = nonempty_str(rec.get("boot"))

    def ident(v: Any) -> dict[str, Any] | None:
        if type(v) is not dict or boot is None or type(v.get("start")) is not int:
            return None
        return {"pid": v.get("pid"), "start": f"{v['start']}@{boot}"}

    scope = rec.get("scope")
    cg = nonempty_str(rec.get("cgroup"))
    shared = scope == "caller" and cg is not None
    if shared and cg is not None:
        job = os.path.basename(cg)  # the caller's one cgroup is the job of all its commands
    base = {"v": rec.get("v"), "ts": rec.get("ts"), "run": run, "job": job}
    child, start = rec.get("child"), rec.get("start")
    proc = ({"pid": child, "start": f"{start}@{boot}"}
            if type(child) is int and type(start) is int and boot is not None else None)
    out: list[dict[str, Any]] = []
    if event == "start":
        out.append({**base, "event": "job-open", "owner": ident(rec.get("owner")),
                    "name": SHELL_SCOPE_JOB if scope == "caller" else SHELL_JOB,
                    "mechanism": rec.get("mechanism"), "cookie": rec.get("cookie"),
                    "cookie_var": rec.get("cookie_var"), "keeper": ident(rec.get("keeper")),
                    "cgroup": cg})
        if proc is not None:
            out.append({**base, "event": "spawn", **proc, "cgroup": cg})
        return out
    if proc is not None:
        out.append({**base, "event": "exit", **proc})
    detail = rec.get("detail")
    left = detail.get("leftovers") if type(detail) is dict else None
    # A command's job is over when it returned; in scope caller only once it
    # left nothing (the caller's shared cgroup job never: it ends with the caller).
    if scope != "caller" or (not shared and left == 0):
        out.append({**base, "event": "job-close"})
    return out


def record_of(line: bytes, on_corrupt: Callable[[], object] | None = None) -> dict[str, Any] | None:
    """The record one log line holds, or None (not JSON, not an object): the
    one parse of a log line, for the reader and the writer's carry. A
    fragment torn by a full disk and glued before a record (writers put
    ``"v"`` first) is cut off and the record kept. ``on_corrupt()`` is
    called once for a line that is not one whole record, kept from or not."""
    try:
        rec = json.loads(line)
    except (ValueError, RecursionError):
        rec = None
    if isinstance(rec, dict):
        return rec
    if on_corrupt is not None:
        on_corrupt()
    cut = line.rfind(b'{"v":')
    return record_of(line[cut:]) if cut > 0 else None


def _alive_record(rec: dict[str, Any], boot: str, alive: set[int] | None) -> bool:
    """Whether the process a ``spawn`` record names still runs (pid, start, boot)."""
    pid = parse_pid(rec.get("pid"))
    tok = parse_start(rec.get("start"), rec.get("boot"))
    if pid is None or tok is None or tok[1] != boot or (alive is not None and pid not in alive):
        return False
    return identity.is_alive(Identity(pid, tok[0], boot))


_MAYBE = re.compile(rb'"event":"(?:job-open|tasks)"')


def _candidates(blocks: Any, alive: set[int] | None) -> Any:
    """The lines of ``blocks`` (bytes of whole lines) worth parsing: those that
    name a process running now (``"pid":N``), and every ``job-open`` and
    ``tasks`` record - one regular-expression pass per block, so that a copy of
    records about processes long gone costs a scan, not a parse per line."""
    if alive is None:
        for block in blocks:
            yield from block.split(b"\n")
        return
    pids = b"|".join(str(p).encode() for p in sorted(alive))
    hit = re.compile(rb'"pid":(?:' + pids + rb')[,}]')
    for block in blocks:
        starts: set[int] = set()
        for pat in (hit, _MAYBE):
            pos = 0
            while True:
                m = pat.search(block, pos)
                if m is None:
                    break
                start = block.rfind(b"\n", 0, m.start()) + 1
                end = block.find(b"\n", m.end())
                end = len(block) if end < 0 else end
                starts.add(start)
                pos = end
        for start in sorted(starts):
            end = block.find(b"\n", start)
            yield block[start:] if end < 0 else block[start:end]


def still_needed(blocks: Any) -> list[dict[str, Any]]:
    """The records in ``blocks`` (bytes of whole lines of a rotated copy about
    to be deleted) that still prove something - what a rotation carries forward
    (``tether.audit``):

    * a ``spawn`` whose process (pid, start ticks, boot id) still runs: it is
      what ties a leftover (or a protected background/detached process) to
      its run;
    * a ``job-open`` whose keeper still runs, whose cgroup still exists (a
      stale cgroup is proven by the run its records name), or with a spawn
      carried here (its cookie proves the job's processes);
    * a ``run-start`` whose owner still runs (the app name of a live run);
    * the last ``tasks`` record of a job, while its owner or one of the
      tasks' processes still runs (what a resume says it ended).

    Nothing else (exits, closes, reaps, errors, records of another boot, and
    anything about processes that are gone). Leftovers of runs whose owner is
    gone come first: a size cap drops what comes last.
    """
    boot = identity.boot_id()
    alive = proctree.pids()
    records = (rec for rec in map(record_of, _candidates(blocks, alive)) if rec is not None)
    cache: dict = {}
    owners: dict[Identity, bool] = {}
    first: list[dict[str, Any]] = []
    later: list[dict[str, Any]] = []
    last_tasks: dict[tuple[Any, Any], tuple[bool, int]] = {}
    opens: dict[tuple[Any, Any], tuple[dict[str, Any], bool]] = {}  # job-opens not needed yet
    spawned: set[tuple[Any, Any]] = set()  # (run, job) of the spawns carried

    def owner_alive(ident: Identity | None) -> bool:
        if ident is None:
            return False
        if ident not in owners:
            owners[ident] = identity.is_alive(ident)
        return owners[ident]

    for rec in records:
        event = rec.get("event")
        if event not in ("spawn", "job-open", "run-start", "tasks"):
            continue
        try:
            owner = ident_of(rec.get("owner"), boot, cache)
            if owner is not None and owner.boot != boot:
                continue
            live = owner_alive(owner)
            if event == "spawn":
                need = _alive_record(rec, boot, alive)
            elif event == "job-open":
                keeper = ident_of(rec.get("keeper"), boot, cache)
                cg = nonempty_str(rec.get("cgroup"))
                need = (keeper is not None and keeper.boot == boot and identity.is_alive(keeper)) \
                    or (cg is not None and os.path.isdir(cg))
            elif event == "run-start":
                need = live
            else:
                pids = [p for t in rec.get("tasks") or () if type(t) is dict
                        for p in t.get("pids") or () if type(p) is list and len(p) == 2]
                need = live or any(_alive_record({"pid": p[0], "start": p[1], "boot": boot},
                                                 boot, alive) for p in pids)
        except (TypeError, ValueError, AttributeError):
            continue  # a record of the wrong shape proves nothing
        if not need:
            if event == "job-open":
                opens[(rec.get("run"), rec.get("job"))] = (rec, live)
            continue
        if event == "spawn":
            spawned.add((rec.get("run"), rec.get("job")))
        bucket = later if live else first
        if event == "tasks":
            k = (rec.get("run"), rec.get("job"))
            if not isinstance(k[0], str) or not isinstance(k[1], str):
                continue
            prev = last_tasks.get(k)
            if prev is not None:  # only the last one of a job says what is live
                (later if prev[0] else first)[prev[1]] = {}
            last_tasks[k] = (live, len(bucket))
        bucket.append(rec)
    for k in spawned & opens.keys():
        rec, live = opens[k]
        (later if live else first).append(rec)
    return [r for r in first + later if r]
