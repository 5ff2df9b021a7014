"""Anonymization removes VIN, exact GPS and readable plates, and find_pii_leaks proves it."""

from __future__ import annotations

import re
import stat

import numpy as np
import pandas as pd
import pytest

from aiinfra_pipelines.logs.anonymize import (
    ENV_KEY,
    anonymization_key,
    anonymize_log,
    blur_regions,
    coarsen_coordinate,
    find_pii_leaks,
    load_or_create_dev_key,
    plate_boxes,
    pseudonymize_vin,
)
from aiinfra_pipelines.logs.model import DriveLog
from aiinfra_pipelines.logs.reader import read_drive_log
from aiinfra_pipelines.logs.validation import validate_drive_log
from aiinfra_pipelines.logs.writer import encode_drive_log

VIN = "WVWZZZ1JZXW000001"


def raw_pii(log: DriveLog) -> tuple[set[str], list[tuple[float, float]]]:
    return {log.metadata["vin"]}, [(f.latitude, f.longitude) for f in log.frames]


def test_pseudonym_is_deterministic_keyed_and_short(anon_key: bytes) -> None:
    pseudonym = pseudonymize_vin(VIN, anon_key)
    assert re.fullmatch(r"veh-[0-9a-f]{16}", pseudonym)
    assert pseudonymize_vin(VIN, anon_key) == pseudonym
    assert pseudonymize_vin(f" {VIN.lower()} ", anon_key) == pseudonym  # formatting-insensitive
    assert pseudonymize_vin(VIN, b"\x01" * 32) != pseudonym
    assert pseudonymize_vin("WVWZZZ1JZXW000002", anon_key) != pseudonym
    assert VIN.lower() not in pseudonym


def test_short_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 16 bytes"):
        pseudonymize_vin(VIN, b"short")


def test_coarsen_coordinate() -> None:
    assert coarsen_coordinate(48.1371549, 3) == 48.137
    assert coarsen_coordinate(-11.5768, 2) == -11.58
    assert np.isnan(coarsen_coordinate(float("nan"), 3))
    with pytest.raises(ValueError):
        coarsen_coordinate(1.0, -1)


def test_blur_changes_boxes_and_nothing_else() -> None:
    image = np.random.default_rng(0).integers(0, 256, (48, 128, 3), dtype=np.uint8)
    boxes = [(10, 20, 18, 24), (120, 40, 140, 60), None]  # second box is clipped at the edge
    blurred = blur_regions(image, boxes)
    inside = np.zeros((48, 128), dtype=bool)
    inside[20:24, 10:18] = inside[40:48, 120:128] = True
    assert not np.array_equal(blurred[20:24, 10:18], image[20:24, 10:18])
    assert not np.array_equal(blurred[40:48, 120:128], image[40:48, 120:128])
    assert np.array_equal(blurred[~inside], image[~inside])
    assert len(np.unique(blurred[20:24, 10:18].reshape(-1, 3), axis=0)) == 1  # no glyphs left
    assert blurred.dtype == np.uint8 and blurred is not image
    assert np.array_equal(image, np.random.default_rng(0).integers(0, 256, (48, 128, 3), np.uint8))


def test_blur_ignores_boxes_outside_the_image() -> None:
    image = np.random.default_rng(1).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    assert np.array_equal(
        blur_regions(image, [(20, 20, 30, 30), (-5, -5, 0, 3), (4, 4, 4, 6)]), image
    )


def test_anonymize_log(raw_log: DriveLog, anon_key: bytes) -> None:
    """Ingest's own pass still blurs plates (defence in depth behind the car's anonymizer)."""
    log = raw_log
    original_image = log.frames[0].image.copy()
    vin = log.metadata["vin"]
    anonymized = anonymize_log(log, anon_key)
    assert "vin" not in anonymized.metadata
    assert anonymized.metadata["vehicle_pseudonym"] == pseudonymize_vin(vin, anon_key)
    assert {k: v for k, v in anonymized.metadata.items() if k != "vehicle_pseudonym"} == {
        k: v for k, v in log.metadata.items() if k != "vin"
    }
    for raw, anon in zip(log.frames, anonymized.frames, strict=True):
        assert anon.latitude == round(raw.latitude, 3) != raw.latitude
        assert anon.longitude == round(raw.longitude, 3) != raw.longitude
        assert (anon.x, anon.speed_mps, anon.others) == (raw.x, raw.speed_mps, raw.others)
        changed = np.any(anon.image != raw.image, axis=2)
        inside = np.zeros(changed.shape, dtype=bool)
        for x0, y0, x1, y1 in plate_boxes(raw):
            inside[y0:y1, x0:x1] = True
            assert changed[y0:y1, x0:x1].any()
        assert not changed[~inside].any()
    assert log.metadata["vin"] == vin and np.array_equal(log.frames[0].image, original_image)
    assert anonymized.events == log.events


