"""The write-ahead log's on-disk record format (version 2). Pure: bytes in, bytes out.

A WAL or segment file starts with an 8-byte file header ``b"WRNWAL"`` +
version (u16). Then records, each:

    marker      u32   0x57524E52 ("WRNR"), so a scan can find record starts quickly
    length      u32   bytes of the body: 24 + len(payload)
    header_crc  u32   CRC-32 of marker and length: a length that passes is trusted
    body_crc    u32   CRC-32 of the body
    body:
      log_id    u64   which log (a queue, or the node's metadata) the entry belongs to
      term      u64   Raft term (0 until replication)
      index     u64   the entry's index in its log
      payload   bytes

``scan`` reads records back and tells a torn tail (a partial or corrupt last
record: cut it off) from corruption in the middle (a bad record followed by
good ones: refuse to start). After a bad record it looks for any valid record
further on: from the end of the bad record's body when its header is intact
(so a payload that itself contains an encoded record cannot mislead it), else
from the next byte.

A WAL file is allocated ahead of its writes (storage/files.py), so after a
crash it may end in zeros: with ``zero_tail_ok`` they are its end, not a torn
tail (``ScanResult.zero_tail``). Nothing else is allocated ahead, so a segment
that ends in zeros is torn.
"""
from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

# zlib-ng's CRC-32 is zlib's (the same polynomial and values: tests pin them), with
# the carry-less multiply instructions: ~50 GB/s here against ~2 GB/s, where every
# byte of a body is checksummed when written and again when read back.
from zlib_ng.zlib_ng import crc32

FILE_MAGIC = b"WRNWAL"
FORMAT_VERSION = 2
FILE_HEADER = FILE_MAGIC + struct.pack(">H", FORMAT_VERSION)
FILE_HEADER_SIZE = len(FILE_HEADER)

RECORD_MARKER = 0x57524E52
RECORD_MARKER_BYTES = struct.pack(">I", RECORD_MARKER)
_prefix = struct.Struct(">IIII")  # marker, length, header_crc, body_crc
_marker_length = struct.Struct(">II")
_marker_length_pack = _marker_length.pack
_crcs_pack = struct.Struct(">II").pack  # header crc, body crc
_entry_head = struct.Struct(">QQQ")  # log_id, term, index
_prefix_unpack = _prefix.unpack_from
_entry_head_unpack = _entry_head.unpack_from
_entry_head_pack = _entry_head.pack
PREFIX_SIZE = _prefix.size
ENTRY_HEAD_SIZE = _entry_head.size
# A record's payload may not exceed this; a larger length field is corruption.
RECORD_PAYLOAD_MAX_BYTES = 1024 * 1024 * 1024


class Record(NamedTuple):
    # a named tuple: recovery makes one per record, and it is cheap to build
    log_id: int
    term: int
    index: int
    payload: bytes


