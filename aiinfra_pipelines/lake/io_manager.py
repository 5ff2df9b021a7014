"""Dagster IO manager that keeps asset outputs in the versioned lake.

Outputs are written to the run's branch (see :mod:`.publish`) and committed there, one commit
per output, so a step's result is durable the moment the step ends and a later step — in another
process or a retry — can read it. Nothing reaches ``main`` until a publish step merges the
branch. DataFrames are stored as Parquet, mappings and lists as JSON; the lake ref of every
output goes into its materialization metadata so an operator can open the exact object.
"""

from __future__ import annotations

import io
import json
from typing import Any

import dagster as dg
import pandas as pd

from .errors import NotFoundError
from .port import VersionedLake
from .publish import ensure_run_branch, read_ref, root_run_id_of

DATA_PREFIX = "data"
_FORMATS = (".parquet", ".json")


def asset_object_base(asset_key: dg.AssetKey, partition_key: str | None) -> str:
    """Lake key (without extension) of one asset partition: ``data/<asset path>/<partition>``."""
    base = "/".join([DATA_PREFIX, *asset_key.path])
    if partition_key is None:
        return f"{base}/__all__"
    return f"{base}/{partition_key}"


def parquet_bytes(frame: pd.DataFrame) -> bytes:
    """A DataFrame as Parquet bytes: the one encoding every table in the lake uses."""
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    return buffer.getvalue()


def encode_output(obj: Any) -> tuple[str, bytes]:
    """Serialize an output; returns (extension, bytes)."""
    if isinstance(obj, pd.DataFrame):
        return ".parquet", parquet_bytes(obj)
    if isinstance(obj, dict | list):
        return ".json", json.dumps(obj, sort_keys=True, default=str).encode()
    raise TypeError(
        f"the lake IO manager stores pandas DataFrames, dicts and lists; got {type(obj).__name__}"
    )


def decode_output(extension: str, data: bytes) -> Any:
    if extension == ".parquet":
        return pd.read_parquet(io.BytesIO(data))
    return json.loads(data)


def _root_run_id(context: dg.OutputContext | dg.InputContext) -> str | None:
    try:
        run = context.step_context.dagster_run
    except Exception:
        return None
    return root_run_id_of(run)


class LakeIOManager(dg.ConfigurableIOManager):
    """Stores asset outputs as objects on the run branch of the versioned lake."""

    lake: VersionedLake

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        if obj is None:
            return
        root_run_id = _root_run_id(context) or context.run_id
        branch = ensure_run_branch(self.lake, root_run_id)
        partition = context.asset_partition_key if context.has_asset_partitions else None
        extension, payload = encode_output(obj)
        key = asset_object_base(context.asset_key, partition) + extension
        for stale in _FORMATS:  # an output that changed format must not leave its old twin
            if stale != extension and self.lake.object_exists(
                branch, key[: -len(extension)] + stale
            ):
                self.lake.delete_object(branch, key[: -len(extension)] + stale)
        stat = self.lake.put_object(branch, key, payload)
        commit = self.lake.commit(
            branch,
            f"{context.asset_key.to_user_string()}"
            + (f" [{partition}]" if partition else "")
            + f" by run {context.run_id}",
            {
                "dagster_run_id": context.run_id,
                "asset_key": context.asset_key.to_user_string(),
                "partition": partition or "",
                "checksum": stat.checksum,
            },
            allow_empty=True,
        )
        context.add_output_metadata(
            {
                # The commit, not the branch: run branches are deleted once published.
                "lake_ref": dg.MetadataValue.text(
                    f"lakefs://{self.lake.repository}/{commit}/{key}"
                ),
                "lake_branch": branch,
                "lake_commit": commit,
                "lake_key": key,
                "size_bytes": stat.size,
            }
        )

    def load_input(self, context: dg.InputContext) -> Any:
        ref = read_ref(self.lake, _root_run_id(context))
        asset_key = context.asset_key
        if context.has_asset_partitions and len(context.asset_partition_keys) != 1:
            frames = [self._read(ref, asset_key, key) for key in context.asset_partition_keys]
            tables = [frame for frame in frames if isinstance(frame, pd.DataFrame)]
            if len(tables) != len(frames):
                return frames
            return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
        partition = context.asset_partition_key if context.has_asset_partitions else None
        return self._read(ref, asset_key, partition)

    def _read(self, ref: str, asset_key: dg.AssetKey, partition: str | None) -> Any:
        base = asset_object_base(asset_key, partition)
        for extension in _FORMATS:
            if self.lake.object_exists(ref, base + extension):
                return decode_output(extension, self.lake.get_object(ref, base + extension))
        raise NotFoundError(
            f"no stored output for {asset_key.to_user_string()}"
            + (f" partition {partition!r}" if partition else "")
            + f" on lake ref {ref!r} (looked for {base}.parquet/.json): materialize it first"
        )


def read_parquet_prefix(lake: VersionedLake, ref: str, prefix: str) -> pd.DataFrame:
    """Every Parquet object under ``prefix`` at ``ref``, concatenated (empty frame if none)."""
    tables = [
        lake.get_parquet(ref, stat.key)
        for stat in lake.list_objects(ref, prefix=prefix)
        if stat.key.endswith(".parquet")
    ]
    return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()


def read_asset_partitions(lake: VersionedLake, asset: str, ref: str) -> pd.DataFrame:
    """Every stored Parquet partition of ``asset`` at ``ref``, concatenated (a combined view)."""
    return read_parquet_prefix(lake, ref, f"{DATA_PREFIX}/{asset}/")
