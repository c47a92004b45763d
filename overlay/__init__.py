"""The overlay: the FUSE filesystem, capture, the daemon, the control socket, the CLI.

Public surface (everything else is private to the package):
``capture``/``snapshot`` (write-ahead capture), ``IgnoreRules``, ``open_parent``,
``control_socket_path``, and the overlay's error classes.  Importing this package does
not import pyfuse3 or trio; the filesystem and the daemon load them.
"""

from rewindfs.overlay.capture import capture, snapshot
from rewindfs.overlay.tree.ignore import IgnoreRules
from rewindfs.overlay.places import control_socket_path
from rewindfs.overlay.errors import (AlreadyMounted, BadWorkspace, MountFailed, NotMounted,
                                     RefusedWorkspace, StaleMount, UsageError)
from rewindfs.overlay.tree.walk import PathEscape, open_parent

__all__ = [
    "AlreadyMounted", "BadWorkspace", "IgnoreRules", "MountFailed", "NotMounted",
    "PathEscape", "RefusedWorkspace", "StaleMount", "UsageError", "capture",
    "control_socket_path", "open_parent", "snapshot",
]
