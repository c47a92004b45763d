"""``.rewindignore`` at the workspace root, gitignore syntax (DESIGN invariant 7).

An ignored path is never captured, never restored and never deleted by a restore; the
same rules answer for the filesystem and the restore engine so the rule is symmetric.
``.rewindignore`` itself is never ignored.  Matching is on the workspace-relative path;
a directory is matched with a trailing slash so ``build/`` patterns work, and anything
below an ignored directory is ignored (as in git).

When the file changes, two rule sets are in play, and a path counts as ignored only
where both ignore it (``IgnoreRules.both``): for capture, the rules its epoch began
with and the rules now — so a turn that adds a rule and then deletes what it matches
cannot take that deletion out of the history (the rule takes effect for capture at the
next turn boundary); for a restore, the rules now and the rules of the point it goes
back to.

Matching runs on RE2 (``pathspec``'s ``re2`` backend), in time linear in the name:
with Python's backtracking ``re`` a rule such as ``a*a*a*a*a*a*a*a*b`` takes
exponential time on a long name that almost matches, and the daemon's one thread — so
every process in the workspace — would wait on it.  RE2 takes only valid Unicode, so
rules and names are read one character per byte (latin-1), which is also how git
matches them: byte by byte.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import warnings

import pathspec
import re2

from rewindfs.overlay.errors import BadIgnoreRules, TooManyIgnoreRules

log = logging.getLogger(__name__)

__all__ = ["IGNORE_FILE", "BothRules", "IgnoreRules"]

IGNORE_FILE = b".rewindignore"
_MAX_RULES_BYTES = 1 << 20


# What a pattern can fail with: gitignore syntax (pathspec's GitIgnorePatternError, a
# ValueError), and the regular expression it becomes — pathspec compiles each pattern
# with ``re`` too, so "[z-a]", a range written backwards, fails there — or RE2.
_BAD_PATTERN = (ValueError, re.error, re2.error)
# RE2 compiles all patterns into one set within a memory bound (about 1,800 simple ones
# fit); a fixed limit below it makes the refusal the same for every file of that size.
MAX_PATTERNS = 1500


def _spec(lines: list[str]):
    with warnings.catch_warnings():     # "possible nested set" from re, for "[[]" etc.:
        warnings.simplefilter("ignore", FutureWarning)   # about re's future, not ours
        return pathspec.GitIgnoreSpec.from_lines(lines, backend="re2")


class IgnoreRules:
    """Compiled ignore rules; ``ignored(relpath, is_dir)`` is cheap and pure."""

    def __init__(self, lines: list[str] | None = None):
        self.lines = list(lines or [])
        self._spec = _spec(self.lines) if self.lines else None
        self._cache: dict[tuple[bytes, bool], bool] = {}

    @classmethod
    def load(cls, root_fd: int) -> "IgnoreRules":
        """Read ``.rewindignore`` from the root (not following a symlink); empty if it is
        absent or not a readable regular file (a directory, a FIFO, a device).  A
        pattern gitignore syntax rejects (``!``, a trailing ``\\``) or one the
        matcher cannot compile raises ``BadIgnoreRules`` naming its line (too many
        patterns: ``TooManyIgnoreRules``): the caller decides between refusing (mount,
        an offline rewind) and keeping its previous rules (a live mount,
        ``fs.ops.reload_rules``) — never half a rule set."""
        try:    # O_NONBLOCK: a FIFO of that name would wait for a writer, forever
            fd = os.open(IGNORE_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
                         | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=root_fd)
        except OSError:
            return cls()
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return cls()
            data = os.read(fd, _MAX_RULES_BYTES)
        except OSError:     # a directory named .rewindignore, EIO: no rules, as absent
            return cls()
        finally:
            os.close(fd)
        return cls.parse(data)

    @classmethod
    def parse(cls, data: bytes) -> "IgnoreRules":
        """The rules of a ``.rewindignore`` holding *data* (``BadIgnoreRules`` as
        ``load``)."""
        # Lines as git and an editor count them: split on LF only, CRLF tolerated.
        lines = [line.removesuffix("\r") for line in data.decode("latin-1").split("\n")]
        count = sum(1 for line in lines if line.strip() and not line.startswith("#"))
        if count > MAX_PATTERNS:
            raise TooManyIgnoreRules(count=count)
        try:
            return cls(lines)
        except _BAD_PATTERN:
            for number, line in enumerate(lines, 1):
                try:
                    _spec([line])
                except _BAD_PATTERN:
                    raise BadIgnoreRules(line=number,
                                         pattern=os.fsdecode(line.encode("latin-1"))) from None
            # the set fails but no line alone does: RE2's bound, met below the count
            raise TooManyIgnoreRules(count=count) from None

    def ignored(self, relpath: bytes, is_dir: bool = False) -> bool:
        """True if *relpath* (or one of its parent directories) matches a rule."""
        if self._spec is None or not relpath or relpath == IGNORE_FILE:
            return False
        key = (relpath, is_dir)
        hit = self._cache.get(key)
        if hit is None:
            name = relpath.decode("latin-1") + ("/" if is_dir else "")
            hit = self._spec.match_file(name)
            if len(self._cache) > 100_000:  # bounded; rules are cheap to re-evaluate
                self._cache.clear()
            self._cache[key] = hit
        return hit

    def __bool__(self) -> bool:
        return self._spec is not None

    def both(self, other) -> "IgnoreRules | BothRules":
        """Rules that ignore a path only where these and *other* both do (the same
        rules back when they are)."""
        if other is self or other.lines == self.lines:
            return self
        return BothRules(self, other)


class BothRules:
    """What two rule sets both ignore (``IgnoreRules.both``): the ``IgnoreRules``
    interface the filesystem and the restore engine use."""

    def __init__(self, first, second):
        self.first, self.second = first, second
        # never equal to a file's lines: both() of these is never taken for one set
        self.lines = None

    def ignored(self, relpath: bytes, is_dir: bool = False) -> bool:
        return self.first.ignored(relpath, is_dir) and self.second.ignored(relpath, is_dir)

    def both(self, other) -> "BothRules":
        return self if other is self else BothRules(self, other)

    def __bool__(self) -> bool:
        return bool(self.first) and bool(self.second)
