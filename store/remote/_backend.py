"""The backend seam: the five object operations the remote needs, and S3 behind them.

Contract of a backend (``S3Backend`` is the one real implementation):

- ``put(key, data)`` stores ``data`` under ``key`` atomically (a reader sees the old
  object, none, or all of the new one — S3 PUT semantics);
- ``put_if_absent(key, data)`` creates ``key`` only if no object is there
  (``If-None-Match: *``) and returns False if one was.  A server that ignores the header
  overwrites and returns True: ``probe_conditional`` finds out which kind of server it
  is (the lease depends on it, see ``_lease``);
- ``put_file(key, path)`` / ``get_file(key, path)``: the same for a large object,
  streamed from or into a local file (never whole in memory);
- ``get(key)`` returns the bytes (``RemoteObjectMissing`` if there is none);
  ``head(key)`` the size or None; ``list(prefix)`` every key under ``prefix`` with its
  size, in key order (``list_dated``: also its last-modified time, seconds since the
  epoch by the server's clock); ``delete(key)`` removes it (missing is fine).

Keys are relative to the remote's prefix.  ``DirBackend`` (files in a local directory,
conditional create honoured) exists for tests of the logic above the seam.  Every failure that is not "no such object"
leaves as ``RemoteUnreachable`` (network, refused credentials, no bucket), so callers
handle one error, and a push interrupted by it resumes on the next run.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import urllib.parse
from dataclasses import dataclass

from .._errors import (FULL_ERRNOS, BadRemoteUrl, RemoteNoCredentials,
                       RemoteObjectMissing, RemoteUnreachable, StoreFull)

log = logging.getLogger(__name__)

_URL = re.compile(r"s3://([a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])(?:/(.*))?")


@dataclass(frozen=True)
class RemoteConfig:
    """A remote as the store keeps it (never a secret: credentials come from the AWS
    chain — environment, config files, profiles — when a client is made)."""

    name: str
    url: str
    endpoint: str | None = None
    region: str | None = None
    conditional: bool | None = None    # does the server honour If-None-Match (probed)

    @property
    def bucket(self) -> str:
        return parse_url(self.url)[0]

    @property
    def prefix(self) -> str:
        return parse_url(self.url)[1]

    def as_dict(self) -> dict:
        return {"name": self.name, "url": self.url, "endpoint": self.endpoint,
                "region": self.region, "conditional": self.conditional}


def parse_url(url: str) -> tuple[str, str]:
    """``s3://BUCKET/PREFIX`` → (bucket, prefix without slashes at either end)."""
    m = _URL.fullmatch(url or "")
    if m is None:
        bucket = (url or "").removeprefix("s3://").split("/", 1)[0]
        if (url or "").startswith("s3://") and bucket:
            raise BadRemoteUrl(url=url, reason=f"S3 takes no bucket named {bucket!r}: a "
                               "bucket name is 3 to 63 characters, lower-case letters, "
                               "digits, dots and hyphens, with a letter or digit at each end")
        raise BadRemoteUrl(url=url, reason="expected s3://BUCKET or s3://BUCKET/PREFIX")
    raw = m.group(2) or ""
    prefix = raw.strip("/")
    if raw.startswith("/") or "//" in raw or any(p in (".", "..") for p in prefix.split("/")):
        raise BadRemoteUrl(url=url, reason="the prefix has an empty, '.' or '..' part")
    return m.group(1), prefix


def check_endpoint(endpoint: str | None) -> None:
    """``BadRemoteUrl`` unless *endpoint* is None or ``http(s)://HOST[:PORT][/…]`` —
    before anything is made of it (botocore's own refusal reads as our failure)."""
    if endpoint is None:
        return
    parts = urllib.parse.urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadRemoteUrl(url=endpoint, reason="an endpoint is an http:// or https:// URL "
                                                "with a host, e.g. http://127.0.0.1:9000")


