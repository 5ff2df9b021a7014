"""A demo starts from nothing: the state of an earlier run is set aside, one run kept."""

from __future__ import annotations

from aiinfra_pipelines.demo.state import set_aside_previous_run


def test_an_earlier_runs_state_moves_aside_and_the_instance_configuration_stays(tmp_path):
    home = tmp_path / "dagster_home"
    (home / "lake" / "objects").mkdir(parents=True)
    (home / "lake" / "objects" / "a").write_text("first run")
    (home / "dagster.yaml").write_text("storage: {}")
    (home / "README.md").write_text("runtime state lives here")
    moved = set_aside_previous_run(home)
    assert moved == home / "previous"
    assert sorted(p.name for p in home.iterdir()) == ["README.md", "dagster.yaml", "previous"]
    assert (moved / "lake" / "objects" / "a").read_text() == "first run"
    assert set_aside_previous_run(home) is None  # nothing new to move
    # The next run's state replaces the one kept: one run back, the disk does not fill.
    (home / "lake").mkdir()
    (home / "lake" / "b").write_text("second run")
    set_aside_previous_run(home)
    assert [p.name for p in (home / "previous").iterdir()] == ["lake"]
    assert (home / "previous" / "lake" / "b").read_text() == "second run"
    assert set_aside_previous_run(tmp_path / "missing") is None
