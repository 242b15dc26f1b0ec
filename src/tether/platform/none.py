"""No safety net: plain children, ended on request, never on a crash.

Only ever by name (``Job(mechanism="none")``): ``auto`` and ``strict`` never
choose it, and ``require="kernel"`` refuses it. It exists for a program that
must run its children even where no job can be had, and says so: its
``guarantee.disabled`` is set, with the reason the caller gives.

Members are the direct children and what they started, found by parentage
among processes born after the job opened (one bounded capture): an orphan
re-parented away is lost to it, and nothing ends anything when the owner
dies - the audit log and the reaper's next start are the only net left.
``terminate``/``close`` end what is found with ``tether.ending.end``.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

from .. import gate, identity, proctree
from ..ending import KILL_BOUND
from ..errors import JobClosed, SignalRefused
from .base import NONE, Availability, Guarantee, JobBackend, JobOptions, with_cookie

MECHANISM = NONE
_GONE = ("Z", "X", "x")


def probe() -> Availability:
    return Availability(NONE, True, "no safety net: only when asked for by name")


def guarantee(options: JobOptions | None = None) -> Guarantee:
    why = (options.reason if options is not None else None) or "no safety net was asked for " \
        "(mechanism 'none')"
    return Guarantee(
        mechanism=NONE, kernel_enforced=False, transparent=True,
        ends_job="nobody: the orphan-on-crash safety net is disabled",
        not_covered=("every process: a crash or kill of the owner leaves them all running "
                     "(the next start's reaper ends what the audit proves)",),
        disabled=why)


class Backend(JobBackend):
    """Plain ``subprocess.Popen`` children; see the module doc."""

    mechanism = NONE

    def __init__(self, options: JobOptions) -> None:
        self.options = options
        self.born = identity.now_ticks()
        self.children: list[subprocess.Popen] = []
        self.closed = False

    @property
    def guarantee(self) -> Guarantee:
        return guarantee(self.options)

    def popen(self, args: Any, kwargs: dict[str, Any]) -> subprocess.Popen:
        if self.closed:
            raise JobClosed(f"job {self.options.name!r} is closed", mechanism=NONE)
        env = kwargs.get("env")
        kwargs = {**kwargs, "env": with_cookie(dict(os.environ) if env is None else dict(env),
                                             self.options)}
        p = subprocess.Popen(args, **kwargs)
        self.children.append(p)
        return p

    def _members(self) -> list[identity.Identity]:
        roots = {p.pid for p in self.children if p.poll() is None}
        out = {i.pid: i for i in map(identity.read, roots) if i is not None}
        for d in proctree.descendants([p.pid for p in self.children], born_after=self.born):
            out.setdefault(d.pid, d)
        return [i for i in out.values() if i.state not in _GONE and i.start >= self.born]

    def member_pids(self) -> list[int]:
        return [i.pid for i in self._members()]

    def _proof(self) -> gate.Proof:
        """The job's cookie; and its tree: our children (the roots) and what
        they started, as :meth:`gate.Proof.tracking` finds it."""
        o = self.options
        return gate.Proof(f"{o.cookie_var}={o.cookie}".encode() if o.cookie else None)

    def signal_all(self, sig: int) -> list[int]:
        sent = []
        proof = self._proof()
        members = proof.tracking(self._members, roots=[os.getpid()])()
        for ident in members:
            try:
                if gate.send_signal(ident, sig, member=True, proof=proof):
                    sent.append(ident.pid)
            except SignalRefused:
                continue
        return sent

    def kill_all(self, timeout: float | None = None) -> None:
        timeout = KILL_BOUND if timeout is None else timeout
        from ..ending import end

        def reap() -> None:
            for p in self.children:
                p.poll()

        proof = self._proof()
        end(proof.tracking(self._members, roots=[os.getpid()]), born_after=self.born, grace=0,
            on_round=reap, bound=timeout, proof=lambda _i: proof)

    def close(self) -> None:
        if not self.closed:
            self.kill_all()
            self.closed = True

    def trace(self) -> dict[str, Any]:
        return {"disabled": self.guarantee.disabled}
