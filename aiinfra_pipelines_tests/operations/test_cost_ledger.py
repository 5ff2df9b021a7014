"""The compute-cost ledger from a real test instance's runs: seconds, GPU pools, groups."""

from __future__ import annotations

import io
import json
import shutil
import time
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest

from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.operations.assets import compute_cost_ledger
from aiinfra_pipelines.operations.cost_ledger import (
    BY_GROUP_KEY,
    STEPS_KEY,
    LedgerSettings,
    asset_groups,
    ledger_by_asset,
    ledger_by_group,
    loop_asset_groups,
    step_costs,
)
from aiinfra_pipelines_tests.support.operations_lake import materialized

regions = dg.StaticPartitionsDefinition(["north", "south"])


@dg.asset(group_name="prep")
def raw_table() -> int:
    time.sleep(0.2)
    return 1


@dg.asset(group_name="train", pool="gpu")
def fitted(raw_table: int) -> int:
    time.sleep(0.3)
    return raw_table + 1


@dg.asset(group_name="prep", partitions_def=regions)
def per_region() -> int:
    time.sleep(0.1)
    return 2


@dg.asset(group_name="train", op_tags={"aiinfra/compute": "gpu"})
def broken() -> int:
    time.sleep(0.1)
    raise RuntimeError("out of memory")


TOY = [raw_table, fitted, per_region, broken]
GROUPS = asset_groups([dg.Definitions(assets=TOY)])


@pytest.fixture(scope="module")
def history_dir(tmp_path_factory) -> Path:
    """A real instance's storage with four finished runs: two assets, two partitions, one
    failure. Built once; tests read it (``history``) or add runs to a copy (``own_history``)."""
    folder = tmp_path_factory.mktemp("ledger")
    with dg.instance_for_test(temp_dir=str(folder)) as instance:
        dg.materialize([raw_table, fitted], instance=instance)
        for region in ("north", "south"):
            dg.materialize([per_region], instance=instance, partition_key=region)
        failed = dg.materialize([broken], instance=instance, raise_on_error=False)
        assert not failed.success
    return folder


@pytest.fixture(scope="module")
def history(history_dir):
    """The four runs, for tests that only read them."""
    with dg.instance_for_test(temp_dir=str(history_dir)) as instance:
        yield instance


@pytest.fixture
def own_history(history_dir, tmp_path):
    """This test's copy of the four runs: the runs it adds no other test sees (any order)."""
    shutil.copytree(history_dir, tmp_path / "ledger")
    with dg.instance_for_test(temp_dir=str(tmp_path / "ledger")) as instance:
        yield instance


def test_step_seconds_come_from_the_event_log_per_asset_and_partition(history):
    costs = step_costs(history, GROUPS, LedgerSettings.load())
    assert set(costs["asset_key"]) == {"raw_table", "fitted", "per_region", "broken"}
    fitted_row = costs[costs["asset_key"] == "fitted"].iloc[0]
    assert fitted_row["compute"] == "gpu" and fitted_row["group"] == "train"
    assert fitted_row["seconds"] >= 0.3
    raw = costs[costs["asset_key"] == "raw_table"].iloc[0]
    assert raw["compute"] == "cpu" and 0.2 <= raw["seconds"] < fitted_row["seconds"] + 5
    regions_seen = costs[costs["asset_key"] == "per_region"]
    assert sorted(regions_seen["partition"]) == ["north", "south"]
    failed = costs[costs["asset_key"] == "broken"].iloc[0]
    assert (failed["status"], failed["compute"]) == ("failure", "gpu")  # op tag says gpu
    assert failed["seconds"] >= 0.1


def test_the_ledger_sums_cpu_and_gpu_seconds_by_group(history):
    costs = step_costs(history, GROUPS, LedgerSettings.load())
    by_group = ledger_by_group(costs).set_index("group")
    assert set(by_group.index) == {"prep", "train"}
    prep = costs[costs["group"] == "prep"]["seconds"].sum()
    assert by_group.loc["prep", "cpu_seconds"] == pytest.approx(prep)
    assert by_group.loc["prep", "gpu_seconds"] == 0.0
    assert by_group.loc["train", "gpu_seconds"] >= 0.4
    assert by_group.loc["prep", "runs"] == 3
    by_asset = ledger_by_asset(costs)
    assert len(by_asset[by_asset["asset_key"] == "per_region"]) == 2
    assert ledger_by_group(costs.iloc[:0]).empty


def test_the_ledger_asset_publishes_the_table_and_names_loop_groups(own_history, local_lake):
    history = own_history
    resources = {"lake": local_lake}
    finished = len(history.get_runs())
    first = dg.materialize([compute_cost_ledger], instance=history, resources=resources)
    meta = materialized(first, "compute_cost_ledger")
    assert meta["runs"] == finished == 4 and meta["gpu_seconds"] >= 0.4
    groups = {row.data["group"] for row in meta["by_group"].records}
    assert groups == {"unknown"}  # toy assets belong to no layer of the loop
    second = dg.materialize([compute_cost_ledger], instance=history, resources=resources)
    table = pd.read_parquet(io.BytesIO(local_lake.get_object(MAIN_BRANCH, STEPS_KEY)))
    own = table[table["asset_key"] == "compute_cost_ledger"]
    assert len(own) == 1 and own.iloc[0]["run_id"] == first.run_id  # not the running one
    assert own.iloc[0]["group"] == "operations"
    summary = json.loads(local_lake.get_text(MAIN_BRANCH, BY_GROUP_KEY))
    assert summary["runs"] == 5 == materialized(second, "compute_cost_ledger")["runs"]


def test_every_layer_of_the_loop_has_its_groups():
    groups = loop_asset_groups()
    assert groups["scene_index"] == "ingest" and groups["trained_model"] == "training"
    assert groups["rollout"] == "release" and groups["shadow_report"] == "release"
