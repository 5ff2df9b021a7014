"""64-bit perceptual hashes of camera frames and their near pairs, found without O(n²) loops.

A DCT pHash (grey → area-resize to 32x32 → 2-D DCT-II → the 8x8 lowest frequencies → one bit
per coefficient above their median) changes little under sensor noise, recompression, small
brightness shifts and slight blur, but a lot when the scene changes: the Hamming distance
between two hashes is a cheap "is this the same picture" score.

Pairs within a distance ``d`` are found by banding (the pigeonhole form of LSH): cut the 64 bits
into ``d + 1`` chunks; two hashes that differ in at most ``d`` bits agree exactly on at least one
chunk. So only hashes that share a chunk value are compared, via sorting and ``searchsorted``
— recall is exact, and the work is proportional to the candidates, not to n². Identical hashes
are collapsed first, so a thousand copies of one frame cost one comparison, not half a million.

numpy only (no imagehash / scipy dependency): the DCT is a 32x32 matrix product.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

HASH_BITS = 64
RESIZE = 32  # the side the grey image is area-resized to before the DCT
LOW_FREQUENCIES = 8  # 8 x 8 = 64 coefficients = 64 bits
# Frames hashed per matrix product: bounds the float32 working set (~CHUNK x H x W x 4 bytes).
CHUNK = 256
_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)


def _dct_matrix(size: int) -> np.ndarray:
    """Orthonormal DCT-II matrix: ``D @ x`` is the DCT of column vector ``x``."""
    n = np.arange(size)
    matrix = np.sqrt(2.0 / size) * np.cos(np.pi * (2 * n[None, :] + 1) * n[:, None] / (2 * size))
    matrix[0] /= np.sqrt(2.0)
    return matrix.astype(np.float32)


def _area_matrix(source: int, target: int) -> np.ndarray:
    """``target x source`` matrix averaging each output cell over its share of the input."""
    edges = np.linspace(0.0, source, target + 1)
    pixels = np.arange(source)
    # Overlap of pixel [p, p+1) with output cell [edges[k], edges[k+1]).
    low = np.maximum(pixels[None, :], edges[:-1, None])
    high = np.minimum(pixels[None, :] + 1, edges[1:, None])
    weights = np.clip(high - low, 0.0, None)
    return (weights / weights.sum(axis=1, keepdims=True)).astype(np.float32)


_DCT = _dct_matrix(RESIZE)


def _project(images: np.ndarray, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """``left @ grey(image) @ right`` for every frame, as two large GEMMs per chunk.

    The luma weights are folded into ``right`` (a W·3 x k matrix), so the colour image is
    multiplied as it is stored; a broadcast batch of small matrix products, or a separate grey
    conversion, is several times slower in numpy.
    """
    if images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"expected N x H x W x 3 images, got shape {images.shape}")
    n_frames, height, width, _ = images.shape
    right_rgb = np.kron(right, _LUMA[:, None]).astype(np.float32)  # (W*3) x k
    out = np.empty((n_frames, left.shape[0], right.shape[1]), dtype=np.float32)
    for start in range(0, n_frames, CHUNK):
        chunk = images[start : start + CHUNK]
        n = len(chunk)
        flat = chunk.reshape(n * height, width * 3).astype(np.float32)
        across = (flat @ right_rgb).reshape(n, height, -1)  # n x H x k
        out[start : start + n] = np.matmul(left, across)
    return out


def phash(images: np.ndarray) -> np.ndarray:
    """uint8 N x H x W x 3 frames → N uint64 DCT perceptual hashes (module docstring)."""
    if images.ndim != 4 or images.shape[-1] != 3 or 0 in images.shape[1:3]:
        raise ValueError(f"expected N x H x W x 3 images, got shape {images.shape}")
    # Area resize to 32x32 and the DCT folded into one matrix per axis.
    left = _DCT[:LOW_FREQUENCIES] @ _area_matrix(images.shape[1], RESIZE)  # 8 x H
    right = (_DCT[:LOW_FREQUENCIES] @ _area_matrix(images.shape[2], RESIZE)).T  # W x 8
    low = _project(images, left, right).reshape(len(images), -1)
    return pack_bits(low > np.median(low, axis=1, keepdims=True))


def grey_thumbnails(images: np.ndarray, height: int, width: int) -> np.ndarray:
    """uint8 N x H x W x 3 frames → float32 N x (height·width) area-averaged grey thumbnails
    (a cheap, deterministic per-frame feature vector)."""
    if height < 1 or width < 1:
        raise ValueError(f"thumbnail size must be positive, got {height}x{width}")
    left = _area_matrix(images.shape[1], height)
    right = _area_matrix(images.shape[2], width).T
    return _project(images, left, right).reshape(len(images), -1)


def pack_bits(bits: np.ndarray) -> np.ndarray:
    """N x 64 booleans → N uint64, first column the most significant bit."""
    if bits.ndim != 2 or bits.shape[1] != HASH_BITS:
        raise ValueError(f"expected N x {HASH_BITS} bits, got shape {bits.shape}")
    packed = np.packbits(bits.astype(np.uint8), axis=1)
    return packed.view(">u8").astype(np.uint64).ravel()


def hamming(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element-wise number of differing bits between two uint64 arrays."""
    xor = np.bitwise_xor(np.asarray(a, dtype=np.uint64), np.asarray(b, dtype=np.uint64))
    if hasattr(np, "bitwise_count"):  # numpy >= 2
        return np.bitwise_count(xor).astype(np.int64)
    as_bytes = xor.view(np.uint8).reshape(*xor.shape, 8)
    return np.unpackbits(as_bytes, axis=-1).sum(axis=-1).astype(np.int64)


