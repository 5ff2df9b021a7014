"""The perception network: a small CNN that reads the front camera frame.

Small on purpose: it must train to a useful accuracy on 2 CPU cores in minutes, export cleanly
to ONNX (Conv/BatchNorm/ReLU/Gemm, and for the grid head ReduceMax/CumSum/Exp/Sigmoid —
opset 17 ops onnxruntime and TensorRT run; INT8 quantizes only the Conv/Gemm weights) and run
on the car well inside the latency budget.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from .contract import LANES, PerceptionSpec

# Row of the ego lane in the occupancy grid (left, ego, right).
EGO_LANE = 1
# Stride-2 blocks by default: the feature map is the image downsampled 2**stages times per
# axis. A sharper camera (more pixels per metre) takes more stages, so that the trunk and the
# grid head see cells of the same size in metres.
STAGES = 4


def _block(channels_in: int, channels_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(channels_in, channels_out, kernel_size=3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(channels_out),
        nn.ReLU(inplace=True),
    )


def _patch_stem(channels_out: int) -> nn.Sequential:
    """Two stages in one: non-overlapping 4 x 4 pixel patches projected to ``channels_out``.

    On a sharp camera the two full-resolution stride-2 blocks cost most of the network's time
    (their activations are the largest) for features a patch projection learns as well: every
    pixel of the patch still reaches the first channels, only the first nonlinearity moves.
    """
    return nn.Sequential(
        nn.Conv2d(3, channels_out, kernel_size=4, stride=4, bias=False),
        nn.BatchNorm2d(channels_out),
        nn.ReLU(inplace=True),
    )


def feature_map_size(spec: PerceptionSpec, stages: int = STAGES) -> tuple[int, int]:
    """(rows, columns) after ``stages`` blocks (default: the last) for the contract's image."""
    rows, columns = spec.image_height, spec.image_width
    for _ in range(stages):  # kernel 3, stride 2, padding 1: ceil(n / 2)
        rows, columns = (rows - 1) // 2 + 1, (columns - 1) // 2 + 1
    return rows, columns


