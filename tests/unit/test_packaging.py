"""A normal install puts no generic top-level names into site-packages (issue 13).

The three rooms live at the repository root as ``store/``, ``overlay/`` and
``plugin/`` but install as ``rewindfs.store``, ``rewindfs.overlay`` and
``rewindfs.plugin``.  The test builds a real wheel, installs it into a fresh venv in a
directory that also holds unrelated ``plugin/`` and ``store/`` packages (as a user's
project might), and runs the README's agent-loop import there: ours and theirs must
both import, each from its own place.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _wheel(out: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out),
                    str(REPO)], check=True)
    (wheel,) = out.glob("rewindfs-*.whl")
    return wheel


def test_wheel_installs_only_rewindfs_and_coexists_with_other_plugin_and_store(tmp_path):
    wheel = _wheel(tmp_path / "dist")
    tops = {name.split("/", 1)[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert all(t == "rewindfs" or t.endswith(".dist-info") for t in tops), tops
    assert "rewindfs" in tops

    proj = tmp_path / "someone-elses-project"
    for name in ("plugin", "store"):
        (proj / name).mkdir(parents=True)
        (proj / name / "__init__.py").write_text(f"WHOSE = 'theirs: {name}'\n")
    venv = proj / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = subprocess.run([venv / "bin" / "python", "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--target", site, str(wheel)], check=True)
    # Dependencies (trio, …) come from the test's own environment, added as a plain
    # path entry: .pth files (our editable install's finder) are not read from there.
    env = {**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"]}
    code = ("from rewindfs.plugin import Rewindfs\n"
            "import rewindfs.plugin, rewindfs.store, rewindfs.overlay.cli\n"
            "import plugin, store\n"
            "print(rewindfs.plugin.__file__); print(rewindfs.store.__file__)\n"
            "print(plugin.WHOSE); print(store.WHOSE); print(Rewindfs.__name__)\n")
    out = subprocess.run([venv / "bin" / "python", "-c", code], cwd=proj, env=env,
                         check=True, capture_output=True, text=True).stdout.split("\n")
    assert out[0].startswith(site) and out[0].endswith("rewindfs/plugin/__init__.py"), out
    assert out[1].startswith(site) and out[1].endswith("rewindfs/store/__init__.py"), out
    assert out[2:5] == ["theirs: plugin", "theirs: store", "Rewindfs"], out

    version = subprocess.run([venv / "bin" / "python", "-m", "rewindfs.overlay.cli",
                              "--version"], cwd=proj, env=env, check=True,
                             capture_output=True, text=True).stdout
    with open(REPO / "pyproject.toml", "rb") as f:
        expected = tomllib.load(f)["project"]["version"]
    assert version.strip() == f"rewindfs {expected}", version
