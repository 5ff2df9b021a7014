"""Exact and score statistics the project's gates decide with (pure functions, no Dagster).

Every gate that judges noisy evidence — closed-loop episodes, benchmark frames, fleet
telemetry — asks one of a few standard questions; the answers live here once, tested against
known values, so a gate's rule reads as its decision and not as arithmetic
(``../shared/STATISTICS.md`` lists which test fits which shape of evidence).
"""
