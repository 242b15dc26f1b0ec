"""What an audit record holds: its schema, and the builders of the fields a
caller puts in one (a run id, an owner, a spawn's fields).

:mod:`tether.audit`'s writer puts the records in the log (it adds ``v``,
``ts`` and ``event`` itself), :mod:`tether.audit_read` reads them back,
:mod:`tether.records` judges what they prove and :mod:`tether.runs` turns
them into runs. Split from :mod:`tether.audit`, which imports it at load and
still offers these names (``audit.spawn_fields``, ``audit.EVENTS``).
Standard library only: a spawn's record is built on the spawn's path, which
must load nothing else.

Record schema (version ``SCHEMA_VERSION`` = 1). Every record is one JSON
object on one line; ``v``, ``ts`` and ``event`` are always present, the rest
only where known (absent rather than null). Readers must ignore fields they do
not know and must accept records whose ``v`` is greater than theirs.

=============  ==========  ====================================================
field          type        meaning
=============  ==========  ====================================================
v              int         schema version of the writer
ts             float       wall-clock time of the event, epoch seconds
event          str         one of :data:`EVENTS`
run            str         id of one owner's run (:func:`new_run_id`)
owner          object      ``{"pid": int, "start": "ticks@bootid"}`` of the owner
job            str         job id, unique within its run
session        str         optional caller key (a host's session id)
pid            int         the process the event is about
start          str         its start-time token ``"ticks@bootid"``
boot           str         boot id the start ticks belong to
pgid, sid      int         process group and session at spawn
uid            int         real uid of the process
mechanism      str         ``cgroup``, ``subreaper``, ``pgroup``, ``pidns``, ...
in_job         bool        the process was placed inside the job
background     bool        meant to outlive its owner (never reaped)
detached       bool        launched to survive on purpose (never reaped)
cgroup         str         the job's cgroup path, when the mechanism has one
status         int         exit status (``exit``); negative = killed by signal
app            str         host application name, optional
label          str         the app's own name for a spawned process, optional
argv           [str]       ONLY when the caller opted in for that spawn
argv_truncated int         argv was cut to fit a line; original arg count
error          str         for ``error`` records: what went wrong
lost           int         for ``error``/``audit-gap``/``audit-carry-loss``:
                           records lost
tasks          [object]    for ``tasks`` records: a session's live tasks now,
                           ``{"id", "label", "kind", "started", "ticks",
                           "said", "ambient", "pids": [[pid, ticks], ...]}``
carried        bool        a copy a rotation carried forward from a deleted
                           rotated copy (the original is gone); see Rotation in
                           :mod:`tether.audit`
late           bool        a kept ``run-start``/``job-open`` written after a
                           failed write of it; see Trouble there
runs, kept     [str], int  for ``audit-gap``: runs of the lost records, and
                           how many late records follow it
=============  ==========  ====================================================

Metadata only: the writer never adds command text, arguments or environment
values by itself. A caller that wants the argv of one spawn passes
``record_argv=`` to :func:`spawn_fields` for that spawn.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: typing's names cost start-up time
    from collections.abc import Sequence
    from typing import Any

__all__ = ["SCHEMA_VERSION", "EVENTS", "new_run_id", "owner_fields", "spawn_fields"]

SCHEMA_VERSION = 1
EVENTS = ("run-start", "job-open", "spawn", "exit", "job-close", "run-end", "reap", "error",
          "tasks")


def new_run_id() -> str:
    """A fresh run id: sortable by time, unique without coordination."""
    import secrets

    return f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}-{secrets.token_hex(4)}"


def owner_fields(pid: int, start: str | None) -> dict[str, Any]:
    """The ``owner`` value: ``{"pid": pid, "start": "ticks@bootid"}``."""
    return {"pid": int(pid), "start": start}


def spawn_fields(
    *,
    pid: int | None = None,
    start: str | None = None,
    boot: str | None = None,
    pgid: int | None = None,
    sid: int | None = None,
    uid: int | None = None,
    identity: Any = None,
    job: str | None = None,
    session: str | None = None,
    mechanism: str | None = None,
    in_job: bool | None = None,
    background: bool | None = None,
    detached: bool | None = None,
    cgroup: str | None = None,
    app: str | None = None,
    record_argv: Sequence[str | bytes] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Fields of a ``spawn`` record, None values left out.

    *identity* (a ``tether.identity.Identity``) fills pid/start/boot/pgid/
    sid/uid; explicit arguments win. *record_argv* is the per-spawn opt-in to
    keep the command line in the log: without it no argv is recorded, and the
    writer never records one by itself. Bytes arguments are decoded with
    ``os.fsdecode`` (undecodable bytes become ``\\udcXX`` escapes in JSON).
    """
    if identity is not None:
        token = identity.token() if hasattr(identity, "token") else None
        pid = identity.pid if pid is None else pid
        start = token if start is None else start
        boot = getattr(identity, "boot", None) if boot is None else boot
        pgid = getattr(identity, "pgid", None) if pgid is None else pgid
        sid = getattr(identity, "sid", None) if sid is None else sid
        uid = getattr(identity, "uid", None) if uid is None else uid
        if uid is not None and uid < 0:
            uid = None  # Identity's "not read" marker
    rec: dict[str, Any] = {
        "job": job,
        "session": session,
        "pid": pid,
        "start": start,
        "boot": boot,
        "pgid": pgid,
        "sid": sid,
        "uid": uid,
        "mechanism": mechanism,
        "in_job": in_job,
        "background": background,
        "detached": detached,
        "cgroup": cgroup,
        "app": app,
    }
    rec.update(extra)
    out = {k: v for k, v in rec.items() if v is not None}
    if record_argv is not None:
        out["argv"] = [a if isinstance(a, str) else os.fsdecode(a) for a in record_argv]
    return out
