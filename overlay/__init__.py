"""The overlay: the FUSE filesystem, capture, the daemon, the control socket, the CLI.

Public surface (everything else is private to the package):
``capture``/``snapshot`` (write-ahead capture), ``IgnoreRules``, ``open_parent``,
``control_socket_path``, and the overlay's error classes.  Importing this package does
not import pyfuse3 or trio; the filesystem and the daemon load them.
"""

from rewindfs.store._lazy import lazy_names

# The public surface loads on first use (PEP 562): importing a submodule — the CLI
# first of all — does not load the store and capture with it.
_PUBLIC = {
    "capture": "capture", "snapshot": "capture", "IgnoreRules": "tree.ignore",
    "control_socket_path": "places", "PathEscape": "tree.walk", "open_parent": "tree.walk",
    **dict.fromkeys(["AlreadyMounted", "BadWorkspace", "MountFailed", "NotMounted",
                     "RefusedWorkspace", "StaleMount", "UsageError"], "errors"),
}

__all__ = sorted(_PUBLIC)


__getattr__ = lazy_names(__name__, _PUBLIC, globals())
