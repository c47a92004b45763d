"""Issue 14 on a live mount: an invalid ``.rewindignore`` keeps the previous rules and
says so, a mount over one is refused, ``turn end`` without a turn says so, and session
names reach the terminal escaped.  Real daemons, real ``rewindfs`` subprocesses.

Each test failed before issue 14: after a bad ``.rewindignore`` was written, ``status``
said nothing (the daemon's reload raised ``GitIgnorePatternError`` inside the release
handler), the mount over one failed with that raw exception, ``turn end`` printed "turn
ended" with no turn open, and ``ESC`` reached stdout.
"""

from __future__ import annotations

import json

import pytest
from mountkit import cli, is_rewindfs_mount, mounted

ESC = "\x1b[31mred"
PROBLEM = "`.rewindignore` line 2: invalid pattern `!`"


def _records(res) -> list[dict]:
    return [json.loads(line) for line in res.stdout.splitlines()]


# "!" alone is refused by gitignore syntax; "[z-a]" (a range written backwards) by the
# regular expression it becomes: that one escaped as a raw ``re.error`` ("bad character
# range z-a at position 10"), naming neither the file nor the line
@pytest.mark.parametrize("bad", ["!", "[z-a]"])
def test_invalid_ignore_file_keeps_the_previous_rules_and_says_so(tmp_path, bad):
    PROBLEM = f"`.rewindignore` line 2: invalid pattern `{bad}`"
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    (ws / ".rewindignore").write_text("*.log\n")
    with mounted(ws, store) as m:
        # the user's write is accepted (no EIO at close)
        (m.ws / ".rewindignore").write_text(f"*.txt\n{bad}\n")
        assert (m.ws / ".rewindignore").read_text() == f"*.txt\n{bad}\n"
        res = cli("status", "-C", ws, store=store)
        assert res.returncode == 0, res.stderr
        assert PROBLEM + "; the previous rules are in force" in res.stderr, res.stderr
        js = cli("--json", "status", "-C", ws, store=store)
        status = [r for r in _records(js) if r["type"] == "status"][0]
        assert status["warnings"] == [PROBLEM + "; the previous rules are in force."]

        res = cli("turn", "begin", "--session", "s", "--turn", "1", "-C", ws, store=store)
        assert res.returncode == 0 and PROBLEM in res.stderr, res
        (m.ws / "b.log").write_text("ignored by the previous rules\n")
        (m.ws / "c.txt").write_text("ignored only by the half-valid new file\n")
        assert cli("turn", "end", "-C", ws, store=store).returncode == 0
        res = cli("--json", "diff", "t1", "--session", "s", "-C", ws, store=store)
        assert res.returncode == 0, res.stderr
        changed = {r["path"] for r in _records(res) if r["type"] == "diff.change"}
        assert "c.txt" in changed and "b.log" not in changed, changed

        # a mounted rewind restores by the rules in force: c.txt goes, b.log stays
        res = cli("rewind", "t1", "--session", "s", "-C", ws, store=store)
        assert res.returncode == 0, res.stderr
        assert not (m.ws / "c.txt").exists() and (m.ws / "b.log").exists()

        (m.ws / ".rewindignore").write_text("*.log\n")      # fixed: the warning goes
        res = cli("status", "-C", ws, store=store)
        assert res.returncode == 0 and ".rewindignore" not in res.stderr, res.stderr
        res = cli("turn", "begin", "--session", "s", "--turn", "2", "-C", ws, store=store)
        assert res.returncode == 0 and res.stderr == "", res.stderr


@pytest.mark.parametrize("bad", ["!", "[z-a]"])
def test_mount_over_an_invalid_ignore_file_is_refused(tmp_path, bad):
    PROBLEM = f"`.rewindignore` line 2: invalid pattern `{bad}`"
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    (ws / ".rewindignore").write_text(f"# build output\n{bad}\n")
    try:
        for extra in ([], ["--foreground"]):
            res = cli("mount", ws, *extra, store=store, timeout=60)
            assert res.returncode == 2, (extra, res)
            assert PROBLEM in res.stderr and "Traceback" not in res.stderr, res.stderr
            assert not is_rewindfs_mount(ws)
    finally:
        if is_rewindfs_mount(ws):
            cli("unmount", ws, store=store)


