"""Every record of an MCAP file, read linearly under the caps of ``logs.yaml`` ``limits``.

mcap's ``StreamReader`` honours whatever a file declares: a chunk is inflated to the size its
compressor says (a 33 kB zstd chunk became 1 GiB in memory), and records inside are parsed
however many there are (a 1.2 kB file of empty records cost seconds of CPU). This reader walks
the same records with the same mcap record classes, but checks each claim first
(:class:`~aiinfra_pipelines.logs.limits.ReadLimits`): a chunk's declared size and compression
ratio before inflating, the inflated bytes against what was declared (read at most one byte
past it), and the number of records in the file. It also validates what ``validate_crcs=True``
did: each chunk's CRC and the data-section CRC.

The envelope (magic, footer, summary CRC) is checked first by :mod:`.mcap_envelope`; errors
raised here are :class:`DriveLogError` or library errors that ``translate_errors`` maps.
"""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Iterator
from typing import BinaryIO

import lz4.frame
import zstandard
from mcap.data_stream import ReadDataStream
from mcap.opcode import Opcode
from mcap.records import (
    Channel,
    Chunk,
    DataEnd,
    Footer,
    Header,
    McapRecord,
    Message,
    Metadata,
    Schema,
)

from aiinfra_pipelines.logs import errors
from aiinfra_pipelines.logs.errors import DriveLogError
from aiinfra_pipelines.logs.limits import ReadLimits
from aiinfra_pipelines.logs.mcap_envelope import MAGIC
from aiinfra_pipelines.logs.payloads import DeferredMessage, PayloadStore

# Top-level records the scan returns; everything else (indexes, statistics, attachments) is
# skipped in bounded blocks, never read whole.
_PARSED = {
    Opcode.HEADER: Header,
    Opcode.SCHEMA: Schema,
    Opcode.CHANNEL: Channel,
    Opcode.METADATA: Metadata,
    Opcode.CHUNK: Chunk,
    Opcode.DATA_END: DataEnd,
    Opcode.FOOTER: Footer,
}
# Records inside a chunk (the MCAP spec allows only these three there).
_IN_CHUNK = {Opcode.SCHEMA: Schema, Opcode.CHANNEL: Channel}
_SKIP_BLOCK = 1 << 20
_RECORD_HEADER = 9  # opcode (1) + length (8)
_MESSAGE_FIELDS = 22  # channel id (2), sequence (4), log time (8), publish time (8)
_HEADER = struct.Struct("<BQ")
_MESSAGE = struct.Struct("<HIQQ")


