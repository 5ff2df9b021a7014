"""The simulated fleet's vehicles: identities (VIN, model, versions) and home cities.

VINs are synthetic but well-formed (ISO 3779: 17 characters, no I/O/Q, valid check digit) so
downstream validation and anonymization are exercised on realistic identifiers. They derive
from the configured namespace and the vehicle index only, so a car keeps its VIN across runs
with different drive seeds, like a real car across days.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from aiinfra_pipelines.fleet.settings import FleetConfig, fleet_config

VIN_CHARSET = "ABCDEFGHJKLMNPRSTUVWXYZ0123456789"  # ISO 3779: no I, O, Q
VIN_LENGTH = 17
_VIN_WEIGHTS = (8, 7, 6, 5, 4, 3, 2, 10, 0, 9, 8, 7, 6, 5, 4, 3, 2)
_VIN_VALUES = {
    **{str(d): d for d in range(10)},
    **dict(zip("ABCDEFGH", range(1, 9), strict=True)),
    **dict(zip("JKLMN", range(1, 6), strict=True)),
    "P": 7,
    "R": 9,
    **dict(zip("STUVWXYZ", range(2, 10), strict=True)),
}
_EARTH_RADIUS_M = 6_378_137.0  # WGS84 semi-major axis


@dataclass(frozen=True)
class City:
    """A home city and its GPS origin (WGS84 degrees)."""

    name: str
    latitude: float
    longitude: float


@dataclass(frozen=True)
class Vehicle:
    """One car of the fleet: what goes into its logs' metadata."""

    index: int
    vin: str
    model: str
    sensor_config_version: str
    software_version: str
    city: str


def vin_check_digit(vin: str) -> str:
    """The ISO 3779 / NHTSA check digit (position 9) for a 17-character VIN."""
    if len(vin) != VIN_LENGTH:
        raise ValueError(f"VIN must have {VIN_LENGTH} characters, got {len(vin)}")
    total = sum(_VIN_VALUES[ch] * w for ch, w in zip(vin, _VIN_WEIGHTS, strict=True))
    remainder = total % 11
    return "X" if remainder == 10 else str(remainder)


def is_valid_vin(vin: str) -> bool:
    """Length, charset and check digit all hold."""
    if len(vin) != VIN_LENGTH or any(ch not in VIN_CHARSET for ch in vin):
        return False
    return vin[8] == vin_check_digit(vin)


def make_vin(wmi: str, namespace: str, index: int, model_year_code: str) -> str:
    """A deterministic VIN: WMI + hashed descriptor + check digit + year + plant + serial."""
    digest = hashlib.sha256(f"{namespace}|{index}".encode()).digest()
    chars = [VIN_CHARSET[b % len(VIN_CHARSET)] for b in digest]
    descriptor = "".join(chars[:5])  # positions 4-8
    plant = chars[5]  # position 11
    serial = f"{index % 1_000_000:06d}"  # positions 12-17: readable production number
    draft = f"{wmi}{descriptor}0{model_year_code}{plant}{serial}"
    vin = draft[:8] + vin_check_digit(draft) + draft[9:]
    if not is_valid_vin(vin):
        raise ValueError(f"configured WMI/model year produce an invalid VIN: {vin!r}")
    return vin


def cities(config: FleetConfig | None = None) -> list[City]:
    """The configured home cities, in file order."""
    section = fleet_config(config)["fleet"]["cities"]
    return [City(name, float(c["latitude"]), float(c["longitude"])) for name, c in section.items()]


def city_by_name(name: str, config: FleetConfig | None = None) -> City:
    """Look up one configured city."""
    for city in cities(config):
        if city.name == name:
            return city
    raise KeyError(f"unknown city {name!r}")


def build_fleet(
    n_vehicles: int,
    software_version: str | None = None,
    config: FleetConfig | None = None,
) -> list[Vehicle]:
    """``n_vehicles`` cars; models and home cities assigned round-robin.

    ``software_version`` is the engine driving the cars (fleet.yaml default, the rule planner,
    until a released engine is rolled out and passed here).
    """
    section = fleet_config(config)["fleet"]
    models = section["vehicle_models"]
    homes = cities(config)
    version = software_version or str(section["default_software_version"])
    fleet = []
    for index in range(n_vehicles):
        model = models[index % len(models)]
        fleet.append(
            Vehicle(
                index=index,
                vin=make_vin(
                    str(model["wmi"]),
                    str(section["vin_namespace"]),
                    index,
                    str(section["model_year_code"]),
                ),
                model=str(model["name"]),
                sensor_config_version=str(model["sensor_config_version"]),
                software_version=version,
                city=homes[index % len(homes)].name,
            )
        )
    return fleet


def local_to_gps(east_m: float, north_m: float, origin: City) -> tuple[float, float]:
    """Map local ENU metres around ``origin`` to (latitude, longitude) degrees.

    An equirectangular approximation: exact to centimetres over the few kilometres a sim drive
    covers, and invertible without a projection library.
    """
    lat = origin.latitude + math.degrees(north_m / _EARTH_RADIUS_M)
    lon = origin.longitude + math.degrees(
        east_m / (_EARTH_RADIUS_M * math.cos(math.radians(origin.latitude)))
    )
    return lat, lon
