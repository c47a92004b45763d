"""``rewindfs`` — the command line (``app``: the parser, the handlers' dispatch, the exit
codes).

This module is what the ``rewindfs`` script imports first, so it loads nothing but
``app``, and that only inside ``main``: a Ctrl-C while the store, trio and rich are
still loading (a few hundred ms) then exits 130 quietly like any other, instead of
leaving Python's traceback of an interrupted import.
"""

from __future__ import annotations

from rewindfs.overlay.cli.exits import EXIT_INTERRUPTED, EXIT_PIPE_CLOSED

__all__ = ["EXIT_INTERRUPTED", "EXIT_PIPE_CLOSED", "Output", "build_parser", "main"]


def main(argv=None) -> int:
    """Run one command; returns the exit code (``sys.exit(main())``)."""
    try:
        from rewindfs.overlay.cli import app
        return app.main(argv)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def __getattr__(name: str):
    if name in ("Output", "build_parser"):
        from rewindfs.overlay.cli import app
        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
