"""The `tether` command. Thin: parses, then calls the rooms.

Commands whose options belong to one room (shell, reap, ps, init) are
handed their argv and parse it there, so each room's options sit next to
the code that uses them.
"""

from __future__ import annotations

import sys

from ._constants import EXIT_INTERNAL as EXIT_TETHER_FAILURE  # noqa: E402 - shared with C

_DELEGATED = {
    "shell": ("tether.shell", "Run a command through tether-shell (SHELL/COMSPEC drop-in)."),
    "reap": ("tether.reaper", "End leftovers of earlier runs that the audit log proves are ours."),
    "ps": ("tether.ps", "List the live jobs tether knows of, with their member trees."),
    "init": ("tether.init", "Be a container's PID 1, CMD its child: reap zombies, forward signals, end all on exit."),
}


def _parser():
    import argparse

    from .ending import DEFAULT_GRACE, grace_arg
    from .platform import MECHANISM_NAMES

    p = argparse.ArgumentParser(prog="tether", description="Every process a program starts ends when it ends.")
    p.add_argument("--version", action="version", version=_version())
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="Run CMD in a job; the job ends when CMD exits or tether dies.")
    run.add_argument("--mechanism", "-m", default="auto", choices=MECHANISM_NAMES)
    run.add_argument("--require", choices=["kernel"], default=None,
                     help="refuse to run unless the job is kernel-enforced")
    run.add_argument("--grace", type=grace_arg, default=DEFAULT_GRACE, metavar="S",
                     help="seconds between SIGTERM and SIGKILL for what CMD leaves behind "
                          f"(default {DEFAULT_GRACE:g})")
    run.add_argument("--state-dir", default=None, metavar="DIR", help="write the spawn audit log here")
    run.add_argument("--die-with-stdin", action="store_true",
                     help="end the job when stdin hangs up (ssh link dropped)")
    run.add_argument("--die-with-parent", action="store_true",
                     help="end the job when the process that started tether run dies (stdin is not watched)")
    run.add_argument("--lifeline", type=int, default=None, metavar="FD",
                     help="end the job when FD (a pipe or socket the caller holds the other end of) "
                          "reaches EOF or hangs up")
    run.add_argument("--app", default=None, metavar="APP", help="with --session: the application's name")
    run.add_argument("--session", default=None, metavar="KEY",
                     help="hold the session KEY of APP in --state-dir's log: one copy at a time "
                          "(another refuses with 125), a dead copy's leftovers ended first")
    run.add_argument("--label", default=None, metavar="TEXT", help="with --session: what the command is, for reports")
    run.add_argument("--take-over", action="store_true",
                     help="with --session: end the running copy's job first, saying what it ended")
    run.add_argument("--report", default=None, metavar="FILE",
                     help="with --session: when the job ends, one JSON object saying what was ended")
    run.add_argument("--report-fd", type=int, default=None, metavar="N", help="the report to fd N")
    run.add_argument("--verbose", "-v", action="store_true", help="say which mechanism protects the job")
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD [ARG...]")

    doc = sub.add_parser("doctor", help="Which mechanisms protect jobs here, and what they do not cover.")
    doc.add_argument("--json", action="store_true", help="stable JSON (see docs/cli.md)")

    demo = sub.add_parser("demo", help="An escape-artist tree, its owner SIGKILLed: does anything survive?")
    demo.add_argument("--mechanism", "-m", default="auto", choices=MECHANISM_NAMES)
    demo.add_argument("--control", action="store_true",
                      help="run the same tree without tether, to see what survives then")
    demo.add_argument("--json", action="store_true")

    for name, (_mod, text) in _DELEGATED.items():
        sub.add_parser(name, help=text, add_help=False)
    return p


def _version() -> str:
    from . import __version__

    return f"tether {__version__}"


def main(argv: list[str] | None = None) -> int:
    from ._sigwatch import catch_interrupts, release_interrupts

    before = catch_interrupts()  # a Ctrl+C Python loses (raised in a callback) still stops `run`
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        from ._prctl import hold_std_fds
        from .errors import UsageError

        hold_std_fds()  # before anything opens a file that would take a closed one's number
        try:
            return _main(argv)
        except UsageError as e:  # a bad TETHER_* value met on the way: one line, nothing run
            what = argv[0] if argv and not argv[0].startswith("-") else ""
            print(f"tether{' ' + what if what else ''}: {e}", file=sys.stderr)
            return EXIT_TETHER_FAILURE if what == "run" else e.code
    except KeyboardInterrupt:
        # SIGINT before `run` blocks it to wait for the command (or during
        # another command): no traceback, the status of a death by SIGINT; a
        # job already open is ended on the way out (run_command's finally)
        return 128 + 2
    finally:
        release_interrupts(before)


def _main(argv: list[str]) -> int:
    if argv[:2] == ["shell", "--install"]:
        from ._shellinstall import cli as install

        return install(argv[2:])
    if argv and argv[0] in _DELEGATED:
        import importlib

        mod = importlib.import_module(_DELEGATED[argv[0]][0])
        return int(mod.cli(argv[1:]) or 0)
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0) if argv and argv[0] != "run" else (EXIT_TETHER_FAILURE if exc.code else 0)
    if args.command == "run":
        cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        if not cmd:
            print("tether run: missing command (usage: tether run [OPTIONS] -- CMD [ARG...])",
                  file=sys.stderr)
            return EXIT_TETHER_FAILURE
        from .runner import run_command

        state_dir = args.state_dir
        if state_dir is not None:
            from .audit import state_dir_arg
            from .errors import UsageError

            try:
                state_dir = str(state_dir_arg(state_dir))
            except UsageError as e:
                print(f"tether run: {e}", file=sys.stderr)
                return EXIT_TETHER_FAILURE
        from .runner_session import session_args

        session = session_args(state_dir, args.app, args.session, args.label, args.take_over,
                               args.report, args.report_fd)
        if isinstance(session, str):
            print(f"tether run: {session}; nothing was run", file=sys.stderr)
            return EXIT_TETHER_FAILURE
        return run_command(cmd, mechanism=args.mechanism, require=args.require, grace=args.grace,
                           state_dir=state_dir, die_with_stdin=args.die_with_stdin,
                           verbose=args.verbose, die_with_parent=args.die_with_parent,
                           lifeline=args.lifeline, session=session)
    if args.command == "doctor":
        from .doctor import doctor

        return doctor(as_json=args.json)
    if args.command == "demo":
        from .demo import demo

        return demo(mechanism=args.mechanism, control=args.control, as_json=args.json)
    parser.print_help()
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
