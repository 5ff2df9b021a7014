"""Crafted files against the caps of ``logs.yaml`` ``limits``: decompression bombs, chunks that
lie about their size, files of empty records, images that claim (or have) too many pixels,
damaged JPEG data. Each is refused with its own code, in bounded memory, and no reason carries
an object repr. Files are built with mcap's own record classes and the stock writers.
"""

from __future__ import annotations

import dataclasses
import io
import json
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator

import lz4.frame
import numpy as np
import pytest
import zstandard
from mcap.data_stream import RecordBuilder
from mcap.records import Channel, Chunk, DataEnd, Footer, Header
from PIL import Image

from aiinfra_pipelines.logs import errors
from aiinfra_pipelines.logs.errors import DriveLogError
from aiinfra_pipelines.logs.inspect import inspect_log
from aiinfra_pipelines.logs.limits import ReadLimits
from aiinfra_pipelines.logs.reader import scan_mcap
from aiinfra_pipelines.logs.validation import validate_drive_log
from aiinfra_pipelines_tests.support.config_copies import resources_with
from aiinfra_pipelines_tests.support.ros2_recording import write_ros2_recording

MAGIC = b"\x89MCAP0\r\n"
MIB = 1 << 20


def _record(record) -> bytes:
    builder = RecordBuilder()
    record.write(builder)
    return builder.end()


def _message_record(data: bytes = b"", length: int | None = None) -> bytes:
    body = struct.pack("<HIQQ", 1, 0, 1, 1) + data
    return struct.pack("<BQ", 0x05, len(body) if length is None else length) + body


def _mcap(chunk: Chunk) -> bytes:
    """A file of one channel and one chunk, with a valid envelope (no summary section)."""
    parts = [
        MAGIC,
        _record(Header(profile="", library="hostile")),
        _record(Channel(id=1, topic="/x", message_encoding="json", schema_id=0, metadata={})),
        _record(chunk),
        _record(DataEnd(data_section_crc=0)),
        _record(Footer(summary_start=0, summary_offset_start=0, summary_crc=0)),
        MAGIC,
    ]
    return b"".join(parts)


def _chunk(inner: bytes, compression: str, declared: int | None = None) -> Chunk:
    if compression == "zstd":
        data = zstandard.ZstdCompressor(write_content_size=declared is None).compress(inner)
    elif compression == "lz4":
        data = lz4.frame.compress(inner)
    else:
        data = inner
    return Chunk(
        message_start_time=1,
        message_end_time=1,
        uncompressed_size=len(inner) if declared is None else declared,
        uncompressed_crc=zlib.crc32(inner),
        compression=compression,
        data=data,
    )


def _zeros_bomb(inflated_bytes: int, declared: int | None = None) -> bytes:
    """One message whose payload is ``inflated_bytes`` of zeros, zstd-compressed (streamed, so
    building it never holds the inflated bytes)."""
    header = struct.pack("<BQ", 0x05, 22 + inflated_bytes - 31) + struct.pack("<HIQQ", 1, 0, 1, 1)
    compressor = zstandard.ZstdCompressor(level=3).compressobj()
    crc, parts, block = zlib.crc32(header), [compressor.compress(header)], bytes(MIB)
    left = inflated_bytes - len(header)
    while left > 0:
        piece = block[: min(left, MIB)]
        crc = zlib.crc32(piece, crc)
        parts.append(compressor.compress(piece))
        left -= len(piece)
    parts.append(compressor.flush())
    chunk = Chunk(
        message_start_time=1,
        message_end_time=1,
        uncompressed_size=inflated_bytes if declared is None else declared,
        uncompressed_crc=crc,
        compression="zstd",
        data=b"".join(parts),
    )
    return _mcap(chunk)


def _refused(data: bytes, code: str, limits: ReadLimits | None = None) -> str:
    with pytest.raises(DriveLogError) as refused:
        scan_mcap(data, limits)
    assert refused.value.code == code, refused.value
    assert " at 0x" not in str(refused.value)
    return refused.value.message


def _limits(**caps) -> ReadLimits:
    return dataclasses.replace(ReadLimits.load(), **caps)


# ------------------------------------------------------------------------------ chunks
def test_a_chunk_declaring_more_than_the_size_cap_is_refused_before_inflating() -> None:
    bomb = _zeros_bomb(96 * MIB)  # 96 MiB of zeros in a few kB
    assert len(bomb) < 100_000
    message = _refused(bomb, errors.DECOMPRESSION_LIMIT)
    assert f"declares {96 * MIB} B uncompressed; the cap is {64 * MIB} B" in message


@pytest.mark.parametrize("compression", ["zstd", "lz4"])
def test_a_chunk_past_the_ratio_cap_is_refused(compression: str) -> None:
    inner = _message_record() * 40_000  # empty messages compress far past 100:1
    message = _refused(
        _mcap(_chunk(inner, compression)),
        errors.DECOMPRESSION_LIMIT,
        _limits(max_compression_ratio=100),
    )
    assert f"a {compression} chunk of" in message and "the cap is 100:1" in message


def test_a_chunk_that_inflates_past_what_it_declares_is_refused_reading_one_byte_past() -> None:
    """The zstd frame does not state its size and the record says 1 MiB; it inflates to 1 GiB.
    Refused as corrupt with at most 1 MiB + 1 B inflated: the peak memory of a process that
    validates it stays far below the GiB a trusting reader would need.

    The peak is the child's own ``VmHWM``: ``ru_maxrss`` survives fork and exec, so under a
    pytest parent that has grown to gigabytes it reports the parent's peak, not the reader's."""
    bomb = _zeros_bomb(1024 * MIB, declared=MIB)
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, sys\n"
            "from aiinfra_pipelines.logs.validation import validate_drive_log\n"
            "report = validate_drive_log(sys.stdin.buffer.read())\n"
            "hwm = next(l for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"
            "peak = int(hwm.split()[1]) // 1024\n"
            "print(json.dumps({'codes': report.codes, 'peak_rss_mb': peak}))",
        ],
        input=bomb,
        capture_output=True,
        timeout=300,
        check=True,
    )
    result = json.loads(child.stdout.decode().strip().splitlines()[-1])
    assert result["codes"] == [errors.CORRUPT]
    assert result["peak_rss_mb"] < 700, result


