"""MCAP drive logs: schema, writer/reader, validation and anonymization.

The submodules are the API; the names re-exported here are the ones other layers use.
"""

from aiinfra_pipelines.logs.anonymize import (
    anonymization_key,
    anonymize_log,
    blur_regions,
    coarsen_coordinate,
    find_pii_leaks,
    load_or_create_dev_key,
    pseudonymize_vin,
)
from aiinfra_pipelines.logs.errors import DriveLogError
from aiinfra_pipelines.logs.model import DriveLog, Frame, OtherVehicle, TriggerEvent
from aiinfra_pipelines.logs.reader import (
    iter_frames,
    read_drive_log,
    read_metadata,
    summarize_channels,
)
from aiinfra_pipelines.logs.synthetic import make_synthetic_log
from aiinfra_pipelines.logs.validation import validate_drive_log
from aiinfra_pipelines.logs.validation_report import Reason, ValidationReport
from aiinfra_pipelines.logs.writer import encode_drive_log, write_drive_log

__all__ = [
    "DriveLog",
    "DriveLogError",
    "Frame",
    "OtherVehicle",
    "Reason",
    "TriggerEvent",
    "ValidationReport",
    "anonymization_key",
    "anonymize_log",
    "blur_regions",
    "coarsen_coordinate",
    "encode_drive_log",
    "find_pii_leaks",
    "iter_frames",
    "load_or_create_dev_key",
    "make_synthetic_log",
    "pseudonymize_vin",
    "read_drive_log",
    "read_metadata",
    "summarize_channels",
    "validate_drive_log",
    "write_drive_log",
]
