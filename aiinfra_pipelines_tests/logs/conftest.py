"""Shared fixtures: one valid synthetic log and its encoding (bytes are immutable, so shared)."""

from __future__ import annotations

import pytest

from aiinfra_pipelines.logs.model import DriveLog
from aiinfra_pipelines.logs.synthetic import make_synthetic_log
from aiinfra_pipelines.logs.writer import encode_drive_log


@pytest.fixture
def log() -> DriveLog:
    """A fresh log per test, so tests may mutate it to plant one fault."""
    return make_synthetic_log(n_frames=20, seed=7)


@pytest.fixture
def raw_log() -> DriveLog:
    """The same drive as recorded, before the car's anonymizer: readable plates."""
    return make_synthetic_log(n_frames=20, seed=7, vehicle_anonymized=False)


@pytest.fixture(scope="session")
def encoded() -> bytes:
    return encode_drive_log(make_synthetic_log(n_frames=20, seed=7))


@pytest.fixture
def anon_key() -> bytes:
    return bytes(range(32))