def _bands(max_distance: int) -> list[tuple[int, int]]:
    """``max_distance + 1`` contiguous (shift, width) chunks covering the 64 bits."""
    count = max_distance + 1
    widths = [HASH_BITS // count + (1 if i < HASH_BITS % count else 0) for i in range(count)]
    shifts = np.cumsum([0, *widths[:-1]])
    return [(int(shift), width) for shift, width in zip(shifts, widths, strict=True)]


def _band_key(hashes: np.ndarray, shift: int, width: int) -> np.ndarray:
    mask = np.uint64((1 << width) - 1)
    return (hashes >> np.uint64(shift)) & mask


def _ranges_to_pairs(
    starts: np.ndarray, stops: np.ndarray, left: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """For each ``left[k]``, the positions ``starts[k] .. stops[k]-1`` (vectorized expansion)."""
    counts = np.maximum(stops - starts, 0)
    total = int(counts.sum())
    if total == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    owners = np.repeat(np.arange(len(counts)), counts)
    offsets = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    return left[owners], starts[owners] + offsets


def _band_candidates(
    a: np.ndarray, b: np.ndarray | None, shift: int, width: int
) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs (into ``a``, into ``b`` or ``a``) whose hashes agree on one band."""
    keys_a = _band_key(a, shift, width)
    keys_b = keys_a if b is None else _band_key(b, shift, width)
    order = np.argsort(keys_b, kind="stable")
    sorted_keys = keys_b[order]
    stops = np.searchsorted(sorted_keys, keys_a, side="right")
    if b is None:  # within one set: partners after this element's own sorted position
        position = np.empty(len(a), dtype=np.int64)
        position[order] = np.arange(len(a))
        left, right = _ranges_to_pairs(position + 1, stops, np.arange(len(a)))
    else:
        starts = np.searchsorted(sorted_keys, keys_a, side="left")
        left, right = _ranges_to_pairs(starts, stops, np.arange(len(a)))
    return left, order[right]


@dataclass(frozen=True)
class HashPairs:
    """Near pairs: ``left``/``right`` index the hash arrays given, ``distance`` their Hamming."""

    left: np.ndarray
    right: np.ndarray
    distance: np.ndarray

    def __len__(self) -> int:
        return len(self.left)


def _unique_pairs(
    a: np.ndarray, b: np.ndarray | None, max_distance: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct (left, right) candidates over all bands, kept when within ``max_distance``."""
    lefts, rights = [], []
    for shift, width in _bands(max_distance):
        left, right = _band_candidates(a, b, shift, width)
        lefts.append(left)
        rights.append(right)
    left, right = np.concatenate(lefts), np.concatenate(rights)
    if b is None:  # orient within-set pairs so (i, j) and (j, i) collapse
        left, right = np.minimum(left, right), np.maximum(left, right)
    width = len(a) if b is None else len(b)
    codes = np.unique(left.astype(np.int64) * max(width, 1) + right)
    left, right = codes // max(width, 1), codes % max(width, 1)
    distance = hamming(a[left], (a if b is None else b)[right])
    keep = distance <= max_distance
    return left[keep], right[keep], distance[keep]


def near_pairs(hashes: np.ndarray, max_distance: int, other: np.ndarray | None = None) -> HashPairs:
    """Pairs within ``max_distance`` bits: within ``hashes`` (i < j), or ``hashes`` × ``other``.

    Identical hashes are collapsed before banding; the matched groups are expanded back to
    frame pairs at the end, sorted by distance then index.
    """
    if not 0 <= max_distance < HASH_BITS:
        raise ValueError(f"max_distance must be in [0, {HASH_BITS}), got {max_distance}")
    groups_a = _Groups.of(hashes)
    if other is None:
        left, right, distance = _unique_pairs(groups_a.values, None, max_distance)
        # Each group of identical hashes is also a cluster of distance-0 pairs with itself.
        dup = np.flatnonzero(groups_a.sizes > 1)
        left, right = np.concatenate([dup, left]), np.concatenate([dup, right])
        distance = np.concatenate([np.zeros(len(dup), np.int64), distance])
        groups_b = groups_a
    else:
        groups_b = _Groups.of(other)
        left, right, distance = _unique_pairs(groups_a.values, groups_b.values, max_distance)
    same = (left == right) if other is None else np.zeros(len(left), dtype=bool)
    frame_left, frame_right, frame_distance = _expand(
        groups_a, groups_b, (left, right, distance), same
    )
    if other is None:  # distinct hashes i < j may still hold frames j' < i'
        frame_left, frame_right = (
            np.minimum(frame_left, frame_right),
            np.maximum(frame_left, frame_right),
        )
    order = np.lexsort((frame_right, frame_left, frame_distance))
    return HashPairs(frame_left[order], frame_right[order], frame_distance[order])


@dataclass(frozen=True)
class _Groups:
    """Distinct hash ``values``; the original indices of group g are
    ``order[starts[g] : starts[g] + sizes[g]]``."""

    values: np.ndarray
    order: np.ndarray
    starts: np.ndarray
    sizes: np.ndarray

    @classmethod
    def of(cls, hashes: np.ndarray) -> _Groups:
        values, inverse, sizes = np.unique(
            np.asarray(hashes, dtype=np.uint64), return_inverse=True, return_counts=True
        )
        order = np.argsort(inverse.ravel(), kind="stable")
        return cls(values, order, np.cumsum(sizes) - sizes, sizes)

    def members(self, group: int) -> np.ndarray:
        return self.order[self.starts[group] : self.starts[group] + self.sizes[group]]


def _expand(
    groups_a: _Groups,
    groups_b: _Groups,
    pairs: tuple[np.ndarray, np.ndarray, np.ndarray],
    same: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Frame pairs of matched hash groups: singletons vectorized, larger groups member by
    member (all × all; i < j within one group)."""
    left, right, distance = pairs
    single = (groups_a.sizes[left] == 1) & (groups_b.sizes[right] == 1) & ~same
    lefts = [groups_a.order[groups_a.starts[left[single]]]]
    rights = [groups_b.order[groups_b.starts[right[single]]]]
    distances = [distance[single]]
    for i, j, d, within in zip(
        left[~single], right[~single], distance[~single], same[~single], strict=True
    ):
        members_a, members_b = groups_a.members(i), groups_b.members(j)
        if within:
            a, b = np.triu_indices(len(members_a), k=1)
            lefts.append(members_a[a])
            rights.append(members_a[b])
        else:
            lefts.append(np.repeat(members_a, len(members_b)))
            rights.append(np.tile(members_b, len(members_a)))
        distances.append(np.full(len(lefts[-1]), d, dtype=np.int64))
    return np.concatenate(lefts), np.concatenate(rights), np.concatenate(distances)