class S3Backend:
    """Objects in ``bucket`` under ``prefix``, through boto3 (path-style addressing when
    an endpoint is given, as MinIO, Ceph RGW and ``rclone serve s3`` want)."""

    def __init__(self, config: RemoteConfig):
        import boto3
        from botocore.config import Config

        self.config = config
        self.bucket, prefix = parse_url(config.url)
        self._prefix = prefix + "/" if prefix else ""
        style = {"addressing_style": "path"} if config.endpoint else {}
        self._client = boto3.session.Session().client(
            "s3", endpoint_url=config.endpoint, region_name=config.region or None,
            # checksums "when required": every object we read is verified by its own
            # hash anyway, and botocore 1.44's wrapped body breaks its parsing of a 404
            # from servers that send no checksum (rclone serve s3)
            config=Config(s3=style, retries={"max_attempts": 3, "mode": "standard"},
                          connect_timeout=10, read_timeout=60,
                          request_checksum_calculation="when_required",
                          response_checksum_validation="when_required"))

    def _key(self, key: str) -> str:
        return self._prefix + key

    def _call(self, what: str, key: str, fn, **kw):
        from botocore.exceptions import BotoCoreError, ClientError
        try:
            return fn(Bucket=self.bucket, **kw)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("NoSuchKey", "404", "NotFound") or status == 404 and what != "list":
                raise RemoteObjectMissing(key=key) from None
            if code in ("PreconditionFailed", "412") or status == 412:
                raise _Exists() from None
            raise RemoteUnreachable(remote=self.config.name, reason=f"{what} {key}: {code or status}: {exc}") from None
        except (BotoCoreError, OSError) as exc:
            raise self._failed(what, key, exc) from None

    def _failed(self, what: str, key: str, exc: Exception):
        """The error for a request that got no answer: no credentials (trying again
        cannot help: say where they come from), else unreachable."""
        from botocore.exceptions import NoCredentialsError
        if isinstance(exc, NoCredentialsError):
            return RemoteNoCredentials(remote=self.config.name)
        full = _local_exhaustion(exc)
        if full is not None:     # our disk, not the remote: running again cannot help
            return StoreFull(message=f"{what} {key}: {full.strerror}")
        return RemoteUnreachable(remote=self.config.name, reason=f"{what} {key}: {exc}")

    def put(self, key: str, data: bytes) -> None:
        self._call("put", key, self._client.put_object, Key=self._key(key), Body=data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        try:
            self._call("put", key, self._client.put_object, Key=self._key(key), Body=data,
                       IfNoneMatch="*")
        except _Exists:
            return False
        return True

    def get(self, key: str) -> bytes:
        resp = self._call("get", key, self._client.get_object, Key=self._key(key))
        from botocore.exceptions import BotoCoreError
        try:
            return resp["Body"].read()
        except (BotoCoreError, OSError) as exc:
            raise RemoteUnreachable(remote=self.config.name, reason=f"get {key}: {exc}") from None

    def put_file(self, key: str, path: str) -> None:
        """Upload the file at ``path`` (multipart above 8 MiB, never whole in memory)."""
        self._transfer("put", key, self._client.upload_file, path, self.bucket, self._key(key))

    def get_file(self, key: str, path: str) -> None:
        """Download ``key`` into the file at ``path`` (streamed)."""
        self._transfer("get", key, self._client.download_file, self.bucket, self._key(key),
                       path)

    def _transfer(self, what: str, key: str, fn, *args) -> None:
        from boto3.exceptions import Boto3Error
        from botocore.exceptions import BotoCoreError, ClientError
        try:
            fn(*args)
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if status == 404 or code in ("404", "NoSuchKey", "NotFound"):
                raise RemoteObjectMissing(key=key) from None
            raise RemoteUnreachable(remote=self.config.name, reason=f"{what} {key}: {exc}") from None
        except (Boto3Error, BotoCoreError, OSError) as exc:
            raise self._failed(what, key, exc) from None

    def head(self, key: str) -> int | None:
        try:
            resp = self._call("head", key, self._client.head_object, Key=self._key(key))
        except RemoteObjectMissing:
            return None
        return int(resp["ContentLength"])

    def list(self, prefix: str = "") -> list[tuple[str, int]]:
        return [(key, size) for key, size, _mtime in self.list_dated(prefix)]

    def list_dated(self, prefix: str = "") -> list[tuple[str, int, float]]:
        out, token = [], None
        while True:
            kw = {"Prefix": self._key(prefix)}
            if token:
                kw["ContinuationToken"] = token
            resp = self._call("list", prefix, self._client.list_objects_v2, **kw)
            out += [(o["Key"][len(self._prefix):], int(o["Size"]),
                     o["LastModified"].timestamp()) for o in resp.get("Contents", ())]
            if not resp.get("IsTruncated"):
                return sorted(out)
            token = resp["NextContinuationToken"]

    def delete(self, key: str) -> None:
        self._call("delete", key, self._client.delete_object, Key=self._key(key))


class DirBackend:
    """Objects as files under a local directory, with a conditional create that is
    honoured (``O_EXCL`` on the final name after a unique temp write): for tests of the
    logic above the seam (the lease's conditional path, which ``rclone serve s3``
    cannot exercise).  Same contract as ``S3Backend``; not offered to users."""

    def __init__(self, root, name: str = "dir"):
        self.root = os.fspath(root)
        self.config = RemoteConfig(name, "s3://local-dir", conditional=True)

    def _path(self, key: str) -> str:
        if not key or key.startswith("/") or ".." in key.split("/"):
            raise BadRemoteUrl(url=key, reason="not an object key")
        return os.path.join(self.root, key)

    def _write_temp(self, key: str, data: bytes) -> str:
        path = self._path(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp-{secrets.token_hex(6)}"
        with open(tmp, "wb") as f:
            f.write(data)
        return tmp

    def put(self, key: str, data: bytes) -> None:
        os.replace(self._write_temp(key, data), self._path(key))

    def put_if_absent(self, key: str, data: bytes) -> bool:
        tmp = self._write_temp(key, data)
        try:
            os.link(tmp, self._path(key))      # fails if the name exists: atomic
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        return True

    def put_file(self, key: str, path: str) -> None:
        with open(path, "rb") as f:
            self.put(key, f.read())

    def get_file(self, key: str, path: str) -> None:
        with open(path, "wb") as f:
            f.write(self.get(key))

    def get(self, key: str) -> bytes:
        try:
            with open(self._path(key), "rb") as f:
                return f.read()
        except FileNotFoundError:
            raise RemoteObjectMissing(key=key) from None

    def head(self, key: str) -> int | None:
        try:
            return os.stat(self._path(key)).st_size
        except FileNotFoundError:
            return None

    def list(self, prefix: str = "") -> list[tuple[str, int]]:
        return [(key, size) for key, size, _mtime in self.list_dated(prefix)]

    def list_dated(self, prefix: str = "") -> list[tuple[str, int, float]]:
        out = []
        for dirpath, _dirs, files in os.walk(self.root):
            for name in files:
                full = os.path.join(dirpath, name)
                key = os.path.relpath(full, self.root)
                if key.startswith(prefix) and ".tmp-" not in name:
                    st = os.stat(full)
                    out.append((key, st.st_size, st.st_mtime))
        return sorted(out)

    def delete(self, key: str) -> None:
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass


class _Exists(Exception):
    """A conditional create found an object in place (HTTP 412)."""


def open_backend(config: RemoteConfig) -> S3Backend:
    return S3Backend(config)


def probe_conditional(backend) -> bool:
    """True if the server refuses a second ``If-None-Match: *`` create of one key (AWS
    S3 does; ``rclone serve s3`` 1.75 overwrites).  Writes and removes one probe
    object."""
    key = f"probe/{secrets.token_hex(8)}-{os.getpid()}"
    try:
        backend.put_if_absent(key, b"1")
        return not backend.put_if_absent(key, b"2")
    finally:
        backend.delete(key)


def _local_exhaustion(exc: BaseException) -> OSError | None:
    """The ``ENOSPC``/``EDQUOT`` of this machine's disk behind a failed transfer (boto3
    wraps the download's own write error), else None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None
