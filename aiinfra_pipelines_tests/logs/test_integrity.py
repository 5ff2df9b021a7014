"""Damaged files are refused with a precise code, by the reader and by validation alike."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
from mcap.reader import make_reader

from aiinfra_pipelines.logs import errors
from aiinfra_pipelines.logs.errors import DriveLogError
from aiinfra_pipelines.logs.model import TOPIC_CAN, DriveLog
from aiinfra_pipelines.logs.reader import (
    iter_frames,
    read_drive_log,
    read_metadata,
    summarize_channels,
)
from aiinfra_pipelines.logs.validation import validate_drive_log
from aiinfra_pipelines.logs.writer import encode_drive_log

READERS = [read_drive_log, read_metadata, summarize_channels, lambda d: list(iter_frames(d))]


def flip(data: bytes, offset: int, mask: int = 0x01) -> bytes:
    damaged = bytearray(data)
    damaged[offset] ^= mask
    return bytes(damaged)


def reject_code(data: bytes) -> str:
    report = validate_drive_log(data)
    assert not report.accepted
    assert report.log is None
    assert len(report.reasons) == 1, report.reasons  # integrity failures stop early
    return report.reasons[0].code


def first_chunk(data: bytes) -> tuple[int, int]:
    chunk = make_reader(io.BytesIO(data)).get_summary().chunk_indexes[0]
    return chunk.chunk_start_offset, chunk.chunk_length


@pytest.mark.parametrize("fraction", [0.0001, 0.01, 0.25, 0.5, 0.9, 0.999])
def test_truncated_file_is_rejected(encoded: bytes, fraction: float) -> None:
    cut = encoded[: max(1, int(len(encoded) * fraction))]
    assert reject_code(cut) == errors.TRUNCATED
    for read in READERS:
        with pytest.raises(DriveLogError) as raised:
            read(cut)
        assert raised.value.code == errors.TRUNCATED


@pytest.mark.parametrize("missing_tail", [1, 8, 9, 30, 37, 200])
def test_cut_inside_footer_or_summary_is_truncation(encoded: bytes, missing_tail: int) -> None:
    assert reject_code(encoded[:-missing_tail]) == errors.TRUNCATED


def test_flipped_byte_in_chunk_payload_is_a_crc_mismatch(encoded: bytes) -> None:
    start, length = first_chunk(encoded)
    for offset in (start + length // 3, start + length // 2, start + length - 5):
        damaged = flip(encoded, offset)
        assert reject_code(damaged) == errors.CRC_MISMATCH
        with pytest.raises(DriveLogError) as raised:
            read_drive_log(damaged)
        assert raised.value.code == errors.CRC_MISMATCH


def test_flipped_byte_in_chunk_header_is_caught_by_data_section_crc(encoded: bytes) -> None:
    start, _length = first_chunk(encoded)
    message_start_time = start + 1 + 8  # after opcode and record length
    assert reject_code(flip(encoded, message_start_time)) == errors.CRC_MISMATCH


def test_flipped_byte_in_metadata_record_is_a_crc_mismatch(encoded: bytes) -> None:
    metadata = make_reader(io.BytesIO(encoded)).get_summary().metadata_indexes[0]
    assert reject_code(flip(encoded, metadata.offset + metadata.length - 1)) == "crc_mismatch"


def test_flipped_byte_in_summary_is_a_crc_mismatch(encoded: bytes) -> None:
    summary_byte = len(encoded) - 8 - 29 - 40  # inside the summary offsets, before the footer
    damaged = flip(encoded, summary_byte)
    assert reject_code(damaged) == errors.CRC_MISMATCH
    with pytest.raises(DriveLogError, match="summary"):
        summarize_channels(damaged)


def test_any_single_bit_flip_is_detected(encoded: bytes) -> None:
    rng = random.Random(1)
    codes = {
        reject_code(flip(encoded, rng.randrange(len(encoded)), 1 << rng.randrange(8)))
        for _ in range(40)
    }
    assert codes <= errors.INTEGRITY_CODES
    assert errors.CRC_MISMATCH in codes


def test_zero_byte_file() -> None:
    assert reject_code(b"") == errors.EMPTY
    with pytest.raises(DriveLogError) as raised:
        read_drive_log(b"")
    assert raised.value.code == "empty"


@pytest.mark.parametrize("size", [3, 64, 5000])
def test_random_garbage_is_not_mcap(size: int) -> None:
    garbage = np.random.default_rng(size).bytes(size)
    assert reject_code(garbage) == errors.NOT_MCAP


def test_mcap_magic_followed_by_garbage_is_rejected(encoded: bytes) -> None:
    garbage = encoded[:8] + np.random.default_rng(0).bytes(4000) + encoded[:8]
    assert reject_code(garbage) in errors.INTEGRITY_CODES


def test_missing_file_is_unreadable(tmp_path) -> None:
    with pytest.raises(DriveLogError) as raised:
        read_drive_log(tmp_path / "absent.mcap")
    assert raised.value.code == errors.UNREADABLE


def test_reader_refuses_log_without_can_channel(log: DriveLog) -> None:
    with pytest.raises(DriveLogError) as raised:
        read_drive_log(encode_drive_log(log, omit_topics=[TOPIC_CAN]))
    assert raised.value.code == errors.MISSING_CHANNEL
    assert TOPIC_CAN in raised.value.message
