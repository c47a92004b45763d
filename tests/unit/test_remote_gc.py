"""Remote gc (``rewindfs gc --remote``) against a real S3 server (``rclone serve s3``,
``remotekit``): orphans of a killed push go after the grace period and every point still
restores; gc and push exclude each other (the server ignores ``If-None-Match``, so this
is the claims path); a corrupt segment stops gc before it deletes anything.  The
conditional path of the same exclusion runs on ``DirBackend``."""

from __future__ import annotations

import os

import pytest
from remotekit import (add_origin, build_history, cli, new_dir, push_done,  # noqa: F401
                       s3)  # s3: the fixture
from restorekit import open_history
from store_fixtures import assert_sound
from treesnap import compare, exact

from rewindfs.overlay.rewind.remote import capture_tree
from rewindfs.store import Store
from rewindfs.store._errors import (LeaseHeld, LeaseLapsed, RemoteGcRunning,
                                   RemoteUnreachable)
from rewindfs.store.remote import (DirBackend, GcLock, Lease, RemoteConfig, gc_remote,
                                   open_backend, push_workspace)
from rewindfs.store.remote._gc import refuse_if_gc_running, refuse_if_pushing
from rewindfs.store.remote._objects import pack_name, sha256


def _backend(store):
    with Store.open(store) as s:
        return open_backend(RemoteConfig("origin", *s.remote("origin")[:4]))


def _keys(backend) -> set[str]:
    return {k for k, _ in backend.list("")}


def _gc(capsys, store, *extra) -> tuple[int, list[dict]]:
    return cli(capsys, "--store", store, "gc", "--remote", "origin", *extra)


def _error(recs) -> dict:
    return [r for r in recs if r["type"] == "error"][0]


def _plant_orphan(backend) -> str:
    """An object no segment names, as an interrupted push leaves one."""
    name = pack_name(sha256(b"an orphan"))
    backend.put(name, b"an orphan")
    return name


def test_orphans_of_a_killed_push_go_after_the_grace_and_every_point_still_restores(
        s3, tmp_path, capsys):
    expected: dict = {}
    with open_history(new_dir(tmp_path / "a")) as h:
        build_history(h, expected)
        store, root = h.store.path, h.root.decode()
        add_origin(capsys, store, s3)
        ws_id = push_done(capsys, store, root)["workspace"]
        backend = _backend(store)
        # a second push of new work dies once two of its objects are up
        h.turn(4)
        h.write(b"big-1.bin", os.urandom(1_200_000))
        h.write(b"big-2.bin", os.urandom(1_200_000))
        h.write(b"small.txt", b"small\n" * 100)
        h.end_turn()
        before = _keys(backend)
        config = RemoteConfig("origin", *h.store.remote("origin")[:4])

        def die_after_two(report, done, total):
            if report.objects == 2:
                s3.kill()

        with pytest.raises(RemoteUnreachable):
            push_workspace(h.store, h.ws, backend, config, ws_id,
                           capture_tree(h.fd, h.store), progress=die_after_two)
        s3.start()
        orphans = sorted(k for k in _keys(backend) - before
                         if k.startswith(("blobs/", "packs/")))
        assert len(orphans) == 2, orphans
        code, recs = cli(capsys, "--store", store, "fsck", "--remote", "origin")
        assert code == 0 and [r["object"] for r in recs if r["type"] == "fsck.orphan"] == orphans

        # the default grace keeps them: they are minutes old, not a day
        code, recs = _gc(capsys, store)
        assert code == 0, recs
        done = recs[-1]
        assert done["type"] == "gc.remote" and done["deleted"] == 0, done
        assert sorted(r["object"] for r in recs if r["type"] == "gc.kept") == orphans
        assert set(orphans) <= _keys(backend)

        # a dry run names what it would delete and deletes nothing
        code, recs = _gc(capsys, store, "--grace", "0s", "--dry-run")
        assert code == 0, recs
        assert sorted(r["object"] for r in recs if r["type"] == "gc.delete") == orphans
        assert recs[-1]["dry_run"] is True and recs[-1]["deleted"] == 0
        assert set(orphans) <= _keys(backend)

        # grace 0s: they go, and nothing else does
        kept = _keys(backend) - set(orphans)
        code, recs = _gc(capsys, store, "--grace", "0s")
        assert code == 0, recs
        assert sorted(r["object"] for r in recs if r["type"] == "gc.delete") == orphans
        assert recs[-1]["deleted"] == 2
        assert _keys(backend) == kept
        code, recs = cli(capsys, "--store", store, "fsck", "--remote", "origin")
        assert code == 0 and recs[-1]["ok"] and recs[-1]["orphans"] == 0, recs

    for eid, tree in sorted(expected.items()):
        fresh = new_dir(tmp_path / f"m{eid}")
        add_origin(capsys, fresh / "store", s3)
        code, recs = cli(capsys, "--store", fresh / "store", "restore", "--from", "origin",
                         "--workspace", ws_id, "--point", f"e{eid}", fresh / "dir")
        assert code == 0, recs
        assert compare(tree, exact(fresh / "dir")) == [], f"point e{eid}"
        with Store.open(fresh / "store") as restored:
            assert_sound(restored)


