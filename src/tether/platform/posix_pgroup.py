"""Process group + keeper + bounded capture: the portable POSIX mechanism.

Each spawned child leads a new process group; the keeper watches the owner
and, when it dies, kills those groups and every still-parented descendant
found by one bounded capture of the process table (born after the job
started). It needs nothing but POSIX, so it is what macOS and the BSDs get.

A process that double-forks (or ``setsid`` + fork) and whose parent exits
is re-parented to PID 1 and leaves its group: parentage, pgid and sid no
longer link it to the job. Its environment still does: every process the
job starts carries the job's cookie (``TETHER_JOB=...``), so after the group
and session sweep the keeper also ends every process born after the job
opened, of the same user, that carries the cookie (read from /proc, or with
psutil where there is none), the newest pids first (a pid-hopper lives
about a millisecond at each pid, less than a scan of the table takes). What
it still cannot catch, stated by ``guarantee``: a daemon that also clears its
environment, not always a fast pid-hopper, and anything if the keeper itself
is killed first.
"""

from __future__ import annotations

import os
import time

from .. import capture, environ, gate, identity, proctree, sparse_capture
from .base import PGROUP, Availability, Guarantee, JobOptions, KeeperMechanism

MECHANISM = PGROUP


def probe() -> Availability:
    if os.name != "posix":
        return Availability(PGROUP, False, "not POSIX")
    return Availability(PGROUP, True, "portable; keeper-enforced; escapees found by the job's "
                        "cookie (not those that clear their environment)")


def guarantee(options: JobOptions | None = None) -> Guarantee:
    return Guarantee(
        mechanism=PGROUP,
        kernel_enforced=False,
        transparent=False,
        ends_job="tether's keeper (process groups + a bounded process-table capture)",
        visible=("each spawned command leads its own process group (a terminal's Ctrl+C "
                 "reaches it only when tether hands it the foreground)",),
        not_covered=(
            "a double-forked daemon that also clears its environment (outside every group "
            "and session of the job, and without the job's cookie)",
            "a process that clears its environment, whose parent and group leader have "
            "exited, born after that leader was reaped (its group can no longer be proven "
            "the job's: the leader's pid may name a stranger's group by then)",
            "a pid-hopper that changes pid every millisecond or so: the keeper's look at the "
            "newest pids catches it most of the time, not always",
            "anything, if the keeper is SIGKILLed before the owner",
        ) + (() if os.path.isdir("/proc/self/task") else (
            "an exec() of the owner: without /proc the keeper cannot tell it from the "
            "owner's exit, and ends the job then",)),
    )


