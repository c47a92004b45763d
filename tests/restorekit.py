"""History without a mount, for the restore tests: a tiny stand-in for the filesystem.

``History`` mutates a real directory with ordinary syscalls and, before each mutation,
captures the paths it changes into the current epoch with the real
``overlay.capture.capture`` — exactly the write-ahead the FUSE layer performs — so the
store's journal is what a mount would have recorded.
"""

from __future__ import annotations

import contextlib
import os
import stat

from rewindfs.overlay.capture import capture, subtree
from rewindfs.store import Store
from store_fixtures import assert_sound


@contextlib.contextmanager
def open_history(tmp_path):
    """A ``History`` of ``tmp_path/ws`` over its own store ``tmp_path/store``; when the
    block ends without an error the store must pass its consistency check."""
    (tmp_path / "ws").mkdir(exist_ok=True)
    store = Store.open(tmp_path / "store")
    h = History(store, tmp_path / "ws")
    try:
        yield h
        assert_sound(store)
    finally:
        h.close()
        store.close()


class History:
    def __init__(self, store, root):
        self.store = store
        self.root = os.fsencode(os.path.realpath(root))
        self.ws = store.workspace(self.root)
        self.fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def close(self):
        os.close(self.fd)

    def p(self, rel: bytes) -> bytes:
        return os.path.join(self.root, rel)

    # -- epochs --------------------------------------------------------------------
    def turn(self, n: int, session: str = "s1") -> int:
        """Start turn ``n``; return its epoch id (the point "start of turn n")."""
        return self.store.begin_turn(self.ws, session, n, f"turn {n}").id

    def end_turn(self) -> int:
        return self.store.end_turn(self.ws).id

    # -- capture-then-mutate ----------------------------------------------------------
    def touch(self, *rels: bytes) -> None:
        """Capture every path in ``rels`` (and, for directories, their subtrees, and
        for files with several links, their other names: a change to one name changes
        the others' link count or content)."""
        paths = []
        for rel in rels:
            paths.extend(path for path, _is_dir in subtree(self.fd, rel))
        paths += [t for p in paths for t in self.twins(p)]
        epoch = self.store.current_epoch(self.ws).id
        capture(self.fd, self.store, self.ws, epoch, paths)

    def twins(self, rel: bytes) -> list[bytes]:
        try:
            st = os.lstat(self.p(rel))
        except FileNotFoundError:
            return []
        if not stat.S_ISREG(st.st_mode) or st.st_nlink < 2:
            return []
        out = []
        for dirpath, _dirs, files in os.walk(self.root):
            for name in files:
                full = os.path.join(dirpath, name)
                if os.lstat(full).st_ino == st.st_ino and full != self.p(rel):
                    out.append(os.path.relpath(full, self.root))
        return out

    def guard(self, *abs_paths) -> None:
        """``rewind_agent.Agent``'s hook: capture before the change (as the fs would)."""
        self.touch(*(os.path.relpath(os.fsencode(p), self.root) for p in abs_paths))

    def write(self, rel: bytes, data: bytes, *, also=()) -> None:
        """Write a file (``also``: other hard-link names of it, captured too)."""
        self.touch(rel, *also)
        with open(self.p(rel), "wb") as f:
            f.write(data)

    def mkdir(self, rel: bytes) -> None:
        self.touch(rel)
        os.mkdir(self.p(rel))

    def remove(self, rel: bytes, *, also=()) -> None:
        """``rm -rf``: capture the subtree (and ``also``: other names of its inode,
        whose link count drops), then remove it."""
        self.touch(rel, *also)
        full = self.p(rel)
        if os.path.isdir(full) and not os.path.islink(full):
            for dirpath, dirs, files in os.walk(full, topdown=False):
                for n in files:
                    os.unlink(os.path.join(dirpath, n))
                for n in dirs:
                    d = os.path.join(dirpath, n)
                    (os.unlink if os.path.islink(d) else os.rmdir)(d)
            os.rmdir(full)
        else:
            os.unlink(full)

    def rename(self, src: bytes, dst: bytes) -> None:
        """Capture both sides' subtrees (the source's names mapped onto ``dst``)."""
        moved = [dst + p[len(src):] for p, _is_dir in subtree(self.fd, src)]
        self.touch(src, dst, *moved)
        os.rename(self.p(src), self.p(dst))

    def symlink(self, target: bytes, rel: bytes) -> None:
        self.touch(rel)
        os.symlink(target, self.p(rel))

    def link(self, src: bytes, rel: bytes) -> None:
        self.touch(rel, src)
        os.link(self.p(src), self.p(rel))

    def chmod(self, rel: bytes, mode: int) -> None:
        self.touch(rel)
        os.chmod(self.p(rel), mode)

    def setxattr(self, rel: bytes, name: bytes, value: bytes) -> None:
        self.touch(rel)
        os.setxattr(self.p(rel), name, value, follow_symlinks=False)

    def utime(self, rel: bytes, ns: int) -> None:
        self.touch(rel)
        os.utime(self.p(rel), ns=(ns, ns), follow_symlinks=False)
