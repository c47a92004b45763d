"""``rewindfs log/rewind/redo/diff/show/gc`` on an unmounted workspace, in-process
(``overlay.cli.main``), against a real store; exit codes as in DESIGN.md."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from rewindfs.overlay.cli import main
from restorekit import History
from rewindfs.store import Store
from store_fixtures import assert_sound
from treesnap import compare, snapshot


class Env:
    def __init__(self, tmp_path):
        self.store_path = tmp_path / "store"
        self.root = tmp_path / "ws"
        self.root.mkdir()
        self.points = {}

    def history(self):
        """Two turns of session s1, then an edit by hand between turns."""
        with Store.open(self.store_path) as store:
            h = History(store, self.root)
            with open(h.p(b"keep.txt"), "wb") as f:
                f.write(b"from before\n")
            self.points[1] = h.turn(1)
            self.snap1 = snapshot(self.root)
            h.write(b"a.txt", b"one\ntwo\n")
            h.write(b"bin", bytes(range(256)))
            self.points[2] = h.turn(2)
            self.snap2 = snapshot(self.root)
            h.write(b"a.txt", b"one\nTWO\nthree\n")
            h.remove(b"keep.txt")
            h.mkdir(b"d")
            h.write(b"d/x", b"x\n")
            h.end_turn()
            h.write(b"by-hand.txt", b"typed between turns\n")
            h.close()
        self.snap_end = snapshot(self.root)

    def run(self, *argv, capfd):
        code = main(["--store", str(self.store_path), *argv])
        out, err = capfd.readouterr()
        return code, out, err

    def json(self, *argv, capfd):
        code, out, err = self.run(*argv, "--json", capfd=capfd)
        return code, [json.loads(line) for line in out.splitlines()], err

    def check_store(self):
        with Store.open(self.store_path, create=False) as store:
            assert_sound(store)


@pytest.fixture
def env(tmp_path, monkeypatch):
    e = Env(tmp_path)
    e.history()
    monkeypatch.chdir(e.root)
    yield e
    e.check_store()


def test_log_lists_every_epoch_newest_last(env, capfd):
    code, lines, _ = env.json("log", capfd=capfd)
    assert code == 0
    kinds = [(r["type"], r["kind"], r["turn"]) for r in lines]
    assert kinds[:2] == [("epoch", "turn", 1), ("epoch", "turn", 2)]
    assert [r["epoch"] for r in lines] == sorted(r["epoch"] for r in lines)
    code, out, _ = env.run("log", capfd=capfd)
    assert code == 0 and "turn 2" in out and "idle" in out


def test_log_n_shows_the_newest_points_only(env, capfd):
    """A long session's log printed every epoch, hundreds of rows, with no way to ask
    for the last few (``git log -n``)."""
    code, every, _ = env.json("log", capfd=capfd)
    assert code == 0 and len(every) == 3
    code, lines, _ = env.json("log", "-n", "2", capfd=capfd)
    assert code == 0 and lines == every[-2:]
    code, out, _ = env.run("log", "--max-count", "1", capfd=capfd)
    newest = f"e{every[-1]['epoch']}"
    assert code == 0 and newest in out and f"e{every[-2]['epoch']} " not in out, out
    code, nodes, _ = env.json("log", "--tree", capfd=capfd)
    code, lines, _ = env.json("log", "--tree", "-n", "2", capfd=capfd)
    assert code == 0 and lines == nodes[-2:]
    code, out, _ = env.run("log", "--tree", "--all", "-n", "2", capfd=capfd)
    drawn = [line for line in out.splitlines() if " e" in line or line.lstrip()[:1] in "@○↺↻"]
    assert code == 0 and len(drawn) == 2, out
    for bad in ("0", "-1", "x"):
        code, lines, _ = env.json("log", "-n", bad, capfd=capfd)
        assert code == 3 and lines[-1]["code"] == "usage", (bad, lines)


def test_dry_run_lists_plan_and_foreign_paths_and_changes_nothing(env, capfd):
    code, lines, _ = env.json("rewind", "2", "--session", "s1", "--dry-run", capfd=capfd)
    assert code == 0
    (planned,) = lines
    assert planned["type"] == "rewind.planned" and planned["target"] == env.points[2]
    changes = {c["path"]: c["change"] for c in planned["changes"]}
    assert changes == {"a.txt": "written", "keep.txt": "created", "d": "deleted",
                       "d/x": "deleted", "by-hand.txt": "deleted"}
    assert [(f["path"], f["kind"]) for f in planned["foreign"]] == [("by-hand.txt", "idle")]
    assert compare(env.snap_end, snapshot(env.root)) == []
    code, out, _ = env.run("rewind", "t2", "--dry-run", capfd=capfd)
    assert code == 0 and "by-hand.txt" in out and "between turns" in out


def test_rewind_redo_and_events(env, capfd):
    code, lines, _ = env.json("rewind", "t1", capfd=capfd)
    assert code == 0
    types = [r["type"] for r in lines]
    assert types[0] == "rewind.planned" and types[-1] == "rewind.done"
    assert {"rewind.written", "rewind.deleted"} <= set(types)
    assert all(r["v"] == 1 for r in lines)
    assert compare(env.snap1, snapshot(env.root)) == []
    code, _out, _ = env.run("redo", capfd=capfd)
    assert code == 0
    assert compare(env.snap_end, snapshot(env.root)) == []
    code, _out, _ = env.run("rewind", f"e{env.points[2]}", capfd=capfd)
    assert code == 0
    assert compare(env.snap2, snapshot(env.root)) == []


_COUNTED = ("written", "created", "deleted", "meta", "unchanged")


@pytest.mark.parametrize("argv", [["rewind", "t2"], ["rewind", "t1"], ["redo"]])
def test_what_is_done_is_what_the_dry_run_said(env, capfd, argv):
    """A redo's plan said "1 written, 2 created, 0 deleted, 1 metadata-only" and its
    end said "restored 5 path(s)": the directories whose times the engine set back
    after landing their entries (its own renames had moved them) were counted as
    restored, and reported one by one, though their net change was none.  What a
    rewind or redo does — counts and the paths it names — is what its dry run said."""
    if argv == ["redo"]:
        assert env.json("rewind", "t1", capfd=capfd)[0] == 0
    code, lines, _ = env.json(*argv, "--dry-run", capfd=capfd)
    assert code == 0
    (planned,) = lines
    code, lines, _ = env.json(*argv, capfd=capfd)
    assert code == 0
    done = lines[-1]
    assert done["type"] == "rewind.done", lines
    assert {k: done[k] for k in _COUNTED} == {k: planned[k] for k in _COUNTED}
    named = sorted(r["path"] for r in lines if r["type"] in ("rewind.written",
                                                               "rewind.deleted"))
    assert named == sorted(c["path"] for c in planned["changes"])


def test_path_option_limits_the_rewind(env, capfd):
    code, _out, _ = env.run("rewind", "t1", "--path", "a.txt", capfd=capfd)
    assert code == 0
    assert not os.path.exists(env.root / "a.txt")
    assert os.path.exists(env.root / "d/x") and os.path.exists(env.root / "bin")


@pytest.mark.parametrize("argv,code,error", [
    (["rewind", "-1"], 3, "relative-point"),
    (["rewind", "HEAD~1"], 3, "relative-point"),
    (["rewind", "~1"], 3, "relative-point"),
    (["rewind", "prev"], 3, "relative-point"),
    (["rewind", "last"], 3, "relative-point"),
    (["rewind", "e999"], 2, "unknown-point"),
    (["rewind", "t9"], 2, "unknown-point"),
    (["rewind", "t1", "--path", "../outside"], 3, "path-escape"),
    (["rewind", "t1", "--path", "/etc/passwd"], 3, "path-escape"),
    (["redo"], 2, "nothing-to-redo"),
    (["show", "t1", "a.txt"], 2, "absent"),
    (["show", "t1", "."], 2, "not-a-file"),     # was bad-params, the protocol's words
])
def test_bad_input_is_refused_and_changes_nothing(env, capfd, argv, code, error):
    got, lines, _ = env.json(*argv, capfd=capfd)
    assert got == code
    assert lines[-1]["type"] == "error" and lines[-1]["code"] == error, lines
    assert compare(env.snap_end, snapshot(env.root)) == []


def test_open_turn_refuses_unless_forced(env, capfd):
    with Store.open(env.store_path) as store:
        ws = store.workspace(os.fsencode(os.path.realpath(env.root)))
        store.begin_turn(ws, "s1", 3, "busy")
    code, lines, _ = env.json("rewind", "t1", capfd=capfd)
    assert code == 2 and lines[-1]["code"] == "turn-open"
    assert compare(env.snap_end, snapshot(env.root)) == []
    code, _lines, _ = env.json("rewind", "t1", "--force", capfd=capfd)
    assert code == 0
    assert compare(env.snap1, snapshot(env.root)) == []


def test_partial_rewind_exits_1_and_names_the_path(env, capfd):
    stuck = os.fsencode(env.root / "a.txt")
    subprocess.run(["chattr", "+i", stuck], check=True)
    try:
        code, lines, _ = env.json("rewind", "t2", capfd=capfd)
    finally:
        subprocess.run(["chattr", "-i", stuck], check=True)
    assert code == 1
    failed = [r for r in lines if r["type"] == "rewind.failed"]
    assert [f["path"] for f in failed] == ["a.txt"]
    assert lines[-1]["type"] == "rewind.done" and lines[-1]["failed"] == 1
    assert os.path.exists(env.root / "keep.txt") and not os.path.exists(env.root / "d")


def test_diff_and_show(env, capfd):
    code, out, _ = env.run("diff", "t2", capfd=capfd)
    assert code == 0
    assert "-two" in out and "+TWO" in out and "+three" in out
    code, lines, _ = env.json("diff", "t1", "t2", capfd=capfd)
    by_path = {r["path"]: r for r in lines}
    assert by_path["bin"]["summary"] == "Binary bin: absent → 256 bytes"
    assert "+one" in by_path["a.txt"]["diff"]
    code, out, _ = env.run("show", "t2", "a.txt", capfd=capfd)
    assert code == 0 and out == "one\ntwo\n"
    code, out, _ = env.run("show", "t1", "keep.txt", capfd=capfd)
    assert out == "from before\n"


def test_diff_name_status_and_name_only_list_what_changed_as_git_does(env, capfd):
    """After a turn that ran ``npm install`` a person asks what it touched: ``diff``
    printed every file's whole patch, and had no way to ask for the list alone
    (``git diff --name-status`` / ``--name-only``).  The list never reads content, so a
    name list of 20,000 installed files costs no file read."""
    with Store.open(env.store_path) as store:
        h = History(store, env.root)
        h.write(b"odd\nname", b"x")
        h.remove(b"bin")
        h.symlink(b"a.txt", b"bin")                      # a file became a symlink
        h.close()
    code, out, _ = env.run("diff", "--name-status", "t2", capfd=capfd)
    assert code == 0
    assert out.splitlines() == ["M\ta.txt", "T\tbin", "A\tby-hand.txt", "A\td",
                                "A\td/x", "D\tkeep.txt", 'A\t"odd\\nname"'], out
    code, names, _ = env.run("diff", "--name-only", "t2", "--path", "d", capfd=capfd)
    assert code == 0 and names.splitlines() == ["d", "d/x"], names
    code, recs, _ = env.json("diff", "--name-status", "t2", capfd=capfd)
    assert code == 0
    status = {r["path"]: r["status"] for r in recs if r["type"] == "diff.change"}
    assert status == {"a.txt": "M", "bin": "T", "keep.txt": "D", "d": "A", "d/x": "A",
                      "by-hand.txt": "A", "odd\nname": "A"}, recs
    assert all("diff" not in r for r in recs), recs      # no content was read
    code, out, _ = env.run("diff", "--name-only", "t2", "t2", capfd=capfd)
    assert code == 0 and out == "", out                  # nothing, for scripts
    code, out, err = env.run("diff", "--name-only", "--name-status", "t2", capfd=capfd)
    assert code == 3 and "not allowed with" in err, err


def _git(cwd, *args) -> bytes:
    return subprocess.run(["git", "-c", "core.quotePath=false", *args], cwd=cwd,
                          check=True, capture_output=True).stdout


def test_a_name_list_quotes_names_as_git_does_and_dash_z_gives_them_raw(env, capfd,
                                                                         tmp_path):
    """A script reads ``rewindfs diff --name-only`` one line per path, as it reads
    ``git diff --name-only``.  A name holding a newline came out as ``odd\\nname``:
    the same text as a real file named with a backslash and an ``n``, so the script
    could not tell which it was; git C-quotes such a name (``"odd\\nname"``), and
    ``-z`` gives every name raw, ended by a NUL.  Checked against git itself."""
    names = [b"sp ace", b"new\nline", b"tab\tq\"uote\\", b"caf\xc3\xa9", b"back\\n",
             b"caf\xc3\xa9\tt"]
    with Store.open(env.store_path) as store:
        h = History(store, env.root)
        for name in names[:3]:
            h.write(name, b"old\n")
        a = h.turn(3)
        h.write(names[0], b"new\n")          # M
        h.remove(names[1])                   # D
        h.remove(names[2])
        h.symlink(b"sp ace", names[2])       # T: a file became a symlink
        for name in names[3:]:
            h.write(name, b"added\n")        # A
        b = h.end_turn()
        h.close()
    repo = tmp_path / "git"
    repo.mkdir()
    _git(repo, "init", "-q")
    for name in names[:3]:
        (repo / os.fsdecode(name)).write_bytes(b"old\n")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "before")
    (repo / "sp ace").write_bytes(b"new\n")
    (repo / "new\nline").unlink()
    (repo / os.fsdecode(names[2])).unlink()
    os.symlink("sp ace", repo / os.fsdecode(names[2]))
    for name in names[3:]:
        (repo / os.fsdecode(name)).write_bytes(b"added\n")
    _git(repo, "add", "-A")
    paths = [arg for name in names for arg in ("--path", os.fsdecode(name))]
    for flags in (["--name-status"], ["--name-only"], ["--name-status", "-z"],
                  ["--name-only", "-z"]):
        want = _git(repo, "diff", "--cached", "--no-renames", *flags)
        code = main(["--store", str(env.store_path), "diff", f"e{a}", f"e{b}", *paths,
                     *flags])
        out, _ = capfd.readouterr()
        assert code == 0
        assert os.fsencode(out) == want, (flags, out, want)
    code = main(["--store", str(env.store_path), "diff", f"e{a}", "-z"])
    _, err = capfd.readouterr()
    assert code == 3 and "-z lists names" in err, err


def test_a_diff_in_json_is_a_patch_that_applies(env, capfd, tmp_path):
    """The ``diff`` field of ``--json`` lost the "\\ No newline at end of file" marker the
    terminal shows: ``-one+two`` ran two lines together, and ``patch`` made a different
    file from it.  A mode change beside a content change was shown by neither (git
    writes ``old mode``/``new mode``).  Now the field is the patch the terminal prints,
    and it turns the file at A into the file at B."""
    with Store.open(env.store_path) as store:
        h = History(store, env.root)
        h.write(b"t", b"no newline")
        a = h.turn(3)
        h.write(b"t", b"no newline\nmore")
        h.chmod(b"t", 0o700)
        b = h.end_turn()
        h.close()
    code, lines, _ = env.json("diff", f"e{a}", f"e{b}", "--path", "t", capfd=capfd)
    assert code == 0
    (change,) = lines
    patch_text = change["diff"]
    assert "\\ No newline at end of file" in patch_text, patch_text
    assert "old mode 100644" in patch_text and "new mode 100700" in patch_text, patch_text
    work = tmp_path / "apply"
    work.mkdir()
    (work / "t").write_bytes(b"no newline")
    res = subprocess.run(["patch", "-p1", "--no-backup-if-mismatch"], input=patch_text,
                         cwd=work, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (work / "t").read_bytes() == b"no newline\nmore"
    code, out, _ = env.run("diff", f"e{a}", f"e{b}", "--path", "t", capfd=capfd)
    assert code == 0 and "old mode 100644" in out and out.count("No newline") == 2, out


def test_diff_into_a_file_is_a_patch_that_applies(env, capfd, tmp_path):
    """``rewindfs diff A B > x.patch`` then ``patch -p1 < x.patch``: the terminal's
    rendering went into the file too — the tab after a name became spaces, so patch
    took ``sp`` for the name ``sp ace`` and made another file; a CRLF line ended in a
    literal ``\\r``, a form feed became ``\\x0c``.  Written to a file or pipe, the
    diff is now the patch itself, as ``diff -u`` and ``git diff`` write it; a name with
    a newline, tab, quote, backslash or bytes that are not UTF-8 is C-quoted in the
    headers as git quotes it (``"b/new\\nline"``), which patch and git apply read."""
    before = {b"sp ace": b"one\n", b"crlf.txt": b"a\r\nb\r\n", b"ff.c": b"x\n\x0c\ny\n",
              b"new\nline": b"1\n", b"tab\tq\"uote\\": b"2\n", b"\xff\xfebad": b"3\n",
              b"caf\xc3\xa9": b"4\n"}
    after = {b"sp ace": b"one\ntwo\n", b"crlf.txt": b"a\r\nB\r\n", b"ff.c": b"x\n\x0c\nY\n",
             b"new\nline": b"1\n1\n", b"tab\tq\"uote\\": b"2\n2\n", b"\xff\xfebad": b"3\n3\n",
             b"caf\xc3\xa9": b"4\n4\n"}
    with Store.open(env.store_path) as store:
        h = History(store, env.root)
        for name, data in before.items():
            h.write(name, data)
        a = h.turn(3)
        for name, data in after.items():
            h.write(name, data)
        b = h.end_turn()
        h.close()
    args = [arg for name in before for arg in ("--path", os.fsdecode(name))]
    code, out, _ = env.run("diff", f"e{a}", f"e{b}", *args, capfd=capfd)
    assert code == 0
    work = tmp_path / "apply"
    work.mkdir()
    for name, data in before.items():
        (work / os.fsdecode(name)).write_bytes(data)
    res = subprocess.run(["patch", "-p1", "--no-backup-if-mismatch", "--binary"],
                         input=out.encode(), cwd=work, capture_output=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert {os.fsencode(p.name): p.read_bytes() for p in work.iterdir()} == after


def test_a_diff_names_a_symlinks_target(env, capfd):
    """``lnk: absent → symlink`` said what it became but not where it points, the one
    thing a symlink holds (git shows the target as its content)."""
    with Store.open(env.store_path) as store:
        h = History(store, env.root)
        a = h.turn(3)
        h.symlink(b"a.txt", b"lnk")
        h.end_turn()
        h.close()
    code, out, _ = env.run("diff", f"e{a}", "--path", "lnk", capfd=capfd)
    assert code == 0 and "lnk: absent → symlink to a.txt" in out, out


def test_gc_and_not_a_workspace(env, capfd, tmp_path, monkeypatch):
    code, lines, _ = env.json("gc", "--max-bytes", "1G", capfd=capfd)
    assert code == 0 and lines[0]["type"] == "gc"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, lines, _ = env.json("rewind", "t1", capfd=capfd)
    assert code == 2 and lines[-1]["code"] == "not-a-workspace"


def test_subdirectory_of_a_workspace_works(env, capfd, monkeypatch):
    os.makedirs(env.root / "d", exist_ok=True)
    monkeypatch.chdir(env.root / "d")
    code, _out, _ = env.run("rewind", "t2", "--path", "x", capfd=capfd)
    assert code == 0
    assert not os.path.exists(env.root / "d/x")


def test_killed_cli_rewind_is_finished_by_the_next_rewind_or_redo_only(env, capfd):
    from mountkit import cli
    res = cli("rewind", "t1", store=env.store_path, cwd=env.root,
              env={"REWINDFS_FAULT_AFTER": "3"})
    assert res.returncode == -9
    half = snapshot(env.root)
    res = cli("log", store=env.store_path, cwd=env.root)   # read-only: names it only
    assert res.returncode == 0 and "interrupted rewind is pending" in res.stderr
    assert compare(half, snapshot(env.root)) == []
    res = cli("rewind", "t1", "--dry-run", store=env.store_path, cwd=env.root)
    assert res.returncode == 0 and compare(half, snapshot(env.root)) == []
    # redo: finishes the interrupted rewind first (and says so), then undoes it
    res = cli("redo", store=env.store_path, cwd=env.root)
    assert res.returncode == 0
    assert res.stderr.startswith("warning: finishing an interrupted rewind first")
    assert not [n for n in os.listdir(env.root) if n.startswith(".rewindfs~")]
    assert compare(env.snap_end, snapshot(env.root)) == []
    code, _out, _ = env.run("rewind", "t1", capfd=capfd)
    assert code == 0
    assert compare(env.snap1, snapshot(env.root)) == []
