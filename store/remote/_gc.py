"""Remote gc: delete the blob objects and packs no segment names, once they are older
than a grace period — never one a push in progress may still name.

Reachable: every object a blob row of any segment of any workspace names, and every
segment, lease and claim (only ``blobs/`` and ``packs/`` are ever candidates; segments
are the roots and are never deleted).  A pack's rows are all in the one segment written
after it, so a pack is either wholly named or an orphan; a pack some segment names is
kept whole (no repacking).  A segment that cannot be read or decoded stops gc before
it deletes anything (``RemoteGcUnsafe``): without it, reachability is unknown.

Pushes and gc exclude each other (docs/remote.md, "Remote gc"), with the lease
machinery of ``_lease`` on both kinds of server:

- gc takes the remote-wide ``GcLock`` (``gc/lease`` or ``gc/claims/<token>``), *then*
  lists every workspace lease and claim: a live one → it releases its lock and
  refuses (``LeaseHeld``, naming the holder);
- a push takes its workspace lease, *then* lists the gc lock and claims: a live one →
  it releases its lease and refuses (``RemoteGcRunning``).

Each side writes its own record before it lists the other's, so whichever lists second
sees the first one's record: at most one proceeds (both may refuse).  Both sides renew
from a thread and stop before their next write once their record has gone unrenewed for
half its TTL (``Lease.check_live``): a push writes no segment — so it never names a
large object it skipped as present, which gc may have deleted meanwhile — and gc
deletes nothing more.  The grace period (default 24 h) is the second guard, for a
segment PUT already in flight when the lease lapsed: an object a push uploaded itself
is young for a day, so gc leaves it alone unless the push was away longer than that.

Costs: one LIST of the whole remote and one GET per segment; a DELETE per orphan.  A
dry run takes no lock and writes nothing.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field

from .._errors import (RemoteGcRunning, RemoteGcUnsafe, RemoteObjectCorrupt,
                       RemoteObjectMissing)
from ._index import RemoteWorkspace
from ._lease import Lease
from ._objects import blob_name, decode_segment, parse_segment_name

log = logging.getLogger(__name__)

DEFAULT_GRACE_S = 24 * 3600
_WS_LOCK = re.compile(r"ws/([^/]+)/(?:lease|claims/[^/]+)")
_GC_LOCK = re.compile(r"gc/(?:lease|claims/[^/]+)")


class GcLock(Lease):
    """The remote-wide gc lock: a ``Lease`` of scope ``gc`` (conditional create, or
    claims where the server ignores ``If-None-Match``); two gcs exclude each other."""

    def __init__(self, backend, remote: str, store_id: str, *, conditional: bool,
                 ttl_s: float | None = None):
        kw = {} if ttl_s is None else {"ttl_s": ttl_s}
        super().__init__(backend, remote, None, store_id, conditional=conditional,
                         scope="gc", **kw)

    def _held_by(self, other: dict) -> RemoteGcRunning:
        held = super()._held_by(other)
        return RemoteGcRunning(remote=self.remote, holder=held.details["holder"],
                               until=held.details["until"], store=other.get("store"))


def refuse_if_gc_running(lease: Lease) -> None:
    """Called by a push right after taking its lease: a live gc lock → the lease is
    released and ``RemoteGcRunning`` names the gc's holder."""
    keys = [k for k, _size in lease.backend.list("gc/") if _GC_LOCK.fullmatch(k)]
    other = lease.first_live(keys)
    if other is not None:
        lease.release()
        raise GcLock(lease.backend, lease.remote, lease.store_id,
                     conditional=lease.conditional)._held_by(other)


def refuse_if_pushing(lock: GcLock) -> None:
    """Called by gc right after taking its lock: a live workspace lease or claim → the
    lock is released and ``LeaseHeld`` names the push's holder and workspace."""
    for key, _size in lock.backend.list("ws/"):
        m = _WS_LOCK.fullmatch(key)
        if m is None:
            continue
        other = lock.first_live([key])
        if other is not None:
            lock.release()
            raise Lease(lock.backend, lock.remote, m.group(1), lock.store_id,
                        conditional=lock.conditional)._held_by(other)


