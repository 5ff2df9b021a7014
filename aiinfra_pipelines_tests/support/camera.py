"""The fleet camera's image size, for synthetic logs that must look like the fleet's."""

from __future__ import annotations

from aiinfra_pipelines.perception.contract import perception_spec

_SPEC = perception_spec()
# make_synthetic_log(..., **CAMERA_SIZE): frames the perception engine accepts as its input.
CAMERA_SIZE: dict[str, int] = {
    "image_height": _SPEC.image_height,
    "image_width": _SPEC.image_width,
}
