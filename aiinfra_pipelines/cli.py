"""The ``aiinfra`` command: the demo loop, the simulated fleet, the lake, scene queries, pulls,
trigger proposals, traces, retention plans and status.

Every command works on the environment's resources (``AIINFRA_ENV``, default local), so the
same commands inspect a laptop's LocalLake or a production lakeFS.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from aiinfra_pipelines.cli_errors import BoundaryGroup
from aiinfra_pipelines.config import PROJECT_ROOT
from aiinfra_pipelines.progress import progress_bar

# The root group guards every invocation: bad input ends in one line and exit code 2.
app = typer.Typer(
    help="aiinfra: the perception stack's data loop.", no_args_is_help=True, cls=BoundaryGroup
)
fleet_app = typer.Typer(help="The simulated fleet.", no_args_is_help=True)
lake_app = typer.Typer(help="The versioned data lake.", no_args_is_help=True)
logs_app = typer.Typer(help="Drive logs (MCAP recordings).", no_args_is_help=True)
app.add_typer(fleet_app, name="fleet")
app.add_typer(lake_app, name="lake")
pull_app = typer.Typer(
    help="Raw segments the cars hold only as index records: request and follow pulls.",
    no_args_is_help=True,
)
app.add_typer(logs_app, name="logs")
app.add_typer(pull_app, name="pull")
triggers_app = typer.Typer(
    help="Trigger config proposals: list, approve (recorded on the lake), ship over OTA.",
    no_args_is_help=True,
)
app.add_typer(triggers_app, name="triggers")
console = Console()


def _default_dagster_home() -> None:
    os.environ.setdefault("DAGSTER_HOME", str(PROJECT_ROOT / "dagster_home"))


def _lake():
    _default_dagster_home()
    from aiinfra_pipelines.environment import build_lake, load_environment

    lake = build_lake(load_environment())
    lake.ensure_repository()
    return lake


@fleet_app.command("drive")
def fleet_drive(
    vehicles: int = typer.Option(4, "--vehicles", "-n", min=1, help="vehicles in the fleet"),
    episodes: int = typer.Option(2, "--episodes", "-e", min=1, help="episodes per vehicle"),
    seed: int = typer.Option(0, "--seed", "-s", help="makes the drive reproducible"),
    batch: str = typer.Option("", help="upload batch id (default: time + seed)"),
) -> None:
    """Drive the simulated fleet and land the kept segments on an ingest branch."""
    from aiinfra_pipelines.fleet.drive import drive_and_land
    from aiinfra_pipelines.fleet.landing import ingest_branch_name
    from aiinfra_pipelines.lake.layout import LOG_SUFFIX

    if batch:
        ingest_branch_name(batch)  # a batch id the lake refuses: say so before driving
    result = drive_and_land(
        _lake(),
        vehicles=vehicles,
        episodes=episodes,
        seed=seed,
        batch_id=batch or None,
        console=console,
    )
    logs = sum(key.endswith(LOG_SUFFIX) for key in result.keys)
    console.print(
        f"landed [bold]{logs}[/] log(s) and {len(result.keys) - logs} index record(s) or "
        f"notice(s), {result.total_bytes / 1e6:.1f} MB on [cyan]{result.branch}[/] at commit "
        f"[green]{result.commit[:12]}[/]"
    )


@lake_app.command("branches")
def lake_branches(prefix: str = typer.Option("", help="only branches starting with this")) -> None:
    """List branches and their head commits."""
    table = Table("branch", "head")
    for branch in _lake().list_branches(prefix=prefix):
        table.add_row(branch.name, branch.head[:12])
    console.print(table)


@lake_app.command("log")
def lake_log(ref: str = typer.Argument("main"), limit: int = typer.Option(20, min=1)) -> None:
    """Commits reachable from a ref, newest first, with their metadata."""
    table = Table("commit", "created", "message", "metadata")
    for commit in _lake().log(ref, limit=limit):
        meta = ", ".join(f"{k}={v}" for k, v in sorted(commit.metadata.items()))
        table.add_row(
            commit.id[:12],
            commit.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            escape(commit.message),
            escape(meta),
        )
    console.print(table)


@lake_app.command("ls")
def lake_ls(ref: str = typer.Argument("main"), prefix: str = typer.Argument("")) -> None:
    """Objects at a ref (a branch includes its uncommitted writes)."""
    table = Table("key", "size", "checksum")
    for stat in _lake().list_objects(ref, prefix=prefix):
        table.add_row(escape(stat.key), f"{stat.size:,}", stat.checksum[:12])
    console.print(table)


@lake_app.command("diff")
def lake_diff(left: str, right: str, prefix: str = typer.Option("")) -> None:
    """What changed from LEFT to RIGHT (committed trees)."""
    table = Table("change", "key")
    for entry in _lake().diff(left, right, prefix=prefix):
        table.add_row(entry.type, escape(entry.key))
    console.print(table)


@lake_app.command("upload")
def lake_upload(
    paths: list[Path] = typer.Argument(..., exists=True, dir_okay=False, help="MCAP files"),
    batch: str = typer.Option("", help="upload batch id (default: current time)"),
) -> None:
    """Land MCAP files from disk on a new ingest branch as one commit (a real fleet's upload)."""
    from aiinfra_pipelines.fleet.landing import ingest_branch_name, land_batch

    batch_id = batch or datetime.now(UTC).strftime("upload%Y%m%dT%H%M%S")
    ingest_branch_name(batch_id)  # refused before any file is read
    with progress_bar(console) as progress:
        task = progress.add_task("uploading", total=len(paths))
        result = land_batch(
            _lake(),
            batch_id,
            [(path.stem, path.read_bytes()) for path in paths],
            {"source": "aiinfra lake upload"},
            on_progress=lambda done, _total: progress.update(task, completed=done),
        )
    console.print(f"landed {len(result.keys)} file(s) on {result.branch} at {result.commit[:12]}")


@logs_app.command("inspect")
def logs_inspect(
    path: Path = typer.Argument(..., exists=True, dir_okay=False, help="an MCAP file"),
    source: str = typer.Option(
        None, "--source", help="source profile (resources/sources); default: by channels"
    ),
    as_json: bool = typer.Option(False, "--json", help="one JSON object on stdout"),
) -> None:
    """Check a recording before upload: profile, channels, sensors, frames and the verdict.

    Exits 1 when ingestion would quarantine the file.
    """
    import json

    from aiinfra_pipelines.logs.inspect import inspect_log

    report = inspect_log(path, source)
    if as_json:
        typer.echo(json.dumps(report, sort_keys=True))  # one object on one line
    else:
        verdict = "[green]accepted[/]" if report["accepted"] else "[red]refused[/]"
        console.print(
            f"{escape(str(path))}: {verdict} as [bold]{report['profile'] or 'no profile'}[/], "
            f"{report['frames']} frame(s), {report['duration_s']:.1f} s"
        )
        channels = Table("topic", "encoding", "schema", "messages", "rate Hz")
        for row in report["channels"]:
            rate = "" if row["rate_hz"] is None else f"{row['rate_hz']:.2f}"
            channels.add_row(
                escape(row["topic"]),
                row["encoding"],
                escape(row["schema"]),
                str(row["messages"]),
                rate,
            )
        console.print(channels)
        sensors = Table("role", "topic", "messages", "rate Hz", "details")
        for sensor in report["sensors"]:
            details = {
                k: v
                for k, v in sensor.items()
                if k not in ("role", "topic", "schema", "messages", "rate_hz")
            }
            rate = "" if sensor["rate_hz"] is None else f"{sensor['rate_hz']:.2f}"
            sensors.add_row(
                sensor["role"],
                escape(sensor["topic"]),
                str(sensor["messages"]),
                rate,
                escape(json.dumps(details)),
            )
        console.print(sensors)
        pii = report["pii_findings"]
        anonymizer = report["metadata"].get("anonymizer_version", "none recorded")
        console.print(
            f"PII check: {pii['count']} readable region(s) in {len(pii['frames'])} frame(s); "
            f"anonymized on the vehicle by {escape(anonymizer)}"
        )
        for reason in report["reasons"]:
            console.print(f"  [red]{reason['code']}[/]: {escape(reason['message'])}")
    if not report["accepted"]:
        raise typer.Exit(code=1)


@pull_app.command("request")
def pull_request(
    log_ids: list[str] = typer.Argument(None, help="index-only segments (log ids) to pull"),
    slice_name: str = typer.Option("", "--slice", help="pull index-only segments of this slice"),
    limit: int = typer.Option(
        0, "--limit", min=0, help="at most this many with --slice (0: mining.yaml max_segments)"
    ),
    reason: str = typer.Option(..., "--reason", help="what the raw segments are wanted for"),
    requested_by: str = typer.Option("operator", "--by", help="who asks (recorded)"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object on stdout"),
) -> None:
    """Ask the fleet for raw segments; the cars that hold them send them in their next window."""
    import json

    from aiinfra_pipelines.ingest.pulls import request_raw_segments, requested_log_ids
    from aiinfra_pipelines.ingest.views import raw_available, scene_index_view
    from aiinfra_pipelines.mining.settings import PullSettings

    lake = _lake()
    index = scene_index_view(lake, include_index_only=True)
    wanted = list(log_ids or [])
    if slice_name:
        if index.empty or slice_name not in set(index["slice"]):
            raise typer.BadParameter(
                f"no indexed segment in slice {slice_name!r}", param_hint="--slice"
            )
        held = index[(index["slice"] == slice_name) & ~raw_available(index)]
        asked = requested_log_ids(lake)
        most = limit or PullSettings.load().max_segments
        wanted += [log_id for log_id in dict.fromkeys(held["log_id"]) if log_id not in asked][:most]
    if not wanted:
        raise typer.BadParameter(
            "name log ids or a --slice with index-only segments not yet requested"
        )
    result = request_raw_segments(lake, index, wanted, reason=reason, requested_by=requested_by)
    report = {
        "request_id": result.request_id,
        "requested": result.requested,
        "skipped": result.skipped,
        "main_commit": result.merge_commit,
    }
    if as_json:
        typer.echo(json.dumps(report, sort_keys=True))
        return
    console.print(f"{result.request_id}: requested {len(result.requested)} segment(s)")
    for log_id, why in result.skipped.items():
        console.print(f"  skipped {escape(log_id)}: {escape(why)}")


@pull_app.command("list")
def pull_list(
    status_filter: str = typer.Option("", "--status", help="open, served, closed or expired"),
    as_json: bool = typer.Option(False, "--json", help="a JSON list on stdout"),
) -> None:
    """Every pull request and its answer (served by which batch, or closed and why)."""
    import json

    from aiinfra_pipelines.ingest.pulls import CLOSED, EXPIRED, OPEN, SERVED, pull_requests

    statuses = (OPEN, SERVED, CLOSED, EXPIRED)
    if status_filter and status_filter not in statuses:
        raise typer.BadParameter(
            f"{status_filter!r} is not one of {', '.join(statuses)}", param_hint="'--status'"
        )
    requests = [
        r for r in pull_requests(_lake()) if not status_filter or r["status"] == status_filter
    ]
    if as_json:
        typer.echo(json.dumps(requests, sort_keys=True))
        return
    table = Table("log", "status", "slice", "requested", "answer")
    for request in requests:
        answer = request.get("closed_reason") or (request.get("served_by") or {}).get("partition")
        table.add_row(
            escape(request["log_id"]),
            request["status"],
            request.get("slice", ""),
            request["requested_at"],
            escape(str(answer or "")),
        )
    console.print(table)


@triggers_app.command("list")
def triggers_list() -> None:
    """Every proposed trigger config version, its rules and who approved it."""
    from aiinfra_pipelines.lake.layout import MAIN_BRANCH, trigger_approval_key
    from aiinfra_pipelines.release.trigger_ota import (
        latest_proposal_version,
        proposed_versions,
        read_proposal,
    )

    lake = _lake()
    latest = latest_proposal_version(lake)
    table = Table("version", "base", "rules (slice: expected frames/h)", "state", "approved by")
    for version in proposed_versions(lake):
        proposal = read_proposal(lake, version) or {}
        approval = lake.get_json_or_none(MAIN_BRANCH, trigger_approval_key(version))
        rules = ", ".join(
            f"{rule['slice']}: {rule['expected_yield']['expected_frames_per_hour']}"
            for rule in proposal.get("rules", [])
        )
        state = "approved" if approval else ("latest" if version == latest else "superseded")
        who = f"{approval['approved_by']} at {approval['approved_at']}" if approval else ""
        table.add_row(version, proposal.get("base_version", ""), escape(rules), state, escape(who))
    console.print(table)


@triggers_app.command("approve")
def triggers_approve(
    version: str = typer.Argument(..., help="the proposed trigger config version"),
    approved_by: str = typer.Option(..., "--by", help="who approves (recorded on the lake)"),
) -> None:
    """Record an approval of the latest proposal; unknown or superseded versions are refused."""
    from aiinfra_pipelines.release.trigger_ota import approve_trigger_proposal

    run_id = "cli-triggers-approve-" + datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
    # An unknown or superseded version is refused by TriggerApprovalError: one line, exit 2.
    approval = approve_trigger_proposal(_lake(), version, approved_by, root_run_id=run_id)
    console.print(
        f"trigger config {escape(version)} approved by {escape(approval['approved_by'])} at "
        f"{approval['approved_at']}; ship it with `aiinfra triggers ship`"
    )


@triggers_app.command("ship")
def triggers_ship() -> None:
    """Sign the newest approved trigger config into the OTA repository beside the engines."""
    _default_dagster_home()
    from aiinfra_pipelines.environment import build_resources
    from aiinfra_pipelines.release.trigger_ota import ship_trigger_config

    resources = build_resources()
    lake = resources["lake"]
    lake.ensure_repository()
    run_id = "cli-triggers-ship-" + datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
    publication = ship_trigger_config(lake, resources["release_keys"], root_run_id=run_id)
    if publication is None:
        typer.echo("nothing approved: no trigger config shipped", err=True)
        raise typer.Exit(code=1)
    for path, custom in sorted(publication.trigger_targets.items()):
        console.print(f"{path}: {custom['trigger_config_version']}")
    console.print(f"OTA metadata versions {publication.versions}")


@app.command("status")
def status() -> None:
    """What the lake holds: ingest branches, published frames by slice, quarantine."""
    from aiinfra_pipelines.status import render_status

    render_status(_lake(), console)


@app.command("trace")
def trace(
    query: str = typer.Argument(
        ..., help="an engine sha256 (or a prefix of 8+ hex), a model version or a VIN"
    ),
    public_key: list[str] = typer.Option(
        [], "--public-key", help="trusted certificate public key (hex); repeatable"
    ),
) -> None:
    """Which model runs there, the dataset commit that trained it, the raw log commits that
    fed the dataset, and the reports that certified it."""
    from aiinfra_pipelines.release.keys import trusted_certificate_keys
    from aiinfra_pipelines.release.trace import render_trace
    from aiinfra_pipelines.release.trace import trace as trace_query

    # Nothing found is TraceNotFound (a LookupError): one line, exit 2.
    result = trace_query(_lake(), query, trusted_certificate_keys(public_key))
    render_trace(result, console)


@app.command("retention")
def retention(
    as_json: bool = typer.Option(False, "--json", help="the plan as JSON, for scripts"),
) -> None:
    """What retention would delete now and what it keeps, with the lineage that keeps it (a dry
    run: nothing is deleted or recorded)."""
    import json

    from aiinfra_pipelines.operations.retention import plan_retention, render_plan

    plan = plan_retention(_lake(), datetime.now(UTC))
    if as_json:
        typer.echo(json.dumps(plan.to_record(), sort_keys=True))
    else:
        render_plan(plan, console)


@app.command("query")
def query(
    expression: str = typer.Argument(
        ..., help='e.g. "weather=fog AND road_type=merge AND event:low_ttc AND speed_mps>20"'
    ),
    ref: str = typer.Option("main", "--ref", help="lake branch, tag or commit to query"),
    limit: int = typer.Option(0, "--limit", min=0, help="at most this many rows (0: all)"),
    include_index_only: bool = typer.Option(
        False, "--include-index-only", help="also segments whose raw log is still on the car"
    ),
    as_json: bool = typer.Option(False, "--json", help="one JSON object on stdout"),
) -> None:
    """Scene-index frames matching a query (fields: the index's columns; event:NAME; AND, OR,
    NOT, parentheses). Exits 2 for a query that cannot run."""
    from aiinfra_pipelines.curation.query import QueryError, query_scene_index
    from aiinfra_pipelines.curation.query_view import render_query_result, result_json
    from aiinfra_pipelines.lake.errors import NotFoundError

    lake = _lake()
    try:
        result = query_scene_index(
            lake, expression, ref, limit=limit or None, include_index_only=include_index_only
        )
    except QueryError as error:
        typer.echo(f"query error: {error.message}", err=True)
        raise typer.Exit(code=2) from None
    except NotFoundError:
        raise typer.BadParameter(f"no lake ref {ref!r}", param_hint="--ref") from None
    if as_json:
        typer.echo(result_json(result, ref))
        return
    render_query_result(result, ref, console)


@app.command("similar")
def similar(
    frame: str = typer.Argument(..., help="the frame to match: <log_id>:<frame_index>"),
    k: int = typer.Option(
        None, "-k", "--k", help="neighbours, itself included (default: similarity.yaml)"
    ),
    ref: str = typer.Option("main", "--ref", help="lake branch, tag or commit of the index"),
    as_json: bool = typer.Option(False, "--json", help="a JSON list of neighbours on stdout"),
) -> None:
    """Frames most like FRAME by the deployed engine's embeddings (cosine distance), with each
    one's slice and events and the lake commit the index was built from. Exits 2 for a query
    that cannot run."""
    from aiinfra_pipelines.curation.similarity import UnknownFrameError
    from aiinfra_pipelines.curation.similarity_query import FrameSyntaxError, similar_frames
    from aiinfra_pipelines.curation.similarity_settings import SimilaritySettings
    from aiinfra_pipelines.curation.similarity_store import NoSimilarityIndexError
    from aiinfra_pipelines.curation.similarity_view import render_similar, similar_json
    from aiinfra_pipelines.lake.errors import NotFoundError

    settings = SimilaritySettings.load()
    k = settings.default_k if k is None else k
    if not 1 <= k <= settings.max_k:
        typer.echo(f"similar error: -k must be in [1, {settings.max_k}], got {k}", err=True)
        raise typer.Exit(code=2)
    try:
        result = similar_frames(_lake(), frame, k, ref)
    except (FrameSyntaxError, UnknownFrameError, NoSimilarityIndexError) as error:
        typer.echo(f"similar error: {error}", err=True)
        raise typer.Exit(code=2) from None
    except NotFoundError:
        raise typer.BadParameter(f"no lake ref {ref!r}", param_hint="--ref") from None
    if as_json:
        typer.echo(similar_json(result))
        return
    render_similar(result, ref, console)


@app.command("demo")
def demo(
    vehicles: int = typer.Option(None, min=1, help="cars (default: resources/demo.yaml)"),
    episodes: int = typer.Option(None, min=1, help="drives per car and cycle"),
    seed: int = typer.Option(None),
    faulty_logs: int = typer.Option(None, min=0, help="corrupt logs landed to show quarantine"),
    cycles: int = typer.Option(None, min=1, help="turns of the loop"),
    timeout_s: int = typer.Option(None, help="give up waiting for the daemon after this long"),
) -> None:
    """The main job: drive, land, and let the Dagster daemon's sensors run the whole loop."""
    _default_dagster_home()
    from aiinfra_pipelines.demo import run_demo

    run_demo(
        vehicles=vehicles,
        episodes=episodes,
        seed=seed,
        faulty_logs=faulty_logs,
        cycles=cycles,
        timeout_s=timeout_s,
        console=console,
    )


if __name__ == "__main__":
    app()
