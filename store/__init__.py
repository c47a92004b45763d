"""The on-disk store: an LMDB index and content-addressed blobs (pure data: no FUSE,
no trio, never touches a workspace).  See docs/architecture.md for the contract and
docs/store.md for the on-disk layout, durability and measurements."""

from ._blob import INLINE_MAX, BlobCollision, hash_fd
from ._check import FsckReport, Problem
from ._epoch import Epoch
from ._errors import (
    BadPath, BadPoint, BlobCorrupt, BlobMissing, IndexCorrupt, InternalError, NothingToRedo,
    PathEscape, RewindfsError, SchemaTooNew, StoreError, StoreFull, StoreInsideWorkspace, TurnOpen,
    UnknownPoint,
)
from ._gc import GcReport
from ._history import RedoStale
from ._journal import EpochClosed, Recorded
from ._plan import Action, Plan
from ._preimage import PreImage, check_relpath
from ._session import AmbiguousPoint, BadSession, SessionConflict
from ._store import Store

__all__ = [
    "INLINE_MAX", "Action", "AmbiguousPoint", "BadPath", "BadPoint", "BadSession", "BlobCollision",
    "BlobCorrupt", "BlobMissing", "Epoch", "EpochClosed", "FsckReport", "GcReport",
    "IndexCorrupt", "InternalError", "NothingToRedo", "PathEscape", "Plan", "PreImage", "Problem",
    "Recorded", "RedoStale", "RewindfsError", "SchemaTooNew", "SessionConflict", "Store", "StoreError", "StoreFull",
    "StoreInsideWorkspace", "TurnOpen", "UnknownPoint",
    "check_relpath", "hash_fd",
]
