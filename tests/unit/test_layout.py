"""The package's shape (issue 41): a few modules at the top, the wings each saying what they
hold, and a client that brings none of the server along."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "msgtable"
TOP_MODULES_AT_MOST = 6
ROW = re.compile(r"^    (\S+?/?)\s{2,}\S")


def packages() -> list[Path]:
    return sorted(
        p.parent
        for p in PACKAGE.rglob("__init__.py")
        if p.parent != PACKAGE and "proto" not in p.relative_to(PACKAGE).parts
    )


def listed(package: Path) -> list[str]:
    """The names the package's docstring lists under Modules:, in order."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    assert "\nModules:\n" in doc, f"{package}: its docstring has no Modules: list"
    block = doc.split("\nModules:\n", 1)[1]
    return [m.group(1) for line in block.splitlines() if (m := ROW.match(line))]


def present(package: Path) -> list[str]:
    modules = [p.stem for p in package.glob("*.py") if p.stem != "__init__"]
    subpackages = [d.name + "/" for d in package.iterdir() if (d / "__init__.py").is_file()]
    return sorted(modules + subpackages, key=lambda n: n.rstrip("/"))


def test_at_most_six_modules_stay_at_the_top_of_the_package():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= TOP_MODULES_AT_MOST, top


@pytest.mark.parametrize("package", packages(), ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_each_package_names_its_modules_in_its_docstring(package: Path):
    assert listed(package) == present(package)


def test_importing_the_clients_brings_no_database_driver_and_no_server_module():
    code = (
        "import sys, msgtable.client, msgtable.aio\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'sqlalchemy', 'pymysql', 'pymysqlreplication', 'MySQLdb'} or m.startswith("
        "('msgtable.store', 'msgtable.engine', 'msgtable.server', 'msgtable.features')))\n"
        "print(bad)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


MODULE_LINES_AT_MOST = 1000
LONG_MODULE_LINES = 700
LONG_MODULES_AT_MOST = 4
FUNCTION_LINES_AT_MOST = 80


def sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "proto" not in p.relative_to(PACKAGE).parts)


def test_modules_and_functions_are_sizes_that_read() -> None:
    """No module over 1,000 lines and at most four over 700; no function over 80 lines."""
    lines = {p.relative_to(PACKAGE): len(p.read_text().splitlines()) for p in sources()}
    assert {str(p): n for p, n in lines.items() if n > MODULE_LINES_AT_MOST} == {}
    long = sorted(str(p) for p, n in lines.items() if n > LONG_MODULE_LINES)
    assert len(long) <= LONG_MODULES_AT_MOST, f"over {LONG_MODULE_LINES} lines: {long}"
    functions = [
        f"{p.relative_to(PACKAGE)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for p in sources()
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (node.end_lineno or node.lineno) - node.lineno + 1 > FUNCTION_LINES_AT_MOST
    ]
    assert functions == []
