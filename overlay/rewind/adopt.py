"""Adopting a large file as the rewind's own pre-image blob instead of copying it.

A rewind captures the current content of every file it replaces (write-ahead), then
renames the restored file over it.  For a large file that content is about to lose its
only name anyway, so instead of copying it into a new blob file the restore engine
hard-links the inode into the store's temp area (``store.adoption_path``) and lets the
store make that link the blob file (``store.put_adopted``: hash after linking, fsync,
rename into place).  When the restored file lands, the inode's workspace name is gone
and the store holds its only name: no copy was written, and no 1 GiB was freed (on a
``discard`` mount a large free costs synchronous discards).

Adoption is sound only while nothing can write to the inode through its workspace
name.  ``Adopter.put`` therefore adopts only when every one of these holds, else it
stores a copy (``store.put_fd``, the behaviour without adoption):

- the path is one the plan replaces by landing a plain file (``replaced``), not one it
  only re-stamps (a ``meta`` change keeps the inode) or a hard-link group member;
- a regular file larger than the store's inline limit, with exactly one link, on the
  store's filesystem (``link`` fails with ``EXDEV`` otherwise), and after linking the
  store's name is the inode's second name and the inode is the one captured;
- ``writers.fence_writes((dev, ino))`` said yes: through the mount no handle can write
  to it and none may be opened until ``unfence_writes`` (the daemon,
  ``RewindOperations.fence_writes``).  Without ``writers`` (an unmounted workspace:
  any process may hold the real file open) nothing is adopted.

The fence lasts until ``settle()``, after the run's landings: for every adopted blob
whose file still has another name (its landing failed, or the file was renamed or
linked elsewhere meanwhile) the store takes a private copy (``store.unshare_blob``)
before the fence is lifted; if even that fails the fence stays (writes to that file
are refused until the daemon restarts) rather than let a write change a stored
pre-image.  A crash in between leaves the sharing to ``recover``, which lands the path
again and unshares every blob recorded in the interrupted rewind epoch.  What stays
unprotected, as for capture itself: a process writing the bare directory under the
mount (``rewindfs status`` names such processes).
"""

from __future__ import annotations

import errno
import logging
import os
import stat

from rewindfs.store import INLINE_MAX
from rewindfs.store._errors import RewindfsError

from rewindfs.overlay.tree import meta

log = logging.getLogger(__name__)


class Adopter:
    """``put_file`` for ``capture.capture_images`` during one rewind run."""

    def __init__(self, store, writers=None, replaced=()):
        self.store = store
        self.writers = writers
        self.replaced = set(replaced)
        self.adopted: list[tuple[bytes, bytes, tuple[int, int]]] = []  # (path, key, inode)

    def put(self, relpath: bytes, dir_fd: int, name: bytes, fd: int) -> tuple[bytes, int]:
        st = os.fstat(fd)
        hint = meta.key_hint(st)
        if not self._eligible(relpath, st):
            return self.store.put_fd(fd, hint)
        if hint is not None:
            known = self.store.put_known(fd, hint)   # already stored: no copy, no link
            if known is not None:
                return known
        adopted = self._adopt(relpath, dir_fd, name, st)
        return adopted if adopted is not None else self.store.put_fd(fd)

    def _eligible(self, relpath: bytes, st: os.stat_result) -> bool:
        return (self.writers is not None and relpath in self.replaced
                and stat.S_ISREG(st.st_mode) and st.st_nlink == 1
                and st.st_size > INLINE_MAX)

    def _adopt(self, relpath, dir_fd, name, st) -> tuple[bytes, int] | None:
        inode = (st.st_dev, st.st_ino)
        if not self.writers.fence_writes(inode):
            log.debug("%r is open for writing; copied, not adopted", relpath)
            return None
        fenced = True
        try:
            tmp = self.store.adoption_path()
            if not _link_checked(dir_fd, name, tmp, inode, relpath):
                return None
            key, size = self.store.put_adopted(tmp)   # hashes the linked inode
            self.adopted.append((relpath, key, inode))
            fenced = False                             # until settle()
            return key, size
        finally:
            if fenced:
                self.writers.unfence_writes(inode)

    def settle(self) -> list[tuple[bytes, BaseException]]:
        """After the run's landings: give every adopted blob still named in the tree a
        private copy, then lift its fence.  Returns (path, error) for each blob that
        could not be unshared (its fence stays)."""
        failed = []
        adopted, self.adopted = self.adopted, []
        for relpath, key, inode in adopted:
            try:
                if self.store.unshare_blob(key):
                    log.info("%r kept its adopted inode; the store took a copy", relpath)
            except Exception as exc:    # noqa: BLE001 - reported, and the fence stays
                log.error("blob %s still shares %r's inode: %s", key.hex(), relpath, exc)
                failed.append((relpath, exc))
                continue
            self.writers.unfence_writes(inode)
        return failed


def _link_checked(dir_fd: int, name: bytes, tmp: str, inode, relpath) -> bool:
    """Link ``name`` (not following a symlink) to ``tmp``; True if ``tmp`` is now the
    second name of ``inode``.  Any other outcome removes ``tmp`` and says False."""
    try:
        os.link(name, tmp, src_dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOENT,
                             errno.EACCES, errno.EOPNOTSUPP):
            raise
        log.debug("cannot link %r into the store (%s); copied", relpath, exc.strerror)
        return False
    st = os.lstat(tmp)
    if (st.st_dev, st.st_ino) == inode and stat.S_ISREG(st.st_mode) and st.st_nlink == 2:
        return True
    log.debug("%r changed while being adopted; copied", relpath)
    _unlink_quiet(tmp)
    return False


def _unlink_quiet(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def unshare_epoch(store, ws: int, epoch_id: int) -> None:
    """Recovery: unshare every large blob the (interrupted) rewind epoch recorded — an
    adopted inode whose landing never happened still has its workspace name.  A blob
    that cannot be unshared is logged (fsck reports it as ``shared-blob``)."""
    try:
        images = [img for _path, img in store.journal(ws, epoch_id)]
    except RewindfsError as exc:
        log.error("cannot list the interrupted rewind's pre-images: %s", exc)
        return
    for img in images:
        if img.kind == "file" and img.size > INLINE_MAX:
            try:
                store.unshare_blob(img.blob)
            except RewindfsError as exc:
                log.error("blob %s may still share a workspace file: %s", img.blob.hex(), exc)
