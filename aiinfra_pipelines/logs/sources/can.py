"""A CAN decoding table: physical signals read out of raw ``can_msgs/msg/Frame`` payloads.

A car that records its bus raw (``ros2_socketcan`` publishes every frame as ``can_msgs/msg/
Frame``) carries signals no standard ROS message does — the brake pedal, above all. Which bytes
of which frame hold a signal is the car maker's DBC, so it lives in the source profile's ``can``
table (resources/sources), one entry per signal: frame id, byte offset and length, signedness,
byte order, and the linear conversion ``physical = raw * scale + offset``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiinfra_pipelines.logs import errors
from aiinfra_pipelines.logs.errors import DriveLogError

BYTE_ORDERS = frozenset({"little", "big"})  # Intel / Motorola in DBC terms


@dataclass(frozen=True)
class CanSignal:
    """One table entry: where a signal sits in a frame's payload and how it converts."""

    name: str
    frame_id: int
    start_byte: int
    length: int  # bytes
    signed: bool = False
    byte_order: str = "little"
    scale: float = 1.0
    offset: float = 0.0

    def describe(self) -> str:
        return f"CAN 0x{self.frame_id:X} {self.name}"

    def decode(self, payload: bytes, where: str) -> float:
        """The physical value in ``payload`` (a frame's data bytes)."""
        end = self.start_byte + self.length
        if len(payload) < end:
            raise DriveLogError(
                errors.DECODE_ERROR,
                f"{where}: CAN 0x{self.frame_id:X} carries {len(payload)} B, "
                f"{self.name} needs bytes {self.start_byte}..{end - 1}",
            )
        raw = int.from_bytes(
            payload[self.start_byte : end],
            "little" if self.byte_order == "little" else "big",
            signed=self.signed,
        )
        return raw * self.scale + self.offset


def parse_can_table(raw: Mapping[str, Any] | None, profile: str) -> dict[str, CanSignal]:
    """The profile's ``can`` table; a clear ``ValueError`` for a malformed entry."""
    table = {}
    for name, entry in (raw or {}).items():
        try:
            signal = CanSignal(
                name=str(name),
                frame_id=int(entry["id"]),
                start_byte=int(entry["byte"]),
                length=int(entry["length"]),
                signed=bool(entry.get("signed", False)),
                byte_order=str(entry.get("byte_order", "little")),
                scale=float(entry.get("scale", 1.0)),
                offset=float(entry.get("offset", 0.0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"source profile {profile}: CAN signal {name}: {exc!r}") from exc
        if signal.byte_order not in BYTE_ORDERS:
            raise ValueError(
                f"source profile {profile}: CAN signal {name} byte_order "
                f"{signal.byte_order!r} is not one of {sorted(BYTE_ORDERS)}"
            )
        if signal.start_byte < 0 or signal.length <= 0:
            raise ValueError(f"source profile {profile}: CAN signal {name} has no bytes")
        table[signal.name] = signal
    return table
