"""Issue 14, "small things seen" and invalid ignore rules, as a person meets them on an
unmounted workspace: real ``rewindfs`` subprocesses against a real store (no FUSE).

Each test failed on the code before issue 14: raw ``ValueError`` from a bad
``.rewindignore``, ``ESC`` bytes from session names and labels reaching the terminal,
``b'…'`` and bare epoch numbers in messages, "nothing to change" for a path no point
knows, options without help, and a ``log`` table wider than 80 columns.
"""

from __future__ import annotations

import json
import os

import pytest

from mountkit import cli
from restorekit import History
from rewindfs.store import Store
from treesnap import snapshot

ESC_SESSION = "\x1b[31mred"
ESC_LABEL = "fix \x1b]0;pwned\x07 the \x1b[2J build"
LONG_LABEL = "refactor the parser so that every error names its line " * 4


@pytest.fixture
def ws(tmp_path):
    """A workspace with history: turn 1 of a session named with an escape sequence
    (label with escapes too), turn 2 with a long label, then an idle edit."""
    root = tmp_path / "ws"
    root.mkdir()
    store_path = tmp_path / "store"
    with Store.open(store_path) as store:
        h = History(store, root)
        h.write(b"a.txt", b"one\n")
        h.mkdir(b"d")
        store.begin_turn(h.ws, ESC_SESSION, 1, ESC_LABEL)
        h.write(b"a.txt", b"two\n")
        h.write(b"d/x", b"x\n")
        store.begin_turn(h.ws, ESC_SESSION, 2, LONG_LABEL)
        h.write(b"a.txt", b"three\n")
        h.end_turn()
        h.close()
    return root, store_path


def run(ws, *args, env=None):
    root, store_path = ws
    return cli(*args, store=store_path, cwd=root, env=env)


# -- invalid .rewindignore, offline ----------------------------------------------------------

@pytest.mark.parametrize("command", [["rewind", "e1"], ["redo"], ["rewind", "e1", "--dry-run"]])
def test_offline_rewind_with_invalid_ignore_file_exits_2_with_the_line(ws, command):
    root, _ = ws
    if command == ["redo"]:
        assert run(ws, "rewind", "e2").returncode == 0
    (root / ".rewindignore").write_text("*.log\n\n!\nbuild/\n")
    before = snapshot(root)
    res = run(ws, *command)
    assert res.returncode == 2, res
    assert "Traceback" not in res.stderr and "ValueError" not in res.stderr
    assert "`.rewindignore` line 3: invalid pattern `!`" in res.stderr, res.stderr
    assert snapshot(root) == before
    js = run(ws, "--json", *command)
    err = [json.loads(line) for line in js.stdout.splitlines()][-1]
    assert err["type"] == "error" and err["code"] == "bad-ignore-rules" and js.returncode == 2


def test_ignore_rules_name_the_first_bad_line(tmp_path):
    from rewindfs.overlay.errors import BadIgnoreRules
    from rewindfs.overlay.tree.ignore import IgnoreRules

    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        (tmp_path / ".rewindignore").write_bytes(b"# c\r\nok/\r\nfoo\\\r\n!\n")
        with pytest.raises(BadIgnoreRules) as exc:
            IgnoreRules.load(fd)
        assert exc.value.details["line"] == 3
        assert "`.rewindignore` line 3: invalid pattern `foo\\`" in exc.value.message
        (tmp_path / ".rewindignore").write_bytes(b"ok/\n[z-a]\n")  # a range backwards
        with pytest.raises(BadIgnoreRules) as exc:
            IgnoreRules.load(fd)
        assert "`.rewindignore` line 2: invalid pattern `[z-a]`" in exc.value.message
        (tmp_path / ".rewindignore").unlink()
        (tmp_path / ".rewindignore").mkdir()     # not a file: no rules, no crash
        assert not IgnoreRules.load(fd)
    finally:
        os.close(fd)


# -- control characters ---------------------------------------------------------------------

