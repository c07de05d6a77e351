"""The fast tier (``pytest -m "not slow"``) covers every module: each module under dcl_core/ and search_spaces/ is
imported by a test that is not marked ``slow``, read from the test files' import statements.

The modules are listed from the tree when the test runs (packages move; no list is kept here). What counts as
covering a module M, in a test file under tests/ (helpers and conftest.py included) whose module-level
``pytestmark`` is not ``slow``, outside any test or class marked ``slow``:

- ``import M`` / ``from M import x``, and ``from P import M`` where M is P's submodule;
- ``from P import x`` where package P re-exports x from M (``from M import x`` anywhere in P's ``__init__``,
  followed through re-exports of re-exports, so also through a ``TYPE_CHECKING`` block beside a lazy
  ``__getattr__``, or through a lazy ``__getattr__``'s module-level map of names to P's submodules,
  ``{"MoCo": "moco"}``);
- a parent package of an imported module (its ``__init__`` runs on that import);
- a string constant that is M's name (``python -m M``: also covers ``M.__main__``), or Python code in a string
  (``python -c "from M import x"``) that imports it.
"""

import ast
import contextlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("dcl_core", "search_spaces")


def modules_under(root: Path, packages: tuple[str, ...] = PACKAGES) -> set[str]:
    """Every module of ``packages`` below ``root``, dotted (a package by its own name)."""
    found = set()
    for package in packages:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            found.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def _module_file(root: Path, module: str) -> Path:
    path = root.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def reexports(root: Path, modules: set[str]) -> dict[str, dict[str, str]]:
    """{module: {name: the module that defines it}} for the names a module imports from another module of the tree
    (``from dcl_core.losses.dcl import DCLLoss`` in dcl_core/losses/__init__.py: DCLLoss → dcl_core.losses.dcl)."""
    imported: dict[str, dict[str, tuple[str, str]]] = {}
    for module in modules:
        path = _module_file(root, module)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        names: dict[str, tuple[str, str]] = {}
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, node.module] if node.module else up)
            for alias in node.names:
                if base in modules:
                    names[alias.asname or alias.name] = (base, alias.name)
        for node in ast.parse(path.read_text()).body:  # a lazy __getattr__'s map: {"MoCo": "moco", ...}
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
                pairs = [(k.value, v.value) for k, v in zip(node.value.keys, node.value.values, strict=True)
                         if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)]
                if pairs and all(isinstance(v, str) and f"{package}.{v}" in modules for _, v in pairs):
                    for name, sub in pairs:
                        names.setdefault(name, (package, sub))
        imported[module] = names

    def source(module: str, name: str, depth: int = 0) -> str:
        if f"{module}.{name}" in modules:
            return f"{module}.{name}"
        if name in imported.get(module, {}) and depth < 20:
            return source(*imported[module][name], depth + 1)
        return module

    return {m: {name: source(m, name) for name in names} for m, names in imported.items()}


def _is_slow(mark: ast.expr) -> bool:
    """``pytest.mark.slow`` (or ``pytest.mark.slow(...)``)."""
    if isinstance(mark, ast.Call):
        mark = mark.func
    return (isinstance(mark, ast.Attribute) and mark.attr == "slow" and isinstance(mark.value, ast.Attribute)
            and mark.value.attr == "mark")


def _marks_slow(value: ast.expr) -> bool:
    """A ``pytestmark`` value (one mark or a list of them) that includes ``slow``."""
    return any(_is_slow(m) for m in (value.elts if isinstance(value, ast.List | ast.Tuple) else [value]))


def _slow_pytestmark(body: list[ast.stmt]) -> bool:
    return any(isinstance(s, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in s.targets)
               and _marks_slow(s.value) for s in body)


def wholly_slow(tree: ast.Module) -> bool:
    """The file's module-level ``pytestmark`` marks every test in it ``slow``."""
    return _slow_pytestmark(tree.body)


