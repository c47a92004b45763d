"""``rewindfs`` — the command line (``overlay.cli.main`` loads this module).

Subcommands come from two modules, each with ``register(subparsers)`` (adds its
parsers, each setting ``command=<name>``) and ``HANDLERS`` (name → ``handler(args, out)
-> int``): ``overlay.cli.mount`` (mount, unmount, run, turn begin|end, status, fsck)
and, when present, ``overlay.cli.rewind`` (log, rewind, redo, diff, show, gc), and
``overlay.cli.remote`` (remote add|list|remove|log, push, restore).

Exit codes are made here and only here (DESIGN): a handler's return value, or
``RewindfsError.exit_code`` for an error (0 done, 1 partial, 2 could not run, 3 usage;
argparse errors are usage errors and exit 3; any other exception exits 2, never 1).
Two more, outside that contract, as shells and git have them: Ctrl-C exits 130 (an
``Interrupted`` prints its line first: what the interrupted command left behind), and
a closed stdout (``rewindfs log | head -2``) exits 141 — the status a shell shows for
git killed by SIGPIPE — quietly: no traceback, no "could not run".
``--json`` prints JSON Lines ``{"v":1,"type":...}``; otherwise people get rich output
on a terminal.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import select
import sys

from rewindfs.store._errors import InternalError, RewindfsError

from rewindfs.overlay.cli import mount, options, remote, rewind
from rewindfs.overlay.cli.render import escape
from rewindfs.overlay.errors import Interrupted, StaleMount, UsageError
from rewindfs.overlay.places import DEAD_MOUNT, check_named_dir
from rewindfs.overlay.cli.exits import EXIT_INTERRUPTED, EXIT_PIPE_CLOSED

__all__ = ["Output", "build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    commands = None     # the action add_subparsers returned: ``rewindfs help`` walks it

    def error(self, message):
        raise UsageError(f"{message} (see {self.prog} --help)")

    def add_subparsers(self, **kwargs):
        self.commands = super().add_subparsers(**kwargs)
        return self.commands


class Output:
    """Where a command's results go: JSON Lines (``--json``) or rich text for people."""

    def __init__(self, json_mode: bool, stream=None):
        self.json = json_mode
        self.stream = stream or sys.stdout
        self._console = None

    @property
    def console(self):
        if self._console is None:
            from rich.console import Console

            class _Console(Console):
                def on_broken_pipe(self) -> None:
                    # rich's own exits 1 ("partial"); main() decides (quietly, 141)
                    raise BrokenPipeError(errno.EPIPE, "the reader of stdout is gone")

            self._console = _Console(file=self.stream, highlight=False)
        return self._console

    def emit(self, type_: str, **fields) -> None:
        """One machine-readable record (printed only in ``--json`` mode)."""
        if self.json:
            self.stream.write(json.dumps({"v": 1, "type": type_, **fields}) + "\n")
            self.stream.flush()

    def say(self, text: str, **style) -> None:
        """A line for people (suppressed in ``--json`` mode)."""
        if not self.json:
            self.console.print(text, soft_wrap=True, **style)

    def to_program(self) -> bool:
        """True when stdout is a file or a pipe (not ``--json``): output that another
        program reads (a patch, a list of paths) is then written as it is."""
        return not self.json and not self.console.is_terminal

    def write_raw(self, text: str) -> None:
        """``text`` exactly: no markup, tabs and control characters kept (rich expands
        tabs, and ``escape`` shows ``\\r``: either breaks a patch)."""
        self.stream.write(text)

    def write_bytes(self, data: bytes) -> None:
        """``data`` exactly, for names that are not UTF-8 (``diff -z``)."""
        self.stream.flush()
        buffer = getattr(self.stream, "buffer", None)
        if buffer is None:
            self.stream.write(data.decode("utf-8", "surrogateescape"))
        else:
            buffer.write(data)
            buffer.flush()

    def say_stderr(self, text: str) -> None:
        """A line for people on stderr, plain, as a shell says a command did not start
        (suppressed in ``--json`` mode, whose record says it)."""
        if not self.json:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()

    def warn(self, text: str) -> None:
        """A warning (plain text, escaped here): JSON record on stdout in ``--json``
        mode, else to stderr."""
        if self.json:
            self.emit("warning", message=text)
        else:
            from rich.console import Console
            Console(stderr=True, highlight=False).print(f"[yellow]warning:[/] {escape(text)}",
                                                        soft_wrap=True)

    def error(self, exc: RewindfsError) -> None:
        if self.json:
            self.emit("error", **exc.to_dict(), exit_code=exc.exit_code)
        else:
            from rich.console import Console
            Console(stderr=True, highlight=False).print(
                f"[red]rewindfs: {escape(exc.message)}[/] [dim]({exc.code})[/]", soft_wrap=True)


