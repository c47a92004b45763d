"""Hostile input: nothing is ever written outside the workspace.

- A thread keeps swapping a directory of the workspace for a symlink to an outside
  directory *while* a rewind lands files into it: the rewind names what it could not
  restore, the outside directory is untouched, and a later rewind completes.
- ``..`` and absolute paths in protocol requests (rewind paths, show path, diff paths)
  are refused with ``path-escape`` / ``bad-params``.
- Names with newlines, control characters and invalid UTF-8, and a path at the 4096-byte
  limit (nested 255-byte names), are captured and restored through a real mount; one
  past the limit is refused cleanly.

Every test compares a sentinel directory outside the workspace before and after.
"""

from __future__ import annotations

import errno
import os
import random
import stat
import threading

import pytest

from mountkit import PYTHON, ROOT, cli, mounted
from ptykit import Terminal
from rewindfs.overlay.rewind.engine import apply_plan, plan_rewind
from restorekit import History
from rewindfs.store import Store
from store_fixtures import assert_sound
from relkit import trials
from treesnap import compare, snapshot


@pytest.fixture
def outside(tmp_path):
    """A sentinel directory outside the workspace; must be identical at the end."""
    top = tmp_path / "outside"
    (top / "d").mkdir(parents=True)
    for i in range(40):
        (top / "d" / f"f{i}").write_bytes(b"sentinel %d" % i)
        (top / f"f{i}").write_bytes(b"top sentinel %d" % i)
    before = snapshot(top)
    yield top
    assert compare(before, snapshot(top)) == [], "something was written outside"


# -- a directory swapped for a symlink during the restore ------------------------------

class Swapper(threading.Thread):
    """Swap ``root/d`` ↔ a symlink to ``outside/d`` until stopped."""

    def __init__(self, root: bytes, outside, rng):
        super().__init__(daemon=True)
        self.d, self.hidden = os.path.join(root, b"d"), os.path.join(root, b".d-hidden")
        self.target = os.fsencode(outside / "d")
        self.rng, self.halt, self.swaps = rng, threading.Event(), 0

    def run(self):
        while not self.halt.is_set():
            os.rename(self.d, self.hidden)
            os.symlink(self.target, self.d)
            self.swaps += 1
            for _ in range(self.rng.randrange(200)):
                pass
            os.unlink(self.d)
            os.rename(self.hidden, self.d)


@pytest.mark.parametrize("seed", trials(3))
def test_symlink_swap_during_restore_writes_nothing_outside(tmp_path, outside, seed):
    rng = random.Random(seed)
    (tmp_path / "ws" / "d").mkdir(parents=True)
    for i in range(40):
        (tmp_path / "ws" / "d" / f"f{i}").write_bytes(rng.randbytes(rng.choice((10, 5000))))
    base = snapshot(tmp_path / "ws")
    with Store.open(tmp_path / "store") as store:
        h = History(store, tmp_path / "ws")
        try:
            e1 = h.turn(1)
            for i in range(40):
                rel = b"d/f%d" % i
                if i % 3 == 0:
                    h.remove(rel)
                else:
                    h.write(rel, b"agent wrote %d" % i)
            for i in range(40, 50):
                h.write(b"d/f%d" % i, b"new")
            h.end_turn()
            swapper = Swapper(h.root, outside, rng)
            swapper.start()
            try:
                plan = plan_rewind(h.fd, store, h.ws, f"e{e1}")
                result = apply_plan(h.fd, store, h.ws, plan, session=None)
            finally:
                swapper.halt.set()
                swapper.join()
            assert swapper.swaps > 0
            for fail in result.failed:      # whatever failed is named, never followed
                assert fail.path.startswith(b"d"), fail
            # Undisturbed now, the files' rewind completes.  (Not ``d`` itself: the raced
            # rewind recorded ``d`` as it found it — moved away by the attacker, outside
            # any capture — and by the point rule that is d's state at e1 now.)
            files = [b"d/f%d" % i for i in range(50)]
            plan = plan_rewind(h.fd, store, h.ws, f"e{e1}", paths=files)
            again = apply_plan(h.fd, store, h.ws, plan, session=None)
            assert again.failed == []
            assert compare(base, snapshot(tmp_path / "ws")) == []
            assert_sound(store)
        finally:
            h.close()


# -- `..` and absolute paths on the wire ------------------------------------------------

