"""Who owns each rewind, what ``redo`` undoes, and when that would discard work.

Contract (DESIGN "Rewind to E"; docs/history.md):

- Every ``rewind`` epoch has an **owner**: its ``session`` field (the session it was
  made for, ``--session``/``--undo-for``), or None — the workspace's *manual* owner,
  i.e. the CLI or the agent API without a session.  A ``redo`` epoch has the owner of
  the rewind it undid, and ``target`` = that rewind's id.
- **Redo is a stack per owner**, last in first out: walking the workspace's epochs in
  order, an owner's rewind pushes, an owner's redo pops the rewind it names.  ``redo``
  undoes the top of the owner's stack; an empty stack is ``NothingToRedo``.  A plain
  rewind to any point (also to where a redo went) pushes again: going forward after a
  redo is a rewind, never a toggle.
- **Stale redo**: redoing rewind R goes back to point R (the tree as R found it), which
  also undoes every change made after R.  The epochs after R that changed the tree —
  minus rewind/redo pairs that both lie after R (they cancel out) and minus epochs that
  touched no path — are R's *stale changes*; a redo with any is refused
  (``RedoStale``) unless forced.

Pure functions over a workspace's epochs (``_epoch.Epoch``, ascending id); the caller
reads them in one transaction.
"""

from __future__ import annotations

from ._errors import RedoStale, describe_epoch

__all__ = ["RedoStale", "describe_epoch", "redo_stack", "redo_stacks", "stale_changes"]


def redo_stack(epochs, owner: str | None) -> list:
    """The rewinds of ``owner`` not yet undone, oldest first (the top is last)."""
    stack: list = []
    for e in epochs:
        if e.session != owner:
            continue
        if e.kind == "rewind":
            stack.append(e)
        elif e.kind == "redo":
            stack = [r for r in stack if r.id != e.target]
    return stack


def redo_stacks(epochs) -> dict:
    """Every owner's stack that is not empty: owner → rewinds not yet undone."""
    owners = {e.session for e in epochs if e.kind == "rewind"}
    return {o: s for o in owners if (s := redo_stack(epochs, o))}


def stale_changes(epochs, rewind) -> list:
    """The epochs after ``rewind`` whose changes a redo of it would undo (see above)."""
    after = [e for e in epochs if e.id > rewind.id]
    undone = {e.target for e in after if e.kind == "redo"}
    cancelled = {e.id for e in after if e.kind == "rewind" and e.id in undone}
    cancelled |= {e.id for e in after if e.kind == "redo" and e.target in cancelled}
    return [e for e in after if e.paths > 0 and e.id not in cancelled]
