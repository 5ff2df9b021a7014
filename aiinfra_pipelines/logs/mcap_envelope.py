"""The first layer of reading an MCAP drive log: opening any source, checking the envelope
(leading magic, closing footer and magic, summary CRC) and turning every library's exception
into a :class:`DriveLogError` with a stable reason code.

Apart from :mod:`.reader` because it trusts nothing inside the file: a truncated upload, a cut
transfer or a file that is not MCAP at all is refused here, before any record is parsed.
"""

from __future__ import annotations

import io
import os
import struct
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import BinaryIO

import zstandard
from mcap.exceptions import EndOfFile, InvalidMagic, McapError, RecordLengthLimitExceeded
from mcap.stream_reader import CRCValidationError

from aiinfra_pipelines.logs import errors
from aiinfra_pipelines.logs.errors import DriveLogError

Source = bytes | bytearray | memoryview | BinaryIO | str | os.PathLike[str]

MAGIC = b"\x89MCAP0\r\n"
_FOOTER_RECORD_SIZE = 1 + 8 + 8 + 8 + 4  # opcode, length, summary_start, offset_start, crc
_FOOTER_OPCODE = 0x02
_CRC_BLOCK = 1 << 20


# --------------------------------------------------------------------------- opening + errors


@contextmanager
def open_source(source: Source) -> Iterator[BinaryIO]:
    """A seekable stream positioned at the file start, whatever the caller handed in."""
    if isinstance(source, bytes | bytearray | memoryview):
        yield io.BytesIO(bytes(source))
    elif isinstance(source, str | os.PathLike):
        try:
            handle = open(source, "rb")  # noqa: SIM115 - closed below, after the caller's use
        except OSError as exc:
            raise DriveLogError(errors.UNREADABLE, f"cannot open {source}: {exc}") from exc
        with handle:
            yield handle
    elif source.seekable() and source.tell() == 0:
        yield source
    else:
        # Offsets in MCAP are absolute; a pipe or a stream mid-way must be buffered first.
        yield io.BytesIO(source.read())


def _stream_size(stream: BinaryIO) -> int:
    size = stream.seek(0, io.SEEK_END)
    stream.seek(0)
    return size


@contextmanager
def translate_errors() -> Iterator[None]:
    """Map the many exception types mcap, zstd and lz4 raise onto our reason codes."""
    try:
        yield
    except DriveLogError:
        raise
    except Exception as exc:
        code, message = _reason_for(exc)
        raise DriveLogError(code, message) from exc


def _lz4_or_unreadable(exc: BaseException) -> tuple[str, str]:
    if "LZ4" in str(exc).upper():
        return errors.CRC_MISMATCH, f"chunk payload is corrupted ({exc})"
    return errors.UNREADABLE, f"{type(exc).__name__}: {exc}"


# The first entry whose classes match decides, so subclasses stand before their bases.
_REASONS: tuple[tuple[type | tuple[type, ...], Callable[[BaseException], tuple[str, str]]], ...] = (
    (CRCValidationError, lambda exc: (errors.CRC_MISMATCH, str(exc))),
    # A flipped byte in a compressed chunk usually breaks decompression before the CRC of the
    # decompressed bytes can be compared; it is the same fault, so the same code.
    (
        zstandard.ZstdError,
        lambda exc: (errors.CRC_MISMATCH, f"chunk payload is corrupted (zstd: {exc})"),
    ),
    (InvalidMagic, lambda exc: (errors.NOT_MCAP, str(exc))),
    (
        (EndOfFile, struct.error),
        lambda _: (
            errors.CORRUPT,
            "a record extends past the end of the file (corrupt length field)",
        ),
    ),
    (RecordLengthLimitExceeded, lambda exc: (errors.CORRUPT, str(exc))),
    (UnicodeDecodeError, lambda exc: (errors.CORRUPT, f"record text is not UTF-8: {exc}")),
    (RuntimeError, _lz4_or_unreadable),
    (
        (McapError, ValueError, KeyError, IndexError),
        lambda exc: (errors.CORRUPT, f"{type(exc).__name__}: {exc}"),
    ),
)


def _reason_for(exc: BaseException) -> tuple[str, str]:
    """The reason code and message of a reader failure (UNREADABLE for anything unforeseen)."""
    for classes, reason in _REASONS:
        if isinstance(exc, classes):
            return reason(exc)
    return errors.UNREADABLE, f"{type(exc).__name__}: {exc}"


# --------------------------------------------------------------------------- envelope


def _check_leading_magic(stream: BinaryIO, size: int) -> None:
    if size == 0:
        raise DriveLogError(errors.EMPTY, "the file is empty (0 bytes)")
    head = stream.read(len(MAGIC))
    if head != MAGIC:
        if len(head) < len(MAGIC) and MAGIC.startswith(head):
            raise DriveLogError(errors.TRUNCATED, f"file ends inside the MCAP magic ({size} B)")
        raise DriveLogError(errors.NOT_MCAP, "not an MCAP file (leading magic missing)")


def _read_footer(stream: BinaryIO, size: int) -> tuple[int, int]:
    """``(summary_start, summary_crc)``, or TRUNCATED when the file was never finished."""
    minimum = 2 * len(MAGIC) + _FOOTER_RECORD_SIZE
    stream.seek(max(size - len(MAGIC), 0))
    if size < minimum or stream.read(len(MAGIC)) != MAGIC:
        raise DriveLogError(
            errors.TRUNCATED,
            f"file ends without the closing MCAP magic after {size} B: the upload was cut "
            "or the writer never finished",
        )
    stream.seek(size - len(MAGIC) - _FOOTER_RECORD_SIZE)
    footer = stream.read(_FOOTER_RECORD_SIZE)
    opcode, length, summary_start, _offset_start, summary_crc = struct.unpack("<BQQQI", footer)
    if opcode != _FOOTER_OPCODE or length != _FOOTER_RECORD_SIZE - 9:
        raise DriveLogError(errors.TRUNCATED, "no footer record before the closing magic")
    if summary_start >= size:
        raise DriveLogError(errors.CORRUPT, f"footer points past the file end ({summary_start})")
    return summary_start, summary_crc


def _check_summary_crc(stream: BinaryIO, size: int, summary_start: int, expected: int) -> None:
    """mcap's Python readers ignore the footer's summary CRC; the chunk index lives there."""
    if expected == 0:
        return  # writer did not compute one
    start = summary_start or size - len(MAGIC) - _FOOTER_RECORD_SIZE
    end = size - len(MAGIC) - 4  # the CRC covers the footer up to, not including, itself
    stream.seek(start)
    crc, remaining = 0, end - start
    while remaining > 0:
        block = stream.read(min(_CRC_BLOCK, remaining))
        crc, remaining = zlib.crc32(block, crc), remaining - len(block)
    if crc != expected:
        raise DriveLogError(
            errors.CRC_MISMATCH,
            f"summary section CRC mismatch (expected {expected}, calculated {crc})",
        )


def check_envelope(stream: BinaryIO) -> int:
    """Validate magic, footer and summary CRC; returns the file size."""
    size = _stream_size(stream)
    _check_leading_magic(stream, size)
    summary_start, summary_crc = _read_footer(stream, size)
    _check_summary_crc(stream, size, summary_start, summary_crc)
    stream.seek(0)
    return size
