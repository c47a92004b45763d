"""Random real-syscall changes to a directory tree, for the restore tests (through a
mount, or on a plain directory with a capture hook standing in for the filesystem)."""

from __future__ import annotations

import errno
import os
import random


class Agent:
    """Makes random changes to the tree under ``root`` with real syscalls.

    ``guard(*paths)``, if given, is called with every absolute path a change is about to
    touch (both sides of a rename, a moved directory's names at their destination) —
    the hook a test uses to capture pre-images as the filesystem would."""

    def __init__(self, root: str, rng: random.Random, *, links: bool = True, guard=None):
        self.root, self.rng, self.links = root, rng, links
        self.guard = guard or (lambda *paths: None)
        self.n = 0

    def _all(self, want_dir=None):
        out = []
        for dirpath, dirs, files in os.walk(self.root):
            for name in dirs + files:
                full = os.path.join(dirpath, name)
                is_dir = os.path.isdir(full) and not os.path.islink(full)
                if want_dir is None or want_dir == is_dir:
                    out.append(full)
        return sorted(out)

    def _under(self, top):
        out = []
        for dirpath, dirs, files in os.walk(top):
            out += [os.path.join(dirpath, n) for n in dirs + files]
        return out

    def _files(self):
        return [p for p in self._all(False) if os.path.isfile(p) and not os.path.islink(p)]

    def _dirs(self):
        return [self.root] + self._all(True)

    def _new_name(self):
        self.n += 1
        return os.path.join(self.rng.choice(self._dirs()), f"n{self.n}")

    def step(self):
        ops = [self.create] * 4 + [self.mkdir] * 2 + [
            self.overwrite, self.overwrite, self.append, self.truncate, self.rename_file,
            self.rename_dir, self.link, self.link, self.symlink, self.chmod, self.setxattr,
            self.setxattr, self.removexattr, self.unlink, self.rmtree, self.mkfifo]
        if not self.links:
            ops = [op for op in ops if op != self.link]
        try:
            self.rng.choice(ops)()
        except OSError as exc:   # e.g. renaming a directory into itself: fine, skipped
            if exc.errno not in (errno.EINVAL, errno.ENOTEMPTY, errno.EEXIST,
                                 errno.ENOENT, errno.EISDIR, errno.ENOTDIR):
                raise

    def _data(self):
        size = self.rng.choice((0, 1, 100, 5000, 70000, 300_000))
        return self.rng.randbytes(size)

    def create(self):
        new = self._new_name()
        self.guard(new)
        with open(new, "wb") as f:
            f.write(self._data())

    def _pick_file(self):
        files = self._files()
        return self.rng.choice(files) if files else None

    def overwrite(self):
        if (p := self._pick_file()):
            self.guard(p)
            with open(p, "r+b") as f:
                f.seek(self.rng.randrange(0, os.path.getsize(p) + 1))
                f.write(self.rng.randbytes(self.rng.randrange(1, 3000)))

    def append(self):
        if (p := self._pick_file()):
            self.guard(p)
            with open(p, "ab") as f:
                f.write(b"more\n")

    def truncate(self):
        if (p := self._pick_file()):
            self.guard(p)
            os.truncate(p, self.rng.randrange(0, os.path.getsize(p) + 2))

    def rename_file(self):
        if (p := self._pick_file()):
            new = self._new_name()
            self.guard(p, new)
            os.rename(p, new)

    def rename_dir(self):
        dirs = self._all(True)
        if dirs:
            src = self.rng.choice(dirs)
            dst = self._new_name()
            if not (dst + "/").startswith(src + "/"):
                moved = [dst + p[len(src):] for p in [src] + self._under(src)]
                self.guard(src, *moved)
                os.rename(src, dst)

    def link(self):
        if (p := self._pick_file()):
            new = self._new_name()
            self.guard(new, p)
            os.link(p, new)

    def symlink(self):
        target = self.rng.choice(["n1", "../x", "/etc/hostname", "dangling"])
        new = self._new_name()
        self.guard(new)
        os.symlink(target, new)

    def chmod(self):
        if (p := self._pick_file()):
            self.guard(p)
            os.chmod(p, self.rng.choice((0o600, 0o644, 0o755, 0o640)))

    def setxattr(self):
        if (p := self._pick_file()):
            self.guard(p)
            os.setxattr(p, f"user.k{self.rng.randrange(3)}", self.rng.randbytes(8))

    def removexattr(self):
        if (p := self._pick_file()):
            for name in os.listxattr(p):
                self.guard(p)
                os.removexattr(p, name)
                return

    def unlink(self):
        paths = [p for p in self._all(False)]
        if paths:
            p = self.rng.choice(paths)
            self.guard(p)
            os.unlink(p)

    def mkdir(self):
        new = self._new_name()
        self.guard(new)
        os.mkdir(new)

    def mkfifo(self):
        new = self._new_name()
        self.guard(new)
        os.mkfifo(new, 0o640)

    def rmtree(self):
        dirs = self._all(True)
        if dirs:
            top = self.rng.choice(dirs)
            self.guard(top)
            for dirpath, subdirs, files in os.walk(top, topdown=False):
                for name in files:
                    os.unlink(os.path.join(dirpath, name))
                for name in subdirs:
                    full = os.path.join(dirpath, name)
                    (os.unlink if os.path.islink(full) else os.rmdir)(full)
            os.rmdir(top)
