"""Every ``aiinfra`` command, given malformed arguments, ends in one line and exit code 2.

Measured before the boundary existed: ``aiinfra query`` with 300 nested parentheses
(RecursionError), a 50-digit integer (duckdb's exception) or 5,000 AND terms (4 GB of memory);
``aiinfra similar log:`` with 5,000 digits; invalid UTF-8 arguments; ``aiinfra lake upload``
with a key the lake refuses — each ended in a traceback. The console script is exercised once
as a process (invalid UTF-8 only reaches a real argv); the rest run in-process through the
same boundary (``cli_errors.run``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from aiinfra_pipelines.cli import app
from aiinfra_pipelines.cli_errors import BAD_INPUT_EXIT, run

DEEP = "(" * 300 + "weather=fog" + ")" * 300
WIDE = " AND ".join(["weather=fog"] * 5000)


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.delenv("AIINFRA_ENV", raising=False)
    return home


def malformed(tmp_path: Path) -> list[list[str]]:
    garbage = tmp_path / "garbage.mcap"
    garbage.write_bytes(b"not an mcap file at all")
    bad_name = tmp_path / "bad name?.mcap"
    bad_name.write_bytes(b"\x89MCAP0\r\n")
    return [
        ["nosuch"],
        ["fleet", "drive", "--vehicles", "-1"],
        ["fleet", "drive", "--episodes", "many"],
        ["fleet", "drive", "--batch", "../../escape"],
        ["lake", "branches", "--prefix"],
        ["lake", "log", "no/such/branch"],
        ["lake", "log", "main", "--limit", "0"],
        ["lake", "ls", "main", "../x"],
        ["lake", "ls", "no-such-branch"],
        ["lake", "diff", "main", "nope"],
        ["lake", "upload", str(tmp_path / "missing.mcap")],
        ["lake", "upload", str(bad_name), "--batch", "a/b"],
        ["logs", "inspect", str(tmp_path / "missing.mcap")],
        ["logs", "inspect", str(garbage), "--source", "no-such-profile"],
        ["pull", "request", "--reason"],
        ["pull", "request", "--slice", "a/b/c", "--limit", "-3", "--reason", "x"],
        ["pull", "list", "--status", "bogus"],
        ["triggers", "approve", "triggers-999", "--by", "me"],
        ["triggers", "approve"],
        ["status", "--bogus"],
        ["trace", ""],
        ["trace", "no-such-model"],
        ["retention", "--json", "--bogus"],
        ["query", DEEP],
        ["query", WIDE],
        ["query", "speed_mps > " + "9" * 50],
        ["query", "weather = 'fog' AND"],
        ["query", "x" * 5000],
        ["similar", "log:" + "1" * 5000],
        ["similar", "no-colon"],
        ["similar", "log:1", "-k", "0"],
        ["demo", "--vehicles", "0"],
        ["demo", "--cycles", "zero"],
    ]


def test_every_command_refuses_malformed_arguments_in_one_line_with_exit_2(home, tmp_path, capsys):
    for arguments in malformed(tmp_path):
        code = run(app, arguments)
        out, err = capsys.readouterr()
        where = f"aiinfra {' '.join(a[:40] for a in arguments)}"
        assert code == BAD_INPUT_EXIT, (where, code, out[-500:], err[-500:])
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1, (where, err)
        assert not out.strip(), (where, out)
        assert "Traceback" not in err + out, where
        assert " at 0x" not in err, (where, err)  # no object reprs
        assert len(lines[0]) <= 420, where


def test_the_console_script_refuses_invalid_utf8_in_one_line(home):
    script = Path(sys.executable).with_name("aiinfra")
    command = [os.fsencode(script), b"query", b"weather=\xff\xfe"]
    result = subprocess.run(command, capture_output=True, timeout=120, env=os.environ)
    assert result.returncode == BAD_INPUT_EXIT, result.stderr[-500:]
    assert result.stderr.decode().strip() == ("aiinfra: error: argument 2 is not valid UTF-8 text")
    assert b"Traceback" not in result.stdout + result.stderr