def test_a_zstd_frame_contradicting_its_chunk_record_is_refused() -> None:
    inner = _message_record(b"x" * 100)
    chunk = _chunk(inner, "zstd")
    lying = dataclasses.replace(chunk, uncompressed_size=len(inner) + 5)
    assert "frame says" in _refused(_mcap(lying), errors.CORRUPT)


def test_an_unknown_chunk_compression_is_refused() -> None:
    chunk = dataclasses.replace(_chunk(_message_record(), ""), compression="brotli")
    assert "'brotli' is not zstd or lz4" in _refused(_mcap(chunk), errors.CORRUPT)


def test_a_message_record_shorter_than_its_fields_is_refused() -> None:
    inner = _message_record(length=5) + bytes(64)
    assert "too short" in _refused(_mcap(_chunk(inner, "")), errors.CORRUPT)


def test_a_file_of_more_records_than_the_cap_is_refused_in_bounded_work() -> None:
    inner = _message_record() * 2_000
    assert scan_mcap(_mcap(_chunk(inner, "lz4")), _limits(max_records=5_000))
    message = _refused(_mcap(_chunk(inner, "lz4")), errors.RECORD_LIMIT, _limits(max_records=1_000))
    assert "more than 1000 records" in message


def test_the_shipped_caps_admit_the_projects_own_logs(encoded: bytes) -> None:
    """Control: the writer's logs (1 MiB zstd chunks) read under the shipped caps."""
    scanned = scan_mcap(encoded)
    assert sum(len(records) for records in scanned.messages.values()) > 0


# ------------------------------------------------------------------------------ images
def _jpeg(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((height, width, 3), 90, np.uint8)).save(buffer, "JPEG", quality=80)
    return buffer.getvalue()


def _claims(jpeg: bytes, width: int, height: int) -> bytes:
    """``jpeg`` with its frame header (SOF0) rewritten to claim ``width`` x ``height``."""
    start = jpeg.index(b"\xff\xc0")
    return jpeg[: start + 5] + struct.pack(">HH", height, width) + jpeg[start + 9 :]


@pytest.fixture(params=["in_memory", "streaming"])
def streaming(request, tmp_path) -> Iterator[bool]:
    """Each image test twice: read in memory, and as ingest reads (payloads left in the file,
    images decoded when a frame is read: a damaged frame surfaces during the checks)."""
    if request.param == "in_memory":
        yield False
        return
    overlay = {"logs.yaml": {"reader": {"deferred_payload_bytes": 64}}}
    with resources_with(tmp_path / "resources", overlay):
        yield True


def _report(craft, streaming: bool = False) -> object:
    report = validate_drive_log(write_ros2_recording(craft_image=craft), streaming=streaming)
    assert not report.accepted
    assert all(" at 0x" not in reason.message for reason in report.reasons)
    return report


def test_a_jpeg_header_claiming_20000_by_20000_is_refused_before_decoding(streaming: bool) -> None:
    report = _report(lambda i, jpeg: _claims(jpeg, 20_000, 20_000) if i == 3 else jpeg, streaming)
    assert report.codes[0] == errors.IMAGE_TOO_LARGE
    assert "image of 20000x20000 (400000000 pixels) passes the cap" in report.reasons[0].message


def test_real_5000_by_5000_frames_are_refused_as_too_large(streaming: bool) -> None:
    large = _jpeg(5000, 5000)  # a few hundred kB that would decode to 75 MB each
    report = _report(lambda i, jpeg: large if i < 5 else jpeg, streaming)
    assert report.codes[0] == errors.IMAGE_TOO_LARGE
    assert "5000x5000" in report.reasons[0].message


def test_a_jpeg_with_its_image_data_overwritten_mid_way_is_a_bad_image(streaming: bool) -> None:
    """Header and end marker intact, 1 kB of the entropy-coded data zeroed: other decoders
    return a grey-smeared frame without a word; this one is refused naming the frame."""

    def damaged(i: int, jpeg: bytes) -> bytes:
        if i != 4:
            return jpeg
        scan = jpeg.index(b"\xff\xda")
        middle = (scan + len(jpeg)) // 2
        return jpeg[:middle] + bytes(min(1024, len(jpeg) - middle - 2)) + jpeg[-2:]

    report = _report(damaged, streaming)
    assert report.codes == [errors.BAD_IMAGE]
    assert "image is damaged" in report.reasons[0].message
    assert str(1_717_228_800_000_000_000 + 4 * 100_000_000) in report.reasons[0].message


def test_garbage_that_claims_to_be_an_image_is_a_bad_image_without_object_reprs(
    streaming: bool,
) -> None:
    report = _report(lambda i, jpeg: b"\x89PNG not really" if i == 2 else jpeg, streaming)
    assert report.codes == [errors.BAD_IMAGE]
    assert "<data>" not in report.reasons[0].message


def test_inspect_reports_a_bomb_with_its_code_and_no_channels(tmp_path) -> None:
    path = tmp_path / "bomb.mcap"
    path.write_bytes(_zeros_bomb(96 * MIB))
    report = inspect_log(path)
    assert not report["accepted"]
    assert [reason["code"] for reason in report["reasons"]] == [errors.DECOMPRESSION_LIMIT]
    assert report["channels"] == []
