"""Issue 12, the lesser four: another session's open turn is never closed silently;
gc numbers are validated at both edges; a directory replaced by a symlink is restored
in one rewind without following the symlink; blobs and restores keep files sparse."""

from __future__ import annotations

import json
import math
import os

import pytest

from mountkit import cli, mounted
from rewindfs.overlay.control.client import call as proto_call
from rewindfs.store import Store
from store_fixtures import assert_sound


# -- 1. turn.begin refuses another session's open turn -------------------------------------

@pytest.mark.mount
def test_turn_begin_refuses_another_sessions_open_turn(tmp_path):
    ws, store = tmp_path / "ws", tmp_path / "store"
    with mounted(ws, store) as m:
        (ws / "f").write_bytes(b"before")
        a = m.call("turn.begin", session="A", turn=1, label="a1")["epoch"]
        # B over the control socket: refused, naming A's turn; nothing changes
        with pytest.raises(Exception) as exc:
            m.call("turn.begin", session="B", turn=1, label="b1")
        assert getattr(exc.value, "code", None) == "turn-open"
        assert "Turn 1 of session A" in str(exc.value)
        # B through the CLI: same refusal, exit 2, the holder named
        res = cli("turn", "begin", "--session", "B", "--turn", "1", "-C", ws, store=store)
        assert res.returncode == 2, res.stderr
        assert "Turn 1 of session A is still open" in res.stderr, res.stderr
        st = m.call("status")
        assert st["open_turn"]["session"] == "A" and st["epoch"] == a
        # A's later write lands in A's turn and A's end still works
        (ws / "f").write_bytes(b"during A")
        m.call("turn.end", session="A")
        # A re-beginning its own stale turn (lost turn.end) stays allowed
        m.call("turn.begin", session="A", turn=2)
        a3 = m.call("turn.begin", session="A", turn=3)["epoch"]
        assert m.call("status")["open_turn"]["turn"] == 3
        # --force closes A's turn
        res = cli("turn", "begin", "--session", "B", "--turn", "1", "--force", "-C", ws,
                  store=store)
        assert res.returncode == 0, res.stderr
        st = m.call("status")
        assert st["open_turn"]["session"] == "B" and st["epoch"] > a3
        with pytest.raises(Exception) as exc:     # A's end now names the mismatch
            m.call("turn.end", session="A")
        assert getattr(exc.value, "code", None) == "bad-session"
        m.call("turn.end", session="B")
    points = {(p["session"], p["turn"]) for p in _points(store, ws) if p["kind"] == "turn"}
    assert points == {("A", 1), ("A", 2), ("A", 3), ("B", 1)}


@pytest.mark.mount
def test_python_agent_turn_is_refused_while_another_session_holds_one(tmp_path):
    from rewindfs.plugin._errors import RewindfsClientError
    from rewindfs.plugin.agent import Rewindfs
    ws, store = tmp_path / "ws", tmp_path / "store"
    with mounted(ws, store) as m:
        rw = Rewindfs.for_directory(ws, store=store, strict=True)
        try:
            with rw.turn("A", 1):
                (ws / "f").write_bytes(b"A's")
                with pytest.raises(RewindfsClientError) as exc:
                    with rw.turn("B", 1):
                        pass
                assert exc.value.code == "turn-open"
                assert "Turn 1 of session A" in exc.value.message
                assert m.call("status")["open_turn"]["session"] == "A"
            with rw.turn("A", 2):       # A's own stale turn: re-begin still works
                with rw.turn("A", 3):
                    pass
            with rw.turn("B", 1):       # nothing open: B may begin
                pass
            with rw.turn("A", 4):
                with rw.turn("B", 2, force=True):
                    assert m.call("status")["open_turn"]["session"] == "B"
                    with pytest.raises(RewindfsClientError) as exc:
                        rw.client.turn_end("A")     # the force closed A's turn
                    assert exc.value.code == "bad-session"
        finally:
            rw.close()


def _points(store, ws):
    res = cli("log", "--json", "-C", ws, store=store)
    assert res.returncode == 0, res.stderr
    return [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]


