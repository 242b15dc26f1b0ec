"""Contract tests of the one engine that ends processes (tether.ending).

Every case runs real processes, and each has a control that shows the check
can fail: the same processes, handled by something that does not do what
the engine promises, are seen alive by the same check.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from procutil import wait_until

from tether import gate, identity
from tether.ending import DEFAULT_GRACE, KILL_BOUND, MAX_GRACE, check_grace, end

pytestmark = [
    pytest.mark.mechanism,
    pytest.mark.timeout(60),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="real processes, Linux"),
]


def start(procs, script: str) -> subprocess.Popen:
    return procs.popen(["sh", "-c", script], stdin=subprocess.DEVNULL)


def one(procs, script: str) -> identity.Identity:
    p = start(procs, script)
    ident = wait_until(lambda: identity.read(p.pid))
    wait_until(lambda: (identity.read(p.pid) or ident).comm != "python3")
    return identity.read(p.pid) or ident


def ignores_term(ident: identity.Identity) -> bool:
    """Whether the shell has run its ``trap '' TERM``: SIGTERM's own bit, not
    any bit (a shell started from a background job without job control has
    SIGQUIT and SIGINT ignored from its first instruction, and a SIGTERM sent
    before the trap ends it)."""
    ign = identity.status_fields(ident.pid, b"SigIgn").get(b"SigIgn", b"0")
    return bool(int(ign, 16) & (1 << (signal.SIGTERM - 1)))


def test_term_ignorer_gets_sigkill_after_the_grace(procs):
    polite = one(procs, "exec sleep 300")
    stubborn = one(procs, "trap '' TERM; while :; do sleep 0.05; done")
    wait_until(lambda: ignores_term(stubborn))
    t0 = time.monotonic()
    e = end(procs.alive, born_after=procs.born, grace=0.5)  # the loop's sleeps too
    took = time.monotonic() - t0
    assert e.ok and not procs.alive()
    assert e.how(polite) == "SIGTERM" and e.how(stubborn) == "SIGKILL"
    assert 0.5 <= took < 3
    # Control: SIGTERM alone leaves the ignorer running.
    again = one(procs, "trap '' TERM; while :; do sleep 0.05; done")
    wait_until(lambda: ignores_term(again))
    gate.send_signal(again, signal.SIGTERM, member=True)
    time.sleep(0.5)
    assert identity.is_alive(again)
    end(targets=[again], born_after=procs.born, grace=0)


def test_a_stopped_process_is_continued_so_it_sees_sigterm(procs):
    stopped = one(procs, "exec sleep 300")
    os.kill(stopped.pid, signal.SIGSTOP)  # our own direct child, by the pid Popen holds
    wait_until(lambda: identity.read(stopped.pid).state == "T")
    e = end(targets=[stopped], born_after=procs.born, grace=2.0)
    assert e.ok and e.how(stopped) == "SIGTERM"  # ended within the grace, not by SIGKILL
    # Control: SIGTERM to a stopped process without SIGCONT ends nothing.
    ctl = one(procs, "exec sleep 300")
    os.kill(ctl.pid, signal.SIGSTOP)
    wait_until(lambda: identity.read(ctl.pid).state == "T")
    gate.send_signal(ctl, signal.SIGTERM, member=True)
    time.sleep(0.3)
    assert identity.is_alive(ctl)
    end(targets=[ctl], born_after=procs.born, grace=0)


def test_a_fork_loop_is_ended_in_rounds(procs):
    # A shell that starts a new sleep every 10 ms: one pass cannot end it, rounds can.
    start(procs, "while :; do sleep 30 & sleep 0.01; done")
    assert len(procs.wait_count(3)) >= 3
    # Control: one pass over what is there now leaves the loop's newest children.
    for i in procs.alive():
        if i.comm == "sleep":
            gate.send_signal(i, signal.SIGKILL, member=True)
    time.sleep(0.1)
    assert [i for i in procs.alive() if i.comm == "sleep"]
    t0 = time.monotonic()
    e = end(procs.alive, born_after=procs.born, grace=0, quiet=0.2, bound=10)
    assert len(e.ended) >= 3 and e.ok
    assert procs.alive() == []
    assert time.monotonic() - t0 < 10
    # Nothing to find: back after the quiet period, nothing signalled.
    assert end(lambda: [], born_after=procs.born, grace=0, quiet=0.05).ended == []


def test_a_frozen_fork_loop_is_ended_in_one_round(procs):
    start(procs, "while :; do sleep 30 & sleep 0.005; done")
    assert len(procs.wait_count(3)) >= 3
    e = end(procs.alive, born_after=procs.born, grace=0, freeze=True)
    assert e.ok and procs.alive() == []


# setsid, fork, the parent exits: a new pid every ~50 ms. Bounded: it stops
# at the test's stop file (the fixture's cleanup makes it) or after 2000 hops.
HOPPER = ("H='[ -e \"$HOPLOG.stop\" ] && exit 0; HOPS=$((${HOPS:-0}+1)); "
          "[ $HOPS -gt 2000 ] && exit 0; export HOPS; echo $$ >> \"$HOPLOG\"; sleep 0.05; "
          "setsid sh -c \"$H\" & exit 0'; export H; setsid sh -c \"$H\" & exit 0")


def test_a_pid_hopper_is_ended(procs):
    start(procs, HOPPER)
    wait_until(lambda: os.path.getsize(procs.hoplog) > 20)
    # Control: one look, then a kill a moment later (as a one-pass tool does)
    # misses it: it has hopped meanwhile, and its log keeps growing.
    seen = procs.alive()
    time.sleep(0.15)
    for i in seen:
        gate.send_signal(i, signal.SIGKILL, member=True)
    size = os.path.getsize(procs.hoplog)
    assert wait_until(lambda: os.path.getsize(procs.hoplog) > size, timeout=3)
    # The engine finds again until nothing is found for a while.
    e = end(procs.alive, born_after=procs.born, grace=0, quiet=0.5, bound=10)
    assert e.ended
    assert procs.seen_alive(0.5) == []


def test_never_a_process_born_before_the_call(procs):
    old = one(procs, "exec sleep 300")
    time.sleep(0.02)
    born = identity.now_ticks()
    while identity.now_ticks() == born:  # the next tick: nothing of old's can match it
        time.sleep(0.002)
    born = identity.now_ticks()
    young = one(procs, "exec sleep 300")
    e = end(lambda: [old, young], born_after=born, grace=0)
    assert identity.is_alive(old) and not identity.is_alive(young)
    assert e.how(young) == "SIGKILL" and e.how(old) is None
    # Control: the same call without that bound ends it.
    e = end(lambda: [old], born_after=None, grace=0)
    assert e.how(old) == "SIGKILL" and not identity.is_alive(old)


def test_never_pid_1_self_or_an_ancestor():
    me = identity.read(os.getpid())
    parent = identity.read(os.getppid())
    init = identity.read(1)
    targets = [i for i in (init, me, parent) if i is not None]
    sent = []

    def recording(ident, sig, member=False):
        sent.append(ident.pid)
        return gate.send_signal(ident, sig, member=member)

    e = end(targets=targets, born_after=None, grace=0.2, bound=0.5, send=recording)
    assert {i.pid for i, _ in e.refused} == {i.pid for i in targets}
    assert all("refusing to signal" in why for _, why in e.refused)
    assert e.ended == [] and all(identity.is_alive(i) for i in targets)
    assert set(sent) == {i.pid for i in targets}  # asked once each, refused by the gate
    # A fake identity (many fake pids equal ours): the gate refuses it before
    # any system call that could signal, and it is never asked about again.
    sent.clear()
    fake = identity.Identity(os.getpid(), 12345, identity.boot_id())
    e = end(targets=[fake], born_after=None, grace=0.1, send=recording)
    assert sent == [os.getpid()] and e.ended == [] and len(e.refused) == 1


def test_a_kernel_kill_hook_is_credited_and_the_rest_get_sigkill(procs):
    a = one(procs, "exec sleep 300")
    b = one(procs, "exec sleep 301")
    calls = []

    def kill():  # stands for cgroup.kill of a set that holds only a
        calls.append(1)
        gate.send_signal(a, signal.SIGKILL, member=True)

    e = end(targets=[a, b], born_after=procs.born, grace=0, kill=kill, kill_name="cgroup.kill",
            kill_covers=lambda i: i.pid == a.pid)
    assert e.ok and calls
    assert e.how(a) == "cgroup.kill" and e.how(b) == "SIGKILL"


def test_grace_is_validated_everywhere():
    assert check_grace(0) == 0.0 and check_grace(2) == 2.0 and check_grace(MAX_GRACE) == MAX_GRACE
    for bad in (-1, float("nan"), float("inf"), MAX_GRACE + 1):
        with pytest.raises(ValueError):
            check_grace(bad)
    for bad in ("2", None, True):
        with pytest.raises(TypeError):
            check_grace(bad)
    with pytest.raises(ValueError):
        end(lambda: [], born_after=None, grace=-1)
    assert DEFAULT_GRACE == 2.0 and KILL_BOUND == 5.0
