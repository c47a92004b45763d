"""Where the store lives, and the rule that it never lies inside a workspace it serves."""

from __future__ import annotations

import os
import pathlib

from ._errors import StoreInsideWorkspace


def default_store_path() -> pathlib.Path:
    """``$REWINDFS_HOME``, else ``$XDG_DATA_HOME/rewindfs``, else
    ``~/.local/share/rewindfs`` (empty variables count as unset)."""
    if home := os.environ.get("REWINDFS_HOME"):
        return pathlib.Path(home)
    if data := os.environ.get("XDG_DATA_HOME"):
        return pathlib.Path(data) / "rewindfs"
    return pathlib.Path.home() / ".local" / "share" / "rewindfs"


def is_inside(path: bytes, root: bytes) -> bool:
    """True if real path *path* is *root* or lies below it (both resolved)."""
    root = root.rstrip(b"/") or b"/"
    return path == root or path.startswith(root + b"/") or root == b"/"


def check_outside(store_real: bytes, workspace_real: bytes) -> None:
    """Raise ``StoreInsideWorkspace`` if the store is the workspace or lies under it.

    Both paths must already be resolved.  The workspace is compared as given and never
    touched: the daemon calls this for a path it may have mounted over, and touching its
    own mount from inside would deadlock.
    """
    if is_inside(store_real, workspace_real):
        ws = workspace_real.rstrip(b"/") or b"/"
        raise StoreInsideWorkspace(store=os.fsdecode(store_real), workspace=os.fsdecode(ws))
