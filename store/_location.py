"""The rule that a store never lies inside a workspace it serves.

Where the store lives by default is not the store's business: it opens the path it is
given.  The default (``$REWINDFS_HOME``, …) has its one Python home in
``rewindfs.plugin._paths``, which the plugin needs without importing ``store``.
"""

from __future__ import annotations

import os

from ._errors import StoreInsideWorkspace


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
