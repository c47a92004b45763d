"""Plans: the ordered actions that bring touched paths back to their state at a point.

Order (what the restore engine may rely on):

1. every ``delete`` (target ``absent``), deepest path first — children before parents;
2. every ``mkdir`` / ``write`` / ``symlink`` / ``mknod``, shallowest first — parents
   before children; the first name of a hard-link group comes before its other names;
3. one ``meta`` per target directory, deepest first — a directory's mtime is set after
   its children landed.

Ties are broken by path bytes so a plan is deterministic.  A plan lists target states
only; it is idempotent (replaying it after a crash lands the same tree).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ._preimage import SPECIALS, PreImage, depth

# every special file (fifo, socket, device) is made by one ``mknod``
_CREATE_OP = {"dir": "mkdir", "file": "write", "symlink": "symlink",
              **{k: "mknod" for k in SPECIALS}}


@dataclass(frozen=True)
class Action:
    op: str          # "delete" | "mkdir" | "write" | "symlink" | "mknod" | "meta"
    path: bytes
    image: PreImage  # the target state (for "delete": PreImage.ABSENT)


@dataclass
class Plan:
    """An ordered list of ``Action`` for point ``target``; ``paths`` = every path it
    touches."""

    target: int
    actions: list[Action] = field(default_factory=list)
    paths: set[bytes] = field(default_factory=set)
    damaged: dict[bytes, str] = field(default_factory=dict)   # path → "epoch N: why"

    def __iter__(self):
        return iter(self.actions)

    def __len__(self):
        return len(self.actions)

    def __bool__(self):
        return True

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for a in self.actions:
            out[a.op] = out.get(a.op, 0) + 1
        return out


def build(target: int, states: dict[bytes, PreImage]) -> Plan:
    """Order the target ``states`` (path → PreImage) into a ``Plan``.  A ``Damaged``
    state (its journal entry no longer decodes) gets no action: it is listed in
    ``Plan.damaged`` so the restore engine names it while the rest lands."""
    damaged = {p: f"epoch {img.epoch}: {img.reason}"
               for p, img in states.items() if img.kind == "damaged"}
    states = {p: img for p, img in states.items() if img.kind != "damaged"}
    deletes = sorted((p for p, img in states.items() if img.kind == "absent"),
                     key=lambda p: (-depth(p), p))
    creates = sorted((p for p, img in states.items() if img.kind != "absent"),
                     key=lambda p: (depth(p), p))
    dirs = sorted((p for p in creates if states[p].kind == "dir"),
                  key=lambda p: (-depth(p), p))
    actions = [Action("delete", p, PreImage.ABSENT) for p in deletes]
    actions += [Action(_CREATE_OP[states[p].kind], p, states[p]) for p in creates]
    actions += [Action("meta", p, states[p]) for p in dirs]
    return Plan(target, actions, set(states), damaged)
