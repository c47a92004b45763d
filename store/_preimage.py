"""Pre-images (the state of one path before its first change in an epoch) and paths.

A ``PreImage`` is immutable and self-contained: together with the blob it names it is
enough to put the path back exactly.  ``encode``/``decode`` are its only on-disk form.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ._errors import BadPath, PathTooLong

# The position is the kind's code on disk: append only.  SPECIALS are made by
# ``mknod``; a device's number is its ``rdev`` (schema 4 added the last three kinds).
KINDS = ("absent", "file", "symlink", "dir", "fifo", "socket", "chardev", "blockdev")
SPECIALS = ("fifo", "socket", "chardev", "blockdev")
DEVICES = ("chardev", "blockdev")
_KIND_CODE = {k: i for i, k in enumerate(KINDS)}
MAX_PATH = 4096


@dataclass(frozen=True)
class PreImage:
    """The state of a path: ``absent`` or a file/symlink/dir/fifo/socket/chardev/
    blockdev with its metadata.

    ``blob`` (16-byte xxh3-128 key) only for files, ``target`` only for symlinks,
    ``rdev`` (the device number, ``os.makedev``) only for devices; ``link_group`` is
    equal for names of the same inode at capture time (hard links).
    """

    kind: str
    mode: int = 0
    uid: int = 0
    gid: int = 0
    size: int = 0
    mtime_ns: int = 0
    xattrs: tuple[tuple[bytes, bytes], ...] = ()
    blob: bytes | None = None
    target: bytes | None = None
    link_group: bytes | None = None
    rdev: int = 0

    ABSENT: ClassVar[PreImage]

    def __post_init__(self):
        if self.kind not in _KIND_CODE:
            raise ValueError(f"unknown pre-image kind {self.kind!r}")
        if (self.kind == "file") != (self.blob is not None):
            raise ValueError("a file pre-image needs a blob key, and only a file has one")
        if (self.kind == "symlink") != (self.target is not None):
            raise ValueError("a symlink pre-image needs a target, and only a symlink has one")
        if self.rdev and self.kind not in DEVICES:
            raise ValueError("only a device pre-image has a device number")

    @property
    def exists(self) -> bool:
        return self.kind != "absent"


PreImage.ABSENT = PreImage("absent")


@dataclass(frozen=True)
class Damaged:
    """Stands in for a journal entry that no longer decodes (a damaged index value).

    Iterating code (plans, fsck, gc) gets this instead of an exception, so one damaged
    entry names its path and the rest of the history stays usable.  Never stored."""

    epoch: int
    reason: str
    kind: ClassVar[str] = "damaged"
    exists: ClassVar[bool] = True


def encode(img: PreImage) -> list:
    """The msgpack-able form (a list, compact and order-stable).  Fields are only ever
    appended: ``rdev`` (schema 4) is the 11th, and a record without it (schema ≤ 3)
    still decodes, as ``rdev`` 0."""
    return [
        _KIND_CODE[img.kind], img.mode, img.uid, img.gid, img.size, img.mtime_ns,
        [[n, v] for n, v in img.xattrs], img.blob, img.target, img.link_group, img.rdev,
    ]


def decode(fields: list) -> PreImage:
    kind, mode, uid, gid, size, mtime_ns, xattrs, blob, target, link_group = fields[:10]
    rdev = fields[10] if len(fields) > 10 else 0
    return PreImage(
        KINDS[kind], mode, uid, gid, size, mtime_ns,
        tuple((bytes(n), bytes(v)) for n, v in xattrs), blob, target, link_group, rdev,
    )


def check_relpath(path) -> bytes:
    """Return ``path`` if it is a valid workspace-relative path, else raise ``BadPath``.

    Valid: bytes, ``b""`` (the root) or components joined by ``b"/"`` with no leading
    or trailing slash, no empty, ``.`` or ``..`` component, no NUL, at most 4096 bytes.
    """
    if not isinstance(path, bytes):
        raise BadPath(path=path, reason="not bytes")
    if len(path) > MAX_PATH:
        raise PathTooLong(path=path[:64] + b"...", limit=MAX_PATH)
    if b"\0" in path:
        raise BadPath(path=path, reason="contains NUL")
    if path == b"":
        return path
    for part in path.split(b"/"):
        if part in (b"", b".", b".."):
            raise BadPath(path=path, reason="empty, '.' or '..' component or absolute")
    return path


def depth(path: bytes) -> int:
    """Number of components (the root is 0)."""
    return path.count(b"/") + 1 if path else 0


def is_under(path: bytes, top: bytes) -> bool:
    """True if ``path`` is ``top`` or lies in its subtree (the root covers all)."""
    return not top or path == top or path.startswith(top + b"/")
