"""``fsck --remote``: read every object a remote's segments name and verify it.

Every segment of every workspace is read and checked against its name; every blob row
is checked against the object that should hold it — a pack entry by decompressing it
and comparing SHA-256 and size, a blob object by streaming it through SHA-256 (into a
temp file, never whole in memory).  Problems name the object, the workspace and how
many blobs are affected; objects no segment names (an interrupted push leaves them)
are listed as orphans, a warning.  Downloads everything: it costs a full read of the
remote.
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass, field

from .._errors import RemoteObjectCorrupt, RemoteObjectMissing
from ._index import RemoteWorkspace, segment_keys, workspace_ids
from ._objects import blob_name, decode_segment, unpack_entry


@dataclass
class RemoteCheck:
    objects_checked: int = 0
    blobs_checked: int = 0
    problems: list = field(default_factory=list)     # dicts: code, object, message, …
    orphans: list = field(default_factory=list)      # object names

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        return {"ok": self.ok, "objects_checked": self.objects_checked,
                "blobs_checked": self.blobs_checked, "problems": self.problems,
                "orphans": self.orphans}


def check_remote(backend) -> RemoteCheck:
    out = RemoteCheck()
    present = dict(backend.list(""))
    rows: dict[str, list] = {}            # object -> [(workspace, sha, size, where)]
    for ws_id in workspace_ids(backend):
        state = RemoteWorkspace(ws_id)
        for _seq, key in segment_keys(backend, ws_id):
            out.objects_checked += 1
            try:
                state.merge(decode_segment(key, backend.get(key)), key)
            except (RemoteObjectCorrupt, RemoteObjectMissing) as exc:
                out.problems.append(_problem(exc, key, ws_id, 0))
        for sha, size, where in state.blobs.values():
            name = blob_name(sha) if where[0] == "b" else where[1]
            rows.setdefault(name, []).append((ws_id, sha, size, where))
    for name, group in sorted(rows.items()):
        out.objects_checked += 1
        out.blobs_checked += len(group)
        if name not in present:
            out.problems.append(_problem(RemoteObjectMissing(key=name), name,
                                         group[0][0], len(group)))
            continue
        bad = _check_object(backend, name, group)
        if bad:
            out.problems.append({**_problem(RemoteObjectCorrupt(
                key=name, reason=f"{bad} of its {len(group)} blob(s) do not match their "
                                 "hashes"), name, group[0][0], bad)})
    out.orphans = sorted(k for k in present if k.startswith(("blobs/", "packs/"))
                         and k not in rows)
    return out


def _check_object(backend, name: str, group) -> int:
    """How many of the blobs ``group`` places in object ``name`` fail to verify."""
    if name.startswith("blobs/"):
        _ws, sha, size, _where = group[0]
        return 0 if _streamed_sha(backend, name) == (sha, size) else len(group)
    try:
        body = backend.get(name)
    except RemoteObjectMissing:
        return len(group)
    bad = 0
    for _ws, sha, size, where in group:
        try:
            unpack_entry(name, body, *where[2:5], size, sha)
        except RemoteObjectCorrupt:
            bad += 1
    return bad


def _streamed_sha(backend, name: str) -> tuple[bytes, int] | None:
    with tempfile.NamedTemporaryFile(prefix="rewindfs-check-") as tmp:
        try:
            backend.get_file(name, tmp.name)
        except RemoteObjectMissing:
            return None
        h, n = hashlib.sha256(), 0
        with open(tmp.name, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
                n += len(chunk)
        return h.digest(), n


def _problem(exc, name: str, ws_id: str, blobs: int) -> dict:
    return {"code": exc.code, "object": name, "workspace": ws_id, "blobs": blobs,
            "message": exc.message}
