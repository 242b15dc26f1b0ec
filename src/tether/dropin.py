"""``tether.run`` and ``tether.Popen``: ``subprocess.run`` and ``subprocess.Popen``
that put each call in a job of its own.

    import tether
    r = tether.run(["make", "test"], timeout=600, capture_output=True, text=True)
    with tether.Popen(["npm", "run", "dev"]) as p:
        ...

Same arguments, return types and exceptions (``TimeoutExpired``,
``CalledProcessError``, ``FileNotFoundError``...) as the ``subprocess``
functions; the difference is what ends:

* ``tether.run``: when the command returns, whatever it left running gets
  SIGTERM, ``grace`` seconds, then SIGKILL; on a timeout, an error
  (``check=True`` too) or Ctrl+C, the whole tree is killed at once - not only
  the command, as ``subprocess.run`` (and ``Job.run``) does.
* ``tether.Popen``: the end of its ``with`` block ends the tree (with the
  grace after a normal exit, at once after an exception); so does the object
  being garbage-collected. Until then it is a ``subprocess.Popen``: ``wait``,
  ``poll``, ``send_signal`` and friends concern the command only, and
  ``p.job`` is its ``tether.Job`` (``p.job.members()``, ``p.job.terminate()``).

In every case the tree also ends when this Python process dies, however it
dies. Keyword-only extras, not ``subprocess``'s: ``mechanism``, ``require``
(see ``tether.Job``), ``grace`` and ``name``.
"""

from __future__ import annotations

import subprocess

from .ending import DEFAULT_GRACE
from .job import Job

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs start-up time: hints only
    from typing import Any, AnyStr, Literal, overload  # noqa: F401 - AnyStr: the quoted base

    from ._typing import CMD, PopenKwargs, Unpack

__all__ = ["run", "Popen"]


def _job(args: Any, mechanism: str, require: str | None, grace: float, name: str | None) -> Job:
    if name is None:
        from .stops import argv_label

        name = argv_label(args)
    return Job(name=name, mechanism=mechanism, grace=grace, require=require)


if TYPE_CHECKING:  # overloads for checkers; the definition below runs
    @overload
    def run(args: CMD, *, text: Literal[True], input: str | None = None, capture_output: bool = False,
            timeout: float | None = None, check: bool = False, encoding: str | None = None,
            errors: str | None = None, universal_newlines: bool | None = None,
            mechanism: str = "auto", require: str | None = None, grace: float = DEFAULT_GRACE,
            name: str | None = None,
            **kwargs: Unpack[PopenKwargs]) -> subprocess.CompletedProcess[str]: ...
    @overload
    def run(args: CMD, *, encoding: str, input: str | None = None, capture_output: bool = False,
            timeout: float | None = None, check: bool = False, text: bool | None = None,
            errors: str | None = None, universal_newlines: bool | None = None,
            mechanism: str = "auto", require: str | None = None, grace: float = DEFAULT_GRACE,
            name: str | None = None,
            **kwargs: Unpack[PopenKwargs]) -> subprocess.CompletedProcess[str]: ...
    @overload
    def run(args: CMD, *, errors: str, input: str | None = None, capture_output: bool = False,
            timeout: float | None = None, check: bool = False, text: bool | None = None,
            encoding: str | None = None, universal_newlines: bool | None = None,
            mechanism: str = "auto", require: str | None = None, grace: float = DEFAULT_GRACE,
            name: str | None = None,
            **kwargs: Unpack[PopenKwargs]) -> subprocess.CompletedProcess[str]: ...
    @overload
    def run(args: CMD, *, universal_newlines: Literal[True], input: str | None = None,
            capture_output: bool = False, timeout: float | None = None, check: bool = False,
            text: bool | None = None, encoding: str | None = None, errors: str | None = None,
            mechanism: str = "auto", require: str | None = None, grace: float = DEFAULT_GRACE,
            name: str | None = None,
            **kwargs: Unpack[PopenKwargs]) -> subprocess.CompletedProcess[str]: ...
    @overload
    def run(args: CMD, *, text: Literal[False] | None = None, input: bytes | None = None,
            capture_output: bool = False, timeout: float | None = None, check: bool = False,
            encoding: None = None, errors: None = None,
            universal_newlines: Literal[False] | None = None,
            mechanism: str = "auto", require: str | None = None, grace: float = DEFAULT_GRACE,
            name: str | None = None,
            **kwargs: Unpack[PopenKwargs]) -> subprocess.CompletedProcess[bytes]: ...
    @overload
    def run(args: CMD, *, input: Any = None, capture_output: bool = False,
            timeout: float | None = None, check: bool = False, text: bool | None = None,
            encoding: str | None = None, errors: str | None = None,
            universal_newlines: bool | None = None,
            mechanism: str = "auto", require: str | None = None, grace: float = DEFAULT_GRACE,
            name: str | None = None,
            **kwargs: Unpack[PopenKwargs]) -> subprocess.CompletedProcess[Any]: ...



