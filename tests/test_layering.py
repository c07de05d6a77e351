"""The architecture, enforced: every package of the project stands on one floor and imports only from the floors
below it, nothing below the study layer imports Ray, MLflow or Optuna, the study's analysis writes no file, no
module is too long, and nothing reaches into Ray/MLflow/Optuna internals.

- Every package of ``dcl_core``, ``search_spaces``, ``studies`` and ``benchmarks`` stands on one of :data:`FLOORS`
  (docs/architecture.md lists the same floors, and its map of modules keeps their order) and imports only from
  the floors below it: never from a package on its own floor or above, read from every import statement,
  including those inside functions and ``importlib.import_module("x")`` (d).
- Nothing below the study layer (the library, ``search_spaces`` and the single run's command lines) imports
  Ray, MLflow or Optuna, and neither do the study's ``analysis`` and ``plan`` floors; no study floor below its
  command lines imports one of the single run's (``dcl_core.cli_common``, ``dcl_core.train``, ...) (d). Checked also
  by importing the library in a fresh interpreter (a).
- Nothing in dcl_core, search_spaces or studies imports the benchmark baselines (lightly, kornia), which only the
  ``bench`` extra installs (d).
- ``dcl_core.config`` stays torch-free, since the registries import its name lists (a); so does the study command
  line up to its parsing, so a study's ``--help`` is instant (a).
- The study's ``analysis`` is pure: it writes no file (no ``savefig``, ``write_text``, ``mkdir``, ``open(.., "w")``
  ...); its figures come back unsaved and ``dcl_core.study.plan.writers`` writes them (f).
- No module of dcl_core, search_spaces, studies or benchmarks is over 500 lines, and no function over 60 (from its
  ``def`` to its last line) unless a ``# long: <reason>`` comment on its ``def`` line, or on the line above it or
  its decorators, says why (g).
- No import cycle: no two modules of dcl_core, search_spaces, studies or benchmarks import each other, directly or
  around a circle of several, counting every import statement (lazy ones inside functions too) and
  ``importlib.import_module("x")`` (h).
- An import inside a function is a lazy import of something heavy that a ``--help`` must not pay for, and says so
  in a comment on its line or the line above it (e).
- No code uses a private (single-underscore) name of Ray, MLflow or Optuna, a Ray DeveloperAPI that hands out
  an internal object (``get_storage()``), or an environment switch of Ray that Ray's documentation does not list
  (c): their internals change without notice between releases. Nor does a module import another's private name
  (``from dcl_core.training.trainer import _grad_norm``): what a benchmark or a study needs is public.

Each check is a function of a source tree, and each is also run on a small tree with a planted violation, so a
check that stopped detecting anything would fail.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ARCHITECTURE = REPO / "docs" / "architecture.md"

# Every package of the project, floor by floor from the ground up. A package imports only from the floors below
# it; a module belongs to the longest name here that it is or lies under. docs/architecture.md lists the same.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("dcl_core.config", "dcl_core.metric_names", "dcl_core.distributed", "search_spaces"),
    ("dcl_core.files", "dcl_core.losses", "dcl_core.models", "dcl_core.eval"),
    ("dcl_core.data", "dcl_core.frameworks"),
    ("dcl_core.training", "dcl_core.losscheck"),
    ("dcl_core.cli_common",),
    ("dcl_core.train", "dcl_core.evaluate", "dcl_core.export", "dcl_core.pack", "dcl_core.losses.__main__"),
    ("dcl_core.study.analysis",),
    ("dcl_core.study.plan",),
    ("dcl_core.study.tracking",),
    ("dcl_core.study.execution",),
    ("dcl_core.study.cli",),
    ("dcl_core.study",),  # the package's face (its __init__) and python -m dcl_core.study (__main__)
    ("studies", "benchmarks"),
)
# The folders whose every module stands on a floor; dcl_core's own __init__ (a docstring) imports nothing.
TOPS = ("dcl_core", "search_spaces", "studies", "benchmarks")
SERVICES = ("ray", "mlflow", "optuna")
# Benchmark baselines (the ``bench`` extra): a user without them must be able to import everything else.
BASELINES = ("lightly", "kornia")
# The single run's command lines: below the study layer, and still nothing of the study's but its cli imports them.
COMMAND_LINES = ("dcl_core.cli_common", "dcl_core.train", "dcl_core.evaluate", "dcl_core.export", "dcl_core.pack",
                 "dcl_core.losses.__main__")
STUDY_LAYER = "dcl_core.study.analysis"  # the study layer's lowest floor
# Modules a fresh interpreter must not load with the library (a).
FORBIDDEN = ("dcl_core.study", *COMMAND_LINES, *SERVICES, *BASELINES)
# Where no private name of Ray, MLflow or Optuna may appear.
PRIVATE_API_DIRS = ("dcl_core", "studies", "search_spaces", "benchmarks")
THIRD_PARTY = SERVICES
# A dotted path from ray/mlflow/optuna through a single-underscore name: ray.air._internal, mlflow.utils._x.
PRIVATE_PATH = re.compile(r"\b(?:ray|mlflow|optuna)(?:\.\w+)*\._[A-Za-z]")
# Internals of Ray's MLflowLoggerCallback that a subclass can reach without naming ray or mlflow.
RAY_PRIVATE_ATTRIBUTES = re.compile(r"\b(?:_trial_runs|mlflow_util|_get_client)\b")
# Ray DeveloperAPIs that return ray.*._internal objects (the train/tune context's storage).
RAY_DEVELOPER_APIS = re.compile(r"\.get_storage\(")
# Ray's environment variables the project may name, each where Ray documents it for users.
DOCUMENTED_RAY_ENV = {
    "RAY_ADDRESS": "ray.init / ray job submit: the cluster to attach to",
    "RAY_AIR_NEW_OUTPUT": "Ray AIR environment variables: 0 disables the new console output",
    "RAY_AUTH_MODE": "Ray security, token authentication (ray-security/token-auth): token / disabled",
    "RAY_AUTH_TOKEN": "Ray security, token authentication: the token itself",
    "RAY_AUTH_TOKEN_PATH": "Ray security, token authentication: the token's file (default ~/.ray/auth_token)",
    "RAY_CHDIR_TO_TRIAL_DIR": "tune.Trainable: 0 keeps the driver's working directory in trials",
    # read, never set: not in Ray's user guide, so tests/study/plan/test_ray_address.py pins it to Ray's own code
    "RAY_TMPDIR": "Ray's default temp folder, where ray.init(address='auto') reads ray_current_cluster",
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "Ray Tune environment variables: 1 adds no default logger callbacks",
    "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S": "Ray Tune environment variables",
    "TUNE_WARN_THRESHOLD_S": "Ray Tune environment variables: when an event loop operation is logged as slow",
}
RAY_ENV = re.compile(r"[\"'](?:RAY|TUNE)_[A-Za-z0-9_]+[\"']")
# The size bounds and the folders they hold for.
SIZED = TOPS
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60
LONG_REASON = re.compile(r"#\s*long:\s*\S")
# Calls that write a file (or make a folder): none in the study's analysis floor.
WRITE_CALLS = frozenset({"savefig", "write_text", "write_bytes", "mkdir", "makedirs", "write_with", "write_table",
                         "write_csv", "write_rows", "save_figure", "open_append", "open_fd", "rename", "unlink",
                         "rmtree", "symlink_to", "touch", "to_parquet", "to_csv", "dump"})
PURE = ("dcl_core.study.analysis",)
def is_forbidden(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in FORBIDDEN)


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


# ----------------------------------------------------------------------------------------------------- checks


def modules_loaded_by(code: str, pythonpath: Path) -> list[str]:
    """Every module in ``sys.modules`` after running ``code`` in a fresh interpreter with ``pythonpath`` first."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pythonpath), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=pythonpath, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def module_name(path: Path, root: Path) -> str:
    """The dotted name of the module in ``path`` (a package by its own name)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_files(root: Path, tops: Sequence[str] = TOPS) -> list[Path]:
    return [path for top in tops for path in sorted((root / top).rglob("*.py"))]


def is_module(root: Path, name: str) -> bool:
    """Whether ``name`` is a module or package of the tree under ``root``."""
    path = root.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def package_of(module: str, floors: Sequence[Sequence[str]] = FLOORS) -> tuple[int, str] | None:
    """(floor, package) of ``module``: the longest name on ``floors`` that it is or lies under (None: no floor)."""
    found = [(floor, name) for floor, names in enumerate(floors) for name in names
             if module == name or module.startswith(name + ".")]
    return max(found, key=lambda fn: len(fn[1])) if found else None


def imported_modules(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path``, at any depth: ``from a import b`` imports ``a.b`` where that is
    a module of the tree under ``root``, else ``a`` (b is a name of a's); relative imports are resolved, and
    ``importlib.import_module("x")`` counts."""
    package = list(path.relative_to(root).parts[:-1])  # the package a relative import starts from
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            subs = [f"{module}.{alias.name}" for alias in node.names if is_module(root, f"{module}.{alias.name}")]
            found += [(node.lineno, sub) for sub in subs]
            if len(subs) < len(node.names):
                found.append((node.lineno, module))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def unplaced_modules(root: Path, floors: Sequence[Sequence[str]] = FLOORS) -> list[str]:
    """Modules on no floor; ``dcl_core`` itself (its ``__init__``) may stand on none while it imports nothing."""
    hits = []
    for path in source_files(root):
        name = module_name(path, root)
        if package_of(name, floors) is None and not (name == "dcl_core" and not imported_modules(path, root)):
            hits.append(name)
    return hits