def test_turn_end_without_an_open_turn_says_so(tmp_path):
    ws, store = tmp_path / "ws", tmp_path / "store"
    with mounted(ws, store):
        res = cli("turn", "end", "-C", ws, store=store)
        assert res.returncode == 0, res.stderr
        assert "no turn was open" in res.stdout and "turn ended" not in res.stdout
        assert _records(cli("--json", "turn", "end", "-C", ws, store=store))[0]["ended"] is False
        assert cli("turn", "begin", "--session", "s", "--turn", "1", "-C", ws,
                   store=store).returncode == 0
        res = cli("turn", "end", "-C", ws, store=store)
        assert res.returncode == 0 and "turn ended" in res.stdout, res


def test_session_names_are_escaped_in_turn_status_and_errors(tmp_path):
    ws, store = tmp_path / "ws", tmp_path / "store"
    with mounted(ws, store):
        res = cli("turn", "begin", "--session", ESC, "--turn", "1", "--label", "x\x1b[2Jy",
                  "-C", ws, store=store)
        assert res.returncode == 0, res.stderr
        assert "\x1b" not in res.stdout and "\\x1b[31mred" in res.stdout, res.stdout
        res = cli("status", "-C", ws, store=store)
        assert res.returncode == 0, res.stderr
        assert "\x1b" not in res.stdout + res.stderr and "\\x1b[31mred" in res.stdout
        # refused: another session's turn is open; the message names it, escaped
        res = cli("turn", "begin", "--session", "other", "--turn", "1", "-C", ws, store=store)
        assert res.returncode == 2, res
        assert "\x1b" not in res.stderr and "\\x1b[31mred" in res.stderr, res.stderr
        res = cli("turn", "end", "-C", ws, store=store)
        assert res.returncode == 0


def test_a_rewind_that_restores_the_ignore_file_puts_its_rules_in_force(tmp_path):
    """The mount's rewinds restore by the mount's rules, so those must follow a
    ``.rewindignore`` the rewind itself puts back (it lands behind the handlers)."""
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    (ws / ".rewindignore").write_text("*.log\n")
    with mounted(ws, store) as m:
        assert cli("turn", "begin", "--session", "s", "--turn", "1", "-C", ws,
                   store=store).returncode == 0
        (m.ws / ".rewindignore").write_text("*.tmp\n")
        assert cli("turn", "end", "-C", ws, store=store).returncode == 0
        res = cli("rewind", "t1", "--session", "s", "-C", ws, store=store)
        assert res.returncode == 0, res.stderr
        # (no read of .rewindignore here: closing it would reload the rules anyway)
        assert cli("turn", "begin", "--session", "s", "--turn", "2", "-C", ws,
                   store=store).returncode == 0
        (m.ws / "x.log").write_text("ignored again\n")
        (m.ws / "y.tmp").write_text("recorded again\n")
        assert cli("turn", "end", "-C", ws, store=store).returncode == 0
        res = cli("--json", "diff", "t2", "--session", "s", "-C", ws, store=store)
        changed = {r["path"] for r in _records(res) if r["type"] == "diff.change"}
        assert changed == {"y.tmp"}, changed
        assert (m.ws / ".rewindignore").read_text() == "*.log\n"


def test_dash_c_before_the_command_works_as_git_dash_c(tmp_path):
    """``rewindfs -C ~/proj status``, typed as ``git -C ~/proj status`` is, said
    "invalid choice: '…/proj'" (the directory taken for the command).  Before the
    command, ``-C DIR`` runs it as if started in DIR (git's rule: a later relative
    ``-C`` is taken from the earlier one, and so are relative paths after it); a DIR
    that is not there is named (``bad-workspace``) and nothing runs."""
    ws, store = tmp_path / "ws", tmp_path / "store"
    (ws / "sub").mkdir(parents=True)
    with mounted(ws, store):
        res = cli("-C", tmp_path, "-C", "ws/sub", "turn", "begin", "--session", "s",
                  "--turn", "1", store=store)
        assert res.returncode == 0, res.stderr
        (ws / "f").write_text("made in turn 1\n")
        res = cli("-C", ws, "turn", "end", store=store)
        assert res.returncode == 0, res.stderr
        res = cli("-C", ws, "--json", "diff", "t1", "--name-status", store=store)
        assert res.returncode == 0, res.stderr
        assert [(r["status"], r["path"]) for r in _records(res)] == [("A", "f")], res.stdout
        res = cli("-C", ws, "unmount", ".", store=store)       # DIR taken from -C too
        assert res.returncode == 0, res.stderr
        assert not is_rewindfs_mount(ws)
    res = cli("--json", "-C", tmp_path / "nope", "log", store=store)
    record = _records(res)[-1]
    assert res.returncode == 2 and record["code"] == "bad-workspace", record
