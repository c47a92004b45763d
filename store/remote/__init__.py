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

from rewindfs.store._lazy import lazy_names

# Loaded on first use (PEP 562): the CLI imports this package with every remote command
# module, and only the commands that talk to a remote load boto3.
_PUBLIC = {
    **dict.fromkeys(["DirBackend", "RemoteConfig", "S3Backend", "check_endpoint",
                     "open_backend", "parse_url", "probe_conditional"], "_backend"),
    **dict.fromkeys(["RemoteCheck", "check_remote"], "_check"),
    **dict.fromkeys(["DEFAULT_GRACE_S", "GcLock", "RemoteGcReport", "gc_remote"], "_gc"),
    **dict.fromkeys(["BlobProblem", "fetch_blobs", "wanted_blobs"], "_fetch"),
    **dict.fromkeys(["RemoteWorkspace", "read_workspace", "workspace_ids"], "_index"),
    **dict.fromkeys(["Lease"], "_lease"),
    **dict.fromkeys(["PushReport", "push_workspace"], "_push"),
}

__all__ = sorted(_PUBLIC)

__getattr__ = lazy_names(__name__, _PUBLIC, globals())
