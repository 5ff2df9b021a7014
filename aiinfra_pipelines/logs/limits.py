"""Caps on what an uploaded file declares (``resources/logs.yaml`` ``limits``).

An upload is untrusted input: every size it states — a chunk's uncompressed size, an image's
width and height — is a claim on memory or CPU made before a byte of it is checked. Each claim
is compared with its cap *before* it is honoured, so a crafted file (a 33 kB zstd chunk that
inflates to 1 GiB, a 300-byte JPEG that says 20000 x 20000) is refused with its own code in
bounded time and memory instead of taking an ingest worker down.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiinfra_pipelines.logs import _config, errors
from aiinfra_pipelines.logs.errors import DriveLogError


@dataclass(frozen=True)
class ReadLimits:
    """The caps, in the units the file declares them."""

    max_chunk_uncompressed_bytes: int
    max_compression_ratio: float
    max_records: int
    max_image_pixels: int
    max_image_side_px: int

    @classmethod
    def load(cls) -> ReadLimits:
        values = _config.section("limits")
        return cls(
            max_chunk_uncompressed_bytes=int(values["max_chunk_uncompressed_bytes"]),
            max_compression_ratio=float(values["max_compression_ratio"]),
            max_records=int(values["max_records"]),
            max_image_pixels=int(values["max_image_pixels"]),
            max_image_side_px=int(values["max_image_side_px"]),
        )

    def check_chunk(self, declared_bytes: int, compressed_bytes: int, compression: str) -> None:
        """Refuse a chunk whose declared inflated size passes the size or ratio cap."""
        if declared_bytes > self.max_chunk_uncompressed_bytes:
            raise DriveLogError(
                errors.DECOMPRESSION_LIMIT,
                f"a chunk declares {declared_bytes} B uncompressed; the cap is "
                f"{self.max_chunk_uncompressed_bytes} B (logs.yaml limits)",
            )
        if compression and declared_bytes > self.max_compression_ratio * max(compressed_bytes, 1):
            raise DriveLogError(
                errors.DECOMPRESSION_LIMIT,
                f"a {compression} chunk of {compressed_bytes} B declares {declared_bytes} B "
                f"uncompressed ({declared_bytes / max(compressed_bytes, 1):,.0f}:1); the cap "
                f"is {self.max_compression_ratio:,.0f}:1 (logs.yaml limits)",
            )

    def check_image(self, width: int, height: int, where: str) -> None:
        """Refuse an image whose stated dimensions pass the side or pixel cap (before decoding)."""
        side = self.max_image_side_px
        if width > side or height > side or width * height > self.max_image_pixels:
            raise DriveLogError(
                errors.IMAGE_TOO_LARGE,
                f"{where}: image of {width}x{height} ({width * height} pixels) passes the cap of "
                f"{side} px a side and {self.max_image_pixels} pixels (logs.yaml limits)",
            )
