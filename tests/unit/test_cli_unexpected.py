"""An exception the CLI did not expect exits 2 ("could not run") with one line naming
it, and the traceback only with ``-v``; never Python's default exit 1, which the
contract reserves for "partial" (DESIGN: 0 done, 1 partial, 2 could not run, 3 usage).

The first tests provoke it for real, as a user would, through the installed
``rewindfs`` script: stdout is /dev/full, so printing the result raises
``OSError(ENOSPC)``, an error no command handles.  The ``--json`` test with a working
stdout cannot be provoked from outside (every input we tried is refused with a proper
code), so it runs ``main()`` in-process with ``Store.open`` patched to raise.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rewindfs.overlay.cli import main
from rewindfs.store import Store

REWINDFS = Path(sys.executable).with_name("rewindfs")


@pytest.fixture
def store_dir(tmp_path):
    path = tmp_path / "store"
    Store.open(path).close()
    return path


def _run_to_full_disk(*args):
    """``rewindfs ARGS > /dev/full``: every write to stdout fails with ENOSPC."""
    assert REWINDFS.is_file(), f"the rewindfs script is not installed beside {sys.executable}"
    with open("/dev/full", "w") as full:
        return subprocess.run([str(REWINDFS), *map(os.fspath, args)], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120)


@pytest.mark.parametrize("json_mode", [False, True], ids=["text", "json"])
def test_unexpected_error_exits_2_with_one_line(store_dir, json_mode):
    res = _run_to_full_disk(*(["--json"] if json_mode else []), "--store", store_dir, "fsck")
    assert res.returncode == 2, res.stderr
    assert res.stderr.splitlines() == [
        "rewindfs: could not run: OSError: [Errno 28] No space left on device "
        "(run with -v for the traceback)"], res.stderr


def test_verbose_adds_the_traceback(store_dir):
    res = _run_to_full_disk("-v", "--store", store_dir, "fsck")
    assert res.returncode == 2, res.stderr
    lines = res.stderr.splitlines()
    assert lines[0] == "Traceback (most recent call last):", res.stderr
    assert "OSError: [Errno 28] No space left on device" in lines
    assert lines[-1] == "rewindfs: could not run: OSError: [Errno 28] No space left on device"


def _boom(cls, *args, **kwargs):
    raise KeyError("x")


def test_json_mode_reports_one_error_record(store_dir, monkeypatch, capsys):
    monkeypatch.setattr(Store, "open", classmethod(_boom))
    assert main(["--json", "--store", str(store_dir), "fsck"]) == 2
    captured = capsys.readouterr()
    records = [json.loads(line) for line in captured.out.splitlines()]
    assert records == [{"v": 1, "type": "error", "code": "internal",
                        "message": "could not run: KeyError: 'x'", "exit_code": 2}]
    assert captured.err == ""


def test_text_mode_in_process(store_dir, monkeypatch, capsys):
    monkeypatch.setattr(Store, "open", classmethod(_boom))
    assert main(["--store", str(store_dir), "fsck"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == ("rewindfs: could not run: KeyError: 'x' "
                            "(run with -v for the traceback)\n")


def test_expected_errors_keep_their_own_exit_code(tmp_path):
    """The safety net is not in the way of a RewindfsError: a store that does not exist
    is a ``store-error`` (2) and a bad option a usage error (3), as before."""
    res = subprocess.run([str(REWINDFS), "--json", "--store", str(tmp_path / "none"), "fsck"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert json.loads(res.stdout)["code"] == "store-error"
    res = subprocess.run([str(REWINDFS), "--json", "fsck", "--no-such-option"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 3
    assert json.loads(res.stdout)["code"] == "usage"


@pytest.mark.parametrize("argv", [["mount"], ["rewind"], ["diff", "t1", "t2", "t3"],
                                  ["log", "-n", "0"], ["fsck", "--no-such-option"],
                                  ["turn", "begin"]])
def test_every_usage_error_points_to_help(tmp_path, argv):
    """A usage error says where to read more, as argparse's own do; ``mount`` without
    DIR was the one that did not ("mount: the following arguments are required: DIR")."""
    res = subprocess.run([str(REWINDFS), "--json", "--store", str(tmp_path / "s"), *argv],
                         capture_output=True, text=True, timeout=120)
    record = json.loads(res.stdout)
    assert res.returncode == 3 and record["code"] == "usage", (argv, record)
    assert "--help)" in record["message"], (argv, record)


@pytest.mark.parametrize("turn", ["0", "-1", "4294967296", "99999999999999999999999", "x"])
def test_a_turn_number_out_of_range_is_a_usage_error_naming_the_option(tmp_path, turn):
    """``turn begin --turn 0`` answered "Bad parameters for turn.begin: 'turn' must be
    an integer ≥ 1" (the protocol's words, not the command line's), and ``--turn
    99999999999999999999999`` "Bad session or turn (session 's1'): bad turn number …"
    (``bad-session``, blaming the session).  Both are the option's fault: a usage
    error naming ``--turn`` and the range, before any daemon or store is asked."""
    res = subprocess.run([str(REWINDFS), "--json", "--store", str(tmp_path / "s"), "turn",
                          "begin", "--session", "s1", "--turn", turn, "-C", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    record = json.loads(res.stdout.splitlines()[-1])
    assert res.returncode == 3 and record["code"] == "usage", record
    assert "--turn" in record["message"] and "1 to 4294967295" in record["message"], record
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("argv", [["status"], ["log"], ["rewind", "t1"], ["diff", "t1"],
                                  ["turn", "begin", "--session", "s", "--turn", "1"],
                                  ["push"], ["show", "t1", "f"]])
@pytest.mark.parametrize("target", ["missing", "file"])
def test_a_dash_c_that_is_no_directory_is_named_so(tmp_path, argv, target):
    """``-C /typo`` said "not served by a rewindfs daemon" or "not a rewindfs
    workspace … mount it first" — advice that cannot work for a directory that is not
    there.  As ``mount`` and ``run`` already said, and as ``git -C`` does, it is named:
    ``bad-workspace``, exit 2, nothing made."""
    path = tmp_path / ("nope" if target == "missing" else "f")
    if target == "file":
        path.write_text("x")
    res = subprocess.run([str(REWINDFS), "--json", "--store", str(tmp_path / "s"), *argv,
                          "-C", str(path)], capture_output=True, text=True, timeout=120)
    record = json.loads(res.stdout.splitlines()[-1])
    assert res.returncode == 2 and record["code"] == "bad-workspace", (argv, record)
    reason = "it does not exist" if target == "missing" else "not a directory"
    assert record["message"] == f"{path} is not a directory ({reason}).", record
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("target", ["missing", "file"])
def test_unmount_of_no_directory_is_named_so(tmp_path, target):
    """``rewindfs unmount /typo`` said "/typo is not served by a rewindfs daemon"
    (``not-mounted``), as of a real directory nobody serves; ``umount`` says the path
    is not there.  Named as ``-C /typo`` is: ``bad-workspace``, exit 2."""
    path = tmp_path / ("nope" if target == "missing" else "f")
    if target == "file":
        path.write_text("x")
    res = subprocess.run([str(REWINDFS), "--json", "--store", str(tmp_path / "s"),
                          "unmount", str(path)], capture_output=True, text=True, timeout=120)
    record = json.loads(res.stdout.splitlines()[-1])
    assert res.returncode == 2 and record["code"] == "bad-workspace", record
    reason = "it does not exist" if target == "missing" else "not a directory"
    assert record["message"] == f"{path} is not a directory ({reason}).", record
