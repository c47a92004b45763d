"""Rewind and redo for Python agent loops.

A loop marks each turn; rewindfs then keeps the workspace as it stood at the start
of every turn, and the loop (or its user) can go back::

    from rewindfs.plugin.agent import Rewindfs

    rw = Rewindfs.for_directory(workdir)            # the daemon serving workdir
    for n, prompt in enumerate(prompts, start=1):
        with rw.turn("my-session", n, prompt):      # turn.begin … turn.end
            run_agent_step(prompt)                  # every write is captured
    print(rw.points("my-session"))
    rw.rewind(2, session="my-session")              # files as before turn 2
    rw.redo(session="my-session")                   # and back again

Turns are addressed by absolute number (never relative: DESIGN invariant 8).
If the daemon is unreachable when a turn begins, the turn still runs unprotected and
one warning is logged per :class:`Rewindfs` (pass ``strict=True`` to raise instead).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging

from ._errors import DaemonUnreachable, NotMounted, RewindfsClientError
from ._results import Point, RewindResult
from .client import Client

log = logging.getLogger(__name__)

__all__ = ["Rewindfs", "TurnMark", "UnknownTurn"]


class UnknownTurn(RewindfsClientError):
    """The session has no point for that turn."""

    default_code = "unknown-point"


@dataclasses.dataclass
class TurnMark:
    """What ``turn()`` yields: the epoch of the turn, or None when unprotected."""

    session: str
    turn: int
    epoch: int | None

    @property
    def protected(self) -> bool:
        return self.epoch is not None


class Rewindfs:
    """The agent-loop API over one :class:`~plugin.client.Client`."""

    def __init__(self, client: Client | None, *, strict: bool = False):
        self.client = client
        self.strict = strict
        self._warned = False

    @classmethod
    def for_directory(cls, directory=".", *, store=None, strict=False, timeout=30.0) -> "Rewindfs":
        """Find the daemon serving *directory*; without one, turns run unprotected
        (or ``NotMounted`` is raised when *strict*)."""
        try:
            client = Client.for_directory(directory, store=store, timeout=timeout)
        except NotMounted:
            if strict:
                raise
            client = None
        return cls(client, strict=strict)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @contextlib.contextmanager
    def turn(self, session: str, n: int, label: str = "", *, force: bool = False):
        """Mark turn *n* of *session* for the duration of the block.

        ``turn.begin`` is sent before the block runs (so the block's first write is
        already captured in this turn) and ``turn.end`` after it, also when it raises.
        A turn of the same session left open (a lost ``turn.end``) is closed; another
        session's open turn raises ``turn-open`` naming it, unless *force*.
        """
        label = (label or "").splitlines()[0] if label else ""
        mark = TurnMark(session, n, self._begin(session, n, label, force))
        try:
            yield mark
        finally:
            if mark.protected:
                self.client.turn_end(session)

    def _begin(self, session, n, label, force=False) -> int | None:
        if self.client is None:
            return self._unprotected(NotMounted("this directory"))
        try:
            return self.client.turn_begin(session, n, label, force=force)
        except DaemonUnreachable as exc:
            return self._unprotected(exc)

    def _unprotected(self, exc) -> None:
        if self.strict:
            raise exc
        if not self._warned:
            self._warned = True
            log.warning("rewindfs: turns run unprotected: %s", exc.message)
        return None

    def _require(self) -> Client:
        if self.client is None:
            raise NotMounted("this directory")
        return self.client

    def points(self, session: str | None = None) -> list[Point]:
        """Every point of the workspace (of *session* and its fork ancestry, if given)."""
        return self._require().points(session)

    def epoch_of(self, turn: int, session: str) -> int:
        """The epoch that started *turn* of *session*; UnknownTurn if there is none."""
        _check_turn(turn)
        for p in self._require().points(session):
            if p.kind == "turn" and p.turn == turn:
                return p.epoch
        raise UnknownTurn(f"session {session} has no turn {turn} (see points())")

    def rewind(self, turn: int | None = None, *, session: str | None = None,
               epoch: int | None = None, paths=None, dry_run=False, undo_for=None,
               force=False, on_event=None) -> RewindResult:
        """Restore the workspace to the start of *turn* of *session* (or to *epoch*).

        The daemon resolves the turn within the session's points (its fork ancestry
        included); an unknown turn is refused there with ``unknown-point``.  Without
        *session*, *turn* is the workspace's only session's (several sessions:
        ``ambiguous-point``, ``details["data"]["choices"]`` lists them).  The rewind's
        owner is *undo_for*, else *session*, else the manual owner: ``redo()`` with the
        same *session* undoes it."""
        if (turn is None) == (epoch is None):
            raise TypeError("rewind() needs exactly one of turn= or epoch=")
        if turn is not None:
            _check_turn(turn)
            to = f"t{turn}"
        else:
            to = f"e{epoch}"   # a bare number with a session would mean a turn number
        return self._require().rewind(to, paths=paths, dry_run=dry_run, session=session,
                                      undo_for=undo_for, force=force, on_event=on_event)

    def redo(self, *, session: str | None = None, force=False, on_event=None) -> RewindResult:
        """Undo the newest rewind of owner *session* (None: those made without one) not
        yet undone — a stack: the next ``redo()`` undoes the one below it, and an empty
        stack raises ``nothing-to-redo``.  Refused with ``redo-stale`` when the tree
        changed after that rewind (``details["data"]`` names the changes), unless
        *force*."""
        return self._require().redo(session, force=force, on_event=on_event)


def _check_turn(turn) -> None:
    if not isinstance(turn, int) or isinstance(turn, bool) or turn < 1:
        raise RewindfsClientError(
            f"{turn!r} is not an absolute turn number (turns count from 1; "
            "relative forms are refused)", code="relative-point")
