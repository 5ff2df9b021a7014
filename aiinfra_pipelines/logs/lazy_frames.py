"""Frames whose pixels and LiDAR returns are decoded when a frame is read, one at a time.

A log's signals (times, GNSS, pose, vehicle state, ground truth) are a few hundred bytes a
frame and are held for the whole log: validation checks them across frames. Its sensor payloads
are megabytes a frame and are not: :class:`LazyFrames` holds each frame's *skeleton* (every field
but the payloads) and a loader that decodes the payloads of frame ``i`` from the file
(:mod:`.payloads`). Iterating yields complete frames and keeps none, so a pass over a
10-minute log holds one frame's pixels at a time; each pass decodes again (decoding a JPEG is a
few milliseconds, holding a log's pixels is gigabytes).

It is a ``Sequence[Frame]``: code that iterates ``log.frames`` or reads one frame works
unchanged. Code that only needs signals reads :func:`signal_frames`, which costs no decoding.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

import numpy as np

from aiinfra_pipelines.logs.model import Frame

# A skeleton's image: no pixels (the real shape is known once the frame is decoded).
NO_IMAGE = np.zeros((0, 0, 3), dtype=np.uint8)

PayloadLoader = Callable[[int], dict[str, Any]]
FrameTransform = Callable[[Frame], Frame]


class LazyFrames(Sequence[Frame]):
    """A log's frames, sensor payloads decoded on read (see the module docstring)."""

    def __init__(
        self,
        skeletons: list[Frame],
        load: PayloadLoader,
        transforms: tuple[FrameTransform, ...] = (),
    ) -> None:
        self._skeletons = skeletons
        self._load = load
        self._transforms = transforms

    def __len__(self) -> int:
        return len(self._skeletons)

    @overload
    def __getitem__(self, index: int) -> Frame: ...

    @overload
    def __getitem__(self, index: slice) -> list[Frame]: ...

    def __getitem__(self, index: int | slice) -> Frame | list[Frame]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        position = range(len(self))[index]  # IndexError and negative indices as a list has
        frame = dataclasses.replace(self._skeletons[position], **self._load(position))
        for transform in self._transforms:
            frame = transform(frame)
        return frame

    def __iter__(self) -> Iterator[Frame]:
        for position in range(len(self)):
            yield self[position]

    @property
    def skeletons(self) -> list[Frame]:
        """Every frame without its payloads (``image`` is :data:`NO_IMAGE`, no rear image or
        LiDAR): what signal, timing and coordinate checks read, at no decoding cost."""
        return self._skeletons

    def mapped(self, transform: FrameTransform, skeleton: FrameTransform) -> LazyFrames:
        """The frames with ``transform`` applied on read; ``skeleton`` is its effect on a
        skeleton (e.g. anonymization: coarsened GPS there, blurred plates on read too)."""
        return LazyFrames(
            [skeleton(frame) for frame in self._skeletons],
            self._load,
            (*self._transforms, transform),
        )


def signal_frames(frames: Sequence[Frame]) -> Sequence[Frame]:
    """Frames to read signals from: a lazy log's skeletons (no decoding), else the frames."""
    return frames.skeletons if isinstance(frames, LazyFrames) else frames
