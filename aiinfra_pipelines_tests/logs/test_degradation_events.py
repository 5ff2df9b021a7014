"""Degradation transitions in MCAP drive logs: written, read back, kept by anonymization, and
logs from before the state machine (no such channel) still decode and validate."""

from __future__ import annotations

import dataclasses

from aiinfra_pipelines.logs.anonymize import anonymize_log
from aiinfra_pipelines.logs.model import TOPIC_DEGRADATION, DegradationEvent
from aiinfra_pipelines.logs.reader import read_drive_log, summarize_channels
from aiinfra_pipelines.logs.schemas import TOPIC_SCHEMAS
from aiinfra_pipelines.logs.synthetic import make_synthetic_log
from aiinfra_pipelines.logs.validation import validate_drive_log
from aiinfra_pipelines.logs.writer import encode_drive_log


def with_transitions():
    log = make_synthetic_log(n_frames=12, seed=3)
    times = [frame.timestamp_ns for frame in log.frames]
    transitions = [
        DegradationEvent(times[2], "nominal", "degraded", "engine_error", "RuntimeError: boom"),
        DegradationEvent(times[9], "degraded", "nominal", "recovered", "5 clean frames"),
    ]
    return dataclasses.replace(log, degradation=transitions)


def test_transitions_round_trip_on_their_own_topic_and_pass_validation():
    log = with_transitions()
    data = encode_drive_log(log)
    assert summarize_channels(data)[TOPIC_DEGRADATION] == 2
    assert TOPIC_SCHEMAS[TOPIC_DEGRADATION] == "aiinfra.DegradationTransition"
    back = read_drive_log(data)
    assert back.degradation == log.degradation
    assert [(e.rule, e.timestamp_ns) for e in back.events] == [
        (e.rule, e.timestamp_ns) for e in log.events
    ]
    report = validate_drive_log(data)
    assert report.accepted, report


def test_anonymization_keeps_the_transitions():
    log = with_transitions()
    anonymous = anonymize_log(log, b"k" * 32)
    assert anonymous.degradation == log.degradation


def test_a_log_without_the_channel_decodes_with_no_transitions():
    log = make_synthetic_log(n_frames=8, seed=4)
    data = encode_drive_log(log)
    assert TOPIC_DEGRADATION not in summarize_channels(data)
    assert read_drive_log(data).degradation == []
    # ...and so does one whose writer left the channel out although the car had transitions.
    omitted = encode_drive_log(with_transitions(), omit_topics=[TOPIC_DEGRADATION])
    assert read_drive_log(omitted).degradation == []