class CorruptLog(Exception):
    """A bad record in the middle of a file: never skipped silently."""

    def __init__(self, path: str, offset: int, reason: str):
        super().__init__(f"{path}: corrupt record at offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


def encode(log_id: int, term: int, index: int, payload: bytes) -> bytes:
    if len(payload) > RECORD_PAYLOAD_MAX_BYTES:
        raise ValueError(f"record payload of {len(payload)} bytes exceeds {RECORD_PAYLOAD_MAX_BYTES}")
    # The payload (a message batch's bodies) is copied once, by the join; its
    # checksum is computed once, chained on the head's.
    head = _entry_head_pack(log_id, term, index)
    marker_length = _marker_length_pack(RECORD_MARKER, ENTRY_HEAD_SIZE + len(payload))
    crcs = _crcs_pack(crc32(marker_length), crc32(payload, crc32(head)))
    return b"".join((marker_length, crcs, head, payload))


def encode_split(log_id: int, term: int, index: int, payload_head: bytes,
                 data: bytes | memoryview | tuple[bytes, ...]) -> tuple[bytes, ...]:
    """`encode(log_id, term, index, payload_head + data)` as pieces, everything before
    `data` and `data` itself (bytes, or the pieces it is made of), byte for byte the
    same once written one after the other, without copying `data` (a Raft entry's
    command, a snapshot): the checksum runs over the pieces, and the WAL writes them
    as they are (`AppendHandle.write_pieces`)."""
    parts = data if type(data) is tuple else (data,)
    payload_size = len(payload_head) + (len(data) if parts[0] is data else sum(map(len, parts)))
    if payload_size > RECORD_PAYLOAD_MAX_BYTES:
        raise ValueError(f"record payload of {payload_size} bytes exceeds {RECORD_PAYLOAD_MAX_BYTES}")
    head = _entry_head_pack(log_id, term, index) + payload_head
    marker_length = _marker_length_pack(RECORD_MARKER, ENTRY_HEAD_SIZE + payload_size)
    crc = crc32(head)
    for part in parts:   # chained: the checksum of the pieces' concatenation
        crc = crc32(part, crc)
    return (marker_length + _crcs_pack(crc32(marker_length), crc) + head, *parts)


# An encoded record: its bytes, or pieces whose concatenation they are (`encode_split`;
# the first piece holds at least the prefix and the entry head).
Encoded = bytes | tuple[bytes, ...]


def record_size(record: Encoded) -> int:
    return len(record) if type(record) is bytes else sum(map(len, record))


def joined(record: Encoded) -> bytes:
    return record if type(record) is bytes else b"".join(record)


def head_of(record: Encoded) -> tuple[int, int, int]:
    """(log_id, index, length) of one encoded record (as `encode` or `encode_split` made it)."""
    first = record if type(record) is bytes else record[0]
    log_id, _term, index = _entry_head_unpack(first, PREFIX_SIZE)
    return log_id, index, record_size(record)


def heads_of_batch(data: bytes) -> list[tuple[int, int, int]]:
    """(log_id, index, length) of each record of a batch this process encoded:
    lengths read from the prefixes, checksums not computed (the batch has not
    left memory yet)."""
    heads = []
    offset = 0
    while offset < len(data):
        _marker, length = _marker_length.unpack_from(data, offset)
        log_id, _term, index = _entry_head_unpack(data, offset + PREFIX_SIZE)
        heads.append((log_id, index, PREFIX_SIZE + length))
        offset += PREFIX_SIZE + length
    return heads


@dataclass(frozen=True, slots=True)
class ScanResult:
    records: list[Record]
    offsets: list[int]  # where each record starts in the file
    valid_end: int  # offset just past the last good record
    torn_bytes: int  # bytes after valid_end that were cut off as a torn tail
    torn_reason: str | None
    zero_tail: int = 0  # zero bytes after valid_end: space allocated ahead and never written


def zeros_from(data: bytes, start: int) -> bool:
    """Whether `data` holds only zero bytes from `start` on (and something there)."""
    # sliced first: `data` may be a mapped file (storage/files.py), which has no count()
    return start < len(data) and data[start:].count(0) == len(data) - start


def scan(data: bytes, path: str = "<wal>", zero_tail_ok: bool = False,
         visit: Callable[[Record, int], None] | None = None) -> ScanResult:
    """Decode a whole WAL file's bytes. Raises CorruptLog for mid-file damage.

    With ``visit``, each good record is handed to it with its offset as it is
    decoded, and the result lists none: a recovery of a large WAL file never
    holds all its records at once. (Records before a damage that raises have
    been visited: the caller gives up on the whole store then.)"""
    if len(data) < FILE_HEADER_SIZE:
        if FILE_HEADER.startswith(data):
            if not data:
                return ScanResult([], [], 0, 0, None)
            return ScanResult([], [], 0, len(data), "torn file header")
        raise CorruptLog(path, 0, "not a Warren WAL file (bad magic)")
    _check_file_header(data, path)
    records: list[Record] = []
    offsets: list[int] = []
    offset = FILE_HEADER_SIZE
    end = len(data)
    view = memoryview(data)
    while offset < end:
        record, next_offset, problem = _decode(data, view, offset)
        if record is None:
            if zero_tail_ok and zeros_from(data, offset):
                return ScanResult(records, offsets, offset, 0, None, end - offset)
            if _any_valid_record_after(data, next_offset):
                raise CorruptLog(path, offset, problem)
            return ScanResult(records, offsets, offset, end - offset, problem)
        if visit is None:
            records.append(record)
            offsets.append(offset)
        else:
            visit(record, offset)
        offset = next_offset
    return ScanResult(records, offsets, offset, 0, None)


def decode_at(data: bytes, offset: int) -> tuple[Record | None, int, str]:
    """(record, offset after it, "") or (None, where to look for later records, problem)."""
    return _decode(data, memoryview(data), offset)


def _decode(data: bytes, view: memoryview, offset: int) -> tuple[Record | None, int, str]:
    head, next_offset, problem = _decode_head(data, view, offset)
    if head is None:
        return None, next_offset, problem
    log_id, term, index = head
    return Record(log_id, term, index, data[offset + PREFIX_SIZE + ENTRY_HEAD_SIZE:next_offset]), next_offset, ""


def _check_file_header(data: bytes, path: str) -> None:
    if data[:len(FILE_MAGIC)] != FILE_MAGIC or len(data) < FILE_HEADER_SIZE:
        raise CorruptLog(path, 0, "not a Warren WAL file (bad magic)")
    (version,) = struct.unpack_from(">H", data, len(FILE_MAGIC))
    if version != FORMAT_VERSION:
        raise CorruptLog(path, 0, f"unsupported WAL format version {version}")


def scan_heads(data: bytes, path: str = "<wal>") -> tuple[list[tuple[int, int, int, int]], int]:
    """(log_id, index, offset, length) of every record of a file already
    recovered, checksums verified, payloads not copied; and where they end.
    Damage anywhere raises CorruptLog (this file's tail was cut at recovery)."""
    if FILE_HEADER.startswith(data):
        return [], 0  # created, but its header never reached the disk: no records
    _check_file_header(data, path)
    heads = []
    offset = FILE_HEADER_SIZE
    end = len(data)
    view = memoryview(data)
    while offset < end:
        head, next_offset, problem = _decode_head(data, view, offset)
        if head is None:
            if zeros_from(data, offset):
                return heads, offset   # allocated ahead, never written (a WAL file whose close did not cut it)
            raise CorruptLog(path, offset, problem)
        heads.append((head[0], head[2], offset, next_offset - offset))
        offset = next_offset
    return heads, offset


def _decode_head(data: bytes, view: memoryview, offset: int) -> tuple[tuple[int, int, int] | None, int, str]:
    """((log_id, term, index), offset after the record, "") or (None, where to look
    for later records, problem). Checksums are computed over views: nothing is copied."""
    end = len(data)
    if end - offset < PREFIX_SIZE:
        return None, end, "partial record header"
    marker, length, header_crc, body_crc = _prefix_unpack(data, offset)
    if marker != RECORD_MARKER:
        return None, offset + 1, "record marker missing"
    if crc32(view[offset:offset + 8]) != header_crc:
        return None, offset + 1, "record header checksum mismatch"
    if length < ENTRY_HEAD_SIZE or length > RECORD_PAYLOAD_MAX_BYTES + ENTRY_HEAD_SIZE:
        return None, offset + 1, f"impossible record length {length}"
    body_start = offset + PREFIX_SIZE
    body_end = body_start + length
    if body_end > end:
        return None, end, "partial record"
    if crc32(view[body_start:body_end]) != body_crc:
        return None, body_end, "checksum mismatch"
    return _entry_head_unpack(data, body_start), body_end, ""


def _any_valid_record_after(data: bytes, start: int) -> bool:
    """Is there a well-formed record anywhere past a bad one? Then it is not a torn tail."""
    offset = data.find(RECORD_MARKER_BYTES, start)
    while offset != -1:
        record, _, _ = decode_at(data, offset)
        if record is not None:
            return True
        offset = data.find(RECORD_MARKER_BYTES, offset + 1)
    return False