ESCAPES = ["../outside", "/etc/passwd", "d/../../outside", "..", "/", "a/../../x"]


def test_protocol_refuses_escaping_paths(tmp_path, outside):
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    (ws / "d" / "f").write_text("v1")
    with mounted(ws, tmp_path / "store") as m:
        e = m.call("turn.begin", session="s", turn=1, label="x")["epoch"]
        (ws / "d" / "f").write_text("v2")
        m.call("turn.end")
        for bad in ESCAPES:
            for method, params in (("rewind", {"to": f"e{e}", "paths": [bad]}),
                                   ("rewind", {"to": f"e{e}", "paths": ["d", bad],
                                               "dry_run": True}),
                                   ("show", {"point": f"e{e}", "path": bad}),
                                   ("diff", {"a": f"e{e}", "paths": [bad]})):
                with pytest.raises(Exception) as info:
                    m.call(method, **params)
                assert getattr(info.value, "code", None) in ("path-escape", "bad-params"), (
                    method, bad, info.value)
        assert (ws / "d" / "f").read_text() == "v2"     # nothing was rewound
        res = cli("rewind", f"e{e}", "-C", ws, "--path", "../outside", store=m.store)
        assert res.returncode == 3, res.stderr
        res = cli("show", f"e{e}", "/etc/passwd", "-C", ws, store=m.store)
        assert res.returncode == 3, res.stderr


# -- hostile names, the 4096-byte limit ---------------------------------------------------

NAMES = [b"new\nline", b"tab\there", b"bell\x07\x1b[31m", b"\xff\xfe-not-utf8",
         b"caf\xc3\xa9", b"-rf", b" lead space", b"trail space ", b"\\back"]
LONG = b"L" * 255


def _open_chain(root_fd: int, depth: int, *, create: bool) -> int:
    """Walk (and with ``create`` make) ``depth`` nested 255-byte directories."""
    fd = os.dup(root_fd)
    for level in range(depth):
        name = LONG[:-2] + b"%02d" % level
        if create:
            os.mkdir(name, dir_fd=fd)
        nfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    return fd


def fd_snapshot(top) -> dict:
    """{relpath: (kind, mode, content)} walked through dir fds, so paths longer than
    PATH_MAX (the 4096-byte workspace paths under a long absolute prefix) work."""
    out = {}

    def walk(dir_fd: int, rel: bytes) -> None:
        for name in sorted(os.listdir(dir_fd)):
            name = os.fsencode(name)
            path = rel + b"/" + name if rel else name
            st = os.lstat(name, dir_fd=dir_fd)
            if stat.S_ISDIR(st.st_mode):
                out[path] = ("dir", stat.S_IMODE(st.st_mode), None)
                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                              dir_fd=dir_fd)
                try:
                    walk(sub, path)
                finally:
                    os.close(sub)
            elif stat.S_ISREG(st.st_mode):
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
                try:
                    out[path] = ("file", stat.S_IMODE(st.st_mode), os.read(fd, 1 << 20))
                finally:
                    os.close(fd)
            else:
                out[path] = ("other", stat.S_IFMT(st.st_mode), None)

    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        walk(fd, b"")
    finally:
        os.close(fd)
    return out


