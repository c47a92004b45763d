"""One writer per workspace history on a remote: the push lease.

A lease names its holder (this store's id, host and pid) and an expiry.  Taking it:

- **Conditional create** where the server honours ``If-None-Match: *`` (AWS S3 does;
  the remote's ``conditional`` flag, probed by ``remote add``): create ``ws/<id>/lease``
  conditionally.  If one is there, it is read: a lease of our own store whose process
  is gone (a push that crashed) or any expired lease is deleted and the create is tried
  once more; a live lease of someone else is ``LeaseHeld`` naming the holder.  Two
  writers racing for the same create: the server lets exactly one win.
- **Fallback** where the server ignores the header (``rclone serve s3`` 1.75 overwrites):
  every taker writes its own claim ``ws/<id>/claims/<token>`` (a fresh name, so nothing
  is overwritten), then lists the claims.  Any other live claim → it deletes its own
  and refuses (``LeaseHeld``); stale ones (expired, or our store's dead process) are
  removed.  Of two takers, the one that lists second sees the other's claim (its list
  comes after its own write, which comes after the first one's list, which comes after
  the first one's write), so at most one proceeds — both may refuse, never both win.
  This needs read-after-write consistent listing, which S3 has had since 2020.

``renew`` rewrites our lease or claim with a later expiry (``keep_alive`` does it from a
thread every quarter TTL while a push or gc runs); ``check_live`` refuses to go on once
no renewal reached the server for half a TTL (a suspended machine, a cut network), so a
lapsed holder never writes what its lease was guarding; ``release`` deletes it.  Expiry uses the clocks of the machines involved:
a lease is kept ``TTL_S`` (10 min) past its last renewal.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import threading
import time
from datetime import datetime, timezone

from .._process import pid_alive
from .._errors import LeaseHeld, LeaseLapsed, RemoteError, RemoteObjectMissing

log = logging.getLogger(__name__)

TTL_S = 600
_held: set[str] = set()      # tokens of the leases this process holds now


class Lease:
    """The lease of workspace ``ws_id``; ``scope`` names another lock taken the same way
    (``_gc.GcLock``: the remote-wide gc lock, ``gc/lease`` and ``gc/claims/``)."""

    def __init__(self, backend, remote: str, ws_id: str | None, store_id: str, *,
                 conditional: bool, ttl_s: float = TTL_S, scope: str | None = None):
        self.backend, self.remote, self.ws_id = backend, remote, ws_id
        self.scope = scope or f"ws/{ws_id}"
        self.store_id, self.conditional, self.ttl_s = store_id, bool(conditional), ttl_s
        self.token = secrets.token_hex(8)
        self.held = False
        self.expires = 0.0
        self._mutex = threading.Lock()   # a renewal in flight never outlives release()

    # -- what a lease says -------------------------------------------------------------
    def _body(self) -> bytes:
        self.expires = time.time() + self.ttl_s
        return json.dumps({"v": 1, "store": self.store_id, "host": socket.gethostname(),
                           "pid": os.getpid(), "token": self.token,
                           "expires": self.expires}).encode()

    @property
    def _key(self) -> str:
        return f"{self.scope}/lease"

    @property
    def _claims(self) -> str:
        return f"{self.scope}/claims/"

    # -- take, renew, release ----------------------------------------------------------
    def acquire(self) -> "Lease":
        if self.conditional:
            self._acquire_conditional()
        else:
            self._acquire_claim()
        self.held = True
        _held.add(self.token)
        return self

    def _acquire_conditional(self) -> None:
        for _attempt in range(2):
            if self.backend.put_if_absent(self._key, self._body()):
                return
            other = self._read(self._key)
            if other is not None and not self._stale(other):
                raise self._held_by(other)
            self.backend.delete(self._key)
        raise self._held_by(self._read(self._key) or {})

    def _acquire_claim(self) -> None:
        mine = self._claims + self.token
        self.backend.put(mine, self._body())
        for key, _size in self.backend.list(self._claims):
            if key == mine:
                continue
            other = self._read(key)
            if other is None:
                continue
            if self._stale(other):
                self.backend.delete(key)
                continue
            self.backend.delete(mine)
            raise self._held_by(other)

    def renew(self, *, force: bool = False) -> None:
        """Push the expiry out again (a no-op unless half the lease has run out, or
        ``force``).  ``expires`` moves only once the server has the new record."""
        with self._mutex:
            if not self.held or not force and time.time() < self.expires - self.ttl_s / 2:
                return
            key = self._key if self.conditional else self._claims + self.token
            before = self.expires
            try:
                self.backend.put(key, self._body())
            except BaseException:
                self.expires = before
                raise

    @contextlib.contextmanager
    def keep_alive(self):
        """Renew every quarter of the TTL from a thread while the block runs, so one
        long upload (a large blob on a slow link) does not outlive the lease.  A renewal
        that fails is logged; ``check_live`` then notices."""
        stop = threading.Event()

        def renewing():
            while not stop.wait(self.ttl_s / 4):
                try:
                    self.renew(force=True)
                except RemoteError as exc:
                    log.warning("renewing the lease on %s failed: %s", self.scope, exc)

        thread = None
        if self.ttl_s > 0:
            thread = threading.Thread(target=renewing, name="lease-renew", daemon=True)
            thread.start()
        try:
            yield self
        finally:
            stop.set()
            if thread is not None:
                thread.join()

    def check_live(self, what: str) -> None:
        """``LeaseLapsed`` unless this lease was renewed on the server within the last
        half TTL: past that, another machine (whose clock may run up to half a TTL
        ahead) could judge it expired, take over or run gc, so ``what`` must not be
        written."""
        if time.time() > self.expires - self.ttl_s / 2:
            raise LeaseLapsed(remote=self.remote, scope=self.scope, what=what)

    def release(self) -> None:
        with self._mutex:
            if not self.held:
                return
            self.held = False
        _held.discard(self.token)
        if self.conditional:
            current = self._read(self._key)
            if current is not None and current.get("token") == self.token:
                self.backend.delete(self._key)
        else:
            self.backend.delete(self._claims + self.token)

    def __enter__(self):
        return self.acquire()

    def __exit__(self, typ, exc, tb):
        if typ is None:
            self.release()
            return
        try:        # already failing (often: the remote went away); keep that error
            self.release()
        except RemoteError:
            pass

    # -- judging another lease ----------------------------------------------------------
    def first_live(self, keys) -> dict | None:
        """The first of ``keys`` (leases or claims, of any scope) that is live and not
        this one's own, as read; None if none is.  Stale ones are left in place (their
        own scope's next taker removes them)."""
        for key in keys:
            other = self._read(key)
            if other is None or other.get("token") == self.token or self._stale(other):
                continue
            return other
        return None

    def _read(self, key: str) -> dict | None:
        try:
            value = json.loads(self.backend.get(key))
        except RemoteObjectMissing:
            return None
        except ValueError:
            return {}          # unreadable: treated as expired (it names no holder)
        return value if isinstance(value, dict) else {}

    def _stale(self, other: dict) -> bool:
        """Expired, unreadable, or ours from a process that is gone (or from this
        process, by a lease it no longer holds: a push that failed half-way)."""
        try:
            if float(other.get("expires", 0)) < time.time():
                return True
        except (TypeError, ValueError):
            return True
        if other.get("store") == self.store_id and other.get("host") == socket.gethostname():
            if other.get("pid") == os.getpid():
                return other.get("token") not in _held
            return not pid_alive(other.get("pid"))
        return False

    def _held_by(self, other: dict) -> LeaseHeld:
        holder = f"store {other.get('store', '?')} on {other.get('host', '?')} " \
                 f"(pid {other.get('pid', '?')})"
        try:
            until = datetime.fromtimestamp(float(other["expires"]), timezone.utc)
            until = until.strftime("%Y-%m-%d %H:%M:%S UTC")
        except (KeyError, TypeError, ValueError):
            until = "?"
        return LeaseHeld(remote=self.remote, workspace=self.ws_id, holder=holder,
                         until=until, store=other.get("store"), host=other.get("host"))


