"""Remote faults against a real S3 server (``rclone serve s3``, ``remotekit``): a server
killed in the middle of a push, damaged and deleted objects, two machines pushing one
workspace."""

from __future__ import annotations

import os

import pytest
from remotekit import (add_origin, build_history, cli, new_dir, push_done,  # noqa: F401
                       s3)  # s3: the fixture
from restorekit import History, open_history
from treesnap import compare, exact

from rewindfs.overlay.rewind.remote import capture_tree
from rewindfs.store import Store
from rewindfs.store._errors import RemoteUnreachable
from rewindfs.store.remote import (Lease, RemoteConfig, open_backend, push_workspace,
                                   read_workspace)
from rewindfs.store.remote._objects import (blob_name, decode_segment, encode_segment,
                                            segment_name)


def _restore(capsys, tmp_path, s3, ws_id, point, name="m", *extra):
    m = new_dir(tmp_path / name)
    add_origin(capsys, m / "store", s3)
    code, recs = cli(capsys, "--store", m / "store", "restore", "--from", "origin",
                     "--workspace", ws_id, "--point", point, m / "dir", *extra)
    return m, code, recs


def test_a_push_cut_by_the_server_dying_resumes_and_references_nothing_missing(
        s3, tmp_path, capsys):
    expected: dict = {}
    with open_history(new_dir(tmp_path / "a")) as h:
        for i in range(40):                       # enough small blobs for several batches
            h.write(b"f%02d" % i, os.urandom(40_000))
        build_history(h, expected)
        add_origin(capsys, h.store.path, s3)
        config = RemoteConfig("origin", *h.store.remote("origin")[:4])
        backend = open_backend(config)
        ws_id = "cut-push"
        h.store.bind_remote("origin", h.ws, ws_id)
        head = capture_tree(h.fd, h.store)
        seen = []

        def die_after_some(report, done, total):
            seen.append(report.objects)
            if report.objects == 3:
                s3.kill()                          # mid-push: objects 4.. never arrive

        with pytest.raises(RemoteUnreachable):
            push_workspace(h.store, h.ws, backend, config, ws_id, head,
                           progress=die_after_some, batch_bytes=200_000)
        s3.start()
        partial = read_workspace(backend, ws_id)
        assert partial.blobs and not partial.epochs      # blob segments only, no index
        done = push_done(capsys, h.store.path, h.root.decode())
        # resumed: what the first attempt listed in its segments was not sent again
        state = read_workspace(backend, ws_id)
        assert done["blobs"] == len(state.blobs) - len(partial.blobs) > 0
        _assert_every_reference_resolves(backend, state)
        code, recs = cli(capsys, "--store", h.store.path, "fsck", "--remote", "origin")
        assert code == 0 and recs[-1]["ok"], recs
    last = max(expected)
    m, code, recs = _restore(capsys, tmp_path, s3, ws_id, f"e{last}")
    assert code == 0, recs
    assert compare(expected[last], exact(m / "dir")) == []


def _assert_every_reference_resolves(backend, state) -> None:
    names = {k for k, _ in backend.list("")}
    hist = state.history()
    for _e, _p, img in hist.journal:
        if img.kind == "file":
            sha, _size, where = state.blobs[img.blob]
            assert (blob_name(sha) if where[0] == "b" else where[1]) in names


def _pushed(capsys, tmp_path, s3):
    expected: dict = {}
    with open_history(new_dir(tmp_path / "a")) as h:
        build_history(h, expected)
        add_origin(capsys, h.store.path, s3)
        done = push_done(capsys, h.store.path, h.root.decode())
        expected["head"] = exact(h.root)
        return expected, done["workspace"], h.store.path, h.root.decode()


