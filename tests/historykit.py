"""The history tree's parent rule, written out from docs/history.md (not from the code),
for the tests that check ``log --tree --json`` against it."""

from __future__ import annotations


def contract_parents(epochs: list[dict]) -> dict[int, int | None]:
    """anchor(P): Q = the epoch before P; none → the root; turn/idle → Q; rewind/redo
    with target T → anchor(T).  parent(E) = anchor(E)."""
    by_id = {e["epoch"]: e for e in epochs}
    ids = [e["epoch"] for e in epochs]

    def anchor(p):
        i = ids.index(p)
        if i == 0:
            return None
        q = by_id[ids[i - 1]]
        return q["epoch"] if q["kind"] in ("turn", "idle") else anchor(q["target"])

    return {eid: anchor(eid) for eid in ids}
