"""Full disk: the store lives on a small size-limited tmpfs that fills up mid-turn.

The workload's writes then fail with ENOSPC, the real files they targeted stay as they
were (checked through a directory fd opened before the mount), the daemon keeps serving,
and once a filler file on that tmpfs is deleted the same writes succeed.  Finally a
rewind to the start of the turn gives back the tree as it was: no real file changed
without its pre-image.
"""

from __future__ import annotations

import errno
import os

import pytest

from rewindfs.store._errors import RewindfsError
from store_fixtures import assert_sound
from tmpfskit import small_tmpfs

from relkit import Daemon, ensure_unmounted
from treesnap import compare, snapshot

pytestmark = pytest.mark.mount

FILE = 1_500_000      # above the inline limit: each pre-image is a blob file
N_FILES = 8


@pytest.fixture
def small_fs(tmp_path):
    with small_tmpfs(tmp_path / "small", "8m") as mnt:
        yield mnt


def _real(ws_fd: int, name: str) -> bytes:
    fd = os.open(name, os.O_RDONLY, dir_fd=ws_fd)
    try:
        return os.read(fd, 64 << 20)
    finally:
        os.close(fd)


def _replace(path, data: bytes) -> None:
    with open(path, "wb") as f:   # O_TRUNC: the whole old content is the pre-image
        f.write(data)


def test_store_fills_mid_turn_then_recovers(tmp_path, small_fs):
    ws, store = tmp_path / "ws", small_fs / "store"
    ws.mkdir()
    originals = {}
    for i in range(N_FILES):
        originals[f"f{i}"] = os.urandom(FILE)
        (ws / f"f{i}").write_bytes(originals[f"f{i}"])
    filler = small_fs / "filler"
    filler.write_bytes(b"\0" * (3 << 20))
    ws_fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    daemon = Daemon(ws, store)
    try:
        daemon.start()
        epoch = daemon.call("turn.begin", session="s", turn=1, label="fill")["epoch"]
        base = snapshot(ws)
        done, refused = [], []
        for i in range(N_FILES):
            name = f"f{i}"
            try:
                _replace(ws / name, b"new %d" % i)
                done.append(name)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                refused.append(name)
                assert _real(ws_fd, name) == originals[name], f"{name} changed unrecorded"
        assert done and refused, (done, refused)   # it did fill up, mid-turn
        for name in done:
            assert _real(ws_fd, name).startswith(b"new ")
        # still serving: status answers, reads work, the daemon is alive
        assert daemon.call("status")["open_turn"]["epoch"] == epoch
        assert (ws / refused[0]).read_bytes() == originals[refused[0]]
        assert daemon.proc.poll() is None

        filler.unlink()                          # free space: the same change now works
        _replace(ws / refused[0], b"late")
        assert _real(ws_fd, refused[0]) == b"late"
        daemon.call("turn.end")
        res = daemon.call("rewind", to=f"e{epoch}")
        assert res["failed"] == [], res
        assert compare(base, snapshot(ws)) == []
        with _open(store) as s:
            assert_sound(s)
        assert daemon.stop() == 0
    finally:
        os.close(ws_fd)
        daemon.close()
        ensure_unmounted(ws)


def _open(path):
    from rewindfs.store import Store
    return Store.open(path, create=False)


def test_store_fills_during_a_rewind(tmp_path, small_fs):
    """A rewind's own pre-images (the big files it replaces) do not all fit: the paths
    it could not record are named (``store-full``) and left as they are — never changed
    without their pre-image — the rest land; with space freed the rewind completes.

    (Found: content the store already held was refused once the disk was full, because
    a large blob is spooled to a temp file before its key is known; now a full disk
    finishes the hash and accepts the stored copy.)"""
    ws, store = tmp_path / "ws", small_fs / "store"
    ws.mkdir()
    for i in range(5):
        (ws / f"s{i}").write_bytes(b"small %d" % i)
    ws_fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    daemon = Daemon(ws, store)
    try:
        daemon.start()
        epoch = daemon.call("turn.begin", session="s", turn=1, label="grow")["epoch"]
        base = snapshot(ws)
        big = {f"s{i}": os.urandom(FILE) for i in range(5)}
        for name, data in big.items():
            _replace(ws / name, data)
        daemon.call("turn.end")
        filler = small_fs / "filler"
        free = os.statvfs(small_fs).f_bavail * os.statvfs(small_fs).f_frsize
        filler.write_bytes(b"\0" * max(0, free - 2 * FILE - (1 << 20)))

        res = daemon.call("rewind", to=f"e{epoch}")
        failed = {f["path"]: f["code"] for f in res["failed"]}
        assert failed and set(failed.values()) <= {"store-full"}, res
        assert len(failed) < 5, res                      # some did fit, and landed
        for name in big:
            real = _real(ws_fd, name)
            if name in failed:
                assert real == big[name], f"{name} changed without its pre-image"
            else:
                assert real == b"small " + name[1:].encode()
        assert daemon.proc.poll() is None
        partial = snapshot(ws)

        filler.unlink()
        res = daemon.call("rewind", to=f"e{epoch}")
        assert res["failed"] == [], res
        assert compare(base, snapshot(ws)) == []
        res = daemon.call("redo")              # undoes the second rewind: the partial tree
        assert res["failed"] == [], res
        assert compare(partial, snapshot(ws)) == []
        with _open(store) as s:
            assert_sound(s)
        assert daemon.stop() == 0
    finally:
        os.close(ws_fd)
        daemon.close()
        ensure_unmounted(ws)


