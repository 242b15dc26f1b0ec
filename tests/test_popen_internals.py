"""The private parts of CPython's ``subprocess.Popen`` that tether relies on,
pinned on the running Python, so that a Python that changes one fails here (CI
runs this file on the lowest and the highest CPython it claims:
scripts/pythons-tests.sh), not on a user's machine.

POSIX (keeper/posix_popen.py, ``JobPopen``): ``Popen.__init__`` calls
``self._execute_child`` with its arguments by position, in the order our
override names them; ``poll()`` and ``__del__`` go through
``self._internal_poll(_deadstate=...)``, ``wait()`` through
``self._wait(timeout=...)``; both take ``self._waitpid_lock``; the override
calls ``self._close_pipe_fds(...)`` and sets ``self._child_created``; the
spawn copies ``os.environb._data`` (a dict of bytes) when it is there.

Windows (platform/windows_popen.py): ``_job_popen_class`` rebuilds CPython's
Windows ``_execute_child`` from its code object with ``_winapi`` swapped for a
proxy whose ``CreateProcess`` takes the same nine arguments and returns the
same four values; ``_place`` reads ``Popen._handle``. The Windows method is not
compiled on Linux, so it is pinned from this Python's own ``subprocess.py``
source (the Wine lane runs the real thing on one Windows Python).
"""

from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys
import threading

import pytest

from tether.platform import windows

POSIX = os.name == "posix"
needs_posix = pytest.mark.skipif(not POSIX, reason="the POSIX Popen internals")


def _params(func) -> list[str]:
    return list(inspect.signature(func).parameters)


@needs_posix
def test_execute_child_takes_the_arguments_our_override_names_in_order():
    from tether.keeper.posix import JobPopen

    theirs = _params(subprocess.Popen._execute_child)
    ours = _params(JobPopen._execute_child)
    # process_group (3.11+): ours has it with a default, for 3.10's Popen that does not pass it
    assert ours[-1] == "process_group"
    assert inspect.signature(JobPopen._execute_child).parameters["process_group"].default == -1
    assert theirs in (ours, ours[:-1]), theirs
    if sys.version_info >= (3, 11):
        assert theirs == ours


class _Recording(subprocess.Popen):
    """Plain Popen, recording how its own methods call the private ones."""

    calls: list[tuple[str, tuple, dict]]

    def _execute_child(self, *args, **kwargs):
        self.calls = [("_execute_child", args, kwargs)]
        super()._execute_child(*args, **kwargs)

    def _internal_poll(self, *args, **kwargs):
        self.calls.append(("_internal_poll", args, kwargs))
        assert isinstance(self._waitpid_lock, type(threading.Lock()))
        return super()._internal_poll(*args, **kwargs)

    def _wait(self, *args, **kwargs):
        self.calls.append(("_wait", args, kwargs))
        return super()._wait(*args, **kwargs)