# -- 2. gc numbers -------------------------------------------------------------------------

_BAD_CLI = [
    ("--grace", "1e400"), ("--grace", "inf"), ("--grace", "nan"), ("--grace", "-1"),
    ("--grace", "1e300"),
    ("--max-age", "9" * 400 + "d"), ("--max-age", "99999999999w"),
    ("--max-bytes", "9" * 400), ("--max-bytes", "99999999999999T"),
    ("--keep-epochs", "9" * 40), ("--keep-epochs", "-1"),
]
_BAD_WIRE = [
    ("grace_s", math.inf), ("grace_s", math.nan), ("grace_s", -1), ("grace_s", 10 ** 400),
    ("grace_s", 1e300), ("max_age_s", math.inf), ("max_age_s", 10 ** 30),
    ("max_age_s", -0.5), ("keep_epochs", 10 ** 30), ("keep_epochs", -1),
    ("keep_epochs", 1.5), ("max_bytes", 10 ** 30), ("max_bytes", math.nan),
    ("max_bytes", True), ("grace_s", "10"),
]


def _history(ws, store):
    with Store.open(store) as s:
        w = s.workspace(os.fsencode(ws))
        return [e.id for e in s.epochs(w)], s.statistics()["entries"]


@pytest.mark.mount
def test_gc_refuses_absurd_numbers_at_both_edges(tmp_path):
    ws, store = tmp_path / "ws", tmp_path / "store"
    with mounted(ws, store) as m:
        for t in range(1, 4):
            m.call("turn.begin", session="s", turn=t)
            (ws / "f").write_bytes(os.urandom(5000))
            m.call("turn.end", session="s")
        before = [p["epoch"] for p in m.call("points")["points"]]
        for name, value in _BAD_WIRE:
            with pytest.raises(Exception) as exc:
                proto_call(m.socket, "gc", {name: value, "keep_epochs": 1}
                           if name != "keep_epochs" else {name: value}, timeout=60)
            assert getattr(exc.value, "code", None) == "bad-params", (name, value, exc.value)
        for flag, value in _BAD_CLI:   # through the live daemon
            res = cli("gc", "--keep-epochs", "1", flag, value, "-C", ws, store=store)
            assert res.returncode == 3, (flag, value, res.stderr)
            assert "internal" not in res.stderr.lower(), res.stderr
        assert [p["epoch"] for p in m.call("points")["points"]] == before
    history = _history(ws, store)
    for flag, value in _BAD_CLI:       # straight from the store (no daemon)
        res = cli("gc", "--keep-epochs", "1", flag, value, "-C", ws, store=store)
        assert res.returncode == 3, (flag, value, res.stderr)
    assert _history(ws, store) == history
    res = cli("gc", "--keep-epochs", "1", "--grace", "0", "-C", ws, store=store)
    assert res.returncode == 0, res.stderr      # a sane gc still works and drops
    assert len(_history(ws, store)[0]) < len(history[0])
    with Store.open(store) as s:
        assert_sound(s)


def test_store_gc_refuses_absurd_numbers(tmp_path):
    from rewindfs.store._errors import BadPolicy
    with Store.open(tmp_path / "store") as s:
        for name, value in _BAD_WIRE:
            with pytest.raises(BadPolicy):
                s.gc(**{name: value})
        assert_sound(s)


# -- 3. a directory replaced by a symlink since the point -----------------------------------

def _tree(top) -> dict:
    """{relpath: (kind, content or target, mode, mtime_ns)} of everything under *top*,
    read without following symlinks."""
    out = {}
    for dirpath, dirs, files in os.walk(top):
        for name in dirs + files:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            rel = os.path.relpath(full, top)
            if os.path.islink(full):
                out[rel] = ("symlink", os.readlink(full), st.st_mode, st.st_mtime_ns)
            elif os.path.isdir(full):
                out[rel] = ("dir", None, st.st_mode, st.st_mtime_ns)
            else:
                with open(full, "rb") as f:
                    out[rel] = ("file", f.read(), st.st_mode, st.st_mtime_ns)
    return out


