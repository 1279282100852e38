"""The on-disk record of one KV block: a header with a checksum, then the block's bytes.

A record is ``HEADER`` (64 bytes: magic, format version, the block's 16-byte chained hash,
payload length, CRC-32 of the payload) followed by the payload. A file cut short by a crash, a
flipped bit, or a file renamed under another block's key fails :func:`unpack_record` instead of
being served.

The tiers build records in place: :func:`new_record` is the buffer, the block's bytes go into
its payload part (``record[HEADER_SIZE:]``, straight from the device), and :func:`seal_record`
writes the header, checksum included, on whatever thread has the time.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

MAGIC = b"ATLASKV\0"
VERSION = 1
#: magic, version, block hash, payload length, CRC-32; padded to 64 bytes.
HEADER = struct.Struct("<8sI16sQI")
HEADER_SIZE = 64


class CorruptRecord(ValueError):
    """A stored KV block failed its checks (torn write, bad checksum, wrong key or size)."""


def new_record(payload_size: int) -> np.ndarray:
    """An unfilled record buffer: ``uint8 [HEADER_SIZE + payload_size]``."""
    return np.empty(HEADER_SIZE + payload_size, np.uint8)


def seal_record(record: np.ndarray, block_hash: bytes) -> None:
    """Write the header of ``record`` (a :func:`new_record` whose payload is filled): magic,
    version, ``block_hash``, length and the payload's CRC-32 (computed without the GIL)."""
    payload = record[HEADER_SIZE:]
    head = HEADER.pack(MAGIC, VERSION, block_hash, payload.nbytes, zlib.crc32(payload))
    record[:HEADER_SIZE] = np.frombuffer(head.ljust(HEADER_SIZE, b"\0"), np.uint8)


def pack_record(block_hash: bytes, payload) -> bytes:
    """``payload`` (bytes-like) framed with its header."""
    view = memoryview(payload).cast("B")
    record = new_record(view.nbytes)
    record[HEADER_SIZE:] = np.frombuffer(view, np.uint8)
    seal_record(record, block_hash)
    return record.tobytes()


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
