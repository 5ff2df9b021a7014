"""Scenario library and closed-loop regression simulation.

``scenarios`` parses and validates scenario families, ``from_fleet`` turns mined badcases and
fleet failures into regression scenarios, ``library`` versions them (never dropping one) and
shards them, ``runner`` simulates scenarios with engines in spawned worker processes (the loop
itself is ``fleet.closed_loop``), ``gate`` decides pass/fail, ``regression`` aggregates shards
into the report; ``assets`` wires it into Dagster. Everything except ``assets`` is plain
Python that tests call without Dagster.
"""