@pytest.mark.mount
@pytest.mark.parametrize("where", ["outside", "inside"])
def test_dir_replaced_by_symlink_is_restored_in_one_rewind(tmp_path, where):
    import shutil
    ws, store = tmp_path / "ws", tmp_path / "store"
    (ws / "pkg" / "sub").mkdir(parents=True)
    (ws / "pkg" / "a").write_bytes(b"a at the point")
    (ws / "pkg" / "sub" / "c").write_bytes(b"c at the point")
    (ws / "keep").write_bytes(b"keep")
    # the link target holds the same names with other contents (npm link / pnpm)
    target = tmp_path / "linked" if where == "outside" else ws / "linked"
    (target / "sub").mkdir(parents=True)
    (target / "a").write_bytes(b"the linked package's a")
    (target / "sub" / "c").write_bytes(b"the linked package's c")
    (target / "only-there").write_bytes(b"x")
    with mounted(ws, store) as m:
        before = _tree(ws)
        m.call("turn.begin", session="s", turn=1)
        shutil.rmtree(ws / "pkg")
        os.symlink(target, ws / "pkg")
        m.call("turn.end", session="s")
        linked = _tree(target)
        after = _tree(ws)
        res = cli("rewind", "1", "--session", "s", "--json", "-C", ws, store=store)
        assert res.returncode == 0, res.stdout + res.stderr
        assert not (ws / "pkg").is_symlink()
        got = _tree(ws)
        for rel in ("pkg/a", "pkg/sub/c", "keep"):
            assert got[rel][:3] == before[rel][:3], rel
        assert set(k for k in got if k.startswith("pkg")) == \
            set(k for k in before if k.startswith("pkg"))
        assert _tree(target) == linked          # the link's target is untouched
        res = cli("redo", "--session", "s", "--json", "-C", ws, store=store)
        assert res.returncode == 0, res.stdout + res.stderr
        assert os.readlink(ws / "pkg") == os.fspath(target)
        assert _tree(target) == linked
        redone = _tree(ws)
        assert {k: v[:3] for k, v in redone.items()} == \
            {k: v[:3] for k, v in after.items()}
    with Store.open(store) as s:
        assert_sound(s)


# -- 4. sparse blobs and restores ------------------------------------------------------------

GIB, MIB = 1 << 30, 1 << 20