class _RecordBudget:
    """Counts records across the file against ``max_records``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0

    def spend(self) -> None:
        self.count += 1
        if self.count > self.limit:
            raise DriveLogError(
                errors.RECORD_LIMIT,
                f"the file holds more than {self.limit} records (logs.yaml limits.max_records)",
            )


def iter_records(
    stream: BinaryIO, size: int, limits: ReadLimits, store: PayloadStore | None = None
) -> Iterator[McapRecord | DeferredMessage]:
    """Header, schemas, channels, messages and metadata of the file, in file order.

    With a ``store``, a message whose payload the store defers is a :class:`DeferredMessage`
    (its payload read back from the file on use) instead of a message holding its bytes.
    """
    base = stream.tell()  # file offsets of deferred payloads are base + bytes read
    data = ReadDataStream(stream, calculate_crc=True)
    if data.read(len(MAGIC)) != MAGIC:
        raise DriveLogError(errors.NOT_MCAP, "not an MCAP file (leading magic missing)")
    budget = _RecordBudget(limits.max_records)
    while True:
        crc_before = data.checksum()
        opcode, length = data.read1(), data.read8()
        if length > size:
            raise DriveLogError(
                errors.CORRUPT,
                f"a record (opcode {opcode:#x}) claims {length} B, more than the file",
            )
        budget.spend()
        kind = _PARSED.get(opcode)
        if opcode == Opcode.MESSAGE:
            record: McapRecord | DeferredMessage = _message(data, length, store, base)
        elif kind is None:
            _skip(data, length)
            continue
        else:
            offset, start = base + data.count - _RECORD_HEADER, data.count
            record = kind.read(data)
            _skip(data, length - (data.count - start))  # padding a newer writer may add
        if isinstance(record, DataEnd):
            _check_data_crc(record, crc_before)
        elif isinstance(record, Chunk):
            yield from _chunk_records(record, limits, budget, store, offset)
            continue
        elif isinstance(record, Footer):
            return
        yield record


def _message(
    data: ReadDataStream, length: int, store: PayloadStore | None, base: int = 0
) -> Message | DeferredMessage:
    # mcap reads ``length - 22`` data bytes: a shorter record would read to the stream's end.
    if length < _MESSAGE_FIELDS:
        raise DriveLogError(errors.CORRUPT, f"a message record of {length} B is too short")
    if store is None or not store.defers(length - _MESSAGE_FIELDS):
        return Message.read(data, length)
    channel_id, sequence, log_time, publish_time = _MESSAGE.unpack(data.read(_MESSAGE_FIELDS))
    where = (None, base + data.count, length - _MESSAGE_FIELDS)
    _skip(data, length - _MESSAGE_FIELDS)  # CRC'd as it is skipped, never kept
    return DeferredMessage(
        store,
        where,
        channel_id=channel_id,
        sequence=sequence,
        log_time=log_time,
        publish_time=publish_time,
    )


def _skip(data: ReadDataStream, length: int) -> None:
    if length < 0:
        raise DriveLogError(errors.CORRUPT, "a record is longer than its length field says")
    while length > 0:
        length -= len(data.read(min(length, _SKIP_BLOCK)))


def _check_data_crc(record: DataEnd, calculated: int) -> None:
    if record.data_section_crc not in (0, calculated):
        raise DriveLogError(
            errors.CRC_MISMATCH,
            f"data section CRC mismatch (expected {record.data_section_crc}, "
            f"calculated {calculated})",
        )


def inflate(chunk: Chunk, limits: ReadLimits) -> bytes:
    """The chunk's records as bytes: the declared size checked against the caps first, then
    inflated reading at most one byte past it, so a lying header costs no more than the cap."""
    declared = chunk.uncompressed_size
    limits.check_chunk(declared, len(chunk.data), chunk.compression)
    if chunk.compression == "zstd":
        stated = zstandard.frame_content_size(chunk.data)
        if stated not in (-1, declared):  # -1: the frame does not state it
            raise DriveLogError(
                errors.CORRUPT, f"a zstd chunk's frame says {stated} B, its record {declared} B"
            )
        reader = zstandard.ZstdDecompressor().stream_reader(
            io.BytesIO(chunk.data), read_across_frames=True
        )
        inflated = reader.read(declared + 1)
    elif chunk.compression == "lz4":
        inflated = lz4.frame.LZ4FrameDecompressor().decompress(chunk.data, max_length=declared + 1)
    elif chunk.compression == "":
        inflated = chunk.data
    else:
        raise DriveLogError(
            errors.CORRUPT, f"chunk compression {chunk.compression[:32]!r} is not zstd or lz4"
        )
    if len(inflated) != declared:
        found = "more" if len(inflated) > declared else f"{len(inflated)} B"
        raise DriveLogError(
            errors.CORRUPT, f"a chunk inflates to {found}, not the {declared} B it declares"
        )
    if chunk.uncompressed_crc and zlib.crc32(inflated) != chunk.uncompressed_crc:
        raise DriveLogError(
            errors.CRC_MISMATCH,
            f"chunk CRC mismatch (expected {chunk.uncompressed_crc}, "
            f"calculated {zlib.crc32(inflated)})",
        )
    return inflated


def _chunk_records(
    chunk: Chunk,
    limits: ReadLimits,
    budget: _RecordBudget,
    store: PayloadStore | None = None,
    chunk_offset: int = 0,
) -> Iterator[McapRecord | DeferredMessage]:
    """The records of one chunk, parsed from the inflated bytes in place (struct offsets, not
    a stream per field: most of a log's records are here). A payload the ``store`` defers is
    located by the chunk's file offset and its place in the inflated chunk."""
    inflated = inflate(chunk, limits)
    end, position = len(inflated), 0
    while position < end:
        if end - position < _RECORD_HEADER:
            raise DriveLogError(errors.CORRUPT, "a record header runs past its chunk's end")
        opcode, length = _HEADER.unpack_from(inflated, position)
        position += _RECORD_HEADER
        if length > end - position:
            raise DriveLogError(errors.CORRUPT, "a record runs past its chunk's end")
        budget.spend()
        if opcode == Opcode.MESSAGE:
            if length < _MESSAGE_FIELDS:
                raise DriveLogError(errors.CORRUPT, f"a message record of {length} B is too short")
            channel_id, sequence, log_time, publish_time = _MESSAGE.unpack_from(inflated, position)
            payload = length - _MESSAGE_FIELDS
            if store is not None and store.defers(payload):
                yield DeferredMessage(
                    store,
                    (chunk_offset, position + _MESSAGE_FIELDS, payload),
                    channel_id=channel_id,
                    sequence=sequence,
                    log_time=log_time,
                    publish_time=publish_time,
                )
                position += length
                continue
            yield Message(
                channel_id=channel_id,
                sequence=sequence,
                log_time=log_time,
                publish_time=publish_time,
                data=inflated[position + _MESSAGE_FIELDS : position + length],
            )
        elif opcode in _IN_CHUNK:
            body = ReadDataStream(io.BytesIO(inflated[position : position + length]))
            yield _IN_CHUNK[opcode].read(body)
        position += length
