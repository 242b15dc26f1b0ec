"""Attributes of this process that tether sets: its name, child-subreaper,
and a hold on a closed stdin, stdout or stderr.

Import-light (``os``; ``_ctypes`` only inside :func:`set_subreaper`):
the shell wrapper's keeper and ``tether init`` use it.
"""

import os

PR_SET_CHILD_SUBREAPER = 36


def name_process(name: bytes) -> None:
    """Set our comm (``tether ps`` finds keepers and wardens by it)."""
    try:
        with open("/proc/self/comm", "wb") as f:
            f.write(name)
    except OSError:
        pass


def set_subreaper() -> None:
    """``prctl(PR_SET_CHILD_SUBREAPER, 1)``: an orphan anywhere below this
    process re-parents to it instead of to PID 1 (Linux >= 3.4). Raises
    OSError where it is refused or not Linux."""
    # The call itself through _ctypes (0.4 ms to load) rather than ctypes
    # (1.4 ms: every subreaper keeper of tether-shell pays it); ctypes only
    # where that is missing, or to read errno when the call was refused.
    try:
        import _ctypes

        # dlopen(NULL): the program itself (typeshed's stub wants a path)
        fn = _ctypes.dlsym(_ctypes.dlopen(None, 0), "prctl")  # type: ignore[arg-type]
        if _ctypes.call_function(fn, (PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0:
            return
    except (ImportError, AttributeError, OSError):
        pass
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        rc = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError) as e:  # no libc prctl: not Linux
        raise OSError(0, f"prctl(PR_SET_CHILD_SUBREAPER): {e}") from None
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(err)}")


def hold_std_fds() -> None:
    """Put /dev/null, close-on-exec, on whichever of fds 0, 1 and 2 is
    closed. A caller may start a front end (tether-shell, ``tether run``)
    with one closed; the first pipe, socket or pidfd opened would then take
    that number and be taken for stdio: handed to the command as its stdin,
    or overwritten by a keeper's own /dev/null stdio. Close-on-exec, so the
    command still finds it closed, as the caller left it (shell.c's
    hold_std_fds is the same)."""
    if os.name != "posix":
        return
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        if null != fd:  # (cannot be: fd is the lowest free one)
            os.dup2(null, fd, inheritable=False)
            os.close(null)
