"""An owner process for the Windows lane's owner-death tests.

``python.exe -S _owner.py KIND ENDING STRATEGY TOKEN``

Starts ``_child.py tree TOKEN`` (a child that starts a grandchild), prints
``owner OWNER CHILD GRANDCHILD`` (Windows pids), waits for a line on stdin,
then ends as ENDING says.

KIND:
  job         a WindowsJob (the backend under test)
  nested      a WindowsJob nested in another; the tree in the inner one
  background  a background WindowsJob (no kill-on-close): the tree must survive
  nojob       the control: plain subprocess.Popen, no job at all
ENDING:
  exit        os._exit(0): no clean-up code runs
  terminate   TerminateProcess on itself (what Task Manager's "End task" does)
  wait        sleep until killed from outside (SIGKILL of its Linux process)
STRATEGY: a placement strategy of tether.platform.windows, or "default".
"""

import ctypes
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    kind, ending, strategy, token = sys.argv[1:5]
    from tether.platform.base import JobOptions
    from tether.platform.windows import WindowsJob

    cmd = [sys.executable, "-S", os.path.join(HERE, "_child.py"), "tree", token]
    kw = {"stdout": subprocess.PIPE, "stdin": subprocess.DEVNULL, "text": True}
    strat = None if strategy == "default" else strategy
    keep = []  # the jobs stay referenced until this process ends
    if kind == "nojob":
        proc = subprocess.Popen(cmd, **kw)
    elif kind == "background":
        job = WindowsJob(JobOptions(name="bg", job_id=token, background=True), strategy=strat)
        keep.append(job)
        proc = job.popen(cmd, kw)
    elif kind == "nested":
        outer = WindowsJob(JobOptions(name="outer", job_id=token + "o"), strategy=strat)
        inner = WindowsJob(JobOptions(name="inner", job_id=token + "i", parent=outer), strategy=strat)
        keep += [outer, inner]
        proc = inner.popen(cmd, kw)
    elif kind == "job":
        job = WindowsJob(JobOptions(name="owner", job_id=token), strategy=strat)
        keep.append(job)
        proc = job.popen(cmd, kw)
    else:
        print("unknown kind", kind, flush=True)
        return 2
    line = proc.stdout.readline().split()
    if len(line) != 3 or line[0] != "pids":
        print("bad child output", line, flush=True)
        return 2
    print("owner", os.getpid(), line[1], line[2], flush=True)
    # The test opens handles to the tree (so that it can watch it end), then says go.
    sys.stdin.readline()
    if ending == "terminate":
        k = ctypes.WinDLL("kernel32", use_last_error=True)
        k.GetCurrentProcess.restype = ctypes.c_void_p
        k.TerminateProcess.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
        k.TerminateProcess(k.GetCurrentProcess(), 7)
        return 3  # not reached
    if ending == "wait":
        time.sleep(60)
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