def test_log_and_rewind_escape_control_characters(ws):
    root, _ = ws
    res = run(ws, "log", env={"COLUMNS": "200"})
    assert res.returncode == 0, res.stderr
    assert "\x1b" not in res.stdout and "\x07" not in res.stdout
    assert "\\x1b[31mred" in res.stdout
    res = run(ws, "rewind", "1", "--session", ESC_SESSION, "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "\x1b" not in res.stdout + res.stderr
    # an error naming the session: no escape sequence either
    res = run(ws, "rewind", "7", "--session", ESC_SESSION)
    assert res.returncode == 2
    assert "\x1b" not in res.stderr and "\\x1b" in res.stderr, res.stderr
    # --json keeps the text exactly
    js = run(ws, "--json", "log")
    labels = [json.loads(line).get("label") for line in js.stdout.splitlines()]
    assert ESC_LABEL in labels and LONG_LABEL.split("\n")[0] in labels


# -- messages name points and paths as the user types them ----------------------------------

def test_messages_name_points_and_paths_as_typed(ws):
    root, _ = ws
    res = run(ws, "rewind", "e99")
    assert res.returncode == 2
    assert "No point e99 " in res.stderr, res.stderr
    res = run(ws, "show", "e2", "d")
    assert res.returncode == 2
    assert "b'" not in res.stderr and "d is a dir at point e2" in res.stderr, res.stderr
    res = run(ws, "show", "e2", b"../caf\xe9")
    assert res.returncode == 3
    assert "Path ../caf\\xe9 escapes the workspace" in res.stderr, res.stderr


def test_unknown_path_dry_run_says_not_recorded(ws):
    res = run(ws, "rewind", "e2", "--path", "nowhere.txt", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "nowhere.txt: not recorded at that point" in res.stdout, res.stdout
    assert "nothing to change" not in res.stdout
    js = run(ws, "--json", "rewind", "e2", "--path", "nowhere.txt", "--dry-run")
    planned = [json.loads(line) for line in js.stdout.splitlines()][0]
    assert planned["unrecorded"] == ["nowhere.txt"]
    # a path that is recorded keeps its plan
    res = run(ws, "rewind", "e2", "--path", "a.txt", "--dry-run")
    assert "a.txt" in res.stdout and "not recorded" not in res.stdout


# -- help ---------------------------------------------------------------------------------

def _subparsers(parser, prefix=()):
    import argparse
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield prefix + (name,), sub
                yield from _subparsers(sub, prefix + (name,))


def test_every_option_and_positional_has_help():
    import argparse
    from rewindfs.overlay.cli import build_parser
    parser, _ = build_parser()
    missing, dirs = [], {}
    for name, sub in _subparsers(parser):
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction) or action.help == argparse.SUPPRESS:
                continue
            if not (action.help or "").strip():
                missing.append(f"{' '.join(name)} {action.option_strings or action.metavar}")
            if "--dir" in action.option_strings:
                dirs[" ".join(name)] = (tuple(action.option_strings), action.metavar, action.help)
    assert not missing, missing
    assert len(set(dirs.values())) == 1, dirs
    assert dirs["run"][0] == ("-C", "--dir")


@pytest.mark.parametrize("words", [[], ["rewind"], ["remote", "add"], ["turn", "begin"]])
def test_help_command_is_the_commands_own_help(tmp_path, words):
    """``rewindfs help rewind``, typed as ``git help log`` is, said "invalid choice:
    'help'".  It prints what ``rewindfs rewind --help`` prints."""
    store = tmp_path / "store"
    asked = cli("help", *words, store=store)
    assert asked.returncode == 0, asked.stderr
    assert asked.stdout == cli(*words, "--help", store=store).stdout
    assert asked.stdout.startswith(f"usage: {' '.join(['rewindfs', *words])} ")
    assert not store.exists()


@pytest.mark.parametrize("words, says", [
    (["nosuch"], "no command 'nosuch' in rewindfs (one of: mount, "),
    (["remote", "nosuch"], "no command 'nosuch' in rewindfs remote (one of: add, "),
    (["log", "x"], "rewindfs log has no commands under it ('x')"),
])
def test_help_of_no_command_is_a_usage_error(tmp_path, words, says):
    res = cli("help", *words, store=tmp_path / "store")
    assert res.returncode == 3 and says in res.stderr, res.stderr
    assert res.stdout == ""


def test_redo_help_names_no_point(tmp_path):
    res = cli("redo", "--help")
    assert res.returncode == 0
    assert "POINT" not in res.stdout, res.stdout


# -- the log table fits the terminal ----------------------------------------------------------

def test_log_fits_80_columns_with_every_column(ws):
    res = run(ws, "log", env={"COLUMNS": "80"})
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), "\n".join(lines)
    header = [w for w in lines[0].split() if w != "┃"]
    assert header == ["epoch", "kind", "session", "turn", "label", "time", "files", "bytes"]
    row = [line for line in lines if line.lstrip().startswith("e3")]
    assert len(row) == 1 and "…" in row[0], lines     # one line, label cut
    assert not any("refactor" in line for line in lines if line not in row)


def test_log_in_a_narrow_terminal_keeps_the_epoch_ids_whole(ws):
    """30 columns cannot hold every column: the lines are cut at the right edge, so
    the epoch ids a person types next stay readable (the table used to squeeze every
    column into "e…", "ki…")."""
    res = run(ws, "log", env={"COLUMNS": "30"})
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert all(len(line) <= 30 for line in lines), "\n".join(lines)
    assert lines[0].startswith("epoch ┃ kind ┃"), lines
    assert [line.split()[0] for line in lines[2:]] == ["e1", "e2", "e3", "e4"], lines


def test_turn_without_begin_or_end_names_them(tmp_path):
    """``rewindfs turn`` said "name a command (rewindfs --help lists them)": the
    top-level help, which does not list begin and end."""
    res = cli("turn", store=tmp_path / "store")
    assert res.returncode == 3 and "begin|end" in res.stderr, res.stderr
    assert "rewindfs turn --help" in res.stderr, res.stderr


def test_a_rewindignore_too_big_for_the_matcher_is_refused_clearly(tmp_path):
    """RE2 compiles a bounded number of patterns at once (about 1,800).  A generated
    ``.rewindignore`` of 5,000 lines failed with a raw "failed to compile Set"; it is
    refused as an invalid file is (``too-many-ignore-rules``, a ``BadIgnoreRules``),
    saying how many patterns there are and how many fit."""
    from rewindfs.overlay.errors import BadIgnoreRules
    from rewindfs.overlay.tree.ignore import IgnoreRules

    data = "".join(f"build{i}/**/*.o\n" for i in range(5000)).encode()
    with pytest.raises(BadIgnoreRules) as exc:
        IgnoreRules.parse(data)
    assert exc.value.code == "too-many-ignore-rules"
    assert "5000 patterns" in exc.value.message and "1,500" in exc.value.message, exc.value
    assert "the previous rules are in force" in exc.value.kept_previous()
    rules = IgnoreRules.parse(data[: data.index(b"build1500/")])      # 1,500 fit
    assert rules.ignored(b"build1499/x/y.o") and not rules.ignored(b"build1500/y.o")
