"""The ``aiinfra`` command's boundary: bad input ends in one line and exit code 2.

An operator who mistypes an argument, points at a file that is not there or asks for a
branch the lake refuses gets one line that says what is wrong — never a traceback, never a
three-line usage block. What counts as bad input is the errors the project raises for it
(values it refuses, things it cannot find, lake and OTA refusals) plus argument text that is
not valid UTF-8; anything else is a defect and keeps its traceback (exit 1).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import typer
from typer.core import TyperGroup

BAD_INPUT_EXIT = 2
MAX_MESSAGE = 400


def input_errors() -> tuple[type[BaseException], ...]:
    """The errors bad input raises: values refused (every ValueError the project defines is
    one), things not found, lake / OTA / certificate / approval refusals, files that cannot be
    read, and recursion or memory exhausted by input the parsers did not bound. Imported only
    when something went wrong, so the command starts as fast as its own imports allow."""
    from aiinfra_pipelines.lake.errors import LakeError
    from aiinfra_pipelines.release.certificate import CertificateError
    from aiinfra_pipelines.release.ota import OtaError
    from aiinfra_pipelines.release.trigger_ota import TriggerApprovalError

    return (
        ValueError,
        LookupError,
        LakeError,
        OtaError,
        CertificateError,
        TriggerApprovalError,
        OSError,
        RecursionError,
        MemoryError,
    )


def one_line(message: str) -> str:
    """``message`` as one printable line: object reprs dropped, whitespace folded, bounded."""
    from aiinfra_pipelines.logs.errors import plain  # only when something went wrong

    text = plain(str(message), placeholder="<object>")
    text = " ".join(text.split())
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"


def undecodable(arguments: Sequence[str]) -> int | None:
    """The position of the first argument that is not valid UTF-8 (Python hands such bytes
    over as surrogate escapes), or ``None``."""
    for position, argument in enumerate(arguments):
        try:
            argument.encode("utf-8")
        except UnicodeEncodeError:
            return position
    return None


class BoundaryGroup(TyperGroup):
    """The root command group: every invocation — the console script, ``CliRunner`` in the
    tests — passes through :func:`guarded` (pass it as ``typer.Typer(cls=...)``)."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        arguments = list(sys.argv[1:] if args is None else args)

        def invoke() -> Any:
            return super(BoundaryGroup, self).main(
                arguments,
                prog_name,
                complete_var,
                standalone_mode=False,
                windows_expand_args=windows_expand_args,
                **extra,
            )

        code = guarded(invoke, arguments, prog_name or "aiinfra")
        if standalone_mode:
            sys.exit(code)
        return code


def guarded(invoke: Callable[[], Any], arguments: Sequence[str], prog_name: str) -> int:
    """Run ``invoke`` (a non-standalone click main); its exit code, bad input reported as one
    line on stderr and exit code 2."""
    position = undecodable(arguments)
    if position is not None:
        return _refuse(prog_name, f"argument {position + 1} is not valid UTF-8 text")
    try:
        result = invoke()
    except typer.Exit as done:
        return int(done.exit_code)
    except typer.Abort:
        return _refuse(prog_name, "aborted")
    except typer.TyperException as error:  # usage: unknown command, option, bad value
        if type(error).__name__ == "NoArgsIsHelpError":  # a bare group: show its help
            sys.stdout.write(error.ctx.get_help() + "\n")
            return BAD_INPUT_EXIT
        return _refuse(prog_name, error.format_message())
    except input_errors() as error:
        # A builtin error's name says what kind of input failed; the project's own errors say
        # it in their message.
        named = type(error).__module__ == "builtins"
        return _refuse(prog_name, f"{type(error).__name__}: {error}" if named else str(error))
    return result if isinstance(result, int) else 0


def run(app: typer.Typer, arguments: Sequence[str], prog_name: str = "aiinfra") -> int:
    """Run ``app`` on ``arguments`` in-process; the exit code (what the console script exits
    with)."""
    return int(typer.main.get_command(app).main(list(arguments), prog_name, standalone_mode=False))


def _refuse(prog_name: str, message: str) -> int:
    sys.stderr.write(f"{prog_name}: error: {one_line(message)}\n")
    sys.stderr.flush()
    return BAD_INPUT_EXIT