def names_imported(tree: ast.AST, modules: set[str], exports: dict[str, dict[str, str]]) -> set[str]:
    """The modules of ``modules`` this code imports (or names for ``python -m``) outside slow tests and classes;
    ``exports``: :func:`reexports`."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if any(_is_slow(d) for d in node.decorator_list):
                return
            if isinstance(node, ast.ClassDef) and _slow_pytestmark(node.body):
                return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(exports.get(node.module, {}).get(alias.name, f"{node.module}.{alias.name}")
                         for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in modules:
                found.update({node.value, f"{node.value}.__main__"})
            elif "import " in node.value:
                with contextlib.suppress(SyntaxError):
                    found.update(names_imported(ast.parse(node.value), modules, exports))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    with_parents = {".".join(name.split(".")[:i]) for name in found for i in range(1, name.count(".") + 2)}
    return with_parents & modules


def uncovered(root: Path, tests: Path, skip: tuple[Path, ...] = ()) -> tuple[set[str], set[str]]:
    """(every module under ``root``, those no fast test imports), from the test files under ``tests``."""
    modules = modules_under(root)
    exports = reexports(root, modules)
    covered: set[str] = set()
    for path in sorted(tests.rglob("*.py")):
        if path.resolve() in skip:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        if not wholly_slow(tree):
            covered |= names_imported(tree, modules, exports)
    return modules, modules - covered


def test_every_module_is_imported_by_a_fast_test():
    modules, missing = uncovered(REPO, REPO / "tests", skip=(Path(__file__).resolve(),))
    assert len(modules) > 50 and {"dcl_core", "search_spaces"} <= modules  # the tree was found
    assert not missing, f"imported only by slow tests (or by none): {sorted(missing)}; add a fast test"


def test_a_module_imported_only_by_slow_tests_is_found(tmp_path):
    """A planted tree: each way of being covered once, and each way of being imported only by slow tests."""
    for name in ("__init__", "a", "b", "c", "d", "sub/__init__", "sub/__main__", "sub/e", "sub/f", "sub/g"):
        (tmp_path / "dcl_core" / f"{name}.py").parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "dcl_core" / f"{name}.py").write_text("")
    (tmp_path / "search_spaces").mkdir()
    (tmp_path / "search_spaces" / "__init__.py").write_text("")
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_fast.py").write_text(
        "import subprocess, sys\nimport pytest\nfrom dcl_core.a import x\nfrom dcl_core.sub import e\n"
        "import search_spaces\n\n"
        "def test_cli():\n    subprocess.run([sys.executable, '-m', 'dcl_core.sub'])\n"
        "    subprocess.run([sys.executable, '-c', 'from dcl_core.sub.g import y; print(y)'])\n\n"
        "@pytest.mark.slow\ndef test_slow():\n    from dcl_core import b\n\n"
        "@pytest.mark.slow\n@pytest.mark.parametrize('n', [1])\ndef test_slow_too(n):\n    import dcl_core.c\n\n"
        "@pytest.mark.slow\nclass TestSlow:\n    def test_it(self):\n        import dcl_core.sub.f\n"
    )
    slow_file = ("import pytest\nfrom dcl_core import d\n\n"
                 "pytestmark = [pytest.mark.slow, pytest.mark.skipif(False, reason='')]\n")
    (tests / "test_slow.py").write_text(slow_file)
    modules, missing = uncovered(tmp_path, tests)
    assert modules == {"dcl_core", "search_spaces", "dcl_core.sub", "dcl_core.sub.__main__"} | {
        f"dcl_core.{m}" for m in ("a", "b", "c", "d", "sub.e", "sub.f", "sub.g")}
    assert missing == {"dcl_core.b", "dcl_core.c", "dcl_core.d", "dcl_core.sub.f"}
    (tests / "test_slow.py").write_text(slow_file.replace("[pytest.mark.slow, ", "["))  # the same file, not slow
    assert uncovered(tmp_path, tests)[1] == {"dcl_core.b", "dcl_core.c", "dcl_core.sub.f"}