def _version() -> str:
    """The installed distribution's version (pyproject.toml is the one place it is set)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("rewindfs")
    except PackageNotFoundError:     # run from a source tree that was never installed
        return "unknown (not installed)"


def build_parser():
    parser = _Parser(prog="rewindfs", description="Rewind and redo for agent sessions.")
    parser.add_argument("--json", action="store_true", help="print JSON Lines")
    parser.add_argument("--store", metavar="PATH", help="store path (default $REWINDFS_HOME, "
                        "$XDG_DATA_HOME/rewindfs or ~/.local/share/rewindfs)")
    parser.add_argument("-C", dest="chdir", action="append", metavar="DIR",
                        help="run as if started in DIR (as git -C; repeatable, each "
                        "relative one taken from the one before)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug output")
    parser.add_argument("--version", action="version", version=f"rewindfs {_version()}")
    parser.set_defaults(**options.DEFAULTS)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    table = {}
    for group in (mount, rewind, remote):    # one module per command group
        group.register(sub)
        table.update(group.HANDLERS)
    _register_help(sub, parser)
    table["help"] = _help
    return parser, table


def _register_help(sub, parser) -> None:
    """``rewindfs help [COMMAND…]``, as ``git help log``: that command's ``--help``."""
    p = sub.add_parser("help", help="show the help of rewindfs or of a command")
    p.add_argument("topic", nargs="*", metavar="COMMAND",
                   help="a command, or a group and its command (help remote add)")
    p.set_defaults(parser=parser)


def _help(args, out) -> int:
    parser = args.parser
    for word in args.topic:
        choices = _subcommands(parser)
        if not choices:
            raise UsageError(f"{parser.prog} has no commands under it ({word!r})")
        if word not in choices:
            raise UsageError(f"no command {word!r} in {parser.prog} (one of: "
                             f"{', '.join(choices)})")
        parser = choices[word]
    out.write_raw(parser.format_help())
    return 0


def _subcommands(parser) -> dict:
    """The commands under *parser* (``{}`` for a leaf)."""
    commands = getattr(parser, "commands", None)
    return {} if commands is None else dict(commands.choices)


def main(argv=None) -> int:
    """Run one command; returns the exit code (``sys.exit(main())``)."""
    out = Output("--json" in (argv if argv is not None else sys.argv[1:]))
    args = None
    try:
        parser, table = build_parser()
        args = parser.parse_args(argv)
        out = Output(args.json)
        logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                            format="%(name)s: %(message)s")
        handler = table.get(args.command)
        if handler is None:
            raise UsageError("name a command (rewindfs --help lists them)")
        for place in args.chdir or ():      # rewindfs -C DIR COMMAND: as git -C
            check_named_dir(place)
            os.chdir(place)
        if getattr(args, "workspace", None):        # -C DIR: say so if it is not one
            check_named_dir(args.workspace)
        return int(handler(args, out) or 0)
    except RewindfsError as exc:
        out.error(exc)
        return exc.exit_code
    except Interrupted as exc:
        return _interrupted(exc, out)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError as exc:
        if _stdout_closed():
            return _pipe_closed()
        return _unexpected(exc, out, verbose=bool(args is not None and args.verbose))
    except OSError as exc:
        if exc.errno in DEAD_MOUNT:     # a dead daemon's mount, met on the way
            where = os.fsdecode(exc.filename) if exc.filename is not None else "."
            err = StaleMount(path=where)
            out.error(err)
            return err.exit_code
        return _unexpected(exc, out, verbose=bool(args is not None and args.verbose))
    except Exception as exc:    # noqa: BLE001 — the safety net: 2, never 1 ("partial")
        return _unexpected(exc, out, verbose=bool(args is not None and args.verbose))


def _interrupted(exc: Interrupted, out: Output) -> int:
    """The interrupted command's last line (stderr; ``--json``: an ``interrupted``
    record), then 130.  A second Ctrl-C while it is printed still exits 130."""
    try:
        if out.json:
            out.emit("interrupted", message=exc.message)
        else:
            sys.stdout.flush()
            sys.stderr.write(f"rewindfs: {exc.message}\n")
            sys.stderr.flush()
    except (KeyboardInterrupt, OSError):
        pass
    return EXIT_INTERRUPTED


def _stdout_closed() -> bool:
    """True if stdout is a pipe (or socket) whose reader is gone: poll reports an error
    on it.  A ``BrokenPipeError`` from the control socket is not this."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        # a pipe without reader reports POLLERR, a socket whose peer is gone POLLHUP
        return any(ev & (select.POLLERR | select.POLLHUP) for _fd, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def _pipe_closed() -> int:
    """The reader of stdout went away (``| head``): stop quietly, as git does.  Whatever
    is still buffered for stdout goes to /dev/null, so the interpreter's flush at exit
    cannot print "Exception ignored … BrokenPipeError" either."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
    return EXIT_PIPE_CLOSED


def _unexpected(exc: Exception, out: Output, *, verbose: bool) -> int:
    """An exception rewindfs did not expect means "could not run" (exit 2), never
    Python's default exit 1, which the contract reserves for "partial".  One line names
    it (``--json``: one ``error`` record with code ``internal``); the traceback, useful
    only for a bug report, is printed with ``-v``.  Reporting must not raise in turn:
    when the output itself is what failed (stdout on a full disk), the line goes to
    stderr, and when that fails too the exit code alone still says it."""
    err = InternalError(f"could not run: {type(exc).__name__}: {exc}")
    try:
        if verbose:
            import traceback
            traceback.print_exception(exc, file=sys.stderr)
        if out.json:
            try:
                out.error(err)
                return err.exit_code
            except Exception:   # noqa: BLE001 — stdout may be what broke
                pass
        hint = "" if verbose else " (run with -v for the traceback)"
        sys.stderr.write(f"rewindfs: {escape(err.message, markup=False)}{hint}\n")
        sys.stderr.flush()
    except Exception:   # noqa: BLE001 — nowhere left to report
        pass
    return err.exit_code

