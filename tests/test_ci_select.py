"""tests/ci_select.py, the selection .ci/run makes on every change: a pure function of the commit, which keeps the
fast tier, the core and the quick slow tests, and each slow test whose module depends on a changed file: by import,
through a conftest.py, or by naming a file, folder or module in a string (a command run in a subprocess)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ci_select import Repository, changed_files, select

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]

FILES = {
    ".gitignore": "__pycache__/\n.pytest_cache/\n",
    "pkg/__init__.py": "",
    "pkg/a.py": "from pkg import helper\n",
    "pkg/helper.py": "X = 1\n",
    "pkg/b.py": "Y = 2\n",
    "pkg/cli/__init__.py": "",
    "pkg/cli/__main__.py": "from ..b import Y\n",
    "studies/s.py": "import pkg.a\n",
    "docs/guide.md": "words\n",
    "data/table.csv": "1,2\n",
    "tests/conftest.py": "",
    "tests/helpers.py": "import pkg.b\n",
    "tests/test_fast.py": "def test_fast():\n    pass\n",
    "tests/test_imports_a.py": "import pytest\nimport pkg.a\n\n@pytest.mark.slow\ndef test_a():\n    pass\n",
    "tests/test_runs_cli.py": ("import pytest\n\n@pytest.mark.slow\ndef test_cli():\n"
                               "    assert ['-m', 'pkg.cli']\n"),
    "tests/test_runs_study.py": ("import pytest\n\n@pytest.mark.slow\ndef test_study():\n"
                                 "    assert 'studies/s.py'\n"),
    "tests/test_reads_docs.py": ("import pytest\n\n@pytest.mark.slow\ndef test_docs():\n"
                                 "    assert 'guide.md'\n"),
    "tests/test_uses_helpers.py": ("import pytest\nimport helpers\n\n@pytest.mark.slow\ndef test_h():\n"
                                   "    pass\n"),
    "tests/test_joined.py": ("from pathlib import Path\nimport pytest\n\nROOT = Path(__file__).parents[1]\n\n"
                             "@pytest.mark.slow\ndef test_joined():\n"
                             "    assert (ROOT / 'pkg' / 'b.py').read_text()\n"),
    "tests/test_core.py": "import pytest\n\n@pytest.mark.slow\n@pytest.mark.core\ndef test_core():\n    pass\n",
    "tests/test_quick.py": "import pytest\n\n@pytest.mark.slow\ndef test_quick():\n    pass\n",
}
# the slow tests that are neither core nor quick
SLOW = {"test_a", "test_cli", "test_study", "test_docs", "test_h", "test_joined"}
ALWAYS = {"test_fast", "test_core", "test_quick"}


def _git(path: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def repo(pytester: pytest.Pytester) -> Path:
    for name, text in FILES.items():
        pytester.path.joinpath(name).parent.mkdir(parents=True, exist_ok=True)
        pytester.path.joinpath(name).write_text(text)
    pytester.path.joinpath("pytest.ini").write_text("[pytest]\nmarkers =\n    slow\n    core\n"
                                                  "testpaths = tests\npythonpath = .\n")
    pytester.path.joinpath("d.json").write_text(json.dumps({"tests/test_quick.py::test_quick": 2.0}))
    _git(pytester.path, "init", "-q")
    _git(pytester.path, "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A")
    _git(pytester.path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    return pytester.path


def _kept(pytester: pytest.Pytester, since: str = "HEAD") -> set[str]:
    result = pytester.runpytest("-p", "ci_select", "--collect-only", "-q", "--changed-since", since,
                                "--durations-file", "d.json")
    assert result.ret == 0, result.outlines
    return {line.split("::", 1)[1] for line in result.outlines if "::" in line}


@pytest.mark.parametrize(("change", "reached"), [
    ("pkg/helper.py", {"test_a", "test_study"}),  # imported by pkg.a, itself imported by the test and the study
    # by the module run with -m (a relative import), through a helper, and by a path joined with `/` (only that file)
    ("pkg/b.py", {"test_cli", "test_h", "test_joined"}),
    ("pkg/cli/__main__.py", {"test_cli"}),
    ("studies/s.py", {"test_study"}),
    ("docs/guide.md", {"test_docs"}),  # a file name found once in the repository
    ("tests/helpers.py", {"test_h"}),
    ("tests/test_imports_a.py", {"test_a"}),
    ("tests/conftest.py", SLOW),  # every module below it
    ("data/table.csv", SLOW),  # no test depends on it, and it is not prose: nothing says what it can break
])
def test_a_change_keeps_the_slow_tests_that_depend_on_it(repo: Path, pytester: pytest.Pytester, change: str,
                                                        reached: set[str]) -> None:
    assert _kept(pytester) == ALWAYS  # nothing changed: only the fast, core and quick tests
    repo.joinpath(change).write_text(repo.joinpath(change).read_text() + "\n# changed\n")
    assert _kept(pytester) == ALWAYS | reached


def test_committed_deleted_and_new_files_count_and_the_base_is_a_commit(repo: Path, pytester: pytest.Pytester) -> None:
    base = _git(repo, "rev-parse", "HEAD").strip()
    repo.joinpath("docs/guide.md").unlink()
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "gone")
    assert _kept(pytester, base) == ALWAYS | {"test_docs"}  # a deleted file, by the path it had
    assert _kept(pytester) == ALWAYS  # the same tree against the new commit
    repo.joinpath("tests/test_new.py").write_text("import pytest\n\n@pytest.mark.slow\ndef test_new():\n    pass\n")
    assert _kept(pytester) == ALWAYS | {"test_new"}  # untracked, not ignored: its own module
    assert changed_files(repo, "HEAD") == ["tests/test_new.py"]
    result = pytester.runpytest("-p", "ci_select", "--collect-only", "--changed-since", "0" * 40)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "no such commit" in "\n".join(result.errlines)


def test_prose_alone_keeps_no_slow_test_and_the_summary_says_what_ran(repo: Path, pytester: pytest.Pytester) -> None:
    repo.joinpath("README.md").write_text("# new\n")
    result = pytester.runpytest("-p", "ci_select", "-q", "--changed-since", "HEAD", "--durations-file", "d.json")
    assert result.ret == 0
    assert "ci selection: 1 file(s) changed since HEAD; 0 of 6 slow tests over 15 s kept" in result.stdout.str()
    repo.joinpath("data/new.bin").write_bytes(b"\0")
    result = pytester.runpytest("-p", "ci_select", "-q", "--changed-since", "HEAD", "--durations-file", "d.json")
    assert "6 of 6 slow tests over 15 s kept; every slow test, as data/new.bin reaches no test" in result.stdout.str()


def test_this_repository_s_study_tests_depend_on_what_a_study_runs() -> None:
    repo = Repository(ROOT, _git(ROOT, "ls-files").splitlines())
    e2e = repo.dependencies("tests/study/cli/test_studies_e2e.py")
    # the script it runs, the trainable reached through dcl_core.study's lazy imports, a loss, the fork server
    assert {"studies/temperature_sweep.py", "dcl_core/study/execution/trainable.py", "dcl_core/losses/dcl.py",
            "tests/pyrun.py", "tests/conftest.py", "tests/study/conftest.py"} <= e2e
    # this plugin chooses tests and checks none: its patterns ("tests/", "docs/*") pull nothing in
    assert "tests/study/analysis/test_calibration.py" not in e2e and "tests/ci_select.py" not in e2e
    assert select(ROOT, ["tests/study/cli/test_studies_e2e.py", "tests/losses/test_dcl.py"], ["docs/results.md"]) \
        == (set(), [])


@pytest.mark.slow(reason="starts a Python process that imports a study script and the trainable (torch, Ray)")
def test_every_module_a_study_loads_is_among_the_script_s_dependencies() -> None:
    """The static reading against what Python loads: a study script's imports, the trainable its trials run and every
    name the lazy packages offer, imported in a fresh interpreter; every repository file loaded must be a dependency
    of the script (and so of each test that runs it)."""
    code = ("import sys; sys.path.insert(0, 'studies'); sys.argv = ['temperature_sweep.py']\n"
            "import temperature_sweep, dcl_core.study.execution.trainable\n"
            "import dcl_core.data, dcl_core.study, dcl_core.study.tracking\n"
            "for package in (dcl_core.data, dcl_core.study, dcl_core.study.tracking):\n"
            "    [getattr(package, name) for name in getattr(package, '__all__', ())]\n"
            "print('\\n'.join(m.__file__ for m in list(sys.modules.values()) if getattr(m, '__file__', None)))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         check=True).stdout
    loaded = {Path(line).resolve() for line in out.splitlines() if line.endswith(".py") and Path(line).is_absolute()}
    tracked = _git(ROOT, "ls-files").splitlines()
    # the repository's own files: .ci/run's venv (.venv-ci) lies inside the checkout, untracked
    ours = {p.relative_to(ROOT).as_posix() for p in loaded if p.is_relative_to(ROOT)} & set(tracked)
    assert {"dcl_core/study/execution/trainable.py", "studies/temperature_sweep.py"} <= ours
    repo = Repository(ROOT, tracked)
    assert ours - repo.dependencies("studies/temperature_sweep.py") == set()
