"""The one way tether ends processes: politely, then for sure, and says how.

Every feature that ends processes by signal - ``Job.terminate``, a keeper
ending its members from outside, the ``pgroup`` and ``none`` mechanisms, the
shell wrapper's leftovers, PTY close, the pytest leak detector, ``tether
init``, the reaper and the host's resume rule - calls :func:`end`. What only
a kernel object can do at once (``cgroup.kill``, a subreaper's reap loop,
``TerminateJobObject``) stays in its mechanism and is passed in as ``kill``.

One end, in order:

1. ``find()`` names the processes in scope (the caller bounds it: a job's
   members, a test's descendants, a run's leftovers). Nothing born before
   ``born_after`` is ever signalled, whatever ``find`` returns.
2. With ``grace > 0``: SIGTERM to each, parents first, then SIGCONT to
   each (a stopped process acts on SIGTERM only once continued); then up to ``grace`` seconds
   for them to go, finding again as it waits (a process started meanwhile
   joins the next step). ``cancel()`` true cuts the grace short.
3. Optionally frozen (``freeze``): SIGSTOP, parents first, and find again
   until nothing new appears, so nothing forks its way out of the kill.
4. SIGKILL to what is left, deepest first (but what the mechanism's kernel
   kill covers), then ``kill()`` (that kernel kill, if any); find again and
   repeat until nothing is found for ``quiet`` seconds (once anything was
   found at all: with nothing found, nothing was killed, and the first empty
   look ends it) or ``bound`` seconds have passed.

Every signal goes through :func:`tether.gate.send_signal`: only to a
process whose pid, start ticks and boot id still match, never to PID <= 1,
this process or its ancestors (and, unless ``member``, never to another
user's). A zombie counts as gone. The result, :class:`Ending`, lists each
process with how it ended, what survived, and what the gate refused.

Import-light (``os``, ``time``, ``_signal`` and ``tether.identity``).
"""

from __future__ import annotations

import _signal
import time

from . import gate, identity
from .errors import SignalRefused

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from .gate import Proof
    from .identity import Identity

__all__ = ["DEFAULT_GRACE", "MAX_GRACE", "KILL_BOUND", "Ending", "end", "check_grace", "grace_arg",
           "depth_order"]

# DEFAULT_GRACE (seconds between the polite signal and SIGKILL), MAX_GRACE
# (the largest grace tether accepts), KILL_BOUND (seconds tether waits, after
# SIGKILL, for the killed to be gone): shared with the C side, defined there.
from ._constants import DEFAULT_GRACE, KILL_BOUND, MAX_GRACE  # noqa: E402

_SIGTERM = _signal.SIGTERM
_SIGKILL = getattr(_signal, "SIGKILL", _signal.SIGTERM)  # Windows: TerminateProcess either way
_SIGCONT = getattr(_signal, "SIGCONT", None)
_SIGSTOP = getattr(_signal, "SIGSTOP", None)
_GONE = ("Z", "X", "x")
_FREEZE_ROUNDS = 8


def check_grace(value: object, what: str = "grace") -> float:
    """``value`` as seconds if it is a finite number from 0 to
    :data:`MAX_GRACE`; ``ValueError`` (``TypeError`` for a non-number) else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {type(value).__name__}")
    v = float(value)
    if not 0 <= v <= MAX_GRACE:  # NaN compares false; inf is above the maximum
        raise ValueError(f"{what} must be a finite number of seconds from 0 to {MAX_GRACE:g}, "
                         f"not {value!r}")
    return v


def grace_arg(text: str) -> float:
    """An ``argparse`` ``type=`` for a grace in seconds, by :func:`check_grace`'s rules."""
    import argparse

    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    try:
        return check_grace(v)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


class Ending:
    """What one :func:`end` did.

    ``ended``: ``(identity, how)`` for every process it saw go, ``how`` being
    ``"exit"`` (gone before any signal reached it), ``"SIGTERM"`` (during the
    grace), ``"SIGKILL"``, or the name of the mechanism's kernel kill.
    ``survivors``: still alive when it gave up. ``refused``: ``(identity,
    reason)`` the identity gate would not signal. ``elapsed``: seconds.
    """

    __slots__ = ("ended", "survivors", "refused", "elapsed")

    def __init__(self) -> None:
        self.ended: list[tuple[Identity, str]] = []
        self.survivors: list[Identity] = []
        self.refused: list[tuple[Identity, str]] = []
        self.elapsed = 0.0

    @property
    def ok(self) -> bool:
        """True when nothing it meant to end is still alive."""
        return not self.survivors

    def identities(self) -> list[Identity]:
        """The processes it saw go, in the order they went."""
        return [i for i, _ in self.ended]

    def how(self, ident: Identity) -> str | None:
        for i, how in self.ended:
            if i.same_process(ident):
                return how
        return None

    def __repr__(self) -> str:
        return (f"<Ending ended={len(self.ended)} survivors={len(self.survivors)} "
                f"refused={len(self.refused)} {self.elapsed * 1e3:.1f} ms>")


