"""Operations: fleet telemetry, drift monitoring, the compute-cost ledger and loop failures.

The last layer before the sensors: it watches what the released engines do on the fleet and
what the loop itself costs and breaks, and feeds that back (telemetry → rollout decisions,
drift → retraining).
"""