class Mechanism(KeeperMechanism):
    name = PGROUP
    keeps_spawned = True  # each child leads a group that may outlive it
    joins_owner_group = False
    proof: gate.Proof | None = None  # what proved the last look's members
    complete = True  # whether the last look's capture was complete

    # -- what it remembers, and how it proves it still holds ----------------------------
    #
    # Each spawned child leads a group (or, asked for, a session) whose id is
    # its pid. That id means "ours" only while it is: the kernel does not
    # reuse a pid while a process, group or session still holds it, but once
    # the leader is reaped and the last member is gone, the id is free and a
    # stranger may lead a group of that number. So a remembered id is used
    # only while its leader is the keeper's unreaped child, or a live member
    # carries the job's cookie, or (keeper side) a live member other than pid
    # g was born by the tick the leader was reaped (the id was never free
    # since); else it is forgotten for good. A spawned child reaped while its
    # group is empty is forgotten at once (``Keeper.reaped``).

    def note_spawn(self, pid: int, start: int | None = None) -> None:
        if start is None:
            ident = identity.read(pid)
            if ident is None or ident.start < self.born_after:
                return  # gone already (its pid may name another): nothing to remember
            start = ident.start
        self._leaders()[pid] = start

    def _leaders(self) -> dict[int, int]:
        leaders = self.__dict__.get("leaders")
        if leaders is None:
            leaders = self.__dict__["leaders"] = {}
        return leaders

    def spawn_attrs(self, msg: dict) -> dict:
        if msg.get("setsid"):
            return {}
        return {"setpgroup": 0} if msg.get("pgroup", -1) == -1 else {}

    def _carries(self, i: identity.Identity, cookie: bytes | None) -> bool:
        """Whether ``i`` carries the job's cookie. A "no" is remembered per
        identity for the job's life (a kill loop asks again and again, and
        most processes asked are not the job's); a "yes" is read afresh each
        time - a stranger handed a pid within the same clock tick has the same
        pid and start, and must not inherit a "yes". Unreadable (exiting, or
        between fork and exec): asked again."""
        if cookie is None:
            return False
        seen = self.__dict__.setdefault("env_seen", {})
        k = (i.pid, i.start)
        has = seen.get(k)
        if has is None:
            has = environ.environ_has(i.pid, cookie)
            # Unreadable: exiting, or inside exec (its new environment is not
            # set up yet - its name may already be the new program's). Asked
            # again for a few milliseconds (one look may be all a kill loop
            # makes), within a budget per look.
            # An environment set up empty (a process exec'd with none, e.g.
            # another job's native keeper) is a "no" at once: waiting on it
            # cost every look 50 ms.
            while has is None and not environ.environ_empty(i.pid) \
                    and self.__dict__.get("env_wait", 0.0) < 0.05 and identity.is_alive(i):
                time.sleep(0.001)
                self.__dict__["env_wait"] = self.__dict__.get("env_wait", 0.0) + 0.001
                has = environ.environ_has(i.pid, cookie)
            if has is None and environ.environ_empty(i.pid):
                has = False
            if has is None:
                return False
            if not has:
                if len(seen) > 100_000:
                    seen.clear()
                seen[k] = False
        return has

    def _proven_ids(self, cap: capture.Capture, leaders: dict[int, int], keeper,
                    cookie: bytes | None) -> set[int]:
        """The remembered group and session ids that are still the job's
        (see above); the others are dropped from ``leaders``. ``keeper``
        (keeper side): its unreaped children and when the others were reaped."""
        proven = set()
        for g in list(leaders):
            reaped_at = None
            if keeper is not None:
                if g in keeper.children:  # our child, not yet reaped: its pid is still its
                    proven.add(g)
                    continue
                reaped_at = keeper.spawn_reaped.get(g)
            # (Seen from the owner, pid + start ticks + boot of the leader are
            # not enough: a stranger handed its pid within the same clock tick
            # matches them. A member with the cookie is; the leader is one.)
            members = [i for i in cap.by_pgid(g, self.born_after) + cap.by_session(g, self.born_after)
                       if i.state not in "ZXx"]
            # A member born by the tick its leader was reaped (the group had
            # members then: the kernel had not freed the id), or one carrying
            # the cookie. Only the process with pid g can found a group or
            # session g, and after our leader's reap any such is a stranger,
            # born after that reap; a process born before cannot join the
            # stranger's group (not its session: sessions are inherited) -
            # hence "not the pid g" and "born by the reap". Born in the very
            # tick of the reap, it must also not be a child of a member (a
            # stranger's child born in that tick would be).
            inside = {i.pid for i in members} | {g}
            if any(reaped_at is not None and i.pid != g and (
                    i.start < reaped_at or (i.start == reaped_at and i.ppid not in inside))
                   for i in members) or any(self._carries(i, cookie) for i in members):
                proven.add(g)
            else:  # empty, or nothing in it proves it ours: never used again
                del leaders[g]
                if keeper is not None:
                    keeper.spawn_reaped.pop(g, None)
        return proven

    def _related(self, keeper_pid: int, leaders: dict[int, int] | None = None,
                 keeper=None, hot: bool = False,
                 cap: capture.Capture | None = None) -> list[identity.Identity]:
        """The job's live members: the keeper's descendants, the members of
        every remembered group and session that is still the job's, what
        those started, and every process born since the job opened that
        carries its cookie (what those started too). Another user's process
        only under a root owner, and then only with the cookie. Sets
        ``self.proof`` to what proves them at the signal."""
        cookie = self._cookie()
        uid = os.geteuid()
        leaders = self._leaders() if leaders is None else leaders
        self.env_wait = 0.0  # this look's budget for environments being set up

        def own(i: identity.Identity) -> bool:
            return i.pid > 2 and i.state not in "ZXx" and (i.uid == uid or uid == 0)

        # First the newest pids, at once (a kill loop's first look): a
        # pid-hopper lives about a millisecond at each pid, less than a scan
        # of the table takes.
        hopped = []
        if cookie is not None and hot:
            for pid in proctree.newest_pids():
                i = identity.read(pid)
                if i is not None and i.start >= self.born_after and own(i) \
                        and self._carries(i, cookie):
                    hopped.append(i)
        if cap is None:
            cap = sparse_capture.capture(born_after=self.born_after)
        proven = self._proven_ids(cap, leaders, keeper, cookie)
        found = {i.pid: i for i in cap.descendants([keeper_pid], born_after=self.born_after)}
        for g in proven:
            found.update((i.pid, i) for i in cap.by_pgid(g, self.born_after))
            found.update((i.pid, i) for i in cap.by_session(g, self.born_after))
        # Escapees that left parentage, group and session kept the cookie.
        # Such an orphan was re-parented to the nearest subreaper above it or
        # to init: an ancestor of this process, the keeper, or init (a job
        # member that is a subreaper holds its orphans as descendants). So only
        # those processes of ours born since the job opened are asked, each
        # once: the cost follows the job, not the machine.
        if cookie is not None:
            for i in hopped:
                found.setdefault(i.pid, i)
            adopters = identity.own_ancestors() | {os.getpid(), keeper_pid, 1}
            for i in cap.adopted(adopters):
                if i.pid not in found and own(i) and self._carries(i, cookie):
                    found[i.pid] = i
        # What those started, in any group or session (parentage is the proof).
        found.update((d.pid, d) for d in cap.descendants(
            [p for p in found if p != keeper_pid], born_after=self.born_after))
        found.pop(keeper_pid, None)
        out = []
        for i in found.values():
            if i.state in "ZXx":  # a zombie is dead (PID 1 here reaps orphans only every ~2 s)
                continue
            if i.uid != uid and (uid != 0 or not self._carries(i, cookie)):
                continue  # another user's: never for a user's job; for root's, with the cookie
            out.append(i)
        out.sort(key=lambda i: i.pid)
        self.proof = gate.Proof(cookie, groups=frozenset(proven),
                                parents=frozenset({keeper_pid, *(i.pid for i in out)}))
        self.complete = cap.complete
        return out

    # -- a look the owner made, for the keeper's kill loop ------------------------
    #
    # A PTY close captures the whole table in the owner; the keeper's kill
    # loop, asked to close the job right after, would capture it again. So
    # the owner makes its look from that same capture (``look_from``) and
    # sends it in the close request; the keeper starts its loop from it
    # (``seed``): it reads only the processes created since the owner's look,
    # as after a complete look of its own. Used only when complete and when
    # every group the keeper remembers is among the look's groups (the
    # keeper proves a group by its unreaped child or the reap time, which
    # the owner cannot see).

    def look_from(self, keeper_pid: int, cap: capture.Capture, last: int) -> dict | None:
        """The job's members found in ``cap`` (a capture of the whole table
        the caller made after the kernel's last pid was ``last``), as the
        keeper's close takes them; None when it cannot serve."""
        if not last or not cap.complete or (cap.born_after or 0) > self.born_after:
            return None  # (a capture from later than the job opened misses members)
        out = self._related(keeper_pid, cap=cap)
        if not self.complete:
            return None
        groups = set(self.proof.groups if self.proof else ()) \
            | {v for i in out for v in (i.pgid, i.sid) if v > 1}
        return {"last": last, "known": [[i.pid, i.start] for i in out],
                "groups": sorted(groups)}

    def seed(self, seen: object) -> None:
        """Keep the owner's look (``look_from``) for the next kill loop; a
        malformed one is dropped (the loop then looks for itself)."""
        if not isinstance(seen, dict):
            return
        try:
            last = int(seen["last"])
            known = [(int(p), int(t)) for p, t in seen["known"]]
            groups = {int(g) for g in seen["groups"]}
        except (KeyError, TypeError, ValueError):
            return
        if last > 0 and all(p > 1 for p, _ in known):
            self.__dict__["seeded"] = (last, known, groups)

    def _finder(self, keeper_pid: int, leaders: dict[int, int] | None = None, keeper=None):
        """``_related`` for a kill loop, which looks again and again: after a
        complete look, a look reads only the processes created since (the
        pids handed out after the last look's; none at all when the kernel's
        last pid has not moved) and reads the table again only when one of
        them may be the job's (a child of a member or the keeper, in a group
        or session of the job, or carrying the cookie). Sound because nothing
        that existed at a complete look and was not the job's can become the
        job's later: a process joins the job only by being born into it."""
        cookie = self._cookie()
        uid = os.geteuid()
        st: dict = {"last": None}
        seeded = self.__dict__.pop("seeded", None)
        if seeded is not None and set(self._leaders() if leaders is None else leaders) \
                <= seeded[2]:
            last, known, groups = seeded
            st.update(last=last, known={keeper_pid, *(p for p, _ in known)}, groups=set(groups),
                      first=known)
            self.proof = gate.Proof(cookie, groups=frozenset(groups),
                                    parents=frozenset(st["known"]))

        def maybe_ours(pid: int) -> bool:
            i = identity.read(pid)
            if i is None or i.start < self.born_after or i.state in "ZXx":
                return False
            if i.ppid in st["known"] or i.pgid in st["groups"] or i.sid in st["groups"]:
                st["known"].add(i.pid)
                return True
            return (i.uid == uid or uid == 0) and self._carries(i, cookie)

        def find() -> list[identity.Identity]:
            if st["last"] is not None:
                now, pid_max = proctree.last_pid()
                new = proctree.pids_since(st["last"], now, pid_max) if now else None
                if new is not None:
                    st["last"] = now
                    if not any([maybe_ours(p) for p in new]):
                        self.looks_saved = getattr(self, "looks_saved", 0) + 1
                        # (the loop keeps what it found before, by identity;
                        # the first look of a seeded loop: what the owner found)
                        return [i for p, t in st.pop("first", ()) if (i := identity.read(p))
                                is not None and i.start == t and i.state not in "ZXx"]
            st.pop("first", None)
            last = proctree.last_pid()[0]  # before the look: what is born after it is "new"
            out = self._related(keeper_pid, leaders, keeper, hot=st["last"] is None)
            if self.complete and last:
                st["last"] = last
                st["known"] = {keeper_pid, *(i.pid for i in out)}
                st["groups"] = set(self.proof.groups if self.proof else ()) \
                    | {v for i in out for v in (i.pgid, i.sid) if v > 1}
            else:
                st["last"] = None
            return out

        return find

    def _cookie(self) -> bytes | None:
        o = self.options
        return f"{o.cookie_var}={o.cookie}".encode() if o.cookie else None

    def member_pids(self, keeper_pid: int) -> list[int]:
        return [i.pid for i in self._related(keeper_pid)]

    def kill_all(self, keeper, timeout: float) -> None:
        from ..ending import end

        me = os.getpid()
        spawned = keeper.spawned
        # Frozen first, and found again a while after the last find: a
        # pid-hopper forks its successor between a look and a kill, and only
        # the cookie (no parentage, group or session) links that one to us.
        # Every signal carries the proof of the last look (the cookie, or a
        # proven group, session or parent) and the gate checks it on the
        # pinned process: a stranger handed a member's pid is spared.
        end(self._finder(me, spawned, keeper), born_after=self.born_after,
            grace=0, freeze=True, quiet=0.05, on_round=keeper.reap, bound=timeout,
            proof=lambda _i: self.proof)