def test_gps_decimals_come_from_config_or_argument(log: DriveLog, anon_key: bytes) -> None:
    coarse = anonymize_log(log, anon_key, gps_decimals=1)
    assert coarse.frames[0].latitude == round(log.frames[0].latitude, 1)


def test_encoded_anonymized_log_carries_no_raw_vin(log: DriveLog, anon_key: bytes) -> None:
    raw_vins, raw_coordinates = raw_pii(log)
    assert log.metadata["vin"].encode() in encode_drive_log(log)  # the check can see a VIN
    data = encode_drive_log(anonymize_log(log, anon_key))
    assert log.metadata["vin"].encode() not in data
    assert find_pii_leaks(data, raw_vins, raw_coordinates) == []
    assert "vin" not in read_drive_log(data).metadata
    assert validate_drive_log(data, anonymized=True).accepted


def test_find_pii_leaks_is_clean_for_anonymized_output(log: DriveLog, anon_key: bytes) -> None:
    raw_vins, raw_coordinates = raw_pii(log)
    anonymized = anonymize_log(log, anon_key)
    assert find_pii_leaks(anonymized, raw_vins, raw_coordinates) == []
    table = pd.DataFrame(
        {
            "log_id": [anonymized.log_id] * len(anonymized.frames),
            "latitude": [f.latitude for f in anonymized.frames],
            "longitude": [f.longitude for f in anonymized.frames],
        }
    )
    assert find_pii_leaks(table, raw_vins, raw_coordinates) == []


def test_find_pii_leaks_flags_the_raw_log(log: DriveLog) -> None:
    leaks = find_pii_leaks(log, *raw_pii(log))
    assert any("raw VIN" in leak for leak in leaks)
    assert any("latitude" in leak for leak in leaks)
    assert any("longitude" in leak for leak in leaks)


def test_find_pii_leaks_detects_planted_leaks(log: DriveLog, anon_key: bytes) -> None:
    raw_vins, raw_coordinates = raw_pii(log)
    anonymized = anonymize_log(log, anon_key)
    anonymized.metadata["notes"] = f"car {log.metadata['vin'].lower()} braked"
    anonymized.frames[7].longitude = log.frames[7].longitude
    leaks = find_pii_leaks(anonymized, raw_vins, raw_coordinates)
    assert any("raw VIN" in leak and "notes" in leak for leak in leaks)
    assert any("exact raw longitude" in leak for leak in leaks)
    table = pd.DataFrame({"lat": [round(log.frames[0].latitude, 3)], "comment": [f"vin={VIN}"]})
    table_leaks = find_pii_leaks(table, {VIN}, raw_coordinates)
    assert table_leaks == ["raw VIN found in column 'comment' (1 distinct)"]
    assert not any(VIN in leak for leak in table_leaks)  # reports never echo the identifier


def test_dev_key_is_created_once_with_0600(tmp_path) -> None:
    path = tmp_path / "keys" / "anonymization.key"
    key = load_or_create_dev_key(path)
    assert len(key) == 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_or_create_dev_key(path) == key
    assert path.read_bytes() == key


def test_anonymization_key_prefers_the_environment(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    monkeypatch.setenv(ENV_KEY, "ab" * 32)
    assert anonymization_key() == b"\xab" * 32
    assert not (tmp_path / "keys").exists()
    monkeypatch.setenv(ENV_KEY, "not hex")
    with pytest.raises(ValueError, match="hex"):
        anonymization_key()


def test_anonymization_key_falls_back_to_the_dev_key(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    monkeypatch.delenv(ENV_KEY, raising=False)
    key = anonymization_key()
    assert (tmp_path / "keys" / "anonymization.key").read_bytes() == key
    assert anonymization_key() == key


def test_find_pii_leaks_searches_binary_cells(log: DriveLog) -> None:
    """A VIN burnt into a blob (an image, an attachment) is found, in any letter case."""
    _, raw_coordinates = raw_pii(log)
    clean = b"\x00\x01" * 500
    table = pd.DataFrame(
        {
            "image": [clean, clean + f"id:{VIN.lower()}".encode() + clean, clean],
            "note": ["ok", "ok", None],
        }
    )
    assert find_pii_leaks(table, {VIN}, raw_coordinates) == [
        "raw VIN found in column 'image' (1 distinct)"
    ]
    assert find_pii_leaks(table.assign(image=[clean] * 3), {VIN}, raw_coordinates) == []
