"""The staged rollout's two error rates, measured through its own decision code.

Simulated telemetry streams (``aiinfra_pipelines.release.rollout_calibration``: a fleet of
gates.yaml ``release.rollout.calibration`` cars, each sending a record per publish, the control
cohort at the stated event rates) go through ``evaluate_stage`` publish by publish, exactly as
the rollout asset calls it, widening stage by stage until the approval stage. Printed per
figure with its Monte Carlo standard error:

* ``equal_rolled_back`` — an engine equal to production rolled back at any stage (false);
* ``harm_2x_rolled_back`` — an engine with twice the control's at-fault rate rolled back before
  full rollout (detection);
* ``equal_advanced`` — an equal engine reaching the approval stage within its stages' exposure
  caps;
* ``median_frames_to_rollback_2x`` / ``median_frames_to_advance_equal`` — candidate frames,
  over every stage, until that decision; and ``trials`` per kind.

Prints figures, asserts nothing (``release/test_rollout_calibration.py`` holds the targets).

    .venv/bin/python benchmarks/canary_calibration.py [--trials 300] [--seed 0] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import time

from aiinfra_pipelines.config import load_resource_yaml
from aiinfra_pipelines.release.rollout_calibration import calibrate_rollout, stated_targets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    gates = load_resource_yaml("gates.yaml")
    started = time.monotonic()
    figures = calibrate_rollout(args.trials, gates, seed=args.seed)
    targets = stated_targets(gates)
    figures["targets"] = {name: f"{op} {value}" for name, (op, value) in targets.items()}
    figures["missed_targets"] = [
        name
        for name, (op, value) in targets.items()
        if (figures[name] > value if op == "<=" else figures[name] < value)
    ]
    figures["seconds"] = round(time.monotonic() - started, 1)
    for name in ("equal_rolled_back", "harm_2x_rolled_back", "equal_advanced"):
        share = figures[name]
        error = math.sqrt(share * (1 - share) / args.trials)
        target = figures["targets"].get(name, "")
        print(f"{name:<28} {share:.3f} ± {error:.3f}   target {target}")
    for name in ("median_frames_to_rollback_2x", "median_frames_to_advance_equal"):
        print(f"{name:<28} {figures[name]}")
    print(f"exposure caps (candidate frames): {figures['stage_exposure_cap_frames']}")
    if args.json:
        print(json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    main()
