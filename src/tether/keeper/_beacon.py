"""The owner's beacon: its death told at the start of its exit, not the end.

A pidfd becomes readable at the very end of a process's exit, after the
kernel has unmapped its memory: about a millisecond for a Python owner,
several for one holding a few hundred MB (bench/kill_latency.py's
``--beacon-baseline`` rows), and the job's processes run on meanwhile.
Earlier in the same exit (``exit_mm`` -> ``mm_release``, before the
unmapping), the kernel walks the dying thread's robust-futex list: each
robust mutex the thread holds gets ``FUTEX_OWNER_DIED`` in its lock word, and
one waiter is woken. So this process's main thread locks a process-shared
robust mutex in a memfd page, once, and never unlocks it; each native keeper
maps that page and waits on the lock word (keeper.c: ``beacon_wait``).

The traps:

* The same walk runs when the thread calls ``execve``, or when it exits while
  other threads live on. The keeper ends the job only when every thread of
  the owner is exiting; otherwise it goes on waiting on the pidfd, as
  without a beacon.
* A mutex held by a thread that ends before the process would be spent early,
  so the beacon is made on the main thread only (a job opened on another
  thread before then goes without one; ``Job.trace()["owner_watch"]`` says).
* glibc links the robust list through the mutexes themselves: the page stays
  mapped for the life of the process (unmapped, glibc's next update of the
  list would write into a page that is gone). A forked child has the mapping
  but not the mutex on its list (glibc empties the list at fork), so it makes
  its own.
* The kernel wakes one waiter; the first keeper woken wakes the others.

Linux only; ``_TETHER_BEACON=0`` turns it off (benchmarks and tests compare).
"""

from __future__ import annotations

import os
import sys
import threading

OFF = "_TETHER_BEACON"  # "0": no beacon (bench/kill_latency.py's baseline rows, tests)

_PAGE = 4096
_MUTEX = 64  # where the mutex starts in the page (the attribute object sits below it)
_TID_MASK = 0x3FFFFFFF  # FUTEX_TID_MASK
_lock = threading.Lock()
_made: tuple[int, int, int, object] | None = None  # (pid, memfd, offset of the lock word, mmap)
_tried_in = 0  # the pid that tried and could not (not again in that process)
_pages: list = []  # every page made here, mapped until the process ends (the third trap)


def for_keeper() -> tuple[int, int] | None:
    """``(memfd, offset of the lock word)`` of this process's beacon, made on
    the first call from the main thread; None where there is none (not Linux,
    not the main thread yet, a libc whose mutex layout is unknown, turned off).
    The fd is this module's: dup it into the keeper, never close it."""
    global _made, _tried_in
    if not sys.platform.startswith("linux") or os.environ.get(OFF) == "0":
        return None
    pid = os.getpid()
    with _lock:
        if _made is not None and _made[0] == pid:
            return _made[1], _made[2]
        if _tried_in == pid or threading.get_native_id() != pid:
            return None
        try:
            _made = _make(pid)
        except (OSError, ValueError, AttributeError, ImportError):
            _made = None
        if _made is None:
            _tried_in = pid
            return None
        return _made[1], _made[2]


def _word_offset() -> int:
    """Where the lock word sits in a pthread_mutex_t: glibc's ``__lock`` is
    its first member on every Linux architecture; musl's ``_m_lock`` its
    second int. Checked against our thread id once locked (_make)."""
    try:
        if os.confstr("CS_GNU_LIBC_VERSION"):
            return 0
    except (ValueError, OSError):
        pass
    return 4  # musl (the only other libc CPython runs on under Linux)


def _make(pid: int) -> tuple[int, int, int, object] | None:
    import ctypes  # (1.4 ms, once per process: only here)
    import mmap

    off = _word_offset()
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.memfd_create("tether-beacon", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, _PAGE)
        page = mmap.mmap(fd, _PAGE)
        _pages.append(page)
        base = ctypes.addressof(ctypes.c_char.from_buffer(page))
        attr, mutex = ctypes.c_void_p(base), ctypes.c_void_p(base + _MUTEX)
        steps = (lambda: libc.pthread_mutexattr_init(attr),
                 lambda: libc.pthread_mutexattr_setpshared(attr, 1),  # PTHREAD_PROCESS_SHARED
                 lambda: libc.pthread_mutexattr_setrobust(attr, 1),  # PTHREAD_MUTEX_ROBUST
                 lambda: libc.pthread_mutex_init(mutex, attr),
                 lambda: libc.pthread_mutex_lock(mutex))
        for step in steps:
            if step() != 0:
                os.close(fd)
                return None
        word = int.from_bytes(page[_MUTEX + off:_MUTEX + off + 4], sys.byteorder)
        if word & _TID_MASK != threading.get_native_id():
            os.close(fd)  # not the layout we know: the lock word is elsewhere
            return None
    except BaseException:
        os.close(fd)
        raise
    return pid, fd, _MUTEX + off, page
