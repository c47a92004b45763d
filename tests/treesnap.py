"""Tree snapshots for the restore tests: the shared point checker plus hard links.

``snapshot(path)`` = ``pointcheck.snapshot_dir`` (kind, mode, content, symlink target,
device number, xattrs) together with the link structure: for every non-directory, its
link count and the other names of its inode.  ``exact(path)`` adds what ``rsync -a``
keeps besides: every entry's owner and the mtime of every entry but a directory (a
directory's mtime moves whenever a name in it is landed, which is not what these
snapshots judge).  ``compare(expected, actual)`` returns readable differences (empty
list = identical) for either form.  Restore temp names (``.rewindfs~…``) are not
filtered: one surviving a rewind is a bug, and shows up here.
"""

from __future__ import annotations

import dataclasses
import contextlib
import os
import stat

from pointcheck import diff_trees, snapshot_dir


def links(top) -> dict[bytes, tuple[int, tuple[bytes, ...]]]:
    """{relpath: (st_nlink, other names of the same inode)} for every non-directory
    (a symlink, fifo, socket or device can be hard-linked too)."""
    top = os.fsencode(top)
    by_inode: dict[int, list[bytes]] = {}
    nlink: dict[bytes, tuple[int, int]] = {}
    for dirpath, _dirs, files in os.walk(top):
        for name in files:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            if not stat.S_ISDIR(st.st_mode):
                rel = os.path.relpath(full, top)
                by_inode.setdefault(st.st_ino, []).append(rel)
                nlink[rel] = (st.st_nlink, st.st_ino)
    return {rel: (n, tuple(sorted(p for p in by_inode[ino] if p != rel)))
            for rel, (n, ino) in nlink.items()}


def snapshot(top, *, mtimes: bool = False):
    return snapshot_dir(top, xattrs=True, mtimes=mtimes), links(top)


def owners(top) -> dict[bytes, tuple[int, int]]:
    """{relpath: (uid, gid)} of every entry below ``top`` (not following symlinks)."""
    top = os.fsencode(top)
    out = {}
    for dirpath, dirs, files in os.walk(top):
        for name in dirs + files:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            out[os.path.relpath(full, top)] = (st.st_uid, st.st_gid)
    return out


def exact(top):
    """``snapshot`` with mtimes (not of directories) and every entry's owner."""
    tree, link_map = snapshot(top, mtimes=True)
    tree = {p: dataclasses.replace(n, mtime_ns=None) if n.kind == "dir" else n
            for p, n in tree.items()}
    return tree, link_map, owners(top)


def compare(expected, actual) -> list[str]:
    tree_e, links_e, *own_e = expected
    tree_a, links_a, *own_a = actual
    out = diff_trees(tree_e, tree_a)
    for rel in sorted(set(links_e) & set(links_a)):
        if links_e[rel] != links_a[rel]:
            out.append(f"{rel!r}: links {links_a[rel]}, expected {links_e[rel]}")
    if own_e and own_a:
        (own_e,), (own_a,) = own_e, own_a
        out += [f"{p!r}: owner {own_a[p]}, expected {o}"
                for p, o in sorted(own_e.items()) if p in own_a and own_a[p] != o]
    return out


@contextlib.contextmanager
def real_view(ws):
    """A path to the bare directory under a mount over *ws* (``/proc/self/fd/N`` of an
    fd opened before the mount): the real tree, not the kernel's view of it.  Open it
    before mounting."""
    fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)
