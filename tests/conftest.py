"""Shared fixtures, and the test tiers by cost.

- ``tests/unit/``: no FUSE (store, capture and restore on plain directories, protocol
  parsing, the plugin client against a scripted socket, packaging).  Some mount a
  tmpfs to fill a disk on purpose (root), none needs /dev/fuse.
- ``tests/mount/``: really mounts FUSE (``rewindfs mount``), the reliability suite too.
- ``tests/e2e/``: the real dsh harness against a real mount.

Every test under ``tests/mount/`` and ``tests/e2e/`` gets the ``mount`` marker here, so
``pytest -m "not mount"`` runs where there is no FUSE; where FUSE is missing, every
``mount`` test is skipped with the reason instead of failing in its fixture.

Every daemon the tests start uses the FUSE session layer named by ``REWINDFS_SESSION``
(default: the kernel-direct session as root, ``fs.session.default``).
``--fuse-session libfuse`` (or ``kernel``) sets it for the whole run, so CI runs the
mount tier once per session layer: ``scripts/test.sh tests/mount --fuse-session
libfuse`` as a second job (tests that name a session with ``--session`` keep theirs).

The shared kits (``mountkit``, ``relkit``, ``restorekit``, ``store_fixtures``,
``treesnap``, ``pointcheck``, ``tmpfskit``, ``rewind_agent``, ``ptykit``) stay in ``tests/`` and are
imported by those names from every tier (``pythonpath`` in pyproject.toml).
Store fixtures end with the store's own consistency check.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import stat

import pytest

from store_fixtures import assert_sound, store, store_path, ws  # noqa: F401

TESTS = pathlib.Path(__file__).resolve().parent
MOUNTING_DIRS = (TESTS / "mount", TESTS / "e2e")
_FUSE_DEVICE = (10, 229)    # Linux: the misc device FUSE registers as /dev/fuse


def fuse_missing() -> str | None:
    """Why a FUSE mount cannot work here, or None when it can.

    /dev/fuse must be the FUSE character device (not, say, /dev/null bound over it) and
    open read-write; fusermount3 must be on PATH (the tests and mountkit unmount with it).
    """
    try:
        st = os.stat("/dev/fuse")
    except OSError:
        return "needs /dev/fuse (FUSE): not available here"
    if not stat.S_ISCHR(st.st_mode) or (os.major(st.st_rdev), os.minor(st.st_rdev)) != _FUSE_DEVICE:
        return "needs /dev/fuse (FUSE): /dev/fuse here is not the FUSE device"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as e:
        return f"needs /dev/fuse (FUSE): cannot open it ({e.strerror})"
    if shutil.which("fusermount3") is None:
        return "needs fusermount3 (FUSE, package fuse3): not on PATH"
    return None


def pytest_addoption(parser):
    parser.addoption("--fuse-session", choices=("libfuse", "kernel"), default=None,
                     help="the FUSE session layer of every daemon the tests start "
                          "(sets REWINDFS_SESSION)")


def pytest_configure(config):
    chosen = config.getoption("--fuse-session")
    if chosen:
        os.environ["REWINDFS_SESSION"] = chosen


# tryfirst: the marker must be on the items before pytest's own -m selection runs.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    why: str | None = None
    checked = False
    for item in items:
        if any(d in item.path.resolve().parents for d in MOUNTING_DIRS):
            item.add_marker(pytest.mark.mount)
        if item.get_closest_marker("mount") is None:
            continue
        if not checked:
            why, checked = fuse_missing(), True
        if why is not None:
            item.add_marker(pytest.mark.skip(reason=why))
