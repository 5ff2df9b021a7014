"""Size figures of the code base: functions over a line limit and modules over a line limit.

    python benchmarks/code_health.py [--json] [--function-lines 60] [--module-lines 400] [ROOT]

Counts every ``def`` (methods and nested functions included) from its ``def`` line to its last
line, decorators and docstring included, as the code-health issue measured them. The figures are
for reading trends, not a gate: ruff's C901 and PLR0915 (pyproject.toml) are the gate.
"""

from __future__ import annotations

import argparse
import ast
import json
from dataclasses import dataclass
from pathlib import Path

DEFAULT_ROOT = Path(__file__).resolve().parents[1] / "aiinfra_pipelines"


@dataclass(frozen=True)
class Sized:
    where: str
    lines: int


def measure(root: Path) -> tuple[int, list[Sized], list[Sized]]:
    """(function count, every function with its length, every module with its length)."""
    functions: list[Sized] = []
    modules: list[Sized] = []
    for path in sorted(root.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        relative = path.relative_to(root.parent).as_posix()
        modules.append(Sized(relative, len(source.splitlines())))
        for node in ast.walk(ast.parse(source, filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                functions.append(Sized(f"{relative}:{node.name}", length))
    return len(functions), functions, modules


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", type=Path, default=DEFAULT_ROOT)
    parser.add_argument("--function-lines", type=int, default=60)
    parser.add_argument("--module-lines", type=int, default=400)
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args()
    count, functions, modules = measure(args.root)
    long_functions = sorted(
        (f for f in functions if f.lines > args.function_lines), key=lambda f: -f.lines
    )
    long_modules = sorted(
        (m for m in modules if m.lines > args.module_lines), key=lambda m: -m.lines
    )
    result = {
        "functions": count,
        "functions_over_limit": len(long_functions),
        "function_line_limit": args.function_lines,
        "modules": len(modules),
        "modules_over_limit": len(long_modules),
        "module_line_limit": args.module_lines,
        "long_functions": {f.where: f.lines for f in long_functions},
        "long_modules": {m.where: m.lines for m in long_modules},
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"{count} functions, {len(long_functions)} over {args.function_lines} lines; "
        f"{len(modules)} modules, {len(long_modules)} over {args.module_lines} lines"
    )
    for item in long_functions:
        print(f"  {item.lines:4d}  {item.where}")
    for item in long_modules:
        print(f"  {item.lines:4d}  {item.where}")


if __name__ == "__main__":
    main()
