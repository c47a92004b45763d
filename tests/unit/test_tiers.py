"""The test tiers hold: ``-m "not mount"`` selects no test that mounts FUSE, and where
FUSE is missing the mounting tests are skipped with the reason, not errors.

tests/conftest.py marks every test under tests/mount/ and tests/e2e/ ``mount``; a test
elsewhere that mounts would fail without /dev/fuse, so none of tests/unit/ may carry it.
Each check runs pytest itself in a subprocess from the repository root.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
MOUNTING = ("tests/mount/", "tests/e2e/")


def _pytest(*args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           *args], cwd=REPO, capture_output=True, text=True, timeout=600)


def _collected(*args: str) -> list[str]:
    res = _pytest("--collect-only", "-q", *args)
    assert res.returncode == 0, res.stdout + res.stderr
    return [line for line in res.stdout.splitlines() if "::" in line]


def test_not_mount_collects_no_mounting_tier():
    ids = _collected("-m", "not mount")
    assert "tests/unit/test_tiers.py::test_not_mount_collects_no_mounting_tier" in ids
    assert [i for i in ids if i.startswith(MOUNTING)] == []


def test_mount_marks_exactly_the_mounting_tiers():
    marked = _collected("-m", "mount")
    assert any(i.startswith("tests/mount/") for i in marked)
    assert any(i.startswith("tests/e2e/") for i in marked)
    assert [i for i in marked if not i.startswith(MOUNTING)] == []
    everything = _collected()
    assert sorted(i for i in everything if i.startswith(MOUNTING)) == sorted(marked)


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0,
                    reason="needs root and unshare(1) to hide /dev/fuse in a private mount "
                           "namespace")
def test_without_fuse_unit_tests_run_and_mount_tests_skip_with_the_reason():
    # /dev/null bound over /dev/fuse in a private mount namespace (gone with the process):
    # the device node is there but is not FUSE, as in a container without it.
    hide = ("unshare", "--mount", "--propagation", "private", "sh", "-c",
            'if [ -e /dev/fuse ]; then mount --bind /dev/null /dev/fuse || exit 97; fi; '
            'exec "$@"', "hide-fuse")
    res = _pytest("-q", "-rs", "tests/unit/test_protocol_parse.py",
                  "tests/mount/test_protocol.py", "tests/mount/test_fs_capture.py",
                  prefix=hide)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert re.search(r"^1 passed, \d+ skipped in ", out, re.M), out   # no errors, no failures
    skipped = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    assert skipped and all("needs /dev/fuse (FUSE)" in line for line in skipped), out