@dataclass
class RemoteGcReport:
    dry_run: bool
    grace_s: float
    segments: int = 0
    reachable: int = 0                     # blob objects and packs some segment names
    deleted: list = field(default_factory=list)      # [(object, size)] (would be, dry)
    kept: list = field(default_factory=list)         # [(object, size, age_s)] too young

    def as_dict(self) -> dict:
        return {"dry_run": self.dry_run, "grace_s": self.grace_s,
                "segments": self.segments, "reachable": self.reachable,
                "deleted": 0 if self.dry_run else len(self.deleted),
                "would_delete": len(self.deleted) if self.dry_run else 0,
                "bytes_deleted": 0 if self.dry_run else sum(s for _k, s in self.deleted),
                "kept": len(self.kept), "bytes_kept": sum(s for _k, s, _a in self.kept)}


def gc_remote(backend, config, store_id: str, *, grace_s: float = DEFAULT_GRACE_S,
              dry_run: bool = False, on_delete=None,
              lock_ttl_s: float | None = None) -> RemoteGcReport:
    """Delete what no segment names and is older than ``grace_s`` (``dry_run``: only
    say so).  ``on_delete(name, size)`` before each deletion.  Refusals: ``LeaseHeld``
    (a push holds a workspace lease), ``RemoteGcRunning`` (another gc),
    ``RemoteGcUnsafe`` (a segment cannot be read) — each before anything is deleted."""
    report = RemoteGcReport(dry_run=dry_run, grace_s=grace_s)
    if dry_run:
        _collect(backend, config.name, report, None, on_delete)
        return report
    lock = GcLock(backend, config.name, store_id, conditional=bool(config.conditional),
                  ttl_s=lock_ttl_s)
    with lock, lock.keep_alive():
        refuse_if_pushing(lock)
        _collect(backend, config.name, report, lock, on_delete)
    return report


def _collect(backend, remote: str, report: RemoteGcReport, lock, on_delete) -> None:
    # listed after the lock and the lease check: every push that finished has all its
    # segments in this listing, and no push is running
    listing = backend.list_dated("")
    reachable = _reachable(backend, remote, listing, report)
    now = time.time()
    for key, size, mtime in listing:
        if not key.startswith(("blobs/", "packs/")) or key in reachable:
            continue
        age = now - mtime
        if age < report.grace_s:
            report.kept.append((key, size, age))
            continue
        if lock is not None:     # lapsed: a push may have started and named it
            lock.check_live(f"the deletion of {key}")
        if on_delete is not None:
            on_delete(key, size)
        report.deleted.append((key, size))
        if lock is not None:
            backend.delete(key)
    log.info("remote %s gc: %d deleted, %d kept (younger than %ss)", remote,
             len(report.deleted), len(report.kept), report.grace_s)


def _reachable(backend, remote: str, listing, report: RemoteGcReport) -> set[str]:
    """The object names every segment's blob rows name; ``RemoteGcUnsafe`` naming the
    first segment that cannot be read, verified or decoded."""
    names: set[str] = set()
    for key, _size, _mtime in listing:
        parsed = parse_segment_name(key)
        if parsed is None:
            continue
        try:
            state = RemoteWorkspace(parsed[0])
            state.merge(decode_segment(key, backend.get(key)), key)
        except (RemoteObjectCorrupt, RemoteObjectMissing) as exc:
            raise RemoteGcUnsafe(remote=remote, reason=f"segment {key}: {exc.message}",
                                 object=key) from None
        except (ValueError, TypeError, IndexError, KeyError) as exc:
            raise RemoteGcUnsafe(remote=remote, object=key,
                                 reason=f"segment {key}: a blob row does not decode "
                                        f"({exc})") from None
        report.segments += 1
        for sha, _n, where in state.blobs.values():
            names.add(blob_name(sha) if where[0] == "b" else where[1])
    report.reachable = len(names)
    return names
