"""Options several commands share, declared once.

Every attribute a handler reads exists on every parsed namespace: the top parser sets
the defaults (``DEFAULTS``), so handlers read ``args.workspace`` and never probe.
"""

from __future__ import annotations

import argparse

from rewindfs.store._limits import MAX_TURN

__all__ = ["DEFAULTS", "common", "count", "turn_number", "workspace"]

# Attributes only some commands define: None unless the command sets them.
DEFAULTS = {"workspace": None, "dir": None, "path": None}


def common(p) -> None:
    """``--json``/``--store`` also after the command name (SUPPRESS keeps the global
    value when they are not repeated there)."""
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                   help="print JSON Lines")
    p.add_argument("--store", metavar="PATH", default=argparse.SUPPRESS, help="store path")


def workspace(p) -> None:
    """``-C/--dir DIR``: the workspace (default: the current directory), plus ``common``."""
    p.add_argument("-C", "--dir", dest="workspace", metavar="DIR",
                   help="the workspace (default: the current directory)")
    common(p)


def count(text: str) -> int:
    """An argparse ``type``: a whole number of at least 1 (``-n 0`` would show nothing,
    and a negative count means nothing)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return n


def turn_number(text: str) -> int:
    """An argparse ``type``: a turn number, 1 to ``MAX_TURN`` (the store's range; past
    it the daemon's refusal blamed the session)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_TURN:
        raise argparse.ArgumentTypeError(f"expected a turn number from 1 to {MAX_TURN}, "
                                         f"got {text!r}")
    return n
