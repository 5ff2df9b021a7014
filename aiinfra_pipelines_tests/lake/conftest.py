"""Fixtures shared by the lake tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from aiinfra_pipelines_tests.support.http_fakes import FakeLakeFS, serve


@pytest.fixture
def fake() -> Iterator[FakeLakeFS]:
    """A scripted lakeFS API on a loopback port, served for one test."""
    server = FakeLakeFS()
    with serve(server):
        yield server