def run(args: Any, *, input: Any = None, capture_output: bool = False,
        timeout: float | None = None, check: bool = False, mechanism: str = "auto",
        require: str | None = None, grace: float = DEFAULT_GRACE, name: str | None = None,
        **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run`` in a job of its own: nothing it started outlives the call.

    On return, what the command left running gets SIGTERM, ``grace``
    seconds, SIGKILL; on ``TimeoutExpired``, ``CalledProcessError`` (with
    ``check=True``), any other exception or ``KeyboardInterrupt``, the whole
    tree is killed at once, then the exception propagates.
    """
    job = _job(args, mechanism, require, grace, name)
    try:
        # Once the command exits, what it left is ended at once, with the
        # grace: so a leftover holding the output pipes cannot hold the call.
        result = job._run(args, input, capture_output, timeout, check, kwargs,
                          end=lambda _process: job.close(), leftovers=job.terminate)
    except BaseException:
        job.close()
        raise
    try:
        job.terminate()
    finally:
        job.close()
    return result


_OWNING: dict[type, type] = {}


# "AnyStr" quoted: at run time typing is not loaded for it (~3 ms), and
# subprocess.Popen[...] as a base is subprocess.Popen whatever the argument.
class Popen(subprocess.Popen["AnyStr"]):
    """``subprocess.Popen`` in a job of its own (``p.job``).

    The object is the job's own Popen (on POSIX a ``tether`` ``JobPopen``),
    made an instance of this class too: ``isinstance(p, subprocess.Popen)``
    and ``isinstance(p, tether.Popen)`` both hold. Leaving its ``with`` block
    closes its pipes and waits for the command, as ``subprocess.Popen``
    does, then ends everything the command started (SIGTERM, ``grace``,
    SIGKILL; at once if the block raised).
    """

    job: Job

    if TYPE_CHECKING:  # overloads for checkers; the definition below runs
        @overload
        def __new__(cls, args: CMD, *, text: Literal[True], encoding: str | None = None,
                    errors: str | None = None, universal_newlines: bool | None = None,
                    mechanism: str = "auto", require: str | None = None,
                    grace: float = DEFAULT_GRACE, name: str | None = None,
                    **kwargs: Unpack[PopenKwargs]) -> Popen[str]: ...
        @overload
        def __new__(cls, args: CMD, *, encoding: str, errors: str | None = None,
                    text: bool | None = None, universal_newlines: bool | None = None,
                    mechanism: str = "auto", require: str | None = None,
                    grace: float = DEFAULT_GRACE, name: str | None = None,
                    **kwargs: Unpack[PopenKwargs]) -> Popen[str]: ...
        @overload
        def __new__(cls, args: CMD, *, errors: str, encoding: str | None = None,
                    text: bool | None = None, universal_newlines: bool | None = None,
                    mechanism: str = "auto", require: str | None = None,
                    grace: float = DEFAULT_GRACE, name: str | None = None,
                    **kwargs: Unpack[PopenKwargs]) -> Popen[str]: ...
        @overload
        def __new__(cls, args: CMD, *, universal_newlines: Literal[True], text: bool | None = None,
                    encoding: str | None = None, errors: str | None = None,
                    mechanism: str = "auto", require: str | None = None,
                    grace: float = DEFAULT_GRACE, name: str | None = None,
                    **kwargs: Unpack[PopenKwargs]) -> Popen[str]: ...
        @overload
        def __new__(cls, args: CMD, *, text: Literal[False] | None = None, encoding: None = None,
                    errors: None = None, universal_newlines: Literal[False] | None = None,
                    mechanism: str = "auto", require: str | None = None,
                    grace: float = DEFAULT_GRACE, name: str | None = None,
                    **kwargs: Unpack[PopenKwargs]) -> Popen[bytes]: ...
        @overload
        def __new__(cls, args: CMD, *, text: bool | None = None, encoding: str | None = None,
                    errors: str | None = None, universal_newlines: bool | None = None,
                    mechanism: str = "auto", require: str | None = None,
                    grace: float = DEFAULT_GRACE, name: str | None = None,
                    **kwargs: Unpack[PopenKwargs]) -> Popen[Any]: ...

    def __new__(cls, args: Any, *, mechanism: str = "auto", require: str | None = None,
                grace: float = DEFAULT_GRACE, name: str | None = None,
                **kwargs: Any) -> Popen[Any]:
        job = _job(args, mechanism, require, grace, name)
        try:
            p = job.popen(args, **kwargs)
        except BaseException:
            job.close()
            raise
        # The job's backend made the Popen (a JobPopen on POSIX); make it an
        # instance of this class too, by a subclass of both that adds no
        # state. Python then calls __init__ below, which has nothing to do.
        base = type(p)
        owning = _OWNING.get(base)
        if owning is None:
            owning = _OWNING[base] = type(cls.__name__, (cls, base), {"__module__": __name__})
        p.__class__ = owning
        assert isinstance(p, cls)  # it is now (and so checkers know p.job)
        p.job = job
        import weakref

        weakref.finalize(p, job.close)
        return p  # type: ignore[return-value]

    if not TYPE_CHECKING:  # checkers read the signature from __new__ above
        def __init__(self, *args, **kwargs):
            pass  # the job's backend initialised the object in __new__

    def __exit__(self, exc_type: Any, value: Any, traceback: Any) -> None:
        try:
            if exc_type is not None and not issubclass(exc_type, KeyboardInterrupt):
                # The block failed: end the tree first, or subprocess's
                # __exit__ would wait for a command that may never end.
                self.job.close()
            super().__exit__(exc_type, value, traceback)  # pipes closed, the command waited for
        finally:
            try:
                if exc_type is None:
                    self.job.terminate()
            finally:
                self.job.close()