def _pushed(capsys, tmp_path, s3):
    with open_history(new_dir(tmp_path / "a")) as h:
        h.turn(1)
        h.write(b"a.txt", b"one\n")
        h.write(b"big.bin", os.urandom(1_100_000))
        h.end_turn()
        add_origin(capsys, h.store.path, s3)
        done = push_done(capsys, h.store.path, h.root.decode())
        return h.store.path, h.root.decode(), done["workspace"]


def test_gc_while_a_push_holds_the_lease_is_refused_naming_the_holder(s3, tmp_path, capsys):
    store, _root, ws_id = _pushed(capsys, tmp_path, s3)
    backend = _backend(store)
    orphan = _plant_orphan(backend)
    with Lease(backend, "origin", ws_id, "store-elsewhere", conditional=False):
        before = _keys(backend)
        code, recs = _gc(capsys, store, "--grace", "0s")
        assert code == 2, recs
        err = _error(recs)
        assert err["code"] == "lease-held" and "store-elsewhere" in err["message"], err
        assert _keys(backend) == before                  # its claim came and went
    assert orphan in _keys(backend)
    code, recs = _gc(capsys, store, "--grace", "0s")     # the push is done: gc runs
    assert code == 0 and orphan not in _keys(backend), recs


def test_a_push_while_gc_holds_its_lock_is_refused_and_writes_nothing(s3, tmp_path, capsys):
    store, root, _ws_id = _pushed(capsys, tmp_path, s3)
    backend = _backend(store)
    with open(os.path.join(root, "new.txt"), "wb") as f:    # new in the pushed tree
        f.write(b"made while gc runs\n")
    with GcLock(backend, "origin", "gc-elsewhere", conditional=False):
        before = _keys(backend)
        code, recs = cli(capsys, "--store", store, "push", "-C", root)
        assert code == 2, recs
        err = _error(recs)
        assert err["code"] == "remote-gc-running" and "gc-elsewhere" in err["message"], err
        assert _keys(backend) == before
    done = push_done(capsys, store, root)                    # gc is done: the push runs
    assert done["objects"] > 0


