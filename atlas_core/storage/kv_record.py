"""The on-disk record of one KV block: a header with a checksum, then the block's bytes.

A record is ``HEADER`` (64 bytes: magic, format version, the block's 16-byte chained hash,
payload length, CRC-32 of the payload) followed by the payload. A file cut short by a crash, a
flipped bit, or a file renamed under another block's key fails :func:`unpack_record` instead of
being served.
"""

from __future__ import annotations

import struct
import zlib

MAGIC = b"ATLASKV\0"
VERSION = 1
#: magic, version, block hash, payload length, CRC-32; padded to 64 bytes.
HEADER = struct.Struct("<8sI16sQI")
HEADER_SIZE = 64


class CorruptRecord(ValueError):
    """A stored KV block failed its checks (torn write, bad checksum, wrong key or size)."""


def pack_record(block_hash: bytes, payload) -> bytes:
    """``payload`` (bytes-like) framed with its header."""
    view = memoryview(payload).cast("B")
    head = HEADER.pack(MAGIC, VERSION, block_hash, view.nbytes, zlib.crc32(view))
    return head.ljust(HEADER_SIZE, b"\0") + view.tobytes()


def unpack_record(block_hash: bytes, data, payload_size: int) -> memoryview:
    """The payload of a record read back for ``block_hash``.

    Raises:
        CorruptRecord: short or long, foreign magic or version, another block's hash, or a
            checksum mismatch.
    """
    view = memoryview(data).cast("B")
    if view.nbytes != HEADER_SIZE + payload_size:
        raise CorruptRecord(f"record is {view.nbytes} bytes, expected "
                            f"{HEADER_SIZE + payload_size} (torn or foreign file)")
    magic, version, stored_hash, length, crc = HEADER.unpack_from(view)
    if magic != MAGIC or version != VERSION:
        raise CorruptRecord(f"not an Atlas KV record of version {VERSION}")
    if stored_hash != block_hash or length != payload_size:
        raise CorruptRecord("record belongs to another block")
    payload = view[HEADER_SIZE:]
    if zlib.crc32(payload) != crc:
        raise CorruptRecord("checksum mismatch")
    return payload