def _make_sparse(path, seed: int = 0) -> bytes:
    """A 1 GiB file holding 1 MiB of data in two extents (and a trailing hole);
    returns its xxh3-128, the blob key its pre-image must get."""
    import random
    rnd = random.Random(seed)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, GIB)
        os.pwrite(fd, rnd.randbytes(MIB // 2), 100 * MIB)
        os.pwrite(fd, rnd.randbytes(MIB // 2), 900 * MIB + 4096)
        os.fsync(fd)
    finally:
        os.close(fd)
    return _xxh(path)


def _xxh(path) -> bytes:
    from rewindfs.store._copy import hash_fd
    fd = os.open(path, os.O_RDONLY)
    try:
        key, size = hash_fd(fd)
    finally:
        os.close(fd)
    assert size == GIB
    return key


def _disk(path) -> int:
    return os.lstat(path).st_blocks * 512


def _blob_files(store) -> list:
    return [p for p in (store / "blobs").glob("*/*") if p.is_file()]


@pytest.mark.parametrize("kernel_copy", [True, False])
def test_sparse_blob_and_restore_at_the_store(tmp_path, monkeypatch, kernel_copy):
    import errno
    if not kernel_copy:    # the store on another file system: the buffered copy
        def exdev(*_a):
            raise OSError(errno.EXDEV, "cross-device")
        monkeypatch.setattr(os, "copy_file_range", exdev)
    key = _make_sparse(tmp_path / "big")
    assert _disk(tmp_path / "big") <= 2 * MIB
    with Store.open(tmp_path / "store") as s:
        fd = os.open(tmp_path / "big", os.O_RDONLY)
        try:
            assert s.put_fd(fd) == (key, GIB)
            assert os.lseek(fd, 0, os.SEEK_CUR) == 0
        finally:
            os.close(fd)
        (blob,) = _blob_files(tmp_path / "store")
        assert _disk(blob) <= 2 * MIB, _disk(blob)
        out = os.open(tmp_path / "out", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            assert s.copy_blob_to_fd(key, out) == GIB
            os.fsync(out)
        finally:
            os.close(out)
        assert _disk(tmp_path / "out") <= 2 * MIB, _disk(tmp_path / "out")
        assert _xxh(tmp_path / "out") == key
        assert_sound(s)


@pytest.mark.mount
def test_sparse_file_is_captured_and_restored_sparse_through_the_mount(tmp_path):
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    with mounted(ws, store) as m:
        key = _make_sparse(ws / "disk.img")            # written through the mount
        m.call("turn.begin", session="s", turn=1)
        with open(ws / "disk.img", "r+b") as f:         # the agent rewrites it
            f.truncate(0)
            f.write(b"small now")
        m.call("turn.end", session="s")
        blobs = [b for b in _blob_files(store) if b.stat().st_size == GIB]
        assert len(blobs) == 1
        assert _disk(blobs[0]) <= 2 * MIB, _disk(blobs[0])
        res = cli("rewind", "1", "--session", "s", "--json", "-C", ws, store=store)
        assert res.returncode == 0, res.stdout + res.stderr
        assert _xxh(ws / "disk.img") == key
    # the real file under the (now gone) mount
    assert _disk(ws / "disk.img") <= 2 * MIB, _disk(ws / "disk.img")
    assert os.path.getsize(ws / "disk.img") == GIB
    with Store.open(store) as s:
        assert_sound(s)


@pytest.mark.parametrize("kernel_copy", [True, False])
def test_sparse_copies_keep_the_logical_content_randomized(tmp_path, monkeypatch,
                                                            kernel_copy):
    """Random layouts of data, holes and written zeros, with small copy slices: the key
    of ``copy_hashed``/``hash_fd`` is the hash of the whole logical content, the copy
    reads back equal, and it holds no more data blocks than the source (+ one slice)."""
    import errno
    import random
    import xxhash
    from relkit import trials
    from rewindfs.store import _copy
    if not kernel_copy:
        def exdev(*_a):
            raise OSError(errno.EXDEV, "cross-device")
        monkeypatch.setattr(os, "copy_file_range", exdev)
    seeds, failures = trials(40), []
    for seed in seeds:
        rnd = random.Random(seed)
        monkeypatch.setattr(_copy, "STEP", rnd.choice([64 << 10, 1 << 20]))
        monkeypatch.setattr(_copy, "CHUNK", rnd.choice([16 << 10, 64 << 10]))
        src_path, dst_path = tmp_path / f"src{seed}", tmp_path / f"dst{seed}"
        size = rnd.choice([0, 1, 4096, rnd.randrange(1, 8 << 20)])
        with open(src_path, "wb") as f:
            f.truncate(size)
            for _ in range(rnd.randrange(0, 6) if size else 0):
                f.seek(rnd.randrange(size))
                n = rnd.randrange(1, 300_000)
                f.write(rnd.randbytes(n) if rnd.random() < 0.8 else bytes(n))
        data = src_path.read_bytes()
        want = (xxhash.xxh3_128(data).digest(), len(data))
        src = os.open(src_path, os.O_RDONLY)
        dst = os.open(dst_path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            got = (_copy.hash_fd(src), _copy.copy_hashed(src, dst))
            offsets = (os.lseek(src, 0, os.SEEK_CUR), os.lseek(dst, 0, os.SEEK_CUR))
        finally:
            os.close(src)
            os.close(dst)
        if got != (want, want) or dst_path.read_bytes() != data or offsets != (0, 0) \
                or _disk(dst_path) > _disk(src_path) + (1 << 20):
            failures.append(seed)
        src_path.unlink()
        dst_path.unlink()
    print(f"{len(seeds)} trials, {len(failures)} failures")
    assert failures == []
