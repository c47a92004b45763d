"""Typed results of control-socket calls.

Each type is built from the daemon's JSON result with :meth:`from_wire`; fields the
daemon adds later are kept in ``raw`` and never break an older client.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["Change", "Failure", "Point", "RewindResult", "Status", "from_wire"]


def from_wire(cls, data: dict):
    """Build dataclass *cls* from *data*: known fields taken, the whole dict kept in raw."""
    names = {f.name for f in dataclasses.fields(cls)} - {"raw"}
    return cls(**{k: data[k] for k in names if k in data}, raw=dict(data))


@dataclasses.dataclass(frozen=True)
class Point:
    """A point: the workspace as it stood at the start of epoch ``epoch``."""

    epoch: int
    kind: str = "turn"             # "turn" | "idle" | "rewind"
    session: str | None = None
    turn: int | None = None
    label: str = ""
    started_ns: int = 0
    paths: int = 0                 # files changed in that epoch
    bytes: int = 0
    raw: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)


@dataclasses.dataclass(frozen=True)
class Failure:
    path: str
    code: str
    message: str = ""
    raw: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)


@dataclasses.dataclass(frozen=True)
class RewindResult:
    """What a rewind or redo did; ``partial`` when some path could not be restored."""

    epoch: int | None = None       # the rewind epoch
    target: int | None = None      # the point restored
    written: int = 0               # existing paths given other content
    created: int = 0               # paths that did not exist and were brought back
    deleted: int = 0
    meta: int = 0
    failed: tuple = ()
    foreign: tuple = ()
    # the ``remote.learn`` result when the point was learned from a remote first
    # (``Rewindfs(remote=...)``), else None
    learned: Any = None
    raw: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def parse(cls, data: dict) -> "RewindResult":
        r = from_wire(cls, data)
        failed = tuple(from_wire(Failure, f) for f in data.get("failed") or ())
        return dataclasses.replace(r, failed=failed, foreign=tuple(data.get("foreign") or ()))

    @property
    def partial(self) -> bool:
        return bool(self.failed)


@dataclasses.dataclass(frozen=True)
class Status:
    workspace: str = ""
    store: str = ""
    socket: str = ""
    epoch: int | None = None
    open_turn: Any = None
    mounted: bool = True
    pid: int | None = None
    raw: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)


@dataclasses.dataclass(frozen=True)
class Change:
    path: str
    a_kind: str | None = None
    b_kind: str | None = None
    raw: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)


def points(result: dict) -> list[Point]:
    return [from_wire(Point, p) for p in result.get("points") or ()]


def changes(result: dict) -> list[Change]:
    return [from_wire(Change, c) for c in result.get("changes") or ()]

