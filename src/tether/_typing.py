"""Types shared by the ``subprocess``-shaped signatures (type checkers only).

Imported under ``TYPE_CHECKING`` by ``tether.job`` and ``tether.dropin``,
never at run time (``typing`` costs start-up time). The keyword arguments
mirror typeshed's ``subprocess.Popen``, so a checker flags a misspelt one and
``text=True`` gives ``Popen[str]``; those that pick str or bytes
(``text``, ``encoding``, ``errors``, ``universal_newlines``) are spelt out
in each overload instead.
"""

import subprocess
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import IO, Any, TypedDict

from _typeshed import StrOrBytesPath

if sys.version_info >= (3, 12):
    from typing import Unpack
else:
    from typing_extensions import Unpack

__all__ = ["CMD", "FILE", "ENV", "PopenKwargs", "Unpack", "subprocess"]

CMD = StrOrBytesPath | Sequence[StrOrBytesPath]
FILE = None | int | IO[Any]
ENV = Mapping[bytes, StrOrBytesPath] | Mapping[str, StrOrBytesPath]


class PopenKwargs(TypedDict, total=False):
    """``subprocess.Popen``'s keywords but ``args`` and the str/bytes ones."""

    bufsize: int
    executable: StrOrBytesPath | None
    stdin: FILE
    stdout: FILE
    stderr: FILE
    preexec_fn: Callable[[], Any] | None
    close_fds: bool
    shell: bool
    cwd: StrOrBytesPath | None
    env: ENV | None
    startupinfo: Any
    creationflags: int
    restore_signals: bool
    start_new_session: bool
    pass_fds: Collection[int]
    user: str | int | None
    group: str | int | None
    extra_groups: Collection[str | int] | None
    umask: int
    pipesize: int
    process_group: int | None
    #: tether: make the child's stdin (a terminal) its controlling terminal
    ctty: bool
