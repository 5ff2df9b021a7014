"""Scenario-sliced offline evaluation and the comparison of a candidate against production.

Pure logic: ``slices.evaluate_by_slice`` turns predictions into a metrics table per slice,
``compare.compare_with_production`` applies the offline budgets from ``resources/gates.yaml``,
``plots.slice_metric_plot`` draws the comparison for MLflow. The assets and the asset check
that gate a candidate live in ``assets.py``/``checks.py`` and only call these.
"""
