"""Store fixtures: a real LMDB store in a tmp dir; every one ends with ``fsck().ok``.

The lead imports these from conftest.py; store tests import them directly too.
"""

from __future__ import annotations

import pytest

from rewindfs.store import Store


def assert_sound(store: Store) -> None:
    """The store's own consistency check must pass (warnings such as orphans allowed)."""
    report = store.fsck()
    assert report.ok, [(p.code, p.message, p.paths) for p in report.errors]


@pytest.fixture
def store_path(tmp_path):
    return tmp_path / "store"


@pytest.fixture
def store(store_path):
    """An open store; after the test, fsck must report it sound."""
    s = Store.open(store_path)
    try:
        yield s
        assert_sound(s)
    finally:
        s.close()


@pytest.fixture
def ws(store, tmp_path):
    """A workspace id for a directory outside the store."""
    root = tmp_path / "ws"
    root.mkdir()
    return store.workspace(bytes(root))
