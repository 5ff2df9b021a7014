"""Message payloads left in the file until a frame needs them: memory bounded by a window,
not by the log's length.

A 10-minute drive with two 1280x720 JPEG cameras and a LiDAR is gigabytes of payload; a scan
that keeps every message (as mcap's readers do) holds all of it, and decoding every frame before
validating holds ten times more. The streaming scan (:func:`.reader.scan_mcap` with
``deferred=True``) keeps small messages (vehicle state, GNSS, poses: what alignment and the
signal checks read) and replaces each large one — at least ``reader.deferred_payload_bytes``
of logs.yaml — by a :class:`DeferredMessage`: the same fields, and a ``data`` read back from
the file on use through a :class:`PayloadStore`. The store re-inflates the chunk a payload sits
in under the same caps and CRC check as the scan (:func:`.mcap_records.inflate`) and keeps the
most recently used chunks up to ``reader.chunk_cache_bytes``: frames are read in order, so each
chunk is inflated about once per pass.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import BinaryIO

from mcap.data_stream import ReadDataStream
from mcap.opcode import Opcode
from mcap.records import Chunk

from aiinfra_pipelines.logs import _config, errors
from aiinfra_pipelines.logs.errors import DriveLogError
from aiinfra_pipelines.logs.limits import ReadLimits


@dataclass(frozen=True)
class PayloadSettings:
    """logs.yaml ``reader``: which payloads are deferred, and the chunk cache's size."""

    deferred_payload_bytes: int
    chunk_cache_bytes: int

    @classmethod
    def load(cls) -> PayloadSettings:
        return cls(
            deferred_payload_bytes=int(_config.setting("reader", "deferred_payload_bytes")),
            chunk_cache_bytes=int(_config.setting("reader", "chunk_cache_bytes")),
        )


class PayloadStore:
    """Reads payloads back from one MCAP file: by path (reopened per read), or from the
    in-memory bytes or the seekable stream the caller handed in (kept, not copied)."""

    def __init__(
        self,
        source: str | os.PathLike[str] | BinaryIO,
        limits: ReadLimits,
        settings: PayloadSettings | None = None,
    ) -> None:
        self._source = source
        self._limits = limits
        self.settings = settings or PayloadSettings.load()
        self._chunks: OrderedDict[int, bytes] = OrderedDict()
        self._cached_bytes = 0
        self.chunks_inflated = 0  # how often a chunk was inflated again (for benchmarks)

    @contextmanager
    def _open(self) -> Iterator[BinaryIO]:
        if isinstance(self._source, str | os.PathLike):
            with open(self._source, "rb") as handle:
                yield handle
        else:
            yield self._source

    def defers(self, payload_bytes: int) -> bool:
        return payload_bytes >= self.settings.deferred_payload_bytes

    def read(self, chunk_offset: int | None, start: int, length: int) -> bytes:
        """``length`` bytes at ``start`` of the inflated chunk at file offset ``chunk_offset``
        (``None``: at ``start`` in the file itself, for a message outside any chunk)."""
        if chunk_offset is None:
            with self._open() as stream:
                stream.seek(start)
                data = stream.read(length)
            if len(data) != length:
                raise DriveLogError(errors.TRUNCATED, "the file changed after it was scanned")
            return data
        return self._chunk(chunk_offset)[start : start + length]

    def _chunk(self, offset: int) -> bytes:
        cached = self._chunks.get(offset)
        if cached is not None:
            self._chunks.move_to_end(offset)
            return cached
        # Imported here: mcap_records imports this module for DeferredMessage.
        from aiinfra_pipelines.logs.mcap_records import inflate

        with self._open() as stream:
            stream.seek(offset)
            data = ReadDataStream(stream)
            opcode, _length = data.read1(), data.read8()
            if opcode != Opcode.CHUNK:
                raise DriveLogError(errors.CORRUPT, "the file changed after it was scanned")
            inflated = inflate(Chunk.read(data), self._limits)
        self.chunks_inflated += 1
        self._chunks[offset] = inflated
        self._cached_bytes += len(inflated)
        while self._cached_bytes > self.settings.chunk_cache_bytes and len(self._chunks) > 1:
            _, dropped = self._chunks.popitem(last=False)
            self._cached_bytes -= len(dropped)
        return inflated


class DeferredMessage:
    """An MCAP message whose payload stays in the file: ``data`` reads it back on use.

    Duck-types :class:`mcap.records.Message` (channel id, sequence, times, data), so decoding
    and alignment read it as they read a message held in memory.
    """

    __slots__ = ("_store", "_where", "channel_id", "log_time", "publish_time", "sequence")

    def __init__(
        self,
        store: PayloadStore,
        where: tuple[int | None, int, int],
        *,
        channel_id: int,
        sequence: int,
        log_time: int,
        publish_time: int,
    ) -> None:
        self.channel_id = channel_id
        self.sequence = sequence
        self.log_time = log_time
        self.publish_time = publish_time
        self._store = store
        self._where = where  # (chunk file offset or None, start, length)

    @property
    def data(self) -> bytes:
        return self._store.read(*self._where)

    @property
    def size(self) -> int:
        return self._where[2]