def _key(i: Identity) -> tuple[int, int]:
    return (i[0], i[1])


def depth_order(idents: Iterable[Identity], deepest_first: bool) -> list[Identity]:
    """``idents`` by depth below the topmost process of the set (by their
    ppid links among themselves): children before parents when
    ``deepest_first``, parents first otherwise."""
    by_pid = {i[0]: i for i in idents}
    depth: dict[int, int] = {}
    for pid in by_pid:
        chain = []
        cur: int | None = pid
        while cur is not None and cur not in depth and cur not in chain:
            chain.append(cur)
            parent = by_pid.get(cur)
            cur = parent[3] if parent is not None and parent[3] in by_pid else None
        base = depth[cur] if cur is not None and cur in depth else -1
        for c in reversed(chain):
            base += 1
            depth[c] = base
    return sorted(by_pid.values(), key=lambda i: depth.get(i[0], 0), reverse=deepest_first)


def end(
    find: Callable[[], Iterable[Identity]] | None = None,
    *,
    born_after: int | None,
    targets: Iterable[Identity] = (),
    grace: float = DEFAULT_GRACE,
    freeze: bool = False,
    member: bool | Callable[[Identity], bool] = True,
    proof: Callable[[Identity], Proof | None] | None = None,
    kill: Callable[[], object] | None = None,
    kill_name: str = "SIGKILL",
    kill_covers: Callable[[Identity], bool] | None = None,
    polite: Callable[[list[Identity]], object] | None = None,
    cancel: Callable[[], bool] | None = None,
    on_round: Callable[[], object] | None = None,
    bound: float = KILL_BOUND,
    quiet: float = 0.0,
    send: Callable[..., bool] | None = None,
) -> Ending:
    """End what ``find()`` (and ``targets``) name; see the module doc.

    ``born_after``: a tick (:func:`tether.identity.now_ticks`) no process in
    scope was born before; ``None`` only where the caller proved each target
    otherwise (the reaper: each from its own record). ``member``: the caller
    vouches these are its job's (no uid check); a callable decides per process.
    ``proof(identity)``: what else proves a process known from the past is
    the one meant (:class:`tether.gate.Proof`: its job's cookie or
    cgroup); one it does not prove is refused, never signalled. ``kill``: the mechanism's
    kernel-side kill, credited as ``kill_name`` for the processes it covers
    (``kill_covers(identity)``; default: all of them); the rest get SIGKILL
    at once, and anything the kill missed gets SIGKILL on the next round.
    ``polite(targets)`` replaces the SIGTERM+SIGCONT round (Windows sends
    CTRL_BREAK there); when it returns an empty list nothing could be asked,
    and the grace is skipped. ``on_round()`` runs between looks (a keeper reaps
    there). ``send`` replaces ``gate.send_signal`` (a test seam).
    """
    t0 = time.monotonic()
    grace = check_grace(grace)
    run = _Run(find, born_after, member, proof, send or gate.send_signal)
    for i in targets:
        if born_after is None or i[1] >= born_after:
            run.seen.setdefault(_key(i), i)
    try:
        live = run.look()
        if grace > 0 and live and run.ask(live, polite):
            run.wait(grace, on_round, cancel)
        if freeze and _SIGSTOP is not None:
            run.freeze(_SIGSTOP)
        run.kill(bound, quiet, kill, kill_name, kill_covers, on_round)
        run.out.survivors = run.look()
    finally:
        run.thaw()  # on any error too: leave nothing frozen
        run.out.elapsed = time.monotonic() - t0
    return run.out


