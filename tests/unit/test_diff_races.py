"""``state_now`` beside a working agent: a file renamed away or replaced between the
``lstat`` and the hash is looked at again, never an error (seen as ENOENT from
``rewindfs diff`` while a tool replaced files by temp + rename)."""

from __future__ import annotations

import importlib
import os

import pytest
import xxhash

from rewindfs.overlay.rewind import diff


def _state_now_with(tmp_path, monkeypatch, file_key):
    """``state_now`` of ``tmp_path/f`` with ``file_key`` standing in for the hash."""
    monkeypatch.setattr(diff.meta, "file_key", file_key)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return diff.state_now(fd, None, b"f")
    finally:
        os.close(fd)


def test_file_renamed_away_while_hashing_is_looked_at_again(tmp_path, monkeypatch):
    (tmp_path / "f").write_bytes(b"old")
    real_key, calls = diff.meta.file_key, []

    def racing_key(dir_fd, name):
        calls.append(name)
        if len(calls) == 1:   # the agent replaces f (temp + rename) under our feet,
            (tmp_path / "f.tmp").write_bytes(b"new content")   # and our open missed it
            os.rename(tmp_path / "f.tmp", tmp_path / "f")
            raise FileNotFoundError(2, "gone")
        return real_key(dir_fd, name)

    img = _state_now_with(tmp_path, monkeypatch, racing_key)
    assert len(calls) == 2
    assert img.kind == "file" and img.size == len(b"new content")
    assert img.blob == xxhash.xxh3_128(b"new content").digest()


def test_file_that_keeps_vanishing_counts_as_absent(tmp_path, monkeypatch):
    (tmp_path / "f").write_bytes(b"x")

    def always_gone(dir_fd, name):
        raise FileNotFoundError(2, "gone")

    assert _state_now_with(tmp_path, monkeypatch, always_gone).kind == "absent"


def test_other_errors_still_surface(tmp_path, monkeypatch):
    (tmp_path / "f").write_bytes(b"x")

    def denied(dir_fd, name):
        raise PermissionError(13, "denied")

    with pytest.raises(PermissionError):   # not taken for a vanished file
        _state_now_with(tmp_path, monkeypatch, denied)


def test_file_removed_between_its_lstat_and_its_xattrs_is_looked_at_again(
        tmp_path, monkeypatch):
    """Seen in CI as ENOENT on ``/proc/self/fd/N/.f1.tmp`` from ``rewindfs diff`` beside
    a writer: the entry was ``lstat``-ed, then renamed away before its xattrs were read."""
    (tmp_path / "f").write_bytes(b"old")
    capture = importlib.import_module("rewindfs.overlay.capture")  # the module, not its function
    real_read, calls = capture.read_xattrs, []

    def racing_read(dir_fd, name):
        calls.append(name)
        if len(calls) == 1:      # the writer renames f away right after our lstat
            os.rename(tmp_path / "f", tmp_path / "f.gone")
        return real_read(dir_fd, name)

    monkeypatch.setattr(capture, "read_xattrs", racing_read)
    img = _state_now_with(tmp_path, monkeypatch, diff.meta.file_key)
    assert len(calls) == 1      # looked again: the second look finds nothing to read
    assert img.kind == "absent"
