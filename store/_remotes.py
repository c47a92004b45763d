"""Remote configuration kept in the store (the ``remotes`` database, ``_schema``).

Names, URLs, endpoints, regions and the probed conditional-write behaviour of each
remote, the id this store signs its leases with, and which remote workspace id each
local workspace pushes to, and what was last pushed there (so ``status`` can say what
is not pushed yet without asking the remote).  Never a secret: credentials come from
the AWS chain.
"""

from __future__ import annotations

import secrets
import time

from . import _schema as S
from ._errors import RemoteExists, UnknownRemote
from ._limits import check_remote_name
_SELF = b"self"


def _rkey(name: str) -> bytes:
    return b"remote\0" + name.encode()


def _bkey(name: str, ws: int) -> bytes:
    return b"bind\0" + name.encode() + b"\0" + S.u32(ws)


def _pkey(name: str, ws: int) -> bytes:
    return b"pushed\0" + name.encode() + b"\0" + S.u32(ws)


def store_id(txn, db) -> str:
    """This store's id, made on first use (call inside a write transaction)."""
    raw = txn.get(_SELF, db=db["remotes"])
    if raw is not None:
        value = S.load("remotes", _SELF, raw)
        if isinstance(value, str):
            return value
    value = secrets.token_hex(8)
    txn.put(_SELF, S.dump(_SELF, value), db=db["remotes"])
    return value


def add(txn, db, name: str, url: str, endpoint, region, conditional) -> None:
    key = _rkey(check_remote_name(name))
    if txn.get(key, db=db["remotes"]) is not None:
        raise RemoteExists(remote=name)
    txn.put(key, S.dump(key, [url, endpoint, region, conditional, time.time_ns()]),
            db=db["remotes"])


def get(txn, db, name: str) -> list:
    """[url, endpoint, region, conditional, added_ns] of ``name``; ``UnknownRemote``."""
    key = _rkey(name)
    raw = txn.get(key, db=db["remotes"])
    if raw is None:
        raise UnknownRemote(remote=name)
    value = S.load("remotes", key, raw)
    with S.decoding("remotes", key):
        url, endpoint, region, conditional, added = value
        return [str(url), endpoint, region, conditional, added]


def every(txn, db) -> dict[str, list]:
    out = {}
    cur = txn.cursor(db=db["remotes"])
    if cur.set_range(b"remote\0"):
        for key, _raw in cur:
            if not key.startswith(b"remote\0"):
                break
            name = bytes(key[7:]).decode()
            out[name] = get(txn, db, name)
    return out


def remove(txn, db, name: str) -> None:
    key = _rkey(name)
    if not txn.delete(key, db=db["remotes"]):
        raise UnknownRemote(remote=name)
    for kind in (b"bind", b"pushed"):
        _delete_prefix(txn, db, kind + b"\0" + name.encode() + b"\0")


def _delete_prefix(txn, db, prefix: bytes) -> None:
    cur = txn.cursor(db=db["remotes"])
    doomed = []
    if cur.set_range(prefix):
        for k, _ in cur:
            if not k.startswith(prefix):
                break
            doomed.append(bytes(k))
    for k in doomed:
        txn.delete(k, db=db["remotes"])


def binding(txn, db, name: str, ws: int) -> str | None:
    key = _bkey(name, ws)
    raw = txn.get(key, db=db["remotes"])
    if raw is None:
        return None
    value = S.load("remotes", key, raw)
    if not isinstance(value, str):
        raise S.corrupt("remotes", key, "not a workspace id")
    return value


def bind(txn, db, name: str, ws: int, remote_ws: str) -> None:
    key = _bkey(name, ws)
    txn.put(key, S.dump(key, remote_ws), db=db["remotes"])


def record_push(txn, db, name: str, ws: int, epoch: int, pushed_ns: int) -> None:
    """Remember that a push of ``ws`` to ``name`` carried every epoch up to ``epoch`` (the
    newest epoch of the history it read, and the head captured just before)."""
    get(txn, db, name)
    key = _pkey(name, ws)
    txn.put(key, S.dump(key, [epoch, pushed_ns]), db=db["remotes"])


def last_push(txn, db, name: str, ws: int) -> tuple[int, int] | None:
    """(epoch, pushed_ns) of the last successful push of ``ws`` to ``name``; None if
    this store never pushed it there."""
    key = _pkey(name, ws)
    raw = txn.get(key, db=db["remotes"])
    if raw is None:
        return None
    value = S.load("remotes", key, raw)
    with S.decoding("remotes", key):
        epoch, pushed_ns = value
        return int(epoch), int(pushed_ns)
