"""Conformance check for the "state at point E" rule, shared by the store's model test,
the mount tests and the benchmarks.

A *tree snapshot* is ``dict[bytes, Node]``: every path under the root (relative, bytes,
the root itself excluded) → its node.  ``snapshot_dir`` takes one of a real directory;
the model test builds them in memory.  ``diff_trees(expected, actual)`` returns a list
of human-readable differences — empty means "the same tree".
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass


@dataclass(frozen=True)
class Node:
    kind: str                  # "file" | "dir" | "symlink" | "fifo" | "socket" | "chr" | "blk"
    mode: int = 0              # permission bits
    data: bytes | None = None  # file content, symlink target, b"rdev M:m" of a device
    mtime_ns: int | None = None   # compared only when both sides have it
    xattrs: tuple[tuple[bytes, bytes], ...] | None = None   # idem


def snapshot_dir(root, *, mtimes: bool = False, xattrs: bool = False,
                 ignore=lambda relpath: False) -> dict[bytes, Node]:
    """Snapshot a real directory tree without following symlinks."""
    root = os.fsencode(root)
    out: dict[bytes, Node] = {}

    def walk(rel: bytes):
        full = os.path.join(root, rel) if rel else root
        for name in sorted(os.listdir(full)):
            path = rel + b"/" + name if rel else name
            if ignore(path):
                continue
            out[path] = node = _node(os.path.join(root, path), mtimes, xattrs)
            if node.kind == "dir":
                walk(path)

    walk(b"")
    return out


def _node(full: bytes, mtimes: bool, with_xattrs: bool) -> Node:
    st = os.lstat(full)
    mode, mtime = stat.S_IMODE(st.st_mode), (st.st_mtime_ns if mtimes else None)
    xa = None
    if with_xattrs and not stat.S_ISLNK(st.st_mode):
        xa = tuple(sorted((os.fsencode(n), os.getxattr(full, n, follow_symlinks=False))
                          for n in os.listxattr(full, follow_symlinks=False)))
    if stat.S_ISDIR(st.st_mode):
        return Node("dir", mode, None, mtime, xa)
    if stat.S_ISLNK(st.st_mode):
        return Node("symlink", 0, os.readlink(full), None, None)
    if stat.S_ISFIFO(st.st_mode):
        return Node("fifo", mode, None, mtime, xa)
    if stat.S_ISSOCK(st.st_mode):
        return Node("socket", mode, None, mtime, xa)
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):   # never opened
        rdev = b"rdev %d:%d" % (os.major(st.st_rdev), os.minor(st.st_rdev))
        return Node("chr" if stat.S_ISCHR(st.st_mode) else "blk", mode, rdev, mtime, xa)
    with open(full, "rb") as f:
        return Node("file", mode, f.read(), mtime, xa)


def diff_trees(expected: dict[bytes, Node], actual: dict[bytes, Node]) -> list[str]:
    """Differences between two snapshots (empty list: identical)."""
    out = []
    for path in sorted(set(expected) | set(actual)):
        e, a = expected.get(path), actual.get(path)
        if e is None:
            out.append(f"{path!r}: unexpected {a.kind}")
        elif a is None:
            out.append(f"{path!r}: missing {e.kind}")
        else:
            out.extend(f"{path!r}: {d}" for d in _diff_node(e, a))
    return out


def _diff_node(e: Node, a: Node) -> list[str]:
    if e.kind != a.kind:
        return [f"kind {a.kind}, expected {e.kind}"]
    out = []
    if e.kind != "symlink" and e.mode != a.mode:
        out.append(f"mode {a.mode:o}, expected {e.mode:o}")
    if e.data != a.data:
        out.append(f"content {_short(a.data)}, expected {_short(e.data)}")
    if e.mtime_ns is not None and a.mtime_ns is not None and e.mtime_ns != a.mtime_ns:
        out.append(f"mtime {a.mtime_ns}, expected {e.mtime_ns}")
    if e.xattrs is not None and a.xattrs is not None and e.xattrs != a.xattrs:
        out.append(f"xattrs {a.xattrs}, expected {e.xattrs}")
    return out


def _short(data: bytes | None) -> str:
    if data is None or len(data) <= 40:
        return repr(data)
    return f"{data[:32]!r}… ({len(data)} bytes)"
