"""Power cut: whatever the user made durable has its pre-image durable too (DESIGN 12).

The store and the workspace live on one small ext4 file system in a loop-mounted image
file.  A seeded workload writes files through the mount in turns and makes some of the
changes durable: ``write`` + ``fsync``/``fdatasync``, an ``O_SYNC`` write, and the
editor's save (write a temp name, ``fsync`` it, ``rename`` it over the file, ``fsync``
the directory).  Right after the last of those calls returned — while the daemon keeps
running, nothing flushed on purpose — the image file is copied: the copy holds what the
block layer had written at that moment, i.e. what a power cut would have left.  The copy
is mounted (its ext4 journal replayed), its store opened, and every change made durable
before the copy must be there with its pre-image: the journal entry in that turn's
epoch, and for a file its blob readable and equal to the content at the turn's start.

Every trial prints its failures; the run ends with "N trials, 0 failures".  Seeds come
from ``relkit.trials`` (``REWINDFS_TRIALS``/``REWINDFS_SEED`` to run more or others).
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import time

import pytest

from mountkit import mounted
from relkit import trials

pytestmark = pytest.mark.mount

IMAGE_MIB = 96
BIG = 1_100_000          # above the store's inline limit: the pre-image is a blob file
NAMES = [f"f{i}" for i in range(6)] + [f"d/g{i}" for i in range(4)]


def _run(*cmd) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


@contextlib.contextmanager
def loop_ext4(image, mnt, *, make: bool):
    """Attach ``image`` (made a fresh ext4 file system first if ``make``) to a loop
    device and mount it rw on the new directory ``mnt`` (a copy's journal is replayed);
    always unmounted and detached on the way out, also when the test fails."""
    if make:
        with open(image, "wb") as f:
            f.truncate(IMAGE_MIB << 20)
        # no lazy init: a background zeroing thread would write while we copy
        _run("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0",
             str(image))
    dev = _run("losetup", "--find", "--show", str(image))
    try:
        os.mkdir(mnt)
        _run("mount", "-t", "ext4", dev, str(mnt))
        try:
            yield mnt
        finally:
            if subprocess.run(["umount", str(mnt)], capture_output=True).returncode:
                subprocess.run(["umount", "-l", str(mnt)], check=False)
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)


def _content(rng: random.Random) -> bytes:
    size = BIG if rng.random() < 0.1 else rng.randrange(1, 9000)
    return rng.randbytes(size)


def _write(path, data: bytes, flags: int = 0) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flags, 0o644)
    os.write(fd, data)
    return fd


def _op_fsync(ws, rel, data, rng) -> list[bytes]:
    fd = _write(ws / rel, data)
    try:
        (os.fdatasync if rng.random() < 0.5 else os.fsync)(fd)
    finally:
        os.close(fd)
    return [rel.encode()]


def _op_osync(ws, rel, data, rng) -> list[bytes]:
    os.close(_write(ws / rel, data, os.O_SYNC if rng.random() < 0.5 else os.O_DSYNC))
    return [rel.encode()]


def _op_save(ws, rel, data, rng) -> list[bytes]:
    """The editor's atomic save; returns both names it changed."""
    tmp = f"{rel}.tmp{rng.randrange(1 << 30)}"
    fd = _write(ws / tmp, data)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(ws / tmp, ws / rel)
    dfd = os.open((ws / rel).parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return [rel.encode(), tmp.encode()]


def _op_plain(ws, rel, data, rng) -> list[bytes]:
    os.close(_write(ws / rel, data))
    return []                                  # not made durable: nothing to check


OPS = [_op_fsync, _op_osync, _op_save, _op_plain]


def _check_copy(mnt, epoch: int, durable: set, start: dict, now: dict) -> list[str]:
    """Problems with the copy mounted at ``mnt``: every path in ``now`` (made durable,
    not changed since) must hold that content (``None``: be absent), and every path in
    ``durable`` must have its pre-image in ``epoch``: absent, or a file whose blob
    reads back as ``start[path]``."""
    from rewindfs.store import Store

    problems = []
    if not durable:     # nothing made durable, nothing promised (not even the mark)
        return problems
    for path, data in sorted(now.items()):
        try:
            on_copy = (mnt / "ws" / os.fsdecode(path)).read_bytes()
        except FileNotFoundError:
            on_copy = None
        if on_copy != data:
            problems.append(f"{path!r}: the durable change itself is not on the copy")
    try:
        st = Store.open(mnt / "store", create=False)
    except Exception as exc:                    # noqa: BLE001 - any failure is a finding
        return problems + [f"the store does not open: {exc!r}"]
    try:
        wss = st.workspaces()
        if len(wss) != 1:
            return problems + [f"workspaces on the copy: {wss}"]
        try:
            journal = dict(st.journal(wss[0][0], epoch))
        except Exception as exc:                # noqa: BLE001
            return problems + [f"epoch {epoch} unreadable: {exc!r}"]
        for path in sorted(durable):
            img, old = journal.get(path), start.get(path)
            if img is None:
                problems.append(f"{path!r}: no pre-image in epoch {epoch}")
            elif old is None:
                if img.kind != "absent":
                    problems.append(f"{path!r}: pre-image {img.kind}, expected absent")
            else:
                try:
                    ok = img.kind == "file" and st.read_blob(img.blob) == old
                except Exception as exc:        # noqa: BLE001
                    ok, img = False, exc
                if not ok:
                    problems.append(f"{path!r}: wrong pre-image {img!r}")
    finally:
        st.close()
    return problems


def _trial(seed: int, m, image, copy_dir, tree: dict) -> list[str]:
    """One turn of seeded operations; the image is copied right after the last one
    returned, and the copy checked.  ``tree`` (path -> content) is the workspace as the
    test knows it, updated here."""
    rng = random.Random(seed)
    epoch = m.call("turn.begin", session="s", turn=seed, label=f"trial {seed}")["epoch"]
    start = dict(tree)
    durable, now = set(), {}
    for _ in range(rng.randrange(1, 6)):
        rel = rng.choice(NAMES)
        data = _content(rng)
        op = rng.choice(OPS)
        changed = op(m.ws, rel, data, rng)
        tree[rel.encode()] = data
        if changed:
            durable.update(changed)
            now.update({p: None for p in changed})
            now[rel.encode()] = data
        else:
            now.pop(rel.encode(), None)     # changed again without a sync: either may show
    copy = copy_dir / f"copy{seed}.img"
    _run("cp", "--sparse=always", str(image), str(copy))   # the power cut
    m.call("turn.end")
    try:
        with loop_ext4(copy, copy_dir / f"copy{seed}", make=False) as mnt:
            problems = _check_copy(mnt, epoch, durable, start, now)
    finally:
        copy.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            (copy_dir / f"copy{seed}").rmdir()
    return [f"seed {seed}: {p}" for p in problems]


@pytest.mark.parametrize("writeback, passthrough", [("1", "0"), ("0", "0"), ("1", "1")],
                         ids=["writeback", "write-through", "passthrough"])
def test_durable_changes_have_durable_preimages(tmp_path, writeback, passthrough):
    image = tmp_path / "disk.img"
    with loop_ext4(image, tmp_path / "disk", make=True) as disk:
        ws, store = disk / "ws", disk / "store"
        (ws / "d").mkdir(parents=True)
        tree = {}
        for rel in NAMES[::2]:
            tree[rel.encode()] = os.urandom(3000)
            (ws / rel).write_bytes(tree[rel.encode()])
        seeds = trials(12)
        problems, failed = [], 0
        with mounted(ws, store, env={"REWINDFS_WRITEBACK": writeback,
                                     "REWINDFS_PASSTHROUGH": passthrough}) as m:
            for seed in seeds:
                found = _trial(seed, m, image, tmp_path, tree)
                problems += found
                failed += bool(found)
        print(f"writeback={writeback} passthrough={passthrough}: {len(seeds)} trials, {failed} failures")
        assert not problems, "\n".join(problems)


def test_turn_marks_reach_the_disk_without_an_fsync(tmp_path):
    """A turn mark replies before the store is flushed (docs/store.md "Durability"); the
    daemon's background sync puts it on disk within a quarter second.  A copy taken
    well after that (2 s: eight sync periods) must hold the turn's epoch and the
    pre-image of an unsynced change made in it."""
    from rewindfs.store import Store

    image = tmp_path / "disk.img"
    with loop_ext4(image, tmp_path / "disk", make=True) as disk:
        ws = disk / "ws"
        ws.mkdir()
        (ws / "a").write_bytes(b"before")
        with mounted(ws, disk / "store") as m:
            epoch = m.call("turn.begin", session="s", turn=1, label="t")["epoch"]
            (ws / "a").write_bytes(b"after")          # captured, nobody fsyncs
            time.sleep(2)
            copy = tmp_path / "copy.img"
            _run("cp", "--sparse=always", str(image), str(copy))   # the power cut
        with loop_ext4(copy, tmp_path / "copy", make=False) as mnt:
            st = Store.open(mnt / "store", create=False)
            try:
                (wsid, _), = st.workspaces()
                assert epoch in [e.id for e in st.epochs(wsid)]
                img = dict(st.journal(wsid, epoch))[b"a"]
                assert st.read_blob(img.blob) == b"before"
            finally:
                st.close()


def _store_syncs(m) -> int:
    return m.call("status")["fs"]["store_syncs"]


def test_fsync_syncs_the_store_only_when_preimages_are_pending(tmp_path):
    """The price of invariant 12 is paid once per batch of new pre-images: an fsync
    after a capture syncs the store, an fsync with nothing new captured does not."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a").write_bytes(b"old")
    with mounted(ws, tmp_path / "store") as m:
        m.call("turn.begin", session="s", turn=1, label="t")
        base = _store_syncs(m)
        with open(ws / "a", "r+b") as f:        # captured at open (writeback cache)
            f.write(b"new")
            f.flush()
            os.fsync(f.fileno())
            assert _store_syncs(m) == base + 1
            for i in range(5):                  # the same file again: nothing new
                f.write(b"more %d" % i)
                f.flush()
                os.fdatasync(f.fileno())
        dfd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        assert _store_syncs(m) == base + 1
        (ws / "b").write_bytes(b"x")            # a new pre-image (absent) ...
        dfd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)                       # ... is synced before the directory
        finally:
            os.close(dfd)
        assert _store_syncs(m) == base + 2
