"""No module of the project has a standard-library module's name: ``analysis/statistics.py`` beside the standard
library's ``statistics`` (which ``analysis/tables.py`` imports too) read as one module where there were two, and a
script run from a folder holding such a module imports it in place of the standard library's (issue 47)."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("dcl_core", "search_spaces", "studies", "benchmarks")


def named_like_the_standard_library(root: Path) -> list[str]:
    """Every module (a package by its folder's name) under ``FOLDERS`` whose name the standard library also has."""
    found = []
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            name = path.parent.name if path.stem == "__init__" else path.stem
            if name in sys.stdlib_module_names:
                found.append(str(path.relative_to(root)))
    return found


def test_no_module_has_a_standard_library_name():
    assert named_like_the_standard_library(REPO) == []


def test_a_module_or_package_named_like_the_standard_library_is_found(tmp_path):
    (tmp_path / "dcl_core" / "study" / "analysis").mkdir(parents=True)
    (tmp_path / "dcl_core" / "study" / "analysis" / "statistics.py").write_text('"""Planted."""\n')
    (tmp_path / "dcl_core" / "study" / "analysis" / "measures.py").write_text('"""Fine."""\n')
    (tmp_path / "benchmarks" / "json").mkdir(parents=True)
    (tmp_path / "benchmarks" / "json" / "__init__.py").write_text("")
    assert named_like_the_standard_library(tmp_path) == [
        "dcl_core/study/analysis/statistics.py", "benchmarks/json/__init__.py"]
