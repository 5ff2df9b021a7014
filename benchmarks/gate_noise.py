"""How often the closed-loop regression gate refuses an equal candidate, and catches a worse one.

Simulated libraries (``aiinfra_pipelines_tests.support.noisy_library``): 60 scenarios whose
episodes fail by chance — most scenarios easy, a quarter borderline, a fifth hard, as the demo's
reports show. Production and candidate each roll their own seeds, as two different engines do;
the shard's procedure follows (3 seeds, a failing verdict confirmed on 6 more for both) and the
gate of ``resources/gates.yaml`` judges the pooled episodes. Printed per significance setting:

* ``aa_certified`` — an A/A run on independent seeds (the candidate is exactly as good): the
  share of trials certified; every refusal is a false one;
* ``refused_<n>x<fail>`` — the candidate breaks ``n`` easy scenarios (they now fail ``fail`` of
  their episodes, by at-fault collisions): the share of trials refused.

Prints figures, asserts nothing (the tests in ``simulation/test_gate.py`` hold the properties).

    .venv/bin/python benchmarks/gate_noise.py [--trials 200] [--json]
"""

from __future__ import annotations

import argparse
import json

from aiinfra_pipelines.simulation.gate_verdicts import gate_section
from aiinfra_pipelines_tests.support.noisy_library import certify_rate

REGRESSIONS = ((1, 0.9), (1, 0.7), (3, 0.6), (10, 0.3))


def measure(trials: int) -> dict[str, dict[str, float]]:
    configured = dict(gate_section())
    settings = {
        "thresholds only": None,
        "configured": configured.get("regression_significance"),
    }
    figures = {}
    for name, levels in settings.items():
        gates = {**configured, "regression_significance": levels}
        row = {"aa_certified": certify_rate(1, trials, gates)}
        for index, (scenarios, fail) in enumerate(REGRESSIONS):
            certified = certify_rate(10 + index, trials, gates, regression=(scenarios, fail))
            row[f"refused_{scenarios}x{fail}"] = round(1.0 - certified, 4)
        figures[f"{name} {levels or ''}".strip()] = row
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures = measure(args.trials)
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    for name, row in figures.items():
        print(name)
        for key, value in row.items():
            print(f"  {key:>18}: {value:.3f}")


if __name__ == "__main__":
    main()
