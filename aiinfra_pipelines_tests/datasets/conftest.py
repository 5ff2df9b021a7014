"""Fixtures for the dataset tests: a small real fleet and a synthetic frame-table builder."""

from __future__ import annotations

import os
from collections.abc import Callable

import pandas as pd
import pytest

from aiinfra_pipelines_tests.support.dataset_frames import make_frames

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")


@pytest.fixture(scope="module")
def fleet() -> pd.DataFrame:
    """8 highway-env episodes (13 logs, 7 slices); ``fleet_frames`` caches it per process."""
    from aiinfra_pipelines_tests.support.fleet_data import fleet_frames

    return fleet_frames(4, 2, 0)


@pytest.fixture
def frames_factory() -> Callable[..., pd.DataFrame]:
    return make_frames