def bin_column_ranges(
    spec: PerceptionSpec, ego_u_px: float, scaling_px_per_m: float, stride_px: int
) -> tuple[tuple[int, int], ...]:
    """Feature-map column ranges [start, end) under each distance bin of the grid.

    The ego-frame camera puts ego at ``ego_u_px`` with x ahead to the right at
    ``scaling_px_per_m``, so a distance bin is a fixed band of image columns; on a map
    downsampled ``stride_px`` times it covers these columns (at least one each).
    """
    columns = -(-spec.image_width // stride_px)
    ranges = []
    for near, far in zip(spec.bin_edges_m[:-1], spec.bin_edges_m[1:], strict=True):
        start = int((ego_u_px + near * scaling_px_per_m) // stride_px)
        end = int(-(-(ego_u_px + far * scaling_px_per_m) // stride_px))
        start, end = min(max(start, 0), columns - 1), min(max(end, 1), columns)
        ranges.append((start, max(end, start + 1)))
    return tuple(ranges)


def ahead_column_distances(
    spec: PerceptionSpec, ego_u_px: float, scaling_px_per_m: float, stride_px: int
) -> tuple[int, tuple[float, ...]]:
    """(first feature-map column ahead of ego, each such column's centre distance / range)."""
    columns = -(-spec.image_width // stride_px)
    first = int(-(-ego_u_px // stride_px))
    distances = tuple(
        min(((c + 0.5) * stride_px - ego_u_px) / scaling_px_per_m, spec.max_range_m)
        / spec.max_range_m
        for c in range(first, columns)
    )
    return first, distances


def expected_first_gap(column_logits: torch.Tensor, distances: torch.Tensor) -> torch.Tensor:
    """Expected distance (N x 1) of the nearest column with a car, or 1.0 (the range) if none.

    ``column_logits`` (N x C) say "a car in this column", nearest column first; P(first car
    in column j) = p_j x prod_{i < j} (1 - p_i). Computed in log space with an exclusive
    cumulative sum — CumSum, not a MatMul with a triangular mask, so INT8 quantization leaves
    this probability arithmetic alone.
    """
    log_free = nn.functional.logsigmoid(-column_logits)
    free_before = torch.exp(torch.cumsum(log_free, dim=1) - log_free)
    first_here = torch.sigmoid(column_logits) * free_before
    none = torch.exp(log_free.sum(dim=1, keepdim=True))
    return (first_here * distances).sum(dim=1, keepdim=True) + none


class GridHead(nn.Module):
    """Lane detectors shared across the image, max-pooled over each distance bin's columns.

    A dense trunk learns each grid cell's detector from the cars seen at that cell; in
    junctions, where a crossing car may be anywhere, each cell sees few. These convolutions
    detect "a car of lane r centred here" with one filter for every position (a learned
    position map tells them where the lane bands are), and each bin takes its columns' maximum.
    """

    def __init__(
        self,
        channels: int,
        rows: int,
        columns: int,
        ranges: tuple[tuple[int, int], ...],
        ahead: tuple[int, tuple[float, ...]],
    ) -> None:
        super().__init__()
        first, distances = ahead
        self.first_ahead = int(first)
        self.register_buffer("distances", torch.tensor(distances, dtype=torch.float32))
        # Where in the image a detector fires matters (which lane band, which bin): a learned
        # map added to the shared detectors' response at every position, the same for every
        # frame. A parameter rather than a convolution of coordinate channels, so the exported
        # graph holds only an Add of a constant: no batch-shape ops, no Conv on constants.
        self.where = nn.Parameter(torch.zeros(1, channels, rows, columns))
        self.detect_features = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.detect = nn.Sequential(
            nn.BatchNorm2d(channels),
            nn.ReLU(inplace=True),
            nn.Conv2d(channels, LANES, kernel_size=1),
        )
        self.ranges = ranges

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(occupancy logits N x 3 x bins, lead gap N x 1 normalized) from the lane maps.

        The lead gap is the expected distance of the nearest ego-lane column with a car:
        P(first car in column j) = p_j x prod_{i nearer} (1 - p_i), and the full range when
        no column has one — the same detectors, read as "how far is the first car".
        """
        lanes = self.detect(self.detect_features(features) + self.where)
        bins = [lanes[:, :, :, start:end].amax(dim=(2, 3)) for start, end in self.ranges]
        ego_columns = lanes[:, EGO_LANE, :, self.first_ahead :].amax(dim=1)
        gap = expected_first_gap(ego_columns, self.distances)
        return torch.stack(bins, dim=2), gap


class PerceptionNet(nn.Module):
    """Image (N x 3 x H x W, [0,1]) → (occupancy logits N x 3 x bins, lead gap N x 1 in [0,1]).

    ``pool`` averages the last feature map down to (rows, columns) before the shared trunk;
    ``None`` keeps the whole map (4 x 10 cells of 16 x 16 px for the 64 x 160 camera). The
    occupancy grid and the lead gap are *where* questions — which lane, how far ahead — so a
    trunk that sees every cell's position localizes cars far better than one that sees a
    2 x 5 average, for a larger first linear layer but no more convolution work.
    """

    def __init__(
        self,
        spec: PerceptionSpec,
        width: int = 32,
        hidden: int = 128,
        pool: tuple[int, int] | None = (2, 5),
        grid_ranges: tuple[tuple[int, int], ...] | None = None,
        grid_ahead: tuple[int, tuple[float, ...]] | None = None,
        stages: int = STAGES,
        stem_stride: int = 2,
        mirror_average: bool = False,
    ) -> None:
        super().__init__()
        self.mirror_average = bool(mirror_average)
        if stages < 3:
            raise ValueError(f"the network needs at least 3 stages, got {stages}")
        if stem_stride not in (2, 4):
            raise ValueError(f"stem_stride must be 2 or 4, got {stem_stride}")
        if stem_stride == 4 and (spec.image_height % 4 or spec.image_width % 4):
            raise ValueError(
                f"a stride-4 stem needs image sides divisible by 4, got "
                f"{spec.image_height}x{spec.image_width}"
            )
        self.spec = spec
        self.stages = int(stages)
        channels = [width // 2, width] + [width * 2] * (self.stages - 2)
        if stem_stride == 2:
            blocks = [_block(3, channels[0])]
        else:  # the patch stem stands for the first two stages
            blocks = [_patch_stem(channels[1])]
            channels = channels[1:]
        blocks += [_block(c_in, c_out) for c_in, c_out in itertools.pairwise(channels)]
        self.features = nn.Sequential(*blocks)
        if pool is None:
            self.pool: nn.Module = nn.Identity()
            rows, columns = feature_map_size(spec, self.stages)
        else:
            rows, columns = (int(pool[0]), int(pool[1]))
            self.pool = nn.AdaptiveAvgPool2d((rows, columns))
        self.trunk = nn.Sequential(
            nn.Flatten(), nn.Linear(width * 2 * rows * columns, hidden), nn.ReLU(inplace=True)
        )
        self.occupancy_head = nn.Linear(hidden, LANES * spec.bins)
        self.lead_gap_head = nn.Linear(hidden, 1)
        self.grid_head: GridHead | None = None
        if grid_ranges is not None:
            rows, columns = feature_map_size(spec, self.stages - 1)
            if grid_ahead is None:
                raise ValueError("a grid head needs grid_ahead (ahead_column_distances)")
            self.grid_head = GridHead(width * 2, rows, columns, tuple(grid_ranges), grid_ahead)
            # How much of the lead gap comes from the trunk vs the grid (learned, sigmoid).
            self.gap_mix = nn.Parameter(torch.zeros(1))

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One view while training (augmentation mirrors frames already); at inference, with
        ``mirror_average``, the mean of the frame's and its mirror image's readings.

        The top-down camera's mirror image is an equally valid scene with left and right lanes
        swapped (training.objective.mirror_lanes), so a second reading of it, swapped back, is a
        second opinion on the same cells: averaging the two logits removes part of the
        network's variance (seed 7 benchmark: accuracy +0.001, every first-release floor held
        where one view missed one by 0.004). Two passes over one set of weights, not a batch of
        two, so the exported graph needs no batch-shape arithmetic.
        """
        occupancy, lead_gap, _ = self.forward_with_embedding(image)
        return occupancy, lead_gap

    def forward_with_embedding(
        self, image: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(occupancy logits, lead gap, embedding N x hidden) from one pass of the network.

        The embedding is the penultimate feature vector (the trunk's output, the input of the
        occupancy and lead-gap heads). With ``mirror_average`` at inference it is averaged over
        the two views exactly as the outputs are, so the embedding describes the reading the
        engine reports: a frame and its mirror image embed alike, as they predict alike.
        """
        if self.training or not getattr(self, "mirror_average", False):
            return self._single_view(image)
        occupancy, lead_gap, hidden = self._single_view(image)
        mirrored_occupancy, mirrored_gap, mirrored_hidden = self._single_view(image.flip(-2))
        occupancy = 0.5 * (occupancy + mirrored_occupancy.flip(-2))
        return occupancy, 0.5 * (lead_gap + mirrored_gap), 0.5 * (hidden + mirrored_hidden)

    def embed(self, image: torch.Tensor) -> torch.Tensor:
        """Penultimate features N x ``embedding_dim`` (float32): what frame similarity compares."""
        return self.forward_with_embedding(image)[2]

    @property
    def embedding_dim(self) -> int:
        """Width of :meth:`embed`'s vectors (the trunk's ``hidden``)."""
        return int(self.occupancy_head.in_features)

    def _single_view(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.grid_head is None:
            hidden = self.trunk(self.pool(self.features(image)))
            grid = None
        else:
            fine = self.features[:-1](image)
            hidden = self.trunk(self.pool(self.features[-1](fine)))
            grid = self.grid_head(fine)
        occupancy = self.occupancy_head(hidden).view(-1, LANES, self.spec.bins)
        lead_gap = torch.sigmoid(self.lead_gap_head(hidden))
        if grid is not None:
            grid_occupancy, grid_gap = grid
            occupancy = occupancy + grid_occupancy
            mix = torch.sigmoid(self.gap_mix)
            lead_gap = mix * lead_gap + (1.0 - mix) * grid_gap
        return occupancy, lead_gap, hidden


@contextlib.contextmanager
def embedding_as_output(net: PerceptionNet) -> Iterator[PerceptionNet]:
    """While open, ``net(image)`` returns (occupancy, lead gap, embedding): for ONNX export.

    ``net``'s own ``forward`` runs — subclasses included, whatever it computes is what the
    graph computes — and the embedding is taken from the trunk as that call runs it (a forward
    hook), averaged over the views when ``mirror_average`` runs the trunk twice: exactly
    :meth:`PerceptionNet.embed`, from the same pass. Hooks on ``net`` itself rather than a
    wrapper module, so the exported nodes keep their names (``/features/...``), which INT8
    fallback plans and layerwise reports refer to. Removed on exit: training never sees them.
    """
    views: list[torch.Tensor] = []

    def capture(_module: nn.Module, _inputs: Any, output: torch.Tensor) -> None:
        views.append(output)

    def append_embedding(_module: nn.Module, _inputs: Any, outputs: Any) -> Any:
        if not views:
            raise RuntimeError(f"{type(net).__name__}.forward never ran the trunk")
        embedding = views[0]
        for view in views[1:]:
            embedding = embedding + view
        if len(views) > 1:
            embedding = embedding * (1.0 / len(views))
        views.clear()
        return (*outputs, embedding)

    handles = [
        net.trunk.register_forward_hook(capture),
        net.register_forward_hook(append_embedding),
    ]
    try:
        yield net
    finally:
        for handle in handles:
            handle.remove()
