"""Corruption: a damaged blob file, a damaged inline blob value or a damaged index entry is
reported by ``rewindfs fsck`` (exit 1, naming the journal paths that depend on it) and by
the rewind that needs it (``rewind.failed`` naming the path, exit 1), while every other
path of that rewind still lands.  A damaged journal *key* (the value sealed under the old
key) names the path it really belonged to; single-bit flips anywhere in the index are
either harmless or named, never restored wrong (the trial at the end).
"""

from __future__ import annotations

import json
import os

import pytest

from mountkit import cli, mounted
from restorekit import History
from rewindfs.store import Store
from rewindfs.store import _schema as S
from treesnap import snapshot

BIG = 1_300_000     # a blob file
SMALL = 3000        # an inline blob (random: stored raw)
TEXT = b"".join(b"line %d of a source file\n" % i for i in range(200))   # stored zstd


def _lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def _history(tmp_path):
    """Turn 1 rewrites four files; returns (store path, ws path, epoch, base files)."""
    ws, store_path = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    base = {b"big": os.urandom(BIG), b"small": os.urandom(SMALL),
            b"ok1": b"fine one", b"d/ok2": os.urandom(SMALL + 1), b"text": TEXT}
    (ws / "d").mkdir()
    for rel, data in base.items():
        (ws / os.fsdecode(rel)).write_bytes(data)
    with Store.open(store_path) as store:
        h = History(store, ws)
        try:
            epoch = h.turn(1)
            for rel in base:
                h.write(rel, b"changed " + rel)
            h.end_turn()
        finally:
            h.close()
    return store_path, ws, epoch, base


def _blob_of(store, ws_id, epoch, rel) -> bytes:
    return dict(store.journal(ws_id, epoch))[rel].blob


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]


