"""The objects on a remote, and how each one is checked before it is used.

Layout under the remote's prefix (docs/remote.md)::

    blobs/ab/<sha256>          one blob >= ``PACK_LIMIT``, raw, named by SHA-256 of it
    packs/<sha256>             small blobs back to back (each a zstd frame when that is
                               smaller, else raw); named by SHA-256 of the whole object
    ws/<id>/seg/<seq>-<sha>    an index segment of workspace <id>: ``MAGIC`` + one
                               zstd frame of msgpack; <seq> 8 digits, <sha> the first
                               32 hex digits of SHA-256 of the object
    ws/<id>/lease              the push lease (``_lease``), ws/<id>/claims/<token> its
                               fallback where conditional writes are ignored

Every name is a hash of what it holds, so a reader verifies before use: a blob by the
SHA-256 of its content (after decompressing), a pack by its own name, a segment by its
name.  xxh3-128 (the local key) is fast but not collision-resistant against a bucket
someone else can write, so it is only the local key map: each segment's blob table
maps local key -> SHA-256 -> where the bytes are.
"""

from __future__ import annotations

import hashlib
import re

import msgpack
import zstandard

from .._errors import RemoteObjectCorrupt

PACK_LIMIT = 1 << 20          # smaller blobs go into packs
PACK_TARGET = 8 << 20         # a pack is closed once it holds this much
MAGIC = b"RWFSEG1\n"
_SEG = re.compile(r"ws/([^/]+)/seg/(\d{8})-([0-9a-f]{32})")
RAW, ZSTD = 0, 1


def sha256(data) -> bytes:
    return hashlib.sha256(data).digest()


def blob_name(sha: bytes) -> str:
    h = sha.hex()
    return f"blobs/{h[:2]}/{h}"


def pack_name(sha: bytes) -> str:
    return f"packs/{sha.hex()}"


def segment_name(ws_id: str, seq: int, body: bytes) -> str:
    return f"ws/{ws_id}/seg/{seq:08d}-{sha256(body).hex()[:32]}"


def parse_segment_name(key: str) -> tuple[str, int, str] | None:
    m = _SEG.fullmatch(key)
    return None if m is None else (m.group(1), int(m.group(2)), m.group(3))


# -- segments ---------------------------------------------------------------------------
def encode_segment(value: dict) -> bytes:
    return MAGIC + zstandard.ZstdCompressor(level=3).compress(
        msgpack.packb(value, use_bin_type=True))


def decode_segment(key: str, body: bytes) -> dict:
    """The segment at ``key``, verified against its name; ``RemoteObjectCorrupt``."""
    parsed = parse_segment_name(key)
    if parsed is None or sha256(body).hex()[:32] != parsed[2]:
        raise RemoteObjectCorrupt(key=key, reason="its content does not match its name")
    if not body.startswith(MAGIC):
        raise RemoteObjectCorrupt(key=key, reason="not a rewindfs segment")
    try:
        value = msgpack.unpackb(zstandard.ZstdDecompressor().decompress(body[len(MAGIC):]),
                                raw=False)
        if not isinstance(value, dict) or value.get("v") != 1:
            raise ValueError("unknown segment version")
        return value
    except (ValueError, TypeError, zstandard.ZstdError, msgpack.UnpackException) as exc:
        raise RemoteObjectCorrupt(key=key, reason=f"undecodable ({exc})") from None


# -- packs -------------------------------------------------------------------------------
class PackWriter:
    """Small blobs gathered into one pack object.  ``add`` returns the entry's place
    (offset, length, coding) in the pack; ``finish`` the pack's bytes and name."""

    def __init__(self):
        self._parts: list[bytes] = []
        self.size = 0
        self._cctx = zstandard.ZstdCompressor(level=3)

    def add(self, data: bytes) -> tuple[int, int, int]:
        packed = self._cctx.compress(data)
        coding = ZSTD
        if len(packed) >= len(data):
            packed, coding = data, RAW
        place = (self.size, len(packed), coding)
        self._parts.append(packed)
        self.size += len(packed)
        return place

    def __len__(self) -> int:
        return len(self._parts)

    def finish(self) -> tuple[str, bytes]:
        body = b"".join(self._parts)
        return pack_name(sha256(body)), body


def verify_pack(key: str, body: bytes) -> None:
    if pack_name(sha256(body)) != key:
        raise RemoteObjectCorrupt(key=key, reason="its content does not match its name")


def unpack_entry(key: str, body: bytes, offset: int, length: int, coding: int,
                 size: int, sha: bytes) -> bytes:
    """One blob out of a pack (or a whole blob object: offset 0, its length), verified
    by its SHA-256 and size; ``RemoteObjectCorrupt`` names the object otherwise."""
    piece = body[offset:offset + length]
    try:
        data = piece if coding == RAW else zstandard.ZstdDecompressor().decompress(
            piece, max_output_size=size)
    except zstandard.ZstdError as exc:
        raise RemoteObjectCorrupt(key=key, reason=f"blob {sha.hex()[:16]}…: {exc}") from None
    if len(data) != size or sha256(data) != sha:
        raise RemoteObjectCorrupt(key=key,
                                  reason=f"blob {sha.hex()[:16]}… does not match its hash")
    return data
