"""Real programs inside the mount behave as on the bare directory.

Each workload runs twice — in a bare directory and inside a mounted workspace — and
the resulting trees (names, kinds, modes, contents, symlink targets) and outputs must
be equal.  Afterwards the store must hold sound pre-images of what changed.
"""

from __future__ import annotations

import hashlib
import io
import os
import sqlite3
import stat
import subprocess
import tarfile

import pytest

from mountkit import mounted

pytestmark = pytest.mark.mount

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid",
    "GIT_AUTHOR_DATE": "2020-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2020-01-01T00:00:00Z",
    "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent",
}


@pytest.fixture(scope="module")
def m(tmp_path_factory):
    base = tmp_path_factory.mktemp("progs")
    with mounted(base / "ws", base / "store") as mnt:
        yield mnt
    from rewindfs.store import Store
    with Store.open(base / "store") as s:
        assert s.fsck().ok


def tree(root, skip=()) -> dict:
    """Everything below *root*: relpath → (kind, mode, content digest / target)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        dirnames[:] = [d for d in dirnames if os.path.normpath(os.path.join(rel_dir, d))
                       not in skip]
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.normpath(os.path.join(rel_dir, name))
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("symlink", os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                with open(full, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
                out[rel] = ("file", stat.S_IMODE(st.st_mode), digest)
    return out


def both(m, tmp_path, name, fn):
    """Run ``fn(dir)`` in a bare dir and in the mount; return both results."""
    bare = tmp_path / f"bare-{name}"
    inside = m.ws / name
    bare.mkdir()
    inside.mkdir()
    return fn(bare), fn(inside), bare, inside


def run(cmd, cwd, **kw):
    env = dict(os.environ, **GIT_ENV)
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, **kw)
    assert res.returncode == 0, (cmd, res.stdout, res.stderr)
    return res.stdout


def test_git(m, tmp_path):
    def work(d):
        out = []
        run(["git", "init", "-q", "-b", "main"], d)
        for i in range(30):
            os.makedirs(d / f"pkg{i % 5}", exist_ok=True)
            (d / f"pkg{i % 5}" / f"mod{i}.py").write_text(f"x = {i}\n" * (i + 1))
        run(["git", "add", "-A"], d)
        run(["git", "commit", "-q", "-m", "first"], d)
        (d / "pkg1" / "mod1.py").write_text("changed\n")
        os.unlink(d / "pkg2" / "mod2.py")
        (d / "new.txt").write_text("new\n")
        out.append(run(["git", "status", "--porcelain"], d))
        run(["git", "commit", "-q", "-am", "second"], d)
        run(["git", "add", "new.txt"], d)
        run(["git", "commit", "-q", "-m", "third"], d)
        out.append(run(["git", "log", "--format=%H %s"], d))
        out.append(run(["git", "status", "--porcelain"], d))
        run(["git", "fsck", "--strict"], d)
        run(["git", "gc", "-q"], d)
        out.append(run(["git", "log", "--format=%H %s"], d))
        return out

    a, b, bare, inside = both(m, tmp_path, "git", work)
    assert a == b
    assert b[1].count("\n") == 3 and b[2] == ""
    assert tree(bare, skip={".git"}) == tree(inside, skip={".git"})


def _tarball(n=600) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for i in range(n):
            data = (f"file {i}\n" * (i % 50)).encode()
            info = tarfile.TarInfo(f"proj/d{i % 17}/sub{i % 3}/f{i}.txt")
            info.size = len(data)
            info.mode = 0o644 if i % 7 else 0o755
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("proj/link")
        link.type = tarfile.SYMTYPE
        link.linkname = "d1/sub1/f1.txt"
        tar.addfile(link)
        hard = tarfile.TarInfo("proj/hard")
        hard.type = tarfile.LNKTYPE
        hard.linkname = "proj/d2/sub2/f2.txt"
        tar.addfile(hard)
    return buf.getvalue()


def test_tar_extract(m, tmp_path):
    ball = tmp_path / "x.tar.gz"
    ball.write_bytes(_tarball())
    a, b, bare, inside = both(m, tmp_path, "tar", lambda d: run(["tar", "xzf", ball], d))
    assert tree(bare) == tree(inside)
    assert os.stat(inside / "proj" / "hard").st_nlink == 2


def test_compileall_and_sed(m, tmp_path):
    def work(d):
        for i in range(40):
            os.makedirs(d / "src" / f"p{i % 4}", exist_ok=True)
            (d / "src" / f"p{i % 4}" / f"m{i}.py").write_text(
                f"def f{i}():\n    return {i}  # OLD\n")
        run(["python3", "-m", "compileall", "-q", "src"], d)
        run(["sed", "-i", "s/OLD/NEW/", *[f"src/p0/m{i}.py" for i in range(0, 40, 4)]], d)
        return sorted(p for p in tree(d) if p.endswith(".pyc"))

    a, b, bare, inside = both(m, tmp_path, "py", work)
    assert a == b and len(a) == 40
    t_bare, t_in = tree(bare), tree(inside)
    strip = {k: v for k, v in t_bare.items() if not k.endswith(".pyc")}
    assert strip == {k: v for k, v in t_in.items() if not k.endswith(".pyc")}
    assert (inside / "src" / "p0" / "m0.py").read_text().endswith("# NEW\n")


def test_sed_in_place_captures_old_content(m, tmp_path):
    d = m.ws / "sedcap"
    d.mkdir()
    (d / "conf").write_text("key = OLD\n")
    epoch = m.call("turn.begin", session="progs", turn=1, label="sed")["epoch"]
    run(["sed", "-i", "s/OLD/NEW/", "conf"], d)
    m.call("turn.end")
    with m.open_store() as s:
        ws = s.workspace(os.fsencode(os.path.realpath(m.ws)))
        j = dict(s.journal(ws, epoch))
        assert s.read_blob(j[b"sedcap/conf"].blob) == b"key = OLD\n"
    assert (d / "conf").read_text() == "key = NEW\n"


def test_rm_rf(m, tmp_path):
    def work(d):
        for i in range(200):
            os.makedirs(d / "t" / f"a{i % 9}" / f"b{i % 4}", exist_ok=True)
            (d / "t" / f"a{i % 9}" / f"b{i % 4}" / f"f{i}").write_text("x" * i)
        os.symlink("a1", d / "t" / "sym")
        run(["rm", "-rf", "t"], d)
        return sorted(os.listdir(d))

    a, b, bare, inside = both(m, tmp_path, "rm", work)
    assert a == b == []


def test_sqlite_many_small_writes(m, tmp_path):
    def work(d):
        db = sqlite3.connect(d / "app.db")
        db.execute("create table t (k integer primary key, v text)")
        for i in range(300):
            with db:  # one transaction (journal create/write/fsync/unlink) per insert
                db.execute("insert into t (v) values (?)", (f"value {i}" * (i % 13),))
        with db:
            db.execute("update t set v = upper(v) where k % 3 = 0")
            db.execute("delete from t where k % 5 = 0")
        rows = db.execute("select count(*), sum(length(v)) from t").fetchone()
        db.close()
        cli = run(["sqlite3", "app.db", "pragma integrity_check; select count(*) from t;"], d)
        return rows, cli

    a, b, bare, inside = both(m, tmp_path, "sqlite", work)
    assert a == b
    assert b[1].split() == ["ok", str(a[0][0])]


def test_sqlite_wal_mode(m, tmp_path):
    def work(d):
        db = sqlite3.connect(d / "wal.db")
        db.execute("pragma journal_mode=wal")
        db.execute("create table t (k integer primary key, v blob)")
        for i in range(200):
            with db:
                db.execute("insert into t (v) values (?)", (os.urandom(0) + b"x" * i,))
        db.execute("pragma wal_checkpoint(truncate)")
        res = db.execute("select count(*), sum(length(v)) from t").fetchone()
        db.close()
        return res

    a, b, _, _ = both(m, tmp_path, "wal", work)
    assert a == b == (200, sum(range(200)))
