"""``rewindfs`` — the command line.

Subcommands come from two modules, each with ``register(subparsers)`` (adds its
parsers, each setting ``command=<name>``) and ``HANDLERS`` (name → ``handler(args, out)
-> int``): ``overlay.cli.mount`` (mount, unmount, run, turn begin|end, status, fsck)
and, when present, ``overlay.cli.rewind`` (log, rewind, redo, diff, show, gc).

Exit codes are made here and only here (DESIGN): a handler's return value, or
``RewindfsError.exit_code`` for an error (0 done, 1 partial, 2 could not run, 3 usage;
argparse errors are usage errors and exit 3; any other exception exits 2, never 1).
``--json`` prints JSON Lines ``{"v":1,"type":...}``; otherwise people get rich output
on a terminal.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from rewindfs.store._errors import InternalError, RewindfsError

from rewindfs.overlay.cli import mount, options, rewind
from rewindfs.overlay.cli.render import escape
from rewindfs.overlay.errors import UsageError

__all__ = ["Output", "main"]


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(f"{message} (see {self.prog} --help)")


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
            self._console = Console(file=self.stream, highlight=False)
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
            self.emit("error", code=exc.code, message=exc.message, exit_code=exc.exit_code)
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
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug output")
    parser.add_argument("--version", action="version", version=f"rewindfs {_version()}")
    parser.set_defaults(**options.DEFAULTS)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    table = {}
    for group in (mount, rewind):    # one module per command group
        group.register(sub)
        table.update(group.HANDLERS)
    return parser, table


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
        return int(handler(args, out) or 0)
    except RewindfsError as exc:
        out.error(exc)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:    # noqa: BLE001 — the safety net: 2, never 1 ("partial")
        return _unexpected(exc, out, verbose=bool(args is not None and args.verbose))


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