def floor_violations(root: Path, floors: Sequence[Sequence[str]] = FLOORS) -> list[str]:
    """``file:line: module`` for each import of a package on the importer's own floor or above it."""
    hits: list[str] = []
    for path in source_files(root):
        own = package_of(module_name(path, root), floors)
        if own is None:
            continue  # unplaced_modules reports it
        for line, module in imported_modules(path, root):
            theirs = package_of(module, floors)
            if theirs is not None and theirs[1] != own[1] and theirs[0] >= own[0]:
                hits.append(f"{path.relative_to(root)}:{line}: {module} (floor {theirs[0] + 1}) "
                            f"from {own[1]} (floor {own[0] + 1})")
    return hits


def barred(package: str, floors: Sequence[Sequence[str]] = FLOORS) -> tuple[str, ...]:
    """What ``package`` may not import although it stands below it: Ray, MLflow and Optuna below the study layer
    and in its ``analysis`` and ``plan``; the benchmark baselines outside ``benchmarks``; the single run's command
    lines in the study's floors below its own."""
    placed = package_of(package, floors)
    study = package_of(STUDY_LAYER, floors)
    below_study = placed is not None and study is not None and placed[0] < study[0]
    return (
        *(SERVICES if below_study or package in ("dcl_core.study.analysis", "dcl_core.study.plan") else ()),
        *(BASELINES if package != "benchmarks" else ()),
        *(COMMAND_LINES if package.startswith("dcl_core.study.") and package != "dcl_core.study.cli" else ()),
    )