def _write_at(dir_fd: int, name: bytes, data: bytes) -> None:
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=dir_fd)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def test_hostile_names_and_long_paths_round_trip(tmp_path, outside):
    ws = tmp_path / "ws"
    ws.mkdir()
    for n in NAMES[:4]:
        with open(os.path.join(os.fsencode(ws), n), "wb") as f:
            f.write(b"old " + n)
    with mounted(ws, tmp_path / "store") as m:
        base = fd_snapshot(ws)
        e = m.call("turn.begin", session="s", turn=1, label="names")["epoch"]
        wsb = os.fsencode(ws)
        for n in NAMES:
            with open(os.path.join(wsb, n), "wb") as f:
                f.write(b"new " + n)
        os.mkdir(os.path.join(wsb, b"dir\nwith\x01ctl"))
        root_fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
        try:
            # 15 nested 255-byte names + one more: 15 × 256 + 255 = 4095 bytes, the limit
            fd = _open_chain(root_fd, 15, create=True)
            try:
                _write_at(fd, LONG, b"deep")
                # a sibling directory at the limit is fine; a name inside it is past
                # 4096 bytes: refused cleanly (ENAMETOOLONG), nothing created
                os.mkdir(LONG[:-1] + b"X", dir_fd=fd)
                sub = os.open(LONG[:-1] + b"X", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
                try:
                    with pytest.raises(OSError) as info:
                        _write_at(sub, b"g", b"past the limit")
                    assert info.value.errno == errno.ENAMETOOLONG, info.value   # as the kernel says it
                    with pytest.raises(OSError):
                        os.mkdir(b"h", dir_fd=sub)
                    assert os.listdir(sub) == []
                finally:
                    os.close(sub)
            finally:
                os.close(fd)
        finally:
            os.close(root_fd)
        assert m.call("status")["mounted"]
        changed = fd_snapshot(ws)
        assert len(changed) > len(base) + 15
        m.call("turn.end")
        res = cli("log", "-C", ws, "--json", store=m.store)
        assert res.returncode == 0, res.stderr
        res = cli("diff", f"e{e}", "-C", ws, "--json", store=m.store)
        assert res.returncode == 0, res.stderr
        assert "new\\nline" in res.stdout
        # people's output: a name cannot drive the terminal or forge a line
        res = cli("rewind", f"e{e}", "--dry-run", "-C", ws, store=m.store)
        assert res.returncode == 0, res.stderr
        assert "\x1b" not in res.stdout and "\x07" not in res.stdout, res.stdout
        assert "bell\\x07\\x1b[31m" in res.stdout.replace("\\[", "["), res.stdout
        assert "new\\nline" in res.stdout, res.stdout
        assert "/new\nline" not in res.stdout and "\nline (" not in res.stdout
        # a diff into a pipe is a patch: names C-quoted in its headers, the content's
        # bytes as they are (as git writes them; patch needs them)
        res = cli("diff", f"e{e}", "-C", ws, store=m.store)
        assert res.returncode == 0, res.stderr
        headers = [ln for ln in res.stdout.split("\n") if ln.startswith(("---", "+++"))]
        assert '+++ "b/bell\\a\\033[31m"\t(now)' in headers, headers     # git's C quoting
        assert '+++ "b/new\\nline"\t(now)' in headers, headers
        assert not any(c in ln for ln in headers for c in "\x1b\x07\r"), headers
        assert "\n+new bell\x07\x1b[31m\n" in res.stdout, res.stdout
        # a diff on a terminal: neither a name nor the content rings or recolours it
        with Terminal([PYTHON, "-m", "rewindfs.overlay.cli", "--store", str(m.store),
                       "diff", f"e{e}", "-C", str(ws)], cwd=ROOT,
                      env=dict(os.environ, PYTHONPATH=str(ROOT))) as term:
            assert term.wait() == 0
            shown = term.text()
        assert "\x07" not in shown and "bell\\x07\\x1b[31m" in shown, shown

        r = m.call("rewind", to=f"e{e}")
        assert r["failed"] == [], r
        assert fd_snapshot(ws) == base
        r = m.call("redo")
        assert r["failed"] == [], r
        assert fd_snapshot(ws) == changed


def test_rename_pushing_a_subtree_past_the_limit_is_refused(tmp_path, outside):
    """Renaming a directory so that a name inside it would pass 4096 bytes cannot be
    recorded (the moved names' pre-images): refused, nothing moved."""
    ws = tmp_path / "ws"
    ws.mkdir()
    with mounted(ws, tmp_path / "store") as m:
        root_fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.mkdir(b"a", dir_fd=root_fd)
            a_fd = os.open(b"a", os.O_RDONLY | os.O_DIRECTORY, dir_fd=root_fd)
            fd = _open_chain(a_fd, 15, create=True)      # a/… = 2 + 3839 bytes
            os.close(a_fd)
            _write_at(fd, b"f" * 200, b"deep")           # 4042 bytes: fine
            os.close(fd)
            m.call("turn.begin", session="s", turn=1, label="x")
            before = fd_snapshot(ws)
            with pytest.raises(OSError) as info:         # → 4141 bytes
                os.rename(b"a", b"b" * 100, src_dir_fd=root_fd, dst_dir_fd=root_fd)
            assert info.value.errno == errno.ENAMETOOLONG, info.value   # as the kernel says it
            assert fd_snapshot(ws) == before
        finally:
            os.close(root_fd)
        m.call("turn.end")
