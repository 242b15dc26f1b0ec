"""Child process for the Windows lane: one small program, several roles.

Run with the Windows Python (``python.exe -S _child.py MODE TOKEN ...``);
stdlib only, so ``-S`` keeps its start-up short under Wine. TOKEN is a
per-test string that appears on the command line, so a test can recognise
the processes it started (and only those).

Modes:
  sleep TOKEN [SECONDS]      print "ready PID", sleep
  tree TOKEN                 start a grandchild ``sleep``; print "pids CHILD GRANDCHILD"; sleep
  orphan TOKEN               start a grandchild ``sleep``, print "pids CHILD GRANDCHILD", exit 0
  breakaway TOKEN            try to start a child with CREATE_BREAKAWAY_FROM_JOB; print
                             "escaped PID" (then end it) or "denied WINERROR"
  libuv TOKEN                as Node's libuv does: put itself in a job of its own with
                             SILENT_BREAKAWAY_OK, then start a grandchild ``sleep``;
                             print "pids CHILD GRANDCHILD"; sleep
  injob TOKEN                print "injob 0|1" (IsProcessInJob of itself, any job)
  echo TOKEN CODE            copy stdin to stdout upper-cased, "err" to stderr, exit CODE
  env TOKEN NAME             print ascii() of the variable NAME (or <unset>), and the cwd
  marker TOKEN PATH          create PATH (proof the child ran), exit 0
  pidfile TOKEN PATH         write its pid to PATH (written whole, then renamed), sleep
  waitfor TOKEN PATH         wait until PATH exists (at most 20 s); exit 0, or 1 if it never did
  break TOKEN                print "ready", exit 42 on CTRL_BREAK (SIGBREAK), 0 after 20 s
"""

# Only os, sys and time at the top: each import costs start-up time under Wine.
import os
import sys
import time


def _sleep(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.2)


def main() -> int:
    mode, token = sys.argv[1], sys.argv[2]
    rest = sys.argv[3:]
    if mode == "sleep":
        print("ready", os.getpid(), flush=True)
        _sleep(float(rest[0]) if rest else 60.0)
        return 0
    if mode in ("tree", "orphan"):
        import subprocess

        grandchild = subprocess.Popen(
            [sys.executable, "-S", os.path.abspath(__file__), "sleep", token],
            stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
        )
        print("pids", os.getpid(), grandchild.pid, flush=True)
        if mode == "tree":
            _sleep(60.0)
        return 0
    if mode == "breakaway":
        import subprocess

        try:
            p = subprocess.Popen(
                [sys.executable, "-S", "-c", "import time; time.sleep(30)", token],
                creationflags=0x01000000,  # CREATE_BREAKAWAY_FROM_JOB
            )
        except OSError as e:
            print("denied", getattr(e, "winerror", e.errno), flush=True)
            return 0
        print("escaped", p.pid, flush=True)
        p.kill()
        p.wait()
        return 0
    if mode == "libuv":
        import ctypes
        import subprocess

        k = ctypes.WinDLL("kernel32", use_last_error=True)
        k.CreateJobObjectW.restype = ctypes.c_void_p
        k.CreateJobObjectW.argtypes = [ctypes.c_void_p, ctypes.c_wchar_p]
        k.SetInformationJobObject.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                              ctypes.c_uint32]
        k.AssignProcessToJobObject.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        k.GetCurrentProcess.restype = ctypes.c_void_p
        job = k.CreateJobObjectW(None, None)
        info = (ctypes.c_byte * 144)()
        ctypes.c_uint32.from_buffer(info, 16).value = 0x1000  # SILENT_BREAKAWAY_OK
        if not (job and k.SetInformationJobObject(job, 9, ctypes.byref(info), 144)
                and k.AssignProcessToJobObject(job, k.GetCurrentProcess())):
            print("libuv-setup-failed", ctypes.get_last_error(), flush=True)
            return 3
        grandchild = subprocess.Popen(
            [sys.executable, "-S", os.path.abspath(__file__), "sleep", token],
            stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
        )
        print("pids", os.getpid(), grandchild.pid, flush=True)
        _sleep(60.0)
        return 0
    if mode == "injob":
        import ctypes

        k = ctypes.WinDLL("kernel32", use_last_error=True)
        k.GetCurrentProcess.restype = ctypes.c_void_p
        k.IsProcessInJob.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
        flag = ctypes.c_int(0)
        if not k.IsProcessInJob(k.GetCurrentProcess(), None, ctypes.byref(flag)):
            print("injob error", ctypes.get_last_error(), flush=True)
            return 3
        print("injob", flag.value, flush=True)
        return 0
    if mode == "echo":
        data = sys.stdin.read()
        sys.stdout.write(data.upper())
        sys.stdout.flush()
        sys.stderr.write("err")
        sys.stderr.flush()
        return int(rest[0])
    if mode == "env":
        print(ascii(os.environ.get(rest[0], "<unset>")), flush=True)
        print(os.getcwd(), flush=True)
        return 0
    if mode == "marker":
        with open(rest[0], "w") as f:
            f.write(str(os.getpid()))
        return 0
    if mode == "pidfile":
        with open(rest[0] + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(rest[0] + ".tmp", rest[0])
        _sleep(60.0)
        return 0
    if mode == "waitfor":
        deadline = time.monotonic() + 20.0
        while not os.path.exists(rest[0]):
            if time.monotonic() > deadline:
                return 1
            time.sleep(0.02)
        return 0
    if mode == "break":
        import signal

        def on_break(signum, frame):
            print("got break", flush=True)
            os._exit(42)

        signal.signal(signal.SIGBREAK, on_break)
        print("ready", flush=True)
        _sleep(20.0)
        return 0
    print("unknown mode", mode, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