class _Run:
    """One call of :func:`end`: what it has seen, signalled and credited, and
    its steps (2: ``ask`` and ``wait``, 3: ``freeze``, 4: ``kill``)."""

    def __init__(self, find, floor, member, proof, send) -> None:
        self.find, self.floor, self.member, self.proof, self.send = find, floor, member, proof, send
        self.out = Ending()
        self.seen: dict[tuple[int, int], Identity] = {}
        self.how: dict[tuple[int, int], str] = {}
        self.refused: set[tuple[int, int]] = set()
        self.credit: dict[tuple[int, int], str] = {}  # the last step sent to each process
        self.attempted: set[tuple[int, int]] = set()  # handed to the gate at least once
        self.frozen: list[Identity] = []

    def look(self) -> list[Identity]:
        """In scope, not refused, not seen gone: what is still to be ended.
        A process not yet signalled is listed without a look of our own: the
        gate's identity check, at the moment of sending, decides."""
        seen, how, refused = self.seen, self.how, self.refused
        for i in (self.find() if self.find is not None else ()):
            if self.floor is not None and i[1] < self.floor:
                continue  # born before the scope began: never ours to end
            k = _key(i)
            if k not in seen and k not in refused:
                seen[k] = i
        live = []
        for k, i in list(seen.items()):
            if k in how or k in refused:
                continue
            if k not in self.attempted or identity.is_alive(i):
                live.append(i)
            else:
                how[k] = self.credit.get(k, "exit")
                self.out.ended.append((i, how[k]))
        return live

    def _send(self, i: Identity, sig: int) -> bool:
        member = self.member(i) if callable(self.member) else self.member
        if self.proof is not None:
            return bool(self.send(i, sig, member=member, proof=self.proof(i)))
        return bool(self.send(i, sig, member=member))

    def signal(self, i: Identity, sig: int, step: str | None) -> bool:
        k = _key(i)
        self.attempted.add(k)
        try:
            ok = self._send(i, sig)
        except SignalRefused as e:
            self.refused.add(k)
            self.out.refused.append((i, str(e)))
            return False
        except OSError:  # a transient failure (EMFILE, EAGAIN): tried again next round
            return False
        if ok and step is not None:
            self.credit[k] = step
        return ok

    def ask(self, live: list[Identity], polite) -> bool:
        """The polite round; whether anything was asked (else no grace)."""
        if polite is not None:
            sent = polite(live)
            for i in live:
                self.credit.setdefault(_key(i), "SIGTERM")
            return sent is None or bool(sent)
        # Parents first, and every SIGTERM before any SIGCONT: a wrapper
        # script or a supervisor hears it before it sees a child die (a
        # shell's `wait` returns when its child is killed, and the shell would
        # exit without running its trap; a supervisor would restart the child).
        told = [i for i in depth_order(live, deepest_first=False)
                if self.signal(i, _SIGTERM, "SIGTERM")]
        if _SIGCONT is not None:
            for i in told:
                self.signal(i, _SIGCONT, None)
        return bool(told)

    def wait(self, grace: float, on_round, cancel) -> None:
        """The grace: until nothing is left, the grace is over, or ``cancel()``."""
        deadline = time.monotonic() + grace
        delay = 0.001
        while True:
            if on_round is not None:
                on_round()
            if not self.look() or time.monotonic() >= deadline:
                return
            if cancel is not None and cancel():
                return
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.05)

    def freeze(self, sigstop: int) -> None:
        """SIGSTOP, parents first, until nothing new appears."""
        stopped: set[tuple[int, int]] = set()
        for _ in range(_FREEZE_ROUNDS):
            new = [i for i in self.look() if _key(i) not in stopped]
            if not new:
                return
            for i in depth_order(new, deepest_first=False):
                stopped.add(_key(i))
                if self.signal(i, sigstop, None):
                    self.frozen.append(i)

    def kill(self, bound: float, quiet: float, kill, kill_name: str, kill_covers,
             on_round) -> None:
        """The kill, repeated until quiet or the bound."""
        deadline = time.monotonic() + bound
        rounds = 0
        quiet_since: float | None = None
        while True:
            live = self.look()
            now = time.monotonic()
            if not live:
                if quiet_since is None:
                    quiet_since = now
                # The quiet watch is for what a kill may have missed (a
                # pid-hopper's successor): with nothing ever found, nothing
                # was killed, and one more look (this one) is the watch.
                if now - quiet_since >= (quiet if self.seen else 0) or now >= deadline:
                    return
                time.sleep(0.005)
                continue
            quiet_since = None
            if now >= deadline:
                return
            covered: set[tuple[int, int]] = set()
            if kill is not None and rounds == 0:
                covered = {_key(i) for i in live if kill_covers is None or kill_covers(i)}
            for i in depth_order(live, deepest_first=True):
                k = _key(i)
                if k not in covered:
                    # Still alive a round after a kill (its SIGKILL not yet
                    # taken): sent again, but the first kill keeps the credit.
                    was = self.credit.get(k)
                    first = was == "SIGKILL" or (kill is not None and was == kill_name)
                    self.signal(i, _SIGKILL, None if first else "SIGKILL")
            if kill is not None:
                kill()  # after the SIGKILLs: what they could not reach, the kernel ends
                for k in covered:
                    self.attempted.add(k)
                    self.credit[k] = kill_name
            rounds += 1
            if on_round is not None:
                on_round()
            time.sleep(0.001 if rounds < 4 else 0.005)

    def thaw(self) -> None:
        if not self.frozen or _SIGCONT is None:
            return
        for i in self.frozen:
            if _key(i) not in self.how and identity.is_alive(i):
                try:
                    self._send(i, _SIGCONT)
                except (SignalRefused, OSError):
                    pass