@needs_posix
def test_execute_child_is_called_by_position_with_the_pipe_fds():
    p = _Recording([sys.executable, "-c", "pass"], stdin=subprocess.PIPE,
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        name, args, kwargs = p.calls[0]
        assert name == "_execute_child" and kwargs == {}
        names = _params(subprocess.Popen._execute_child)[1:]  # without self
        assert len(args) == len(names)
        got = dict(zip(names, args, strict=True))
        assert got["args"][-2:] == ["-c", "pass"] and got["shell"] is False
        for fd in ("p2cread", "p2cwrite", "c2pread", "c2pwrite", "errread", "errwrite"):
            assert isinstance(got[fd], int) and got[fd] >= 0, (fd, got[fd])
        assert p._child_created is True
    finally:
        p.communicate(timeout=20)


@needs_posix
def test_poll_and_wait_go_through_internal_poll_and_wait():
    p = _Recording([sys.executable, "-c", "import time; time.sleep(0.2)"])
    try:
        assert p.poll() is None
        assert p.calls[-1][0] == "_internal_poll"
        with pytest.raises(subprocess.TimeoutExpired):
            p.wait(timeout=0.01)
        assert p.calls[-1] == ("_wait", (), {"timeout": 0.01})
        assert p.wait(timeout=20) == 0
        assert p.calls[-1] == ("_wait", (), {"timeout": 20})
    finally:
        p.kill()
        p.wait(timeout=20)


@needs_posix
def test_internal_poll_takes_deadstate_and_del_passes_it():
    # Our _internal_poll(_deadstate=None, **_ignored): CPython's __del__ of a
    # child still running passes _deadstate=sys.maxsize by keyword.
    sig = inspect.signature(subprocess.Popen._internal_poll)
    assert list(sig.parameters)[:2] == ["self", "_deadstate"]
    assert sig.parameters["_deadstate"].default is None
    src = inspect.getsource(subprocess.Popen.__del__)
    assert "self._internal_poll(_deadstate=_maxsize)" in src, src
    assert "self._child_created" in src, src  # JobPopen sets it: a child exists to poll
    assert "_maxsize" in inspect.signature(subprocess.Popen.__del__).parameters


@needs_posix
def test_close_pipe_fds_takes_the_six_pipe_ends():
    assert _params(subprocess.Popen._close_pipe_fds) == [
        "self", "p2cread", "p2cwrite", "c2pread", "c2pwrite", "errread", "errwrite"]
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    try:
        p = subprocess.Popen.__new__(subprocess.Popen)
        p._close_pipe_fds(r1, w1, r2, w2, -1, -1)
        # the child's ends (its stdin's read end, its stdout's write end) are
        # closed here; ours stay open
        assert [_is_open(fd) for fd in (r1, w1, r2, w2)] == [False, True, True, False]
    finally:
        for fd in (r1, w1, r2, w2):
            if _is_open(fd):
                os.close(fd)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


@needs_posix
def test_environb_data_is_the_environment_as_bytes():
    data = getattr(os.environb, "_data", None)
    assert isinstance(data, dict)
    assert data == dict(os.environb)
    assert all(isinstance(k, bytes) and isinstance(v, bytes) for k, v in data.items())


# -- Windows: the method rebuilt from its code object, read from this Python's source --

def _windows_execute_child() -> ast.FunctionDef:
    tree = ast.parse(inspect.getsource(subprocess))
    popen = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Popen")
    branch = next(n for n in popen.body if isinstance(n, ast.If)
                  and isinstance(n.test, ast.Name) and n.test.id == "_mswindows")
    return next(n for n in branch.body
                if isinstance(n, ast.FunctionDef) and n.name == "_execute_child")


def test_windows_execute_child_calls_winapi_create_process_as_our_proxy_takes_it():
    func = _windows_execute_child()
    calls = [n for n in ast.walk(func) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == "CreateProcess"
             and isinstance(n.func.value, ast.Name) and n.func.value.id == "_winapi"]
    assert len(calls) == 1, ast.dump(func)[:500]
    call = calls[0]
    ours = _params(windows._create_process)
    assert len(ours) == 9 and not call.keywords and len(call.args) == len(ours)
    assert not any(isinstance(a, ast.Starred) for a in call.args)
    # hp, ht, pid, tid = _winapi.CreateProcess(...): our stand-in returns those four
    assign = next(n for n in ast.walk(func) if isinstance(n, ast.Assign) and n.value is call)
    target = assign.targets[0]
    assert isinstance(target, ast.Tuple) and len(target.elts) == 4
    assert [e.id for e in target.elts] == ["hp", "ht", "pid", "tid"]  # type: ignore[attr-defined]
    ret = inspect.signature(windows._create_process).return_annotation
    assert ret in ("tuple[int, int, int, int]", tuple[int, int, int, int])


def test_windows_execute_child_sets_handle_and_has_no_closure():
    func = _windows_execute_child()
    sets = {t.attr for n in ast.walk(func) if isinstance(n, ast.Assign) for t in n.targets
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
    assert {"_handle", "pid", "_child_created"} <= sets, sets
    # types.FunctionType(code, globals, name, defaults, closure): a nested
    # function or a zero-argument super() would make a closure our copy must carry
    assert not any(isinstance(n, (ast.Nonlocal, ast.Lambda, ast.FunctionDef)) and n is not func
                   for n in ast.walk(func))
    names = {n.id for n in ast.walk(func) if isinstance(n, ast.Name)}
    assert "super" not in names and "__class__" not in names
