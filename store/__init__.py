"""The on-disk store: an LMDB index and content-addressed blobs (pure data: no FUSE,
no trio, never touches a workspace).  See docs/architecture.md for the contract and
docs/store.md for the on-disk layout, durability and measurements."""

import importlib

# The public names load on first use (PEP 562): a client that only needs the error
# classes (the CLI talking to a daemon) does not load LMDB, zstandard and the rest.
_PUBLIC = {
    **dict.fromkeys(["INLINE_MAX", "hash_fd"], "_blob"),
    **dict.fromkeys(["FsckReport", "Problem"], "_check"),
    **dict.fromkeys(["Epoch"], "_epoch"),
    **dict.fromkeys(["AmbiguousPoint", "BadPath", "BadPoint", "BadSession", "BlobCollision",
                     "BlobCorrupt", "BlobMissing", "EpochClosed", "IndexCorrupt",
                     "InternalError", "NothingToRedo", "PathEscape", "RedoStale",
                     "RewindfsError", "SchemaTooNew", "SessionConflict", "StoreError",
                     "StoreFull", "StoreInsideWorkspace", "TurnOpen", "UnknownPoint"],
                    "_errors"),
    **dict.fromkeys(["GcReport"], "_gc"),
    **dict.fromkeys(["Recorded"], "_journal"),
    **dict.fromkeys(["Action", "Plan"], "_plan"),
    **dict.fromkeys(["PreImage", "check_relpath"], "_preimage"),
    **dict.fromkeys(["Store"], "_store"),
}

__all__ = [
    "INLINE_MAX", "Action", "AmbiguousPoint", "BadPath", "BadPoint", "BadSession", "BlobCollision",
    "BlobCorrupt", "BlobMissing", "Epoch", "EpochClosed", "FsckReport", "GcReport",
    "IndexCorrupt", "InternalError", "NothingToRedo", "PathEscape", "Plan", "PreImage", "Problem",
    "Recorded", "RedoStale", "RewindfsError", "SchemaTooNew", "SessionConflict", "Store", "StoreError", "StoreFull",
    "StoreInsideWorkspace", "TurnOpen", "UnknownPoint",
    "check_relpath", "hash_fd",
]


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value          # the next lookup is a plain attribute
    return value
