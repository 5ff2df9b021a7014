"""The one exception the drive-log codec raises, with a machine-readable ``code``.

Ingestion turns a rejected upload into an asset-check result and a quarantine entry; a stable
short code (rather than a parsed exception message) is what dashboards and tests key on.
"""

from __future__ import annotations

import re

# Codes raised by the reader. Validation reuses them as ``Reason.code`` values.
EMPTY = "empty"  # zero-byte file
NOT_MCAP = "not_mcap"  # no MCAP magic: garbage or a different format
TRUNCATED = "truncated"  # ends before the footer/magic or inside a record
CRC_MISMATCH = "crc_mismatch"  # chunk, data-section or summary checksum does not match
CORRUPT = "corrupt"  # structurally invalid records (bad lengths, dangling ids)
UNREADABLE = "unreadable"  # any other failure to read the container
MISSING_CHANNEL = "missing_channel"  # a channel needed to rebuild frames is absent
MISSING_METADATA = "missing_metadata"  # no "drive_log" metadata record
WRONG_SCHEMA = "wrong_schema"  # a known topic carries an unexpected schema or encoding
DECODE_ERROR = "decode_error"  # a message payload is not a valid protobuf of its schema
BAD_IMAGE = "bad_image"  # a camera message whose size/encoding cannot form an rgb8 image
UNALIGNED_CHANNEL = "unaligned_channel"  # no sample near a camera timestamp on some channel
UNKNOWN_SOURCE = "unknown_source"  # no source profile (resources/sources) fits the channels
BAD_POINT_CLOUD = "bad_point_cloud"  # a LiDAR cloud whose field layout or size does not hold
MISSING_CALIBRATION = "missing_calibration"  # a required camera calibration was not recorded
CLOCK_SKEW = "clock_skew"  # a sensor's clock is off against the camera's beyond logs.yaml
BAD_CALIBRATION = "bad_calibration"  # camera calibration absent, non-finite or wrong size
# Caps on what a file declares (logs.yaml ``limits``): refused before the claim is honoured.
DECOMPRESSION_LIMIT = "decompression_limit"  # a chunk inflating past its size or ratio cap
RECORD_LIMIT = "record_limit"  # more records in one file than the cap
IMAGE_TOO_LARGE = "image_too_large"  # an image whose dimensions or pixel count pass the cap

INTEGRITY_CODES: frozenset[str] = frozenset(
    {
        EMPTY,
        NOT_MCAP,
        TRUNCATED,
        CRC_MISMATCH,
        CORRUPT,
        UNREADABLE,
        DECOMPRESSION_LIMIT,
        RECORD_LIMIT,
    }
)

# ``<_io.BytesIO object at 0x7f…>`` and the like: an address says nothing to the reader of a
# reason, and differs between two runs on the same file.
_OBJECT_REPR = re.compile(r"<[^<>]*? at 0x[0-9a-fA-F]+>")


def plain(text: str, placeholder: str = "<data>") -> str:
    """``text`` with each object repr replaced by ``placeholder`` (the same file gives the same
    reason, every time; the CLI's one-line errors use it too)."""
    return _OBJECT_REPR.sub(placeholder, text)


class DriveLogError(Exception):
    """A drive log that cannot be read back into a :class:`~aiinfra_pipelines.logs.model.DriveLog`.

    ``code`` is one of the constants in this module; ``message`` is for humans.
    """

    def __init__(self, code: str, message: str) -> None:
        message = plain(message)
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