def test_full_disk_still_dedups_stored_content(tmp_path, small_fs):
    """The store level of the fix above: with no room for a temp file, content already
    stored is accepted (and touched), new content is ``StoreFull``."""
    from rewindfs.store import StoreFull

    data, other = os.urandom(FILE), os.urandom(FILE)
    src = tmp_path / "src"
    with _open_new(small_fs / "store") as s:
        src.write_bytes(data)
        with open(src, "rb") as f:
            key, size = s.put_fd(f.fileno())
        free = os.statvfs(small_fs).f_bavail * os.statvfs(small_fs).f_frsize
        (small_fs / "filler").write_bytes(b"\0" * max(0, free - (256 << 10)))
        with open(src, "rb") as f:
            assert s.put_fd(f.fileno()) == (key, size)
        src.write_bytes(other)
        with open(src, "rb") as f, pytest.raises(StoreFull):
            s.put_fd(f.fileno())
        assert not os.listdir(small_fs / "store" / "blobs" / "tmp")
        assert s.read_blob(key) == data


def _open_new(path):
    from rewindfs.store import Store
    return Store.open(path)


def test_store_full_at_a_mark_a_held_open_writer_is_never_restored_wrong(tmp_path, small_fs):
    """A file held open for writing across a turn mark, the store's disk full at the
    mark.  Under passthrough the mark captures that file (its writes never reach the
    daemon) and here cannot.  Rewinding to the mark later must not hand back the file
    as the turn left it while saying it is as it was at the mark (as it did: the mark
    was made without that file's state): the mark is refused instead, nothing changed,
    and made once there is room."""
    ws, store = tmp_path / "ws", small_fs / "store"
    ws.mkdir()
    (ws / "log").write_bytes(b"A" * FILE)
    (ws / "other").write_bytes(b"other at the start")
    ws_fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    daemon = Daemon(ws, store)
    try:
        daemon.start()
        daemon.call("turn.begin", session="s", turn=1, label="one")
        fd = os.open(ws / "log", os.O_WRONLY)        # captured at open (A)
        try:
            os.pwrite(fd, b"B" * FILE, 0)
            filler = small_fs / "filler"
            free = os.statvfs(small_fs).f_bavail * os.statvfs(small_fs).f_frsize
            filler.write_bytes(b"\0" * max(0, free - (64 << 10)))
            try:
                daemon.call("turn.begin", session="s", turn=2, label="two")
            except RewindfsError as exc:     # refused: nothing changed, turn 1 goes on
                assert exc.code == "mark-refused" and "log" in str(exc), exc
                assert daemon.call("status")["open_turn"]["turn"] == 1
            filler.unlink()
            # the harness marks again (on main the first mark was made, without log)
            mark = daemon.call("turn.begin", session="s", turn=2, label="two")["epoch"]
            os.pwrite(fd, b"C" * FILE, 0)                # turn 2 changes it
        finally:
            os.close(fd)
        (ws / "other").write_bytes(b"other in turn two")
        daemon.call("turn.end")
        assert _real(ws_fd, "log") == b"C" * FILE
        res = daemon.call("rewind", to=f"e{mark}")
        failed = {f["path"] for f in res["failed"]}
        assert _real(ws_fd, "other") == b"other at the start" or "other" in failed
        real = _real(ws_fd, "log")
        assert real == b"B" * FILE or "log" in failed, (
            f"log is {real[:1]!r}×{len(real)} after a rewind to the mark that reports "
            f"it restored: {res}")
        assert daemon.proc.poll() is None
    finally:
        os.close(ws_fd)
        daemon.close()
        ensure_unmounted(ws)


def test_a_mount_over_a_full_store_serves_and_fails_writes_closed(tmp_path):
    """The store's disk is full when the workspace is mounted again (its idle epoch
    recorded something, so the mount would open a new one: a write to the index).
    The mount serves, as it did before mounts started at a point: writes fail with
    ENOSPC and change nothing, and once space is freed they are captured."""
    from mountkit import mounted

    with small_tmpfs(tmp_path / "small", "3m") as disk:
        # the store is the tmpfs itself: mountkit's daemon log (beside the store) and
        # the daemon's own stdout stay on a disk with room
        ws, store = tmp_path / "ws", disk
        ws.mkdir()
        with mounted(ws, store):
            (ws / "a").write_text("one\n")
        filler = disk / "filler"
        with open(filler, "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        with mounted(ws, store) as m:
            assert (m.ws / "a").read_text() == "one\n"
            with pytest.raises(OSError) as info:      # a new name needs a record
                (m.ws / "b").write_text("two\n")
            assert info.value.errno == errno.ENOSPC
            assert not (m.ws / "b").exists()
            filler.unlink()
            (m.ws / "b").write_text("two\n")
            assert (m.ws / "b").read_text() == "two\n"