def matches(module: str, names: Sequence[str]) -> bool:
    return any(module == name or module.startswith(name + ".") for name in names)


def barred_imports(root: Path, floors: Sequence[Sequence[str]] = FLOORS) -> list[str]:
    """``file:line: module`` for each import of something :func:`barred` to the importer's package."""
    hits: list[str] = []
    for path in source_files(root):
        own = package_of(module_name(path, root), floors)
        if own is None:
            continue
        bad = barred(own[1], floors)
        hits += [f"{path.relative_to(root)}:{line}: {module}" for line, module in imported_modules(path, root)
                 if matches(module, bad)]
    return hits


def _writes(call: ast.Call) -> bool:
    """Whether ``call`` writes a file or makes a folder (:data:`WRITE_CALLS`, ``os.open``, or ``open``/``.open``
    with a mode that writes, appends, creates or updates, or a mode that cannot be read from the source)."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name in WRITE_CALLS:
        return True
    if name != "open":
        return False
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "os":
        return True
    position = 1 if isinstance(func, ast.Name) else 0  # open(file, mode) / Path(...).open(mode)
    mode = next((k.value for k in call.keywords if k.arg == "mode"),
                call.args[position] if len(call.args) > position else ast.Constant("r"))
    return not isinstance(mode, ast.Constant) or any(c in str(mode.value) for c in "wax+")


def file_writes(root: Path, pure: Sequence[str] = PURE) -> list[str]:
    """``file:line: call`` for each call in a module of the ``pure`` packages that writes a file."""
    hits: list[str] = []
    for path in source_files(root):
        if not matches(module_name(path, root), pure):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and _writes(node):
                hits.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node.func)}")
    return sorted(hits)


def oversized(root: Path, tops: Sequence[str] = SIZED) -> list[str]:
    """Modules over :data:`MAX_MODULE_LINES` lines, and functions over :data:`MAX_FUNCTION_LINES` (``def`` to last
    line) whose ``def`` line, or the line above it or its decorators, has no ``# long: <reason>``."""
    hits: list[str] = []
    for path in source_files(root, tops):
        lines = path.read_text().splitlines()
        where = path.relative_to(root)
        if len(lines) > MAX_MODULE_LINES:
            hits.append(f"{where}: {len(lines)} lines (at most {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse("\n".join(lines), str(path))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            top = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            said = [lines[node.lineno - 1], *([lines[top - 2]] if top > 1 else [])]
            if length > MAX_FUNCTION_LINES and not any(LONG_REASON.search(line) for line in said):
                hits.append(f"{where}:{node.lineno}: {node.name} is {length} lines (at most {MAX_FUNCTION_LINES} "
                            "without a '# long: <reason>' comment on its def)")
    return hits


def import_graph(root: Path) -> dict[str, dict[str, int]]:
    """Each module of the tree -> the modules of the tree it imports (:func:`imported_modules`: at any depth,
    lazily or not), each with the first line that imports it."""
    graph: dict[str, dict[str, int]] = {}
    for path in source_files(root):
        name = module_name(path, root)
        edges = graph.setdefault(name, {})
        for line, module in imported_modules(path, root):
            if module != name and is_module(root, module):
                edges[module] = min(line, edges.get(module, line))
    return graph


def _reachable(graph: dict[str, dict[str, int]], start: str) -> set[str]:
    """The modules ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for module in graph.get(todo.pop(), {}):
            if module not in seen:
                seen.add(module)
                todo.append(module)
    return seen


def _shortest_circle(graph: dict[str, dict[str, int]], start: str) -> list[str]:
    """The modules of a shortest circle of imports from ``start`` back to it (breadth first), ``start`` first."""
    parent: dict[str, str] = {}
    queue = [start]
    for module in queue:  # grows while it is read: breadth first
        for imported in sorted(graph.get(module, {})):
            if imported == start:
                circle = [module]
                while circle[-1] != start:
                    circle.append(parent[circle[-1]])
                return circle[::-1]
            if imported not in parent:
                parent[imported] = module
                queue.append(imported)
    raise AssertionError(f"{start} is on no circle")


def import_cycles(root: Path) -> list[str]:
    """One line per group of modules that import each other (directly or around a circle): a shortest circle
    through the first of them by name, ``a:3 -> b:7 -> a`` (line 3 of ``a`` imports ``b``, line 7 of ``b``
    imports ``a``)."""
    graph = import_graph(root)
    reach = {name: _reachable(graph, name) for name in graph}
    hits: list[str] = []
    placed: set[str] = set()
    for name in sorted(graph):
        if name in placed or name not in reach[name]:
            continue
        placed |= {other for other in reach[name] if name in reach.get(other, set())}
        circle = _shortest_circle(graph, name)
        steps = [f"{a}:{graph[a][b]}" for a, b in zip(circle, [*circle[1:], name], strict=True)]
        hits.append(" -> ".join([*steps, name]))
    return hits


def documented_floors(page: str) -> list[tuple[str, ...]]:
    """The floors a page lists under its ``## Floors`` heading: a numbered line each, its packages the names in
    backquotes before the line's first colon."""
    section = page.split("\n## Floors\n", 1)[-1].split("\n## ", 1)[0] if "\n## Floors\n" in page else ""
    return [tuple(re.findall(r"`([\w.]+)`", m.group(1))) for m in re.finditer(r"^\d+\. ([^:]+):", section, re.M)]


def sections_out_of_order(section_of: Callable[[str], int], floors: Sequence[Sequence[str]] = FLOORS) -> list[str]:
    """Pairs of packages the map of modules shows in the opposite order of their floors (``section_of``: the
    index of the map's section that shows a module; the map shows dcl_core and search_spaces)."""
    shown = [(floor, name, section_of(name)) for floor, names in enumerate(floors) for name in names
             if name.split(".")[0] in ("dcl_core", "search_spaces")]
    return [f"{a} (floor {fa + 1}) is shown in section {sa + 1}, after {b} (floor {fb + 1}, section {sb + 1})"
            for fa, a, sa in shown for fb, b, sb in shown if fa < fb and sa > sb]


def _type_checking_lines(tree: ast.AST) -> set[int]:
    """Line numbers inside ``if TYPE_CHECKING:`` blocks (imports for annotations only)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                lines.update(range(inner.lineno, (inner.end_lineno or inner.lineno) + 1))
    return lines


def _explained(lines: list[str], index: int) -> bool:
    """A comment on the import's line, or on the line above the group of imports it belongs to (blank lines and
    the group's other imports between them)."""
    if "#" in lines[index]:
        return True
    for above in reversed(lines[:index]):
        text = above.strip()
        if text.startswith("#"):
            return True
        if text and not text.startswith(("import ", "from ")) and "#" not in text:
            return False
        if "#" in text:
            return True
    return False


def unexplained_lazy_imports(root: Path) -> list[str]:
    """``file:line`` of each import inside a function in dcl_core with no comment on its line or the line above."""
    hits: list[str] = []
    for path in sorted((root / "dcl_core").rglob("*.py")):
        source = path.read_text()
        lines = source.splitlines()
        tree = ast.parse(source, str(path))
        typing_only = _type_checking_lines(tree)
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(func):
                lazy = isinstance(node, ast.Import | ast.ImportFrom) and node.lineno not in typing_only
                if lazy and not _explained(lines, node.lineno - 1):
                    hits.append(f"{path.relative_to(root)}:{node.lineno}")
    return sorted(set(hits))


def private_api_uses(root: Path) -> list[str]:
    """``file:line: text`` for each use of a private Ray/MLflow/Optuna name in the sources under ``root``."""
    hits: list[str] = []
    for folder in PRIVATE_API_DIRS:
        for path in sorted((root / folder).rglob("*.py")):
            source = path.read_text()
            where = path.relative_to(root)
            for number, line in enumerate(source.splitlines(), start=1):
                for pattern in (PRIVATE_PATH, RAY_PRIVATE_ATTRIBUTES, RAY_DEVELOPER_APIS):
                    hits += [f"{where}:{number}: {m.group(0)}" for m in pattern.finditer(line)]
                hits += [f"{where}:{number}: {m.group(0)}" for m in RAY_ENV.finditer(line)
                         if m.group(0)[1:-1] not in DOCUMENTED_RAY_ENV]
            hits += [f"{where}:{line}: {name}" for line, name in _private_names_imported(source, str(path))]
            hits += [f"{where}:{line}: {name}" for line, name in _own_private_imports(source, str(path))]
    return sorted(set(hits))


def _own_private_imports(source: str, filename: str) -> list[tuple[int, str]]:
    """``from dcl_core.x import _name``: a private name of one of the project's modules, used from another."""
    return [(node.lineno, f"{node.module}.{alias.name}") for node in ast.walk(ast.parse(source, filename))
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("dcl_core", "search_spaces")
            for alias in node.names if is_private(alias.name)]


def _private_names_imported(source: str, filename: str) -> list[tuple[int, str]]:
    """Imports of Ray/MLflow/Optuna with a private segment (``from ray.train import _internal``), and private
    attributes of the names those imports bind (``import mlflow as m; m._x``)."""
    tree = ast.parse(source, filename)
    bound: set[str] = set()
    hits: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in THIRD_PARTY:
                    bound.add(alias.asname or alias.name.split(".")[0])
                    if any(is_private(part) for part in alias.name.split(".")):
                        hits.append((node.lineno, alias.name))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in THIRD_PARTY:
            for alias in node.names:
                bound.add(alias.asname or alias.name)
                path = [*node.module.split("."), alias.name]
                if any(is_private(part) for part in path):
                    hits.append((node.lineno, ".".join(path)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            inner = node.value
            while isinstance(inner, ast.Attribute):
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id in bound:
                hits.append((node.lineno, ast.unparse(node)))
    return hits


# ------------------------------------------------------------------------------------------------ the checks


@pytest.mark.slow  # fresh interpreters importing the library: ~20 s
def test_the_library_loads_nothing_from_the_study_layer_or_ray_mlflow_optuna():
    study = next(i for i, floor in enumerate(FLOORS) if STUDY_LAYER in floor)
    library = [name for floor in FLOORS[:study] for name in floor if name not in COMMAND_LINES]
    loaded = modules_loaded_by(f"import {', '.join(library)}", REPO)
    assert "dcl_core.training" in loaded and "search_spaces" in loaded and "torch" in loaded  # the import happened
    assert [m for m in loaded if is_forbidden(m)] == []


def test_the_config_stays_torch_free():
    # The registries (dcl_core.losses, .data, .models, .frameworks) import the config's name lists; the CLIs and
    # the study driver import the config to check a run before any torch is loaded.
    loaded = modules_loaded_by("import dcl_core.config", REPO)
    assert "dcl_core.config" in loaded
    assert [m for m in loaded if m == "torch" or m.startswith("torch.") or is_forbidden(m)] == []


def test_a_study_script_answers_help_without_loading_torch():
    # `python studies/<x>.py --help` or a bad option: argparse answers before torch (seconds) is needed.
    loaded = modules_loaded_by("import dcl_core.study.cli, dcl_core.study", REPO)
    assert "dcl_core.study.cli" in loaded
    assert [m for m in loaded if m in ("torch", "torchvision", "ray", "mlflow", "optuna")] == []


@pytest.mark.slow  # a fresh interpreter importing a study's driver: ~12 s
def test_a_study_driver_reaches_ray_without_torch(tmp_path):
    from cifar10_present import cifar10_present  # dcl_core.data: torch, not for this module's collection

    if not cifar10_present():
        pytest.skip("CIFAR-10 not present: the driver stops at its data, before Ray")
    # A study's driver checks its data and trials, then hands Tune the trainable; torch and torchvision (~10 s on 2
    # cores) load in the trials' processes only. ray.init is where the driver's own preparation ends.
    stop = "import json, os, sys; print(json.dumps(sorted(sys.modules)), flush=True); os._exit(0)"
    code = (f"import ray, runpy, sys\nray.init = lambda *a, **k: exec({stop!r})\n"
            f"sys.argv = ['studies/temperature_sweep.py', '--smoke', '--output-dir', {str(tmp_path / 'out')!r}]\n"
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    loaded = modules_loaded_by(code, REPO)
    assert "dcl_core.study.execution.trainable" in loaded and "dcl_core.data.locate" in loaded  # it got there
    assert [m for m in loaded if m.split(".")[0] in ("torch", "torchvision", "tensorboardX")] == []


@pytest.mark.slow  # a fresh interpreter importing a trial's modules: ~9 s
def test_a_trial_worker_imports_no_mlflow_scipy_or_optuna():
    # Every Ray worker that runs a trial imports the trainable: MLflow and SciPy (the driver's) would add ~2.5
    # CPU-seconds to each worker's start on 2 cores, twice per study.
    loaded = modules_loaded_by("import dcl_core.study.execution.trainable", REPO)
    assert "dcl_core.study.execution.trainable" in loaded and "ray.train" in loaded
    assert [m for m in loaded if m.split(".")[0] in ("mlflow", "scipy", "optuna", "matplotlib")] == []


def test_every_package_stands_on_a_floor():
    assert len(source_files(REPO)) > 100  # the tree was found
    assert [name for floor in FLOORS for name in floor if not (is_module(REPO, name) or (REPO / name).is_dir())] == []
    assert unplaced_modules(REPO) == []


def test_each_package_imports_only_from_the_floors_below_it():
    assert floor_violations(REPO) == []


def test_nothing_below_the_study_layer_imports_ray_mlflow_or_optuna():
    # nor the study's analysis and plan; nor anything but the benchmarks lightly or kornia; nor a study floor below
    # the study's command lines the single run's
    assert barred_imports(REPO) == []


def test_the_study_analysis_writes_no_file():
    assert any(REPO.joinpath("dcl_core", "study", "analysis").glob("*.py"))
    assert file_writes(REPO) == []


def test_no_module_or_function_is_too_long():
    assert oversized(REPO) == []


def test_no_two_modules_import_each_other():
    assert import_cycles(REPO) == []


def test_docs_architecture_lists_these_floors():
    assert documented_floors(ARCHITECTURE.read_text()) == list(FLOORS)


def test_the_map_of_modules_shows_the_floors_in_order():
    from test_architecture_map import floor_of  # the map's section of a module (tests/ is on sys.path)

    assert sections_out_of_order(floor_of) == []


def test_every_lazy_import_says_why():
    assert unexplained_lazy_imports(REPO) == []


def test_no_private_ray_mlflow_or_optuna_name_is_used():
    assert private_api_uses(REPO) == []


# ------------------------------------------------------------------------- the checks detect planted violations


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_a_loaded_forbidden_module_is_detected(tmp_path):
    _write(tmp_path, {"mlflow/__init__.py": "", "badlib/__init__.py": "import json\nimport mlflow\n"})
    loaded = modules_loaded_by("import badlib", tmp_path)
    assert [m for m in loaded if is_forbidden(m)] == ["mlflow"]


@pytest.mark.parametrize(
    ("name", "forbidden"),
    [
        ("dcl_core.train", True),
        ("dcl_core.training", False),
        ("dcl_core.training.trainer", False),
        ("dcl_core.study", True),
        ("dcl_core.study.tracking", True),
        ("dcl_core.study.cli", True),
        ("dcl_core.studyx", False),
        ("dcl_core.cli_common", True),
        ("dcl_core.config", False),
        ("ray.tune", True),
        ("rayleigh", False),
    ],
)
def test_forbidden_names_match_modules_and_submodules_only(name, forbidden):
    assert is_forbidden(name) is forbidden


def test_an_import_from_the_own_floor_or_above_is_detected_at_any_depth(tmp_path):
    _write(
        tmp_path,
        {
            "dcl_core/__init__.py": "",
            "dcl_core/cli_common.py": "",
            "dcl_core/config/__init__.py": "",
            "dcl_core/config/keys.py": "from dcl_core.frameworks.negatives import NEGATIVES\n",  # the library, above
            "dcl_core/frameworks/__init__.py": "from dcl_core.config import LOSS_NAMES\n",  # the config, below
            "dcl_core/frameworks/negatives.py": "",
            "dcl_core/models/__init__.py": "",
            "dcl_core/losses/__init__.py": "",
            "dcl_core/losses/bad.py": (
                "import importlib\n"
                "import dcl_core.train\n"
                "from dcl_core.study import tracking\n"
                "from .. import cli_common\n"
                "from dcl_core import models\n"  # beside it, on its own floor
                "from dcl_core.losses import base\n"  # its own package
                "def later():\n"
                "    from dcl_core.study.execution.tuning import run\n"
                "    importlib.import_module('dcl_core.evaluate')\n"
            ),
            "dcl_core/study/__init__.py": "from dcl_core.study.plan.spec import StudySpec\n",  # the face, above plan
            "dcl_core/study/plan/spec.py": "from dcl_core.study import StudySpec\n",  # the face, above it
            "dcl_core/study/tracking/__init__.py": "",
            "dcl_core/study/execution/tuning.py": "from dcl_core.study import tracking\n",  # a floor below
            "search_spaces/spaces.py": "from dcl_core.config import CONFIG_KEYS\n",  # beside it, on the ground
            "studies/s.py": "from benchmarks.common import Row\nfrom dcl_core.study import StudySpec\n",
            "benchmarks/common.py": "",
        },
    )
    assert floor_violations(tmp_path) == [
        "dcl_core/config/keys.py:1: dcl_core.frameworks.negatives (floor 3) from dcl_core.config (floor 1)",
        "dcl_core/losses/bad.py:2: dcl_core.train (floor 6) from dcl_core.losses (floor 2)",
        "dcl_core/losses/bad.py:3: dcl_core.study.tracking (floor 9) from dcl_core.losses (floor 2)",
        "dcl_core/losses/bad.py:4: dcl_core.cli_common (floor 5) from dcl_core.losses (floor 2)",
        "dcl_core/losses/bad.py:5: dcl_core.models (floor 2) from dcl_core.losses (floor 2)",
        "dcl_core/losses/bad.py:8: dcl_core.study.execution.tuning (floor 10) from dcl_core.losses (floor 2)",
        "dcl_core/losses/bad.py:9: dcl_core.evaluate (floor 6) from dcl_core.losses (floor 2)",
        "dcl_core/study/plan/spec.py:1: dcl_core.study (floor 12) from dcl_core.study.plan (floor 8)",
        "search_spaces/spaces.py:1: dcl_core.config (floor 1) from search_spaces (floor 1)",
        "studies/s.py:1: benchmarks.common (floor 13) from studies (floor 13)",
    ]


def test_a_module_on_no_floor_is_detected(tmp_path):
    _write(tmp_path, {"dcl_core/__init__.py": "", "dcl_core/newpkg/x.py": "", "dcl_core/losses/__init__.py": "",
                      "tools/t.py": ""})  # tools/ is no folder of the project's
    assert unplaced_modules(tmp_path) == ["dcl_core.newpkg.x"]
    _write(tmp_path, {"dcl_core/__init__.py": "from dcl_core.losses import LOSSES\n"})  # the root face imports
    assert unplaced_modules(tmp_path) == ["dcl_core", "dcl_core.newpkg.x"]


def test_ray_mlflow_optuna_below_the_study_layer_and_the_other_barred_imports_are_detected(tmp_path):
    _write(
        tmp_path,
        {
            "dcl_core/cli_common.py": "",
            "search_spaces/spaces.py": "def to_tune():\n    from ray import tune  # seconds\n",
            "dcl_core/train.py": "import mlflow\n",
            "dcl_core/losses/x.py": "import kornia.augmentation\n",
            "dcl_core/study/analysis/plots.py": "def f():\n    import optuna  # heavy\n",
            "dcl_core/study/plan/spec.py": "import mlflow.tracking\n",
            "dcl_core/study/tracking/sync.py": "import mlflow\nfrom dcl_core import cli_common\n",
            "dcl_core/study/execution/results.py": "import ray\nfrom dcl_core.train import main\n",
            "dcl_core/study/cli/script.py": "import ray\nfrom dcl_core.cli_common import run_command\n",
            "studies/s.py": "import ray\nimport lightly\n",
            "benchmarks/b.py": "import lightly\nimport kornia\n",
        },
    )
    assert barred_imports(tmp_path) == [
        "dcl_core/losses/x.py:1: kornia.augmentation",
        "dcl_core/study/analysis/plots.py:2: optuna",
        "dcl_core/study/execution/results.py:2: dcl_core.train",
        "dcl_core/study/plan/spec.py:1: mlflow.tracking",
        "dcl_core/study/tracking/sync.py:2: dcl_core.cli_common",
        "dcl_core/train.py:1: mlflow",
        "search_spaces/spaces.py:2: ray",
        "studies/s.py:2: lightly",
    ]


def test_a_file_written_by_the_analysis_is_detected(tmp_path):
    _write(
        tmp_path,
        {
            "dcl_core/study/analysis/figures.py": (
                "import json, os\n"
                "from pathlib import Path\n"
                "def f(fig, path, rows, mode):\n"
                "    fig.savefig(path)\n"
                "    Path(path).write_text('x')\n"
                "    path.parent.mkdir(parents=True)\n"
                "    open(path, 'w')\n"
                "    path.open(mode='ab')\n"
                "    json.dump(rows, path)\n"
                "    os.open(path, os.O_RDONLY)\n"
                "    open(path, mode)\n"
                "    open(path).read(), path.open('rb'), open(path, mode='r')\n"  # reads
                "    json.dumps(rows), 'a'.replace('a', 'b'), path.read_text()\n"
            ),
            "dcl_core/study/plan/writers.py": "def f(fig, path):\n    fig.savefig(path)\n",  # plan may write
        },
    )
    assert file_writes(tmp_path) == sorted(f"dcl_core/study/analysis/figures.py:{line}: {call}" for line, call in [
        (4, "fig.savefig"), (5, "Path(path).write_text"), (6, "path.parent.mkdir"), (7, "open"), (8, "path.open"),
        (9, "json.dump"), (10, "os.open"), (11, "open")])


def test_a_module_or_function_too_long_is_detected(tmp_path):
    def function(name: str, lines: int, above: str = "", on_def: str = "") -> str:
        return f"{above}def {name}():{on_def}\n" + "    x = 1\n" * (lines - 1)

    _write(
        tmp_path,
        {
            "dcl_core/big.py": "x = 1\n" * 501,
            "dcl_core/ok.py": "x = 1\n" * 500,
            "studies/f.py": "".join([
                function("fits", 60),  # lines 1-60
                function("long", 61),  # 61-121
                function("said", 61, on_def="  # long: one table of cases"),  # 122-182
                function("said_above", 61, above="# long: one table of cases\n@decorated\n"),  # 183-245
                function("comment_is_no_reason", 61, above="# a long one\n"),  # 246-307
            ]),
            "benchmarks/huge.py": "x = 1\n" * 900,  # the benchmarks are held to the same bounds
            "benchmarks/run.py": function("parse", 60) + function("main", 64),
            "tools/long.py": "x = 1\n" * 900,  # tools/ is no folder of the project's
        },
    )
    assert oversized(tmp_path) == [
        "dcl_core/big.py: 501 lines (at most 500)",
        "studies/f.py:61: long is 61 lines (at most 60 without a '# long: <reason>' comment on its def)",
        "studies/f.py:247: comment_is_no_reason is 61 lines (at most 60 without a '# long: <reason>' comment on its "
        "def)",
        "benchmarks/huge.py: 900 lines (at most 500)",
        "benchmarks/run.py:61: main is 64 lines (at most 60 without a '# long: <reason>' comment on its def)",
    ]


def test_modules_that_import_each_other_are_detected(tmp_path):
    _write(
        tmp_path,
        {
            # two modules, one of the imports lazy (the circle dcl_core.data.locate and .packed made)
            "dcl_core/data/errors.py": "",
            "dcl_core/data/locate.py": (
                "from dcl_core.data.errors import DataError\n"
                "def check():\n"
                "    from dcl_core.data.packed import read_split  # deferred\n"
            ),
            "dcl_core/data/packed.py": (
                "from dcl_core.data.errors import DataError\n"
                "from dcl_core.data.locate import PACKED_FILE\n"
            ),
            "dcl_core/data/streaming.py": "from dcl_core.data.locate import check\n",  # into the circle, not on it
            # three around a circle, one through importlib
            "benchmarks/a.py": "from benchmarks import b\n",
            "benchmarks/b.py": "import os\nimport benchmarks.c\n",
            "benchmarks/c.py": "import importlib\ndef f():\n    importlib.import_module('benchmarks.a')\n",
            # a package's face and a module under it
            "dcl_core/study/__init__.py": "from dcl_core.study.plan import spec\n",
            "dcl_core/study/plan/__init__.py": "",
            "dcl_core/study/plan/spec.py": "from dcl_core.study import StudySpec\n",
            "studies/s.py": "import benchmarks.a\nfrom dcl_core.study.plan import spec\n",  # one way only
        },
    )
    assert import_cycles(tmp_path) == [
        "benchmarks.a:1 -> benchmarks.b:2 -> benchmarks.c:3 -> benchmarks.a",
        "dcl_core.data.locate:3 -> dcl_core.data.packed:2 -> dcl_core.data.locate",
        "dcl_core.study:1 -> dcl_core.study.plan.spec:1 -> dcl_core.study",
    ]


def test_the_floors_a_page_lists_are_read_and_compared(tmp_path):
    page = ("# Architecture\n\n## Floors\n\nFrom the ground up:\n\n"
            "1. `dcl_core.config`, `search_spaces`: they import nothing (`dcl_core.x` is not read here)\n"
            "2. `dcl_core.losses`: one file per loss\n\n## Map\n\n3. `dcl_core.study`: not a floor\n")
    assert documented_floors(page) == [("dcl_core.config", "search_spaces"), ("dcl_core.losses",)]
    assert documented_floors(page) != list(FLOORS)
    assert documented_floors("# Architecture\n") == []


def test_a_map_showing_the_floors_out_of_order_is_detected():
    sections = {"dcl_core.config": 1, "search_spaces": 0, "dcl_core.files": 0, "dcl_core.study": 2}
    floors = (("dcl_core.config", "search_spaces"), ("dcl_core.files",), ("dcl_core.study", "studies"))
    assert sections_out_of_order(sections.__getitem__, floors) == [
        "dcl_core.config (floor 1) is shown in section 2, after dcl_core.files (floor 2, section 1)"]


def test_private_names_are_detected(tmp_path):
    _write(
        tmp_path,
        {
            "dcl_core/study/tracking.py": (
                "import mlflow\n"
                "import ray.tune as tune\n"
                "from ray.air._internal.mlflow import _MLflowLoggerUtil\n"
                "from mlflow.tracking import _tracking_service\n"
                "from ray.tune import report\n"
                "class Logger:\n"
                "    def log(self, trial):\n"
                "        run = self._trial_runs[trial]\n"
                "        self.mlflow_util._get_client().log_dict(run, {}, 'x.json')\n"
                "        mlflow.utils._logging_utils.x()\n"
                "        tune._private_thing()\n"
                "        mlflow.start_run(); report({}); print(mlflow.__version__)\n"
            ),
            "studies/ok.py": "import optuna\noptuna.create_study()\nclass A:\n    def f(self):\n        self._x = 1\n"
                             "import os\nos.environ['RAY_ADDRESS']\n",
            "benchmarks/bad.py": "import optuna as o\no._imports.check()\nfrom dcl_core.training.trainer import _n\n",
            "dcl_core/study/trial.py": "from ray import tune\nimport os\n"
                                       "d = tune.get_context().get_storage().trial_working_directory\n"
                                       "os.environ['RAY_experimental_noset_cuda_visible_devices'] = '1'\n",
        },
    )
    hits = private_api_uses(tmp_path)
    assert [h for h in hits if h.startswith("studies/")] == []
    flagged = {h.split(": ", 1)[0] for h in hits}
    assert flagged == {
        "benchmarks/bad.py:2",
        "benchmarks/bad.py:3",
        "dcl_core/study/trial.py:3",
        "dcl_core/study/trial.py:4",
        *(f"dcl_core/study/tracking.py:{n}" for n in (3, 4, 8, 9, 10, 11)),
    }
    assert "dcl_core/study/tracking.py:3: ray.air._internal.mlflow._MLflowLoggerUtil" in hits
    assert "dcl_core/study/tracking.py:11: tune._private_thing" in hits


def test_a_lazy_import_without_a_reason_is_detected(tmp_path):
    _write(
        tmp_path,
        {
            "dcl_core/a.py": (
                "from typing import TYPE_CHECKING\n"
                "import os\n"
                "def f():\n"
                "    import torch  # seconds: not for --help\n"
                "    # Ray takes seconds to import\n"
                "    import ray\n"
                "    from dcl_core import b\n"
                "    x = 1\n"
                "    from dcl_core import d\n"
                "    if TYPE_CHECKING:\n"
                "        from dcl_core import c\n"
            ),
        },
    )
    assert unexplained_lazy_imports(tmp_path) == ["dcl_core/a.py:9"]