def test_gc_refuses_to_delete_anything_when_a_segment_is_corrupt(s3, tmp_path, capsys):
    store, _root, ws_id = _pushed(capsys, tmp_path, s3)
    backend = _backend(store)
    orphan = _plant_orphan(backend)
    seg = sorted(k for k in _keys(backend) if k.startswith(f"ws/{ws_id}/seg/"))[-1]
    data = bytearray(backend.get(seg))
    data[len(data) // 2] ^= 0xFF
    backend.put(seg, bytes(data))
    before = _keys(backend)
    for extra in ((), ("--dry-run",)):
        code, recs = _gc(capsys, store, "--grace", "0s", *extra)
        assert code == 2, recs
        err = _error(recs)
        assert err["code"] == "remote-gc-unsafe" and seg in err["message"], err
        assert not [r for r in recs if r["type"] == "gc.delete"]
        assert _keys(backend) == before and orphan in before


@pytest.mark.parametrize("conditional", [True, False])
def test_gc_lock_and_push_lease_exclude_each_other(tmp_path, conditional):
    backend = DirBackend(tmp_path)
    push = Lease(backend, "origin", "w1", "store-a", conditional=conditional)
    gc = GcLock(backend, "origin", "store-b", conditional=conditional)
    with push:
        refuse_if_gc_running(push)                      # no gc: the push goes on
        with gc:                                        # gc starts during the push
            with pytest.raises(LeaseHeld) as info:
                refuse_if_pushing(gc)
            assert "store-a" in info.value.message and not gc.held
    with gc:
        refuse_if_pushing(gc)                           # no push: gc goes on
        with push:                                      # a push starts during gc
            with pytest.raises(RemoteGcRunning) as info:
                refuse_if_gc_running(push)
            assert "store-b" in info.value.message and not push.held
    assert backend.list("") == []                       # every record released


@pytest.mark.parametrize("conditional", [True, False])
def test_a_push_or_gc_whose_lock_lapsed_stops_before_its_next_write(tmp_path, conditional):
    """A lease not renewed for half its TTL (here: written already expired) may have let
    the other side in: the push writes no segment, gc deletes nothing."""
    backend = DirBackend(tmp_path / "remote")
    config = RemoteConfig("dir", "s3://local-dir", conditional=conditional)
    with open_history(new_dir(tmp_path / "a")) as h:
        h.turn(1)
        h.write(b"a.txt", b"one\n")
        h.end_turn()
        head = capture_tree(h.fd, h.store)
        with pytest.raises(LeaseLapsed) as info:
            push_workspace(h.store, h.ws, backend, config, "w1", head, lease_ttl_s=-1)
        assert "segment" in info.value.message
        assert backend.list("ws/w1/seg/") == []
        orphans = [k for k, _ in backend.list("packs/")]
        assert orphans                                   # its pack went up, unnamed
        with pytest.raises(LeaseLapsed):
            gc_remote(backend, config, "store-x", grace_s=0, lock_ttl_s=-1)
        assert [k for k, _ in backend.list("packs/")] == orphans
        report = push_workspace(h.store, h.ws, backend, config, "w1", head)
        assert report.segments == 1                      # the next push takes over
        assert gc_remote(backend, config, "store-x", grace_s=0).deleted == []  # named now


def test_gc_usage_refusals(tmp_path, capsys):
    store = tmp_path / "store"
    Store.open(store).close()
    code, recs = cli(capsys, "--store", store, "gc", "--dry-run")     # local: a plan
    assert code == 0 and recs[-1]["type"] == "gc" and recs[-1]["dry_run"] is True, recs
    code, recs = cli(capsys, "--store", store, "gc", "--remote", "nope")
    assert code == 3 and _error(recs)["code"] == "unknown-remote", recs
    for flag in (["--keep-epochs", "3"], ["--max-age", "30d"], ["--max-bytes", "1G"],
                 ["--drop-redo"]):   # local retention: silently ignored by --remote before
        code, recs = cli(capsys, "--store", store, "gc", "--remote", "origin", *flag)
        assert code == 3 and _error(recs)["code"] == "usage", (flag, recs)
        assert flag[0] in _error(recs)["message"], recs
    code, recs = cli(capsys, "--store", store, "gc", "--remote", "nope", "--grace", "soon")
    assert code == 3 and _error(recs)["code"] == "bad-amount", recs
