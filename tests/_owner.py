"""An owner process for kill tests: opens a job, starts a tree, reports, waits.

usage: _owner.py MECHANISM SCENARIO [N]
MECHANISM "none" runs the same tree with plain subprocess.Popen (the control).
Prints one JSON line {"mechanism", "pids": [...], "keeper": pid} once the tree is up.
"""

import json
import os
import subprocess
import sys
import threading
import time

SCENARIOS = {
    "child": "exec sleep 300",
    "background": "sleep 300 & wait",
    "daemon": "(setsid sh -c 'exec sleep 300' &) ; exit 0",
    "nohup": "nohup setsid sleep 300 >/dev/null 2>&1 & exit 0",
    "ignorer": "trap '' TERM HUP; while :; do sleep 1; done",
    # Hops until "$HOPLOG.stop" exists (the test's cleanup makes it) or 30000
    # hops: it can never outlive the suite, even if every kill misses it.
    "hopper": ("H='[ -e \"$HOPLOG.stop\" ] && exit 0; HOPS=$((${HOPS:-0}+1)); "
               "[ $HOPS -gt 30000 ] && exit 0; export HOPS; echo $$ >> \"$HOPLOG\"; "
               "setsid sh -c \"$H\" & exit 0'; export H; setsid sh -c \"$H\" & sleep 0.3; exit 0"),
    "many": "i=0; while [ $i -lt ${N:-200} ]; do sleep 300 & i=$((i+1)); done; wait",
    # A double-forked daemon that also clears its environment: no cookie, no
    # test mark. It writes its pid first; the test records its identity.
    "daemon-noenv": ("(setsid sh -c 'echo $$ >> \"$HOPLOG.noenv\"; exec env -i sleep 300' &) ; "
                     "exit 0"),
}


def main() -> None:
    mech, scenario = sys.argv[1], sys.argv[2]
    n = sys.argv[3] if len(sys.argv) > 3 else "200"
    env = dict(os.environ, N=n)
    scripts = list(SCENARIOS.values()) if scenario == "all" else [SCENARIOS[scenario]]
    thread_mode = os.environ.get("OWNER_THREAD") == "1"
    if mech == "none":
        ps = [subprocess.Popen(["/bin/sh", "-c", s], env=env, stdin=subprocess.DEVNULL) for s in scripts]
        info = {"mechanism": "none", "pids": [p.pid for p in ps], "keeper": None}
    else:
        from tether import Job

        holder = {}

        def make() -> None:
            job = Job(name="owner-test", mechanism=mech)
            holder["job"] = job
            holder["ps"] = [job.popen(["/bin/sh", "-c", s], env=env, stdin=subprocess.DEVNULL)
                            for s in scripts]

        if thread_mode:  # the creating thread exits right after (PDEATHSIG trap)
            t = threading.Thread(target=make)
            t.start()
            t.join()
        else:
            make()
        job = holder["job"]
        info = {"mechanism": job.mechanism, "pids": [p.pid for p in holder["ps"]],
                "keeper": job.trace().get("keeper_pid")}
    time.sleep(float(os.environ.get("OWNER_SETTLE", "0.3")))
    print(json.dumps(info), flush=True)
    if os.environ.get("OWNER_EXIT") == "exception":
        raise RuntimeError("owner crashes with an uncaught exception")
    if os.environ.get("OWNER_EXIT") == "normal":
        sys.exit(0)
    time.sleep(600)


if __name__ == "__main__":
    main()
