"""The regression gate's two error rates, measured through its own code.

Simulated outcome tables (``aiinfra_pipelines.simulation.calibration``: 60-scenario libraries
spread like the demo's reports, engines correlated on shared seeds) go through exactly what a
regression report does — content-derived seeds, the staged evidence plan, the paired tests,
the fix records of an earlier cycle and the first-release rule — under the effective
``gates.yaml``. Printed per figure (share of trials, and its Monte Carlo standard error):

* ``aa_certified`` — a candidate exactly as good as its reference (its own perception noise):
  certified; every refusal is a false one (target in gates.yaml ``false_refusal``);
* ``scenario_regression_refused`` / ``subtle_scenario_regression_refused`` — one easy scenario
  from 3 % to 50 % / 25 % at-fault collisions;
* ``library_regression_refused`` / ``small_library_regression_refused`` — +0.05 / +0.02
  at-fault rate spread over every scenario;
* ``fixed_scenario_regression_refused`` — a scenario an earlier version fixed (recorded by the
  gate's own record rule), failing again half the time;
* ``first_release_bad_refused`` — a first candidate adding 0.05 at-fault rate over the oracle;
  ``first_release_aa_certified`` — a first candidate as good as the oracle;
* ``mean_episodes`` / ``mean_candidate_episodes`` — episodes a report drove (every engine,
  nothing cached / the candidate alone), and ``trials``;
* ``offline_aa_certified`` / ``offline_slice_regression_refused`` — the offline gate
  (``evaluation.calibration``: benchmarks shaped like the demo's, per-frame scores through
  ``compare_with_production``): a candidate as good as production certified, one 50-frame
  slice losing 0.05 accuracy refused (``offline_trials`` each).

``--rho`` sets the correlation of same-line engines on a shared seed (the demo's reports:
0.5); ``sensitivity`` reruns the figures at 0.3. Prints figures, asserts nothing
(``simulation/test_gate_calibration.py`` holds the targets).

    .venv/bin/python benchmarks/gate_calibration.py [--trials 500] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from aiinfra_pipelines.config import load_resource_yaml
from aiinfra_pipelines.evaluation.calibration import calibrate_offline, offline_targets
from aiinfra_pipelines.gate_rules import gate_rules
from aiinfra_pipelines.simulation.calibration import CalibrationModel, calibrate, stated_targets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rho", type=float, default=CalibrationModel().rho)
    parser.add_argument("--sensitivity-trials", type=int, default=200)
    parser.add_argument("--offline-trials", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    gates = load_resource_yaml("gates.yaml")
    started = time.monotonic()

    def progress(done: int) -> None:
        if done % 50 == 0:
            print(f"  {done}/{args.trials} trials", file=sys.stderr, flush=True)

    figures = calibrate(
        args.trials,
        gates,
        model=CalibrationModel(rho=args.rho),
        seed=args.seed,
        on_trial=progress,
    )
    sensitivity = (
        calibrate(
            args.sensitivity_trials, gates, model=CalibrationModel(rho=0.3), seed=args.seed + 1
        )
        if args.sensitivity_trials
        else None
    )
    offline = calibrate_offline(args.offline_trials, gates, seed=args.seed)
    wanted = {**stated_targets(gates), **offline_targets(gates)}
    figures = {**figures, **offline}
    result = {
        **figures,
        "targets": wanted,
        "below_target": sorted(k for k, v in wanted.items() if figures.get(k, 0.0) < v),
        "gates_sha256": gate_rules(gates).sha256,
        "seconds": round(time.monotonic() - started, 1),
    }
    if sensitivity is not None:
        result["sensitivity"] = {
            "rho": 0.3,
            **{k: sensitivity[k] for k in stated_targets(gates)},
            "trials": sensitivity["trials"],
        }
    if args.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(f"{key:>40}: {value}")


if __name__ == "__main__":
    main()