def damage_blob_file(store, ws_id, epoch, rel) -> None:
    path = store.blobs.file_path(_blob_of(store, ws_id, epoch, rel))
    with open(path, "r+b") as f:
        f.seek(BIG // 2)
        byte = f.read(1)
        f.seek(BIG // 2)
        f.write(bytes([byte[0] ^ 0xFF]))


def _damage_payload(kind: int, offset: int):
    """A damage function flipping the inline payload of an entry of ``kind`` at ``offset``."""
    def damage(store, ws_id, epoch, rel) -> None:
        key = _blob_of(store, ws_id, epoch, rel)
        with store._w() as txn:
            size, where, touched, data = S.unpack(txn.get(key, db=store._db["blobs"]))
            assert where == kind
            txn.put(key, S.pack([size, where, touched, _flip(data, offset)]),
                    db=store._db["blobs"])
    return damage


damage_inline = _damage_payload(S.INLINE, 10)
damage_inline_zstd = _damage_payload(S.INLINE_ZSTD, 20)


def damage_journal(store, ws_id, epoch, rel) -> None:
    with store._w() as txn:
        txn.put(S.journal_key(ws_id, epoch, rel), b"\xc1garbage", db=store._db["journal"])


def damage_path_index(store, ws_id, epoch, rel) -> None:
    with store._w() as txn:
        assert txn.delete(S.touched_key(ws_id, rel, epoch), db=store._db["touched"])


DAMAGE = {"blob-file": (damage_blob_file, b"big"), "inline": (damage_inline, b"small"),
          "inline-zstd": (damage_inline_zstd, b"text"), "journal": (damage_journal, b"d/ok2")}


def test_lost_path_index_entry_is_reported_and_the_rewind_still_lands(tmp_path):
    """The per-path index entry of a pre-image is gone: fsck names the path; a whole
    rewind restores from the journal itself, so nothing is lost.  (A ``--path`` rewind
    looks paths up in that index and would miss it: run fsck first.)"""
    store_path, ws, epoch, base = _history(tmp_path)
    with Store.open(store_path) as store:
        damage_path_index(store, store.workspace(os.fsencode(ws)), epoch, b"ok1")
    res = cli("fsck", "--json", store=store_path)
    assert res.returncode == 1, res.stdout + res.stderr
    problems = [r for r in _lines(res.stdout) if r["type"] == "fsck.problem"]
    assert any(p["code"] == "index-mismatch" and "ok1" in p["paths"] for p in problems)
    res = cli("rewind", f"e{epoch}", "-C", ws, "--json", store=store_path)
    assert res.returncode == 0, res.stdout + res.stderr
    tree, _ = snapshot(ws)
    assert {rel: tree[rel].data for rel in base} == base


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damage_is_named_and_the_rest_lands(tmp_path, kind):
    store_path, ws, epoch, base = _history(tmp_path)
    damage, victim = DAMAGE[kind]
    with Store.open(store_path) as store:
        ws_id = store.workspace(os.fsencode(ws))
        damage(store, ws_id, epoch, victim)

    res = cli("fsck", "--json", store=store_path)
    assert res.returncode == 1, res.stdout + res.stderr
    problems = [r for r in _lines(res.stdout) if r["type"] == "fsck.problem"]
    assert any(os.fsdecode(victim) in p.get("paths", ()) for p in problems), problems

    res = cli("rewind", f"e{epoch}", "-C", ws, "--json", store=store_path)
    assert res.returncode == 1, res.stdout + res.stderr
    records = _lines(res.stdout)
    failed = [r["path"] for r in records if r["type"] == "rewind.failed"]
    assert failed == [os.fsdecode(victim)], records
    tree, _ = snapshot(ws)
    for rel, data in base.items():
        if rel != victim:
            assert tree[rel].data == data, rel
    assert tree[victim].data == b"changed " + victim   # left as it was, not torn
    assert not [p for p in tree if os.path.basename(p).startswith(b".rewindfs~")]


def _move_journal_key(at: int):
    """A damage function flipping one bit of the victim's journal *key* (the value
    moves with it): byte ``at`` of the key (0-3 workspace, 4-11 epoch, 12- path)."""
    def damage(store, ws_id, epoch, rel) -> None:
        key = S.journal_key(ws_id, epoch, rel)
        with store._w() as txn:
            raw = txn.get(key, db=store._db["journal"])
            assert txn.delete(key, db=store._db["journal"])
            txn.put(key[:at] + bytes([key[at] ^ 1]) + key[at + 1:], raw,
                    db=store._db["journal"])
    return damage


@pytest.mark.parametrize("at", [2, 11, 14], ids=["workspace", "epoch", "path"])
def test_a_damaged_journal_key_names_the_real_path(tmp_path, at):
    """A value is sealed together with its key, so an entry whose key was damaged does
    not restore its pre-image under another name, another epoch or another workspace;
    the per-path index and the epoch's entry count name the path it really belongs to,
    the rest lands, exit 1, and fsck says so too."""
    store_path, ws, epoch, base = _history(tmp_path)
    victim = b"d/ok2"
    with Store.open(store_path) as store:
        _move_journal_key(at)(store, store.workspace(os.fsencode(ws)), epoch, victim)
    res = cli("fsck", "--json", store=store_path)
    assert res.returncode == 1, res.stdout + res.stderr
    problems = [r for r in _lines(res.stdout) if r["type"] == "fsck.problem"]
    assert any("d/ok2" in p["paths"] for p in problems), problems
    res = cli("rewind", f"e{epoch}", "-C", ws, "--json", store=store_path)
    assert res.returncode == 1, res.stdout + res.stderr
    failed = {r["path"]: r for r in _lines(res.stdout) if r["type"] == "rewind.failed"}
    assert "d/ok2" in failed and failed["d/ok2"]["code"] == "index-corrupt", failed
    assert f"epoch {epoch}" in failed["d/ok2"]["message"]
    tree, _ = snapshot(ws)
    assert tree[victim].data == b"changed " + victim
    for rel, data in base.items():
        if rel != victim:
            assert tree[rel].data == data, rel
    assert set(tree) == {b"big", b"small", b"ok1", b"d", b"d/ok2", b"text"}


@pytest.mark.mount
def test_a_flipped_bit_in_a_journal_value_is_named_through_the_daemon(tmp_path):
    """One bit of a sealed journal value (its mode: the setgid bit) flipped: the
    daemon's rewind does not restore it (the checksum fails), names the path and the
    epoch in ``failed``, lands the rest, and answers ``exit_code`` 1."""
    store_path, ws, epoch, base = _history(tmp_path)
    victim = b"ok1"
    with Store.open(store_path) as store:
        key = S.journal_key(store.workspace(os.fsencode(ws)), epoch, victim)
        with store._w() as txn:
            raw = txn.get(key, db=store._db["journal"])
            value = S.unpack(raw[:-S.CHECKSUM])
            value[0][1] ^= 0o2000                     # the mode's setgid bit
            txn.put(key, S.pack(value) + raw[-S.CHECKSUM:], db=store._db["journal"])
    with mounted(ws, store_path) as m:
        res = m.call("rewind", to=f"e{epoch}")
    assert res["exit_code"] == 1, res
    assert [(f["path"], f["code"]) for f in res["failed"]] == [("ok1", "index-corrupt")]
    assert f"epoch {epoch}" in res["failed"][0]["message"]
    tree, _ = snapshot(ws)
    assert tree[victim].data == b"changed ok1" and not tree[victim].mode & 0o2000
    for rel, data in base.items():
        if rel != victim:
            assert tree[rel].data == data, rel


# -- single-bit flips anywhere in the index (issue 12, item 5) ------------------------------
#
# A store with a realistic history (three turns over ~170 paths: contents, modes with
# setgid bits, xattrs, symlinks, renames, deletions) is compacted into one data.mdb, so
# nearly every byte of the file belongs to a live page.  Each trial flips one bit of a
# copy, puts the workspace back as the history left it, and runs ``fsck`` and an offline
# ``rewind`` in a forked child (a crash of LMDB's C code cannot take the test down, and is
# itself a failure).  Acceptable outcomes only: the rewind lands the exact tree of the
# point; or it exits 1 and every path it left wrong is named in ``rewind.failed`` (and
# fsck is not ok); or it exits 2 with a clear error having changed nothing (or having
# landed the exact tree: LMDB may report a damaged page only when the closing
# transaction writes near it).  Never a silently wrong tree, never a raw exception.
# One thing record checksums cannot prevent: LMDB's C code itself crashing (SIGBUS,
# SIGABRT on an assertion) on a damaged *page structure* (a page number or node offset
# in a branch page).  Such a trial is counted apart and must have left the workspace
# untouched (it happens while planning or in fsck, before any change).

import contextlib
import dataclasses
import io
import random
import shutil
import signal
import traceback

import lmdb

from relkit import trials
from tmpfskit import small_tmpfs

FLIP_TRIALS = 150


def _flip_history(tmp_path):
    """(store path, ws path, {point epoch: expected snapshot}) of a three-turn history."""
    ws, store_path = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    rng = random.Random(12)
    for d in ("src", "src/pkg", "src/pkg/sub", "docs", "bin", "shared", "data"):
        (ws / d).mkdir()
    os.chmod(ws / "shared", 0o2775)
    files = []
    for i in range(120):
        rel = ("src/m%d.py", "src/pkg/p%d.py", "src/pkg/sub/s%d.c", "docs/d%d.md",
               "data/r%d.bin")[i % 5] % i
        data = (b"def f%d():\n    return %d\n" % (i, i)) * rng.randrange(1, 4) \
            if i % 5 != 4 else rng.randbytes(rng.randrange(10, 300))
        (ws / rel).write_bytes(data)
        files.append(rel.encode())
    for i in range(8):
        p = ws / f"bin/tool{i}"
        p.write_bytes(b"#!/bin/sh\necho %d\n" % i)
        os.chmod(p, (0o755, 0o2755, 0o4755, 0o700)[i % 4])
    for i in range(10):
        os.setxattr(ws / os.fsdecode(files[i * 3]), b"user.tag", b"v%d" % i)
    for i in range(6):
        os.symlink(f"../src/m{i * 5}.py", ws / f"shared/link{i}")
    (ws / "shared/notes").write_bytes(b"group notes\n")
    points = {}
    with Store.open(store_path) as store:
        h = History(store, ws)
        try:
            for turn in (1, 2, 3):
                points[h.turn(turn)] = _snap(ws)
                for rel in rng.sample(files, 25):
                    if (ws / os.fsdecode(rel)).exists():
                        h.write(rel, b"turn %d rewrote %s\n" % (turn, rel) * rng.randrange(1, 3))
                for rel in rng.sample(files, 6):
                    if (ws / os.fsdecode(rel)).exists():
                        h.chmod(rel, rng.choice((0o2755, 0o600, 0o4711, 0o640)))
                for rel in rng.sample(files, 6):
                    if (ws / os.fsdecode(rel)).exists():
                        h.setxattr(rel, b"user.tag", b"turn%d" % turn)
                for i in range(5):
                    h.write(b"src/new%d_%d.py" % (turn, i), b"new in turn %d\n" % turn)
                h.symlink(b"../docs/d3.md", b"shared/t%d" % turn)
                h.remove(b"shared/link%d" % turn)
                h.chmod(b"shared", (0o775, 0o2770, 0o2775)[turn - 1])
                if turn == 2:
                    h.rename(b"src/pkg/sub", b"src/pkg/moved")
                if turn == 3:
                    h.remove(b"docs")
                h.end_turn()
        finally:
            h.close()
    return store_path, ws, points


def _snap(ws):
    """``snapshot`` with the mtimes of files (a directory's changes with every entry
    made in it, which this history does not capture)."""
    tree, links = snapshot(ws, mtimes=True)
    return {p: n if n.kind != "dir" else dataclasses.replace(n, mtime_ns=None)
            for p, n in tree.items()}, links


def _compact(store_path, into) -> bytes:
    """The store's index compacted into one data.mdb (every page live); its bytes."""
    env = lmdb.open(os.fspath(store_path / "index"), max_dbs=32, readonly=True, lock=False)
    try:
        env.copy(os.fspath(into), compact=True)
    finally:
        env.close()
    return (into / "data.mdb").read_bytes()


def _in_child(argv_list):
    """Run each CLI argv in-process in a forked child: ``(results, crash)`` — one
    ``[exit code, stdout]`` per argv that finished, and the signal that killed the
    child (or why it failed) if it did not finish them all."""
    from rewindfs.overlay.cli import main
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # child: never returns into pytest
        code = 0
        try:
            os.close(r)
            pipe = os.fdopen(w, "w")
            for argv in argv_list:
                buf = io.StringIO()
                try:
                    with contextlib.redirect_stdout(buf), \
                            contextlib.redirect_stderr(io.StringIO()):
                        rc = main(argv)
                except BaseException as exc:   # a raw exception: what the test forbids
                    where = traceback.extract_tb(exc.__traceback__)[-1]
                    rc = f"raw {type(exc).__name__}: {exc} ({where.filename}:{where.lineno})"
                pipe.write(json.dumps([rc, buf.getvalue()]) + "\n")
                pipe.flush()
            pipe.close()
        except BaseException:
            code = 70
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        text = f.read()
    _, status = os.waitpid(pid, 0)
    done = [json.loads(line) for line in text.splitlines()]
    if os.WIFSIGNALED(status):
        return done, signal.Signals(os.WTERMSIG(status)).name
    if os.WEXITSTATUS(status) != 0 or len(done) != len(argv_list):
        return done, f"child exited {os.WEXITSTATUS(status)}"
    return done, None


def _wrong_paths(expected, actual) -> set[bytes]:
    (tree_e, _), (tree_a, _) = expected, actual
    return {p for p in set(tree_e) | set(tree_a) if tree_e.get(p) != tree_a.get(p)}


def _judge(expected, final, after, fsck, rewind) -> str | None:
    """None if the trial's outcome is acceptable, else why not."""
    if isinstance(fsck[0], str) or isinstance(rewind[0], str):
        return f"raw exception: fsck {fsck[0]!r}, rewind {rewind[0]!r}"
    wrong = _wrong_paths(expected, after)
    records = _lines(rewind[1])
    if rewind[0] == 0:
        return f"exit 0 but {len(wrong)} paths wrong: {sorted(wrong)[:5]}" if wrong else None
    if rewind[0] == 1:
        named = {os.fsencode(r["path"]) for r in records if r["type"] == "rewind.failed"}
        unnamed = wrong - named
        if unnamed:
            return f"exit 1 but {len(unnamed)} wrong paths unnamed: {sorted(unnamed)[:5]}"
        if fsck[0] == 0:
            return "the rewind named damage that fsck did not report"
        return None
    if rewind[0] == 2:   # could not run (or finish its bookkeeping): all or nothing
        changed = _wrong_paths(final, after)
        if changed and wrong:
            return f"exit 2 having changed {sorted(changed)[:5]}, yet {len(wrong)} " \
                   f"paths wrong: {sorted(wrong)[:5]}"
        return None
    return f"unexpected exit code {rewind[0]}"


@pytest.fixture(scope="module")
def flip_base(tmp_path_factory):
    """The history on a tmpfs (hundreds of rewinds' fsyncs and syncfs cost nothing)."""
    with small_tmpfs(tmp_path_factory.mktemp("flip") / "mnt", "256m") as top:
        store_path, ws, points = _flip_history(top)
        base = top / "base"
        base.mkdir()
        data = _compact(store_path, base)
        final = top / "final"
        shutil.copytree(ws, final, symlinks=True)
        yield store_path, ws, points, data, final, _snap(ws)


def test_single_bit_flips_in_the_index_are_named_never_restored_wrong(flip_base):
    """Flip one bit of the index per trial: the rewind is exact, or names the damage."""
    store_path, ws, points, data, final, final_snap = flip_base
    failures, tally = [], {}
    seeds = trials(FLIP_TRIALS)
    for seed in seeds:
        rng = random.Random(seed)
        bit = rng.randrange(len(data) * 8)
        point = rng.choice(sorted(points))
        flipped = bytearray(data)
        flipped[bit // 8] ^= 1 << (bit % 8)
        shutil.rmtree(store_path / "index")
        (store_path / "index").mkdir(mode=0o700)
        (store_path / "index" / "data.mdb").write_bytes(flipped)
        shutil.rmtree(ws)
        shutil.copytree(final, ws, symlinks=True)
        store = os.fspath(store_path)
        res, crash = _in_child([["--store", store, "fsck", "--json"],
                                ["--store", store, "rewind", f"e{point}", "-C",
                                 os.fspath(ws), "--json"]])
        if crash is None:
            why = _judge(points[point], final_snap, _snap(ws), *res)
            outcome = {0: "exact", 1: "named", 2: "refused"}.get(res[1][0])
        else:   # see the note above: the workspace must not have been touched
            after = _snap(ws)
            step = ("fsck", "rewind")[len(res)]
            why = None if not _wrong_paths(final_snap, after) else \
                f"{crash} in {step} after changing the workspace"
            outcome = f"lmdb-{crash}-in-{step}"
        if why is not None:
            failures.append(f"seed {seed} (byte {bit // 8} bit {bit % 8}, e{point}): {why}")
        else:
            tally[outcome] = tally.get(outcome, 0) + 1
            tally["fsck-flagged"] = tally.get("fsck-flagged", 0) + (res[0][0] != 0
                                                                    if res else 1)
    print(f"{len(seeds)} trials, {len(failures)} failures {tally}")
    assert not failures, "\n".join(failures)
