"""Remotes: a workspace's history in S3-compatible object storage (pure data: no FUSE,
no trio, never touches a workspace).  docs/remote.md has the layout, the consistency
argument and the lease.

- ``_backend``: the object seam (put/get/head/list/delete, conditional create) and S3;
- ``_objects``: names and formats of blobs, packs and index segments, and their checks;
- ``_index``: a workspace's segments read and merged;
- ``_lease``: one writer per workspace history;
- ``_push`` / ``_fetch``: moving history and blobs each way;
- ``_check``: ``fsck --remote``, every object read and verified;
- ``_gc``: remote gc by reachability with a grace period, and the gc lock that keeps
  it and pushes apart.

Restoring a tree onto a directory is the overlay's (``overlay.cli.remote``): it lands
the fetched history with the restore engine.
"""

from ._backend import (DirBackend, RemoteConfig, S3Backend, open_backend, parse_url,
                       probe_conditional)
from ._check import RemoteCheck, check_remote
from ._gc import DEFAULT_GRACE_S, GcLock, RemoteGcReport, gc_remote
from ._fetch import BlobProblem, fetch_blobs, wanted_blobs
from ._index import RemoteWorkspace, read_workspace, workspace_ids
from ._lease import Lease
from ._push import PushReport, push_workspace

__all__ = ["BlobProblem", "DEFAULT_GRACE_S", "DirBackend", "GcLock", "Lease", "RemoteCheck",
           "RemoteGcReport", "check_remote", "PushReport", "RemoteConfig", "RemoteWorkspace",
           "S3Backend", "fetch_blobs", "gc_remote", "open_backend", "parse_url",
           "probe_conditional", "push_workspace", "read_workspace", "wanted_blobs",
           "workspace_ids"]
