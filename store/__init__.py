"""The on-disk store: an LMDB index and content-addressed blobs (pure data: no FUSE,
no trio, never touches a workspace).  See docs/architecture.md for the contract and
docs/store.md for the on-disk layout, durability and measurements."""

from ._lazy import lazy_names

# The public names load on first use (PEP 562): a client that only needs the error
# classes (the CLI talking to a daemon) does not load LMDB, zstandard and the rest.
_PUBLIC = {
    **dict.fromkeys(["INLINE_MAX", "hash_fd"], "_blob"),
    **dict.fromkeys(["FsckReport", "Problem"], "_check"),
    **dict.fromkeys(["Epoch"], "_epoch"),
    **dict.fromkeys(["AmbiguousPoint", "BadPath", "BadPoint", "BadRemoteName", "BadSession",
                     "BlobCollision", "BlobCorrupt", "BlobMissing", "EpochClosed", "IndexCorrupt",
                     "InternalError", "NothingToRedo", "PathEscape", "PathTooLong", "RedoStale",
                     "RewindfsError", "SchemaTooNew", "SessionConflict", "StoreError",
                     "StoreForeign", "StoreFull", "StoreInsideWorkspace", "StoreReadOnly",
                     "TurnOpen", "UnknownPoint"],
                    "_errors"),
    **dict.fromkeys(["GcReport"], "_gc"),
    **dict.fromkeys(["Recorded"], "_journal"),
    **dict.fromkeys(["MAX_SESSION", "MAX_TURN", "check_remote_name"], "_limits"),
    **dict.fromkeys(["Action", "Plan"], "_plan"),
    **dict.fromkeys(["PreImage", "check_relpath"], "_preimage"),
    **dict.fromkeys(["Store"], "_store"),
}

__all__ = sorted(_PUBLIC)


__getattr__ = lazy_names(__name__, _PUBLIC, globals())
