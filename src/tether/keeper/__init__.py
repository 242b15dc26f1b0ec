"""The keeper subsystem: what keeps a POSIX job, and how its owner talks to it.

A POSIX job's processes are started and ended by its keeper, a small
process of its own that outlives nothing of the owner. This package is
that subsystem; :mod:`tether.platform` holds the mechanisms (one small
module each, and the one table from a name to its module), which it runs.

* ``native`` - the native keeper (``_native/keeper.c``), on Linux the one
  keeper of the cgroup, subreaper and pidns mechanisms: how it is started,
  and what happens where it is missing. ``_beacon`` tells it of the owner's
  death early.
* ``_proto`` - the protocol spoken to a keeper (``docs/protocol.md``).
* ``posix`` (``KeeperJob``) and ``posix_popen`` (``JobPopen``) - the owner's
  side, the client: a job's backend and its ``subprocess.Popen``.
* ``oneshot`` - the one-command client (the Python ``tether-shell``).
* ``_keeper``, ``_keeper_socket``, ``_warden`` - the Python keeper, for
  ``pgroup`` (the mechanism of macOS and the BSDs), and its fork server for
  multi-threaded owners.

Import-light: nothing is imported here.
"""
