"""The architecture, enforced: the library layers never reach up into the study layer, the study layer's floors
never reach up into the floors above them, and nothing reaches into Ray/MLflow/Optuna internals.

- The library (losses, data, models, frameworks, eval, training, config) imports nothing from the study layer
  (``dcl_core.study*``, ``dcl_core.tracking``), the command lines (``dcl_core.train``, ``dcl_core.evaluate``,
  ``dcl_core.cli``) or Ray/MLflow/Optuna: checked by importing it in a fresh interpreter (a) and by reading every
  import statement, including those inside functions (b).
- The study layer's floors (d): ``analysis`` (pure: no Ray, MLflow or Optuna) below ``plan`` (no Ray, MLflow or
  Optuna either) below ``tracking`` below ``execution`` below ``cli``; none of the four floors imports a command
  line (``dcl_core.study.cli``, ``dcl_core.cli``, ``dcl_core.train``, ``dcl_core.evaluate``).
- An import inside a function is a lazy import of something heavy that a ``--help`` must not pay for, and says so
  in a comment on its line or the line above it (e).
- Nothing in dcl_core imports the benchmark baselines (lightly, kornia), which only the ``bench`` extra installs.
- ``dcl_core.config`` stays torch-free, since the registries import its name lists (a); so does the study command
  line up to its parsing, so a study's ``--help`` is instant (a).
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
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Modules the library must not load. A name matches itself and its submodules ("dcl_core.train" does not match
# "dcl_core.training"); "dcl_core.study" matches the dcl_core.study package, "dcl_core.study.cli" is listed too.
FORBIDDEN = (
    "dcl_core.study",
    "dcl_core.train",
    "dcl_core.evaluate",
    "dcl_core.cli",
    "ray",
    "mlflow",
    "optuna",
    # Benchmark baselines (the ``bench`` extra): a user without them must be able to import everything.
    "lightly",
    "kornia",
)
LIBRARY_PACKAGES = ("config", "losses", "data", "models", "frameworks", "eval", "training")
LIBRARY_MODULES = ("distributed.py",)
# Where no private name of Ray, MLflow or Optuna may appear.
PRIVATE_API_DIRS = ("dcl_core", "studies", "search_spaces", "benchmarks")
THIRD_PARTY = ("ray", "mlflow", "optuna")
# The study layer's floors, bottom up, and what each may not import (besides every floor above it).
COMMAND_LINES = ("dcl_core.study.cli", "dcl_core.cli", "dcl_core.train", "dcl_core.evaluate")
STUDY_FLOORS = ("analysis", "plan", "tracking", "execution")
FLOOR_FORBIDS = {
    "analysis": ("ray", "mlflow", "optuna"),
    "plan": ("ray", "mlflow", "optuna"),
    "tracking": (),
    "execution": (),
}
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
    "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S": "Ray Tune environment variables",
    "TUNE_WARN_THRESHOLD_S": "Ray Tune environment variables: when an event loop operation is logged as slow",
}
RAY_ENV = re.compile(r"[\"'](?:RAY|TUNE)_[A-Za-z0-9_]+[\"']")


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


def library_files(root: Path) -> list[Path]:
    """The library's source files under ``root`` (a repository), CLI shims (``__main__.py``) excepted."""
    files = [p for pkg in LIBRARY_PACKAGES for p in sorted((root / "dcl_core" / pkg).rglob("*.py"))]
    files += [root / "dcl_core" / name for name in LIBRARY_MODULES if (root / "dcl_core" / name).is_file()]
    return [p for p in files if p.name != "__main__.py"]