def test_a_corrupt_pack_and_a_deleted_blob_are_named_and_the_rest_lands(s3, tmp_path, capsys):
    expected, ws_id, store, _root = _pushed(capsys, tmp_path, s3)
    with Store.open(store) as a:
        backend = open_backend(RemoteConfig("origin", *a.remote("origin")[:4]))
    code, recs = cli(capsys, "--store", store, "fsck", "--remote", "origin")
    assert code == 0 and recs[-1]["ok"] and recs[-1]["blobs_checked"] > 0, recs
    packs = [k for k, _ in backend.list("packs/")]
    blobs = [k for k, _ in backend.list("blobs/")]
    assert packs and blobs
    data = bytearray(backend.get(packs[0]))
    data[len(data) // 2] ^= 0xFF                    # one flipped byte in the middle
    backend.put(packs[0], bytes(data))              # through the API, so the server's
    backend.delete(blobs[0])                        # cache sees it; the 1.5 MB file's
    code, recs = cli(capsys, "--store", store, "fsck", "--remote", "origin")
    found = {(r["code"], r["object"]) for r in recs if r["type"] == "fsck.problem"}
    assert code == 1 and found == {("remote-object-corrupt", packs[0]),
                                   ("remote-object-missing", blobs[0])}, recs
    last = max(e for e in expected if e != "head")
    m, code, recs = _restore(capsys, tmp_path, s3, ws_id, f"e{last}")
    assert code == 1, recs
    done = [r for r in recs if r["type"] == "restore.done"][0]
    codes = {p["code"] for p in done["problems"]}
    assert codes == {"remote-object-corrupt", "remote-object-missing"}, done["problems"]
    named = {p for prob in done["problems"] for p in prob["paths"]}
    assert "large.bin" in named
    assert all(prob["epochs"] and prob["object"].startswith(("packs/", "blobs/"))
               for prob in done["problems"])
    # the paths that needed no damaged blob landed exactly
    tree, got = expected[last], exact(m / "dir")
    failed = {f["path"] for f in done["failed"]} | named
    ok = [p for p in tree[0] if os.fsdecode(p) not in failed and p in got[0]]
    assert ok and all(tree[0][p] == got[0][p] for p in ok if tree[0][p].kind != "dir")


def test_a_second_machine_pushing_the_same_workspace_is_refused_by_the_lease(
        s3, tmp_path, capsys):
    expected, ws_id, store_a, root_a = _pushed(capsys, tmp_path, s3)
    m, code, recs = _restore(capsys, tmp_path, s3, ws_id, "t3", name="b")
    assert code == 3 and recs[-1]["code"] == "ambiguous-point", recs   # s1's or s2's?
    assert not [r for r in recs if r["type"] == "restore.progress"]    # nothing fetched
    m, code, recs = _restore(capsys, tmp_path, s3, ws_id, "t3", "b2", "--session", "s1")
    assert code == 0, recs
    with Store.open(m / "store") as sb:             # an edit on b, captured as a mount would
        hb = History(sb, m / "dir")
        hb.write(b"from-b.txt", b"made on machine b\n")
        hb.close()
    with Store.open(store_a) as a:
        config = RemoteConfig("origin", *a.remote("origin")[:4])
        assert config.conditional is False           # rclone 1.75: the claims fallback
        lease = Lease(open_backend(config), "origin", ws_id, a.store_id(),
                      conditional=config.conditional)
        a_id = a.store_id()
    with lease:                                        # machine a is pushing
        code, recs = cli(capsys, "--store", m / "store", "push", "-C", m / "dir")
        assert code == 2, recs
        err = [r for r in recs if r["type"] == "error"][0]
        assert err["code"] == "lease-held" and a_id in err["message"], err
    # once a is done, b may push: its history extends the remote's
    done = push_done(capsys, m / "store", m / "dir")
    assert done["objects"] > 0
    # and a, which never saw b's epochs, is refused instead of forking the history
    code, recs = cli(capsys, "--store", store_a, "push", "-C", root_a)
    assert code == 2 and [r for r in recs if r["type"] == "error"][0]["code"] == \
        "remote-diverged", recs
    # a third machine gets a's points and b's tree: one history, pushed from two places
    b_tree = exact(m / "dir")
    c, code, recs = _restore(capsys, tmp_path, s3, ws_id, "t2", "c", "--session", "s1")
    assert code == 0, recs
    t2 = [r for r in recs if r["type"] == "restore.done"][0]["target"]
    assert compare(expected[t2], exact(c / "dir")) == []
    code, recs = cli(capsys, "--store", c / "store", "log", "-C", c / "dir")
    pushed = [r["epoch"] for r in recs if (r.get("label") or "").startswith("pushed tree")]
    assert len(pushed) == 2                    # b's import of a's tree, and c's of b's
    code, recs = cli(capsys, "--store", c / "store", "rewind", "-C", c / "dir",
                     f"e{pushed[-1]}")
    assert code == 0, recs
    assert compare(b_tree, exact(c / "dir")) == []
    code, recs = cli(capsys, "--store", c / "store", "rewind", "-C", c / "dir",
                     f"e{pushed[0]}")
    assert code == 0, recs
    assert compare(expected["head"], exact(c / "dir")) == []          # a's pushed tree


def test_restore_refuses_a_non_empty_directory_and_an_unknown_workspace(s3, tmp_path, capsys):
    _expected, ws_id, _store, _root = _pushed(capsys, tmp_path, s3)
    d = new_dir(tmp_path / "busy")
    (d / "x").write_bytes(b"x")
    add_origin(capsys, tmp_path / "s2", s3)
    code, recs = cli(capsys, "--store", tmp_path / "s2", "restore", "--from", "origin",
                     "--workspace", ws_id, "--point", "t1", d)
    assert code == 3 and recs[-1]["code"] == "restore-target-in-use"
    code, recs = cli(capsys, "--store", tmp_path / "s2", "restore", "--from", "origin",
                     "--workspace", "nope", "--point", "t1", tmp_path / "new")
    assert code == 3 and recs[-1]["code"] == "unknown-remote-workspace"
    code, recs = cli(capsys, "--store", tmp_path / "s2", "restore", "--from", "origin",
                     "--workspace", ws_id, "--point", "e999", tmp_path / "new2")
    assert code == 2 and recs[-1]["code"] == "unknown-point"
    with Store.open(tmp_path / "s2") as s:             # the refused import left nothing
        assert all(not s.epochs(ws) for ws, _root in s.workspaces())


def test_a_refused_restore_makes_no_directory_and_no_workspace(s3, tmp_path, capsys):
    """A restore refused for its point (a typo, an ambiguous turn) had made DIR and
    registered it as a workspace of the store; a ``rewindfs status`` there then opened
    an epoch for it, and the corrected restore was refused: "this store already has
    history for it".  Now the point is checked before anything is made, and the
    corrected command just works.  A DIR that cannot be made is named, no traceback."""
    _expected, ws_id, _store, _root = _pushed(capsys, tmp_path, s3)
    store = tmp_path / "s2"
    add_origin(capsys, store, s3)
    new = tmp_path / "new"
    code, recs = cli(capsys, "--store", store, "restore", "--from", "origin",
                     "--workspace", ws_id, "--point", "e999", new)
    assert code == 2 and recs[-1]["code"] == "unknown-point", recs
    assert not new.exists()
    with Store.open(store) as s:
        assert s.workspaces() == []
    code, recs = cli(capsys, "--store", store, "status", "-C", tmp_path)
    code, recs = cli(capsys, "--store", store, "restore", "--from", "origin",
                     "--workspace", ws_id, "--point", "t1", "--session", "s1", new)
    assert code == 0, recs
    code, recs = cli(capsys, "--store", store, "restore", "--from", "origin",
                     "--workspace", ws_id, "--point", "t1", "--session", "s1",
                     "/proc/rewindfs-no-such-dir")
    (err,) = [r for r in recs if r["type"] == "error"]
    assert code == 3 and err["code"] == "restore-target-in-use", recs
    assert "/proc/rewindfs-no-such-dir" in err["message"], err


def test_ctrl_c_during_a_push_says_what_it_left_and_the_next_push_completes(s3, tmp_path):
    """Ctrl-C while ``rewindfs push`` waits on a server that stopped answering: exit
    130 with a last line that says what is on the remote and how to resume (it used to
    end silently); the next push sends everything."""
    import signal
    import subprocess
    import sys
    import time

    with open_history(new_dir(tmp_path / "a")) as h:
        for i in range(10):
            h.write(b"f%02d" % i, os.urandom(20_000))
        h.turn(1)
        root, store = os.fsdecode(h.root), h.store.path
    env = dict(os.environ, **s3.env)
    rfs = [sys.executable, "-m", "rewindfs.overlay.cli", "--store", str(store)]
    subprocess.run([*rfs, "remote", "add", "origin", s3.url(), "--endpoint", s3.endpoint],
                   env=env, check=True, capture_output=True)
    s3.proc.send_signal(signal.SIGSTOP)            # connections open, nothing answers
    try:
        push = subprocess.Popen([*rfs, "push", "-C", str(root)], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(2)                                # blocked on the server by now
        push.send_signal(signal.SIGINT)
    finally:
        s3.proc.send_signal(signal.SIGCONT)
    out, err = push.communicate(timeout=120)
    assert push.returncode == 130, (out, err)
    assert err.strip(), "interrupted without a word"
    last = err.strip().splitlines()[-1]
    assert "push" in last and "interrupted" in last and "rewindfs push" in last, err
    done = subprocess.run([*rfs, "push", "-C", str(root)], env=env, text=True,
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "pushed" in done.stdout, done.stdout


@pytest.mark.parametrize("where", ["journal", "head"])
@pytest.mark.parametrize("bad", [b"../outside", b"/tmp/abs", b"x/../../up", b"a//b"])
def test_a_forged_segment_naming_a_path_outside_is_refused_as_corrupt(
        s3, tmp_path, capsys, where, bad):
    """Someone else who can write the bucket adds a well-formed segment (its name is
    its hash) whose journal or pushed tree names a path outside the workspace: the
    restore refuses it as a damaged remote object, naming the segment, before any
    blob is downloaded; nothing is written anywhere, and no workspace is made."""
    with open_history(new_dir(tmp_path / "a")) as h:
        h.turn(1)
        h.write(b"a.txt", b"one\n")
        h.end_turn()
        add_origin(capsys, h.store.path, s3)
        ws_id = push_done(capsys, h.store.path, h.root.decode())["workspace"]
        with Store.open(h.store.path) as a:
            backend = open_backend(RemoteConfig("origin", *a.remote("origin")[:4]))
    (key,) = [k for k, _ in backend.list(f"ws/{ws_id}/seg/")]
    seg = decode_segment(key, backend.get(key))
    image = dict((bytes(p), f) for p, f in seg["head"])[b"a.txt"]
    if where == "head":
        seg["head"] = [*seg["head"], [bad, image]]
    else:
        seg["journal"] = [*seg["journal"], [max(e[0] for e in seg["epochs"]), bad, image]]
    body = encode_segment(seg)
    forged = segment_name(ws_id, 2, body)
    backend.put(forged, body)
    m, code, recs = _restore(capsys, tmp_path, s3, ws_id, "t1")
    assert code == 2, recs
    assert [r["type"] for r in recs] == ["error"], recs      # no blob was fetched
    assert recs[0]["code"] == "remote-object-corrupt", recs
    assert forged in recs[0]["message"] and os.fsdecode(bad) in recs[0]["message"], recs
    assert not (m / "dir").exists() and not (tmp_path / "outside").exists()
    assert not os.path.exists("/tmp/abs")
    code, recs = cli(capsys, "--store", m / "store", "remote", "log", "origin")
    assert code == 2 and recs[-1]["code"] == "remote-object-corrupt", recs
    code, recs = cli(capsys, "--store", m / "store", "fsck", "--remote", "origin")
    found = [(r["code"], r["object"]) for r in recs if r["type"] == "fsck.problem"]
    assert code == 1 and found == [("remote-object-corrupt", forged)], recs
