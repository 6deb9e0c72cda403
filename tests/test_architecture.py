"""The one rule of the architecture: ``algorithms`` knows no transport; ``realcomm``
measures and ``simcomm`` models, and neither imports the other (what crosses between them
is a file). Every import counts, at the top of a module or inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {
    "algorithms": {"simcomm", "realcomm", "simpy", "torch"},
    "simcomm": {"realcomm", "torch"},
    "realcomm": {"simcomm", "simpy"},
}


def imported_packages(path: Path) -> set[str]:
    """The top-level packages that a module imports, wherever in it."""
    packages = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            packages |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            packages.add(node.module.split(".")[0])
    return packages


def crossings(package: str) -> dict[str, list[str]]:
    """Each module of ``package`` that imports a forbidden package, with what it imports."""
    found = {str(path.relative_to(ROOT)): sorted(imported_packages(path) & FORBIDDEN[package])
             for path in sorted((ROOT / package).rglob("*.py"))}
    return {name: packages for name, packages in found.items() if packages}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_packages_do_not_import_across_the_line(package: str) -> None:
    assert crossings(package) == {}


def test_the_check_sees_imports_inside_functions(tmp_path: Path) -> None:
    module = tmp_path / "late.py"
    module.write_text("def f():\n    from simcomm.engine import simulate\n    import torch\n")
    assert imported_packages(module) >= {"simcomm", "torch"}


def test_relative_imports_are_refused() -> None:
    # A relative import would slip past the check above, so the packages use none.
    relative = [str(path.relative_to(ROOT)) for package in FORBIDDEN
                for path in (ROOT / package).rglob("*.py")
                for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                if isinstance(node, ast.ImportFrom) and node.level > 0]
    assert relative == []