def imported_modules(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path``, at any depth; ``from a import b`` yields ``a.b`` as well as
    ``a`` (b may be a submodule), relative imports are resolved, and ``importlib.import_module("x")`` counts."""
    package = list(path.relative_to(root).parts[:-1])  # the package a relative import starts from
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names if alias.name != "*"]
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


def upward_imports(root: Path) -> list[str]:
    """``file:line: module`` for each import of a forbidden module by a library file under ``root``."""
    hits: list[str] = []
    for path in library_files(root):
        bad = {(line, module) for line, module in imported_modules(path, root) if is_forbidden(module)}
        # ``from dcl_core.study.cli import main``: report the module, not also ``dcl_core.study.cli.main``.
        hits += [
            f"{path.relative_to(root)}:{line}: {module}"
            for line, module in sorted(bad)
            if (line, module.rpartition(".")[0]) not in bad
        ]
    return hits


def floor_forbids(floor: str) -> tuple[str, ...]:
    """What a study floor's modules may not import: the floors above it, the command lines, its own list."""
    above = STUDY_FLOORS[STUDY_FLOORS.index(floor) + 1:]
    return (*(f"dcl_core.study.{f}" for f in above), *COMMAND_LINES, *FLOOR_FORBIDS[floor])


def matches(module: str, names: tuple[str, ...]) -> bool:
    return any(module == name or module.startswith(name + ".") for name in names)


def floor_violations(root: Path) -> list[str]:
    """``file:line: module`` for each import by a study floor's module of something above it or forbidden to it."""
    hits: list[str] = []
    for floor in STUDY_FLOORS:
        forbidden = floor_forbids(floor)
        for path in sorted((root / "dcl_core" / "study" / floor).rglob("*.py")):
            bad = {(line, module) for line, module in imported_modules(path, root) if matches(module, forbidden)}
            hits += [f"{path.relative_to(root)}:{line}: {module}" for line, module in sorted(bad)
                     if (line, module.rpartition(".")[0]) not in bad]
    return hits


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


def test_the_library_loads_nothing_from_the_study_layer_or_ray_mlflow_optuna():
    loaded = modules_loaded_by("import dcl_core.losses, dcl_core.data, dcl_core.models, dcl_core.frameworks", REPO)
    assert "dcl_core.losses" in loaded and "torch" in loaded  # the import did happen
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


def test_a_trial_worker_imports_no_mlflow_scipy_or_optuna():
    # Every Ray worker that runs a trial imports the trainable: MLflow and SciPy (the driver's) would add ~2.5
    # CPU-seconds to each worker's start on 2 cores, twice per study.
    loaded = modules_loaded_by("import dcl_core.study.execution.trainable", REPO)
    assert "dcl_core.study.execution.trainable" in loaded and "ray.train" in loaded
    assert [m for m in loaded if m.split(".")[0] in ("mlflow", "scipy", "optuna", "matplotlib")] == []


def test_no_library_module_imports_the_study_layer_or_the_command_lines():
    assert len(library_files(REPO)) > 20
    assert upward_imports(REPO) == []


def test_each_study_floor_imports_only_the_floors_below_it():
    assert all(any((REPO / "dcl_core" / "study" / floor).glob("*.py")) for floor in STUDY_FLOORS)
    assert floor_violations(REPO) == []


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
        ("dcl_core.cli", True),
        ("dcl_core.config", False),
        ("ray.tune", True),
        ("rayleigh", False),
    ],
)
def test_forbidden_names_match_modules_and_submodules_only(name, forbidden):
    assert is_forbidden(name) is forbidden


def test_upward_imports_are_detected_at_any_depth(tmp_path):
    _write(
        tmp_path,
        {
            "dcl_core/losses/__init__.py": "",
            "dcl_core/losses/bad.py": (
                "import importlib\n"
                "import dcl_core.train\n"
                "from dcl_core.study import tracking\n"
                "from .. import cli\n"
                "import dcl_core.training\n"
                "from dcl_core.config import LOSS_NAMES\n"
                "def later():\n"
                "    from dcl_core.study.execution.tuning import run\n"
                "    importlib.import_module('dcl_core.evaluate')\n"
                "    import ray.tune\n"
            ),
            "dcl_core/eval/__main__.py": "from dcl_core.evaluate import main\n",  # a CLI shim may
            "dcl_core/training/ok.py": "from dcl_core.training.trainer import train\n",
            "dcl_core/config/keys.py": "from dcl_core.study.cli import parse_overrides\n",
        },
    )
    assert upward_imports(tmp_path) == [
        "dcl_core/config/keys.py:1: dcl_core.study.cli",
        "dcl_core/losses/bad.py:2: dcl_core.train",
        "dcl_core/losses/bad.py:3: dcl_core.study",
        "dcl_core/losses/bad.py:4: dcl_core.cli",
        "dcl_core/losses/bad.py:8: dcl_core.study.execution.tuning",
        "dcl_core/losses/bad.py:9: dcl_core.evaluate",
        "dcl_core/losses/bad.py:10: ray.tune",
    ]


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


def test_upward_imports_between_study_floors_are_detected(tmp_path):
    _write(
        tmp_path,
        {
            "dcl_core/study/analysis/stats.py": "import math\nfrom dcl_core.study.plan.spec import StudySpec\n",
            "dcl_core/study/analysis/plots.py": "def f():\n    import optuna  # heavy\n",
            "dcl_core/study/plan/spec.py": "from dcl_core.study.analysis import stats\nimport mlflow\n",
            "dcl_core/study/tracking/sync.py": "from dcl_core.study.plan.spec import StudySpec\n"
                                               "from dcl_core import cli\n",
            "dcl_core/study/execution/results.py": "from dcl_core.study.tracking import tracker\n"
                                                 "from dcl_core.study.cli import main\n",
        },
    )
    assert floor_violations(tmp_path) == [
        "dcl_core/study/analysis/plots.py:2: optuna",
        "dcl_core/study/analysis/stats.py:2: dcl_core.study.plan.spec",
        "dcl_core/study/plan/spec.py:2: mlflow",
        "dcl_core/study/tracking/sync.py:2: dcl_core.cli",
        "dcl_core/study/execution/results.py:2: dcl_core.study.cli",
    ]


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
