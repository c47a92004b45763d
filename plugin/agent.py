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

With a remote named (``Rewindfs.for_directory(workdir, remote="origin")``, a remote
the store knows: ``rewindfs remote add``), a session can go on on another machine:

- each turn's end asks the daemon to push (``push``, ``wait=False``: queued, the turn
  never waits for the network); a push the daemon refuses never fails the turn — the
  mark's ``push_error`` says why, and it is logged once per code;
- ``rewind(2, session="s1")`` of a point this workspace does not know learns the
  history pushed to the remote first (``remote.learn``, once per :class:`Rewindfs`;
  docs/remote.md, "On a new machine") and rewinds then; ``redo()`` comes back.
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
    # set when the turn has ended with a remote named: the daemon's push reply, or why
    # the push was not queued (the turn itself stands either way)
    push: dict | None = None
    push_error: RewindfsClientError | None = None

    @property
    def protected(self) -> bool:
        return self.epoch is not None


class Rewindfs:
    """The agent-loop API over one :class:`~plugin.client.Client`."""

    def __init__(self, client: Client | None, *, strict: bool = False,
                 remote: str | None = None):
        self.client = client
        self.strict = strict
        self.remote = remote
        self.learned: dict | None = None      # what remote.learn taught, once
        self._warned = False
        self._push_warned: set[str] = set()

    @classmethod
    def for_directory(cls, directory=".", *, store=None, strict=False, timeout=30.0,
                      remote: str | None = None) -> "Rewindfs":
        """Find the daemon serving *directory*; without one, turns run unprotected
        (or ``NotMounted`` is raised when *strict*).  *remote*: the remote turns are
        pushed to and unknown points are learned from (module docstring)."""
        try:
            client = Client.for_directory(directory, store=store, timeout=timeout)
        except NotMounted:
            if strict:
                raise
            client = None
        return cls(client, strict=strict, remote=remote)

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
                if self.remote is not None:
                    self._push_after(mark)

    def _push_after(self, mark: TurnMark) -> None:
        """Queue a push of the ended turn; a refusal is kept on the mark and logged once
        per code, never raised (the turn has happened, its files are captured)."""
        try:
            mark.push = self.push(wait=False)    # this workspace (the daemon's own)
        except RewindfsClientError as exc:
            mark.push_error = exc
            if exc.code not in self._push_warned:
                self._push_warned.add(exc.code)
                log.warning("rewindfs: turns are not pushed to remote %s: %s (%s)",
                            self.remote, _push_reason(exc), exc.code)

    def push(self, *, wait: bool = False, session: str | None = None) -> dict:
        """Ask the daemon to push to the remote named at construction (the daemon's
        only remote when none was); ``wait=False`` only queues it."""
        return self._require().push(self.remote, session=session, wait=wait)

    def learn(self, *, session: str | None = None, workspace: str | None = None) -> dict:
        """Teach this workspace the history pushed to the remote (``remote.learn``):
        the remote workspace *workspace*, or the one where *session* ran turns.  No file
        changes; refused (``learn-target-has-history``) when it has history here."""
        if self.remote is None:
            raise RewindfsClientError("no remote named: Rewindfs.for_directory(..., "
                                      "remote=NAME)", code="usage")
        self.learned = self._require().remote_learn(self.remote, session=session,
                                                    workspace=workspace)
        return self.learned

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

        def attempt() -> RewindResult:
            return self._require().rewind(to, paths=paths, dry_run=dry_run, session=session,
                                          undo_for=undo_for, force=force, on_event=on_event)
        try:
            return attempt()
        except RewindfsClientError as exc:
            # a point made on another machine: learn the pushed history (once), again
            if exc.code != "unknown-point" or self.remote is None or self.learned is not None:
                raise
        learned = self.learn(session=session)
        return dataclasses.replace(attempt(), learned=learned)

    def redo(self, *, session: str | None = None, force=False, on_event=None) -> RewindResult:
        """Undo the newest rewind of owner *session* (None: those made without one) not
        yet undone — a stack: the next ``redo()`` undoes the one below it, and an empty
        stack raises ``nothing-to-redo``.  Refused with ``redo-stale`` when the tree
        changed after that rewind (``details["data"]`` names the changes), unless
        *force*."""
        return self._require().redo(session, force=force, on_event=on_event)


def _push_reason(exc: RewindfsClientError) -> str:
    if exc.code == "unknown-method":
        return "this daemon has no push method (a rewindfs without background push; " \
               "run `rewindfs push` by hand)"
    return exc.message


def _check_turn(turn) -> None:
    if not isinstance(turn, int) or isinstance(turn, bool) or turn < 1:
        raise RewindfsClientError(
            f"{turn!r} is not an absolute turn number (turns count from 1; "
            "relative forms are refused)", code="relative-point")
