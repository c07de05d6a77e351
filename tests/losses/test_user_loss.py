"""A loss from the user's own code: ``loss.name=module:Class`` or ``path/to/file.py:Class`` with its own keyword
arguments in ``loss.params``, refused in one line when its name, its params, its import or its class is wrong."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from dcl_core.config import Config, ConfigError, InputError, apply_overrides, derive, loss_reference
from dcl_core.losses.user import build_user_loss, load_loss_class, loss_source_file, source_sha256
from dcl_core.training.builders import build_loss

PLANTED = Path(__file__).with_name("planted_losses.py")
SOUND = f"{PLANTED}:PositiveWeighted"


def config(**overrides) -> Config:
    return apply_overrides(Config(), {k.replace("__", "."): v for k, v in overrides.items()})


@pytest.mark.parametrize(("name", "module", "file", "attr"), [
    ("my_losses:MyLoss", "my_losses", "", "MyLoss"),
    ("pkg.sub.my_losses:MyLoss", "pkg.sub.my_losses", "", "MyLoss"),
    ("path/to/my_loss.py:MyLoss", "", "path/to/my_loss.py", "MyLoss"),
    ("C:/x/loss.py:L", "", "C:/x/loss.py", "L"),  # the last ':' separates the class
])
def test_a_reference_names_a_module_or_a_file_and_a_class(name, module, file, attr):
    ref = loss_reference(name)
    assert ref is not None and (ref.module, ref.file, ref.attr) == (module, file, attr)
    assert config(loss__name=name).loss.name == name


@pytest.mark.parametrize(("name", "message"), [
    ("nope", "loss.name must be one of align_uniform, dcl, dclw, dclw_exp, eqco, infonce, or your own loss as "
             "module:Class or path/to/file.py:Class; got 'nope'"),
    ("my losses:L", "before the ':' must come an importable module or a .py file"),
    ("my_losses:", "after the ':' must come a class or function name"),
    ("my_losses:class", "after the ':' must come a class or function name"),
    (".py:L", "before the ':' must come an importable module or a .py file"),
    ("import.x:L", "before the ':' must come an importable module or a .py file"),
])
def test_a_bad_reference_is_one_line(name, message):
    with pytest.raises(ConfigError, match=None) as err:
        config(loss__name=name)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("params", "message"), [
    ("[1]", "loss.params must be a JSON object"),
    ("{", "loss.params must be a JSON object such as"),
    ('{"a b": 1}', "is not a keyword argument name"),
    ('{"w": {"x": 1}}', "must be a number, string, boolean or null"),
    ('{"w": NaN}', "must be finite"),
    ('{"temperature": 1}', "loss.params: temperature is set by loss.temperature"),
    ("{" + '"w": 1, ' * 1000 + "}", "characters; at most 4096"),
    ('{"w": ' + "[" * 100 + "]" * 100 + "}", "w must be a number, string, boolean or null, got [[[[[[[...]]]]]]]"),
    # a RecursionError's traceback before; Python 3.12's parser follows it, to the check above (seen on a GPU machine)
    ('{"w": ' + "[" * 2000 + "]" * 2000 + "}", "loss.params"),
])
def test_bad_params_are_one_line(params, message):
    """One short line, whatever the value: a nested value's 4,000 characters were echoed whole."""
    with pytest.raises(ConfigError) as err:
        config(loss__name="my_losses:MyLoss", loss__params=params)
    assert message in str(err.value) and "\n" not in str(err.value) and len(str(err.value)) < 200, str(err.value)


def test_params_nested_too_deep_for_python_s_parser_say_so() -> None:
    """Where json's parser gives up (a RecursionError: Python 3.11), the line says why."""
    text = '{"w": ' + "[" * 2000 + "]" * 2000 + "}"
    try:
        json.loads(text)
    except RecursionError:
        with pytest.raises(ConfigError, match="it nests deeper than"):
            config(loss__name="my_losses:MyLoss", loss__params=text)
    else:
        pytest.skip("this Python's json parser follows 2,000 levels (3.12 and later)")


def test_params_go_to_a_user_loss_only():
    """A study comparing a user loss with DCL sets its params in the base config every trial shares."""
    cfg = config(loss__params='{"positive_weight": 0.5}')
    assert type(build_loss(cfg, derive(cfg))).__name__ == "DCLLoss"


def test_the_config_builds_the_user_loss_with_its_params_and_matches_its_reference():
    from planted_losses import positive_weighted_reference

    cfg = config(loss__name=SOUND, loss__params='{"positive_weight": 0.25}', loss__temperature=0.3)
    loss = build_loss(cfg, derive(cfg))
    assert type(loss).__name__ == "PositiveWeighted" and loss.positive_weight == 0.25
    assert loss.temperature == 0.3 and loss.gather_distributed is True
    z1, z2 = torch.randn(6, 5, dtype=torch.float64), torch.randn(6, 5, dtype=torch.float64)
    expected = positive_weighted_reference(z1, z2, 0.3, positive_weight=0.25)
    assert loss(z1, z2).loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_a_module_on_the_path_is_found_and_hashed(tmp_path, monkeypatch):
    (tmp_path / "my_losses.py").write_text(PLANTED.read_text())
    monkeypatch.syspath_prepend(str(tmp_path))
    cls = load_loss_class("my_losses:PositiveWeighted")
    assert cls.__module__ == "my_losses"
    path = loss_source_file(loss_reference("my_losses:PositiveWeighted"))
    assert path == (tmp_path / "my_losses.py").resolve()
    assert source_sha256(path) == source_sha256(PLANTED)
    monkeypatch.delitem(sys.modules, "my_losses")


def test_two_files_of_one_name_do_not_shadow_each_other(tmp_path):
    for folder, weight in (("a", 2.0), ("b", 3.0)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "loss.py").write_text(
            f"from dcl_core.losses import DCLLoss\nclass L(DCLLoss):\n    WEIGHT = {weight}\n")
    assert load_loss_class(f"{tmp_path}/a/loss.py:L").WEIGHT == 2.0
    assert load_loss_class(f"{tmp_path}/b/loss.py:L").WEIGHT == 3.0


@pytest.mark.parametrize(("source", "attr", "message"), [
    ("raise RuntimeError('boom')\n", "L", "importing {file} failed: RuntimeError: boom"),
    ("import sys\nsys.exit(3)\n", "L", "importing {file} failed: SystemExit: 3"),  # exit 3, silent, before
    ("import no_such_dependency_xyz\n", "L", "failed: ModuleNotFoundError: No module named 'no_such_dependency_xyz'"),
    ("def broken(:\n", "L", "failed: SyntaxError"),
    ("x = 1\n", "L", "has no L"),
    ("L = 3\n", "L", "L must be a subclass of dcl_core.losses.ContrastiveLoss, or an nn.Module whose constructor "
                    "takes temperature (another library's loss); got int 3"),
    ("class L:\n    pass\n", "L", "must be a subclass of dcl_core.losses.ContrastiveLoss"),
    ("from dcl_core.losses import ContrastiveLoss\nclass L(ContrastiveLoss):\n    pass\n", "L",
     "implements neither from_similarities(sims) nor forward(z1, z2)"),
])
def test_bad_user_code_is_one_line_naming_it(tmp_path, source, attr, message):
    file = tmp_path / "user_loss.py"
    file.write_text(source)
    with pytest.raises(InputError) as err:
        load_loss_class(f"{file}:{attr}")
    text = str(err.value)
    assert text.startswith(f"loss.name={file}:{attr}: ") and message.format(file=file) in text and "\n" not in text


def test_a_missing_file_or_module_is_one_line(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load_loss_class(f"{tmp_path}/absent.py:L")
    with pytest.raises(InputError, match="importing no_such_module_xyz failed: ModuleNotFoundError"):
        load_loss_class("no_such_module_xyz:L")
    with pytest.raises(InputError, match="no module named 'no_such_module_xyz' on the Python path"):
        loss_source_file(loss_reference("no_such_module_xyz:L"))


def test_a_loss_path_that_is_a_fifo_or_a_folder_says_what_it_is(tmp_path):
    """Issue 61, item 11: a loss path that is a FIFO or a folder said "no such file"; it says what is there, and the
    FIFO is never opened."""
    os.mkfifo(tmp_path / "fifo.py")
    (tmp_path / "folder.py").mkdir()
    with pytest.raises(InputError) as err:
        load_loss_class(f"{tmp_path}/fifo.py:L")
    assert str(err.value) == (f"loss.name={tmp_path}/fifo.py:L: {tmp_path}/fifo.py is a FIFO, not a Python file: "
                              "name the .py file that defines the loss")
    with pytest.raises(InputError) as err:
        load_loss_class(f"{tmp_path}/folder.py:L")
    assert str(err.value) == (f"loss.name={tmp_path}/folder.py:L: {tmp_path}/folder.py is a folder, not a Python "
                              "file: name the .py file that defines the loss")


def test_arguments_the_class_does_not_take_are_one_line_with_its_signature():
    with pytest.raises(InputError) as err:
        build_user_loss(SOUND, '{"weight": 1}', 0.1, False)
    assert ("PositiveWeighted(temperature=0.1, gather_distributed=False, positive_weight=1.0) does not take "
            "temperature, gather_distributed, weight (loss.params)") in str(err.value)
    with pytest.raises(InputError, match=r"PositiveWeighted\(\.\.\.\) failed: ValueError: math domain error|"
                                         r"PositiveWeighted\(\.\.\.\) failed"):
        build_user_loss(SOUND, '{"positive_weight": 1}', -1.0, False)


def _sources(name):
    """What check_user_losses returns for a study of ``name`` now, without its pre-flight (a process importing
    torch: seconds), for the resumes below; each test calls check_user_losses itself first."""
    from dcl_core.losses.user import loss_sources

    return (loss_sources(name),)


def _study(name):
    from dcl_core.study import StudySpec
    from search_spaces import Grid

    return StudySpec(name="tau", base=config(), grid={"loss.name": Grid(("dcl", name))}, x_key="loss.temperature",
                     x_label="tau")


def test_a_study_records_each_user_loss_source_and_refuses_a_resume_after_it_changed(tmp_path):
    """prepare() finds each user loss's file, its folder's sources and their hashes before Ray; the record holds
    them; a resume with a changed file is refused, one with the same file is not."""
    from dcl_core.study.plan.prepared import check_user_losses
    from dcl_core.study.plan.record import check_same_study, spec_fingerprint

    file = tmp_path / "my_losses.py"
    file.write_text(PLANTED.read_text())
    name = f"{file}:PositiveWeighted"
    spec = _study(name)
    (source,) = check_user_losses(spec)
    assert (source.name, source.file, source.root) == (name, str(file.resolve()), str(tmp_path.resolve()))
    assert source.files == (("my_losses.py", source_sha256(file)),)
    ran = spec_fingerprint(dataclasses.replace(spec, loss_sources=(source,)))
    assert ran["loss_sources"] == {name: source.digest}
    assert ran["loss_source_files"][name]["files"] == {"my_losses.py": source_sha256(file)}
    assert "loss_sources" not in spec_fingerprint(spec)  # a built-in study's record is as before
    check_same_study(dataclasses.replace(spec, loss_sources=_sources(name)), ran)
    file.write_text(PLANTED.read_text() + "\n# changed\n")
    changed = dataclasses.replace(spec, loss_sources=_sources(name))
    with pytest.raises(ConfigError, match=r"the source of .*PositiveWeighted changed since it ran \(my_losses\.py in"):
        check_same_study(changed, ran)


IMPL = """from dcl_core.losses import DCLLoss, LossOutput


class Scaled(DCLLoss):
    def from_similarities(self, sims):
        out = super().from_similarities(sims)
        return LossOutput(loss=SCALE * out.loss)


SCALE = {scale}
"""


@pytest.mark.parametrize("form", ["module", "file"])
def test_a_helper_module_that_changed_between_rounds_refuses_the_resume(tmp_path, monkeypatch, form):
    """Issue: the hash covered one file, so editing the package's impl.py between rounds was accepted and seed 1's
    trials trained another loss (loss 4520 beside 4.8) under the same name. Now the loss's package (a module
    reference) or its file's folder and packages (a file reference) are hashed, and the record names the file."""
    from dcl_core.study.plan.prepared import check_user_losses
    from dcl_core.study.plan.record import check_same_study, spec_fingerprint

    package = tmp_path / "mypkg"
    (package / "parts").mkdir(parents=True)
    (package / "__init__.py").write_text("from mypkg.impl import Scaled\n")
    (package / "impl.py").write_text(IMPL.format(scale=1.0))
    (package / "parts" / "__init__.py").write_text("")
    (tmp_path / "loss_file.py").write_text("from mypkg import Scaled\n")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "scratch.py").write_text("x = 1\n")  # not a package: nothing a loss file imports
    monkeypatch.syspath_prepend(str(tmp_path))
    name = "mypkg:Scaled" if form == "module" else f"{tmp_path / 'loss_file.py'}:Scaled"
    spec = _study(name)
    (source,) = check_user_losses(spec)
    expected = {"__init__.py", "impl.py", "parts/__init__.py"}
    if form == "file":
        expected = {"loss_file.py", *(f"mypkg/{f}" for f in expected)}
    assert {f for f, _ in source.files} == expected
    ran = spec_fingerprint(dataclasses.replace(spec, loss_sources=(source,)))
    (package / "parts" / "__init__.py").write_text("")  # rewritten, the same: the same study
    check_same_study(dataclasses.replace(spec, loss_sources=_sources(name)), ran)
    (package / "impl.py").write_text(IMPL.format(scale=1000.0))
    with pytest.raises(ConfigError, match=r"the source of .*Scaled changed since it ran \((mypkg/)?impl\.py in "):
        check_same_study(dataclasses.replace(spec, loss_sources=_sources(name)), ran)
    for module in [m for m in sys.modules if m == "mypkg" or m.startswith("mypkg.")]:
        monkeypatch.delitem(sys.modules, module)


def test_a_record_from_before_folder_hashing_resumes_while_the_loss_s_own_file_is_unchanged(tmp_path):
    from dcl_core.study.plan.prepared import check_user_losses
    from dcl_core.study.plan.record import check_same_study, spec_fingerprint

    file = tmp_path / "my_losses.py"
    file.write_text(PLANTED.read_text())
    name = f"{file}:PositiveWeighted"
    spec = _study(name)
    old = spec_fingerprint(dataclasses.replace(spec, loss_sources=check_user_losses(spec)))
    old["loss_sources"] = {name: source_sha256(file)}  # as such a record holds it: the file's own hash
    del old["loss_source_files"]
    (tmp_path / "helper.py").write_text("y = 2\n")  # a file the old record knew nothing of
    check_same_study(dataclasses.replace(spec, loss_sources=_sources(name)), old)
    file.write_text(PLANTED.read_text() + "\n# changed\n")
    with pytest.raises(ConfigError, match=r"changed since it ran \(my_losses\.py in"):
        check_same_study(dataclasses.replace(spec, loss_sources=_sources(name)), old)


def test_the_sources_a_loss_is_hashed_with_are_bounded(tmp_path, monkeypatch):
    from dcl_core.losses import user

    file = tmp_path / "my_losses.py"
    file.write_text(PLANTED.read_text())
    os.mkfifo(tmp_path / "pipe.py")  # never opened: not a regular file
    (tmp_path / "link.py").symlink_to("/dev/zero")
    assert {f for f, _ in user.loss_sources(f"{file}:PositiveWeighted").files} == {"my_losses.py"}
    monkeypatch.setattr(user, "MAX_SOURCES_BYTES", 100)
    with pytest.raises(InputError, match="the Python sources a loss is hashed with are over"):
        user.loss_sources(f"{file}:PositiveWeighted")
    monkeypatch.setattr(user, "MAX_SOURCE_FILES", 2)
    for i in range(3):
        (tmp_path / f"m{i}.py").write_text("")
    with pytest.raises(InputError, match="holds over 2 Python files; put the loss in a folder or package of its own"):
        user.loss_sources(f"{file}:PositiveWeighted")


def test_a_large_file_beside_a_loss_is_named_with_why_it_was_read(tmp_path, monkeypatch):
    """A loss's folder is hashed whole; a large generated .py beside it stopped the study with a line naming only
    that file. The line now says why it was read and what to do."""
    from dcl_core.losses import user

    file = tmp_path / "my_losses.py"
    file.write_text(PLANTED.read_text())
    monkeypatch.setattr(user, "MAX_SOURCE_BYTES", file.stat().st_size)
    assert user.loss_sources(f"{file}:PositiveWeighted").files  # the loss's own file at the cap: read
    (tmp_path / "table.py").write_text("x" * (file.stat().st_size + 1))
    with pytest.raises(InputError, match=r"table\.py: a loss's source file is over .* every Python source of "
                                         r".*: put the loss in a folder or package of its own\)$"):
        user.loss_sources(f"{file}:PositiveWeighted")
    (tmp_path / "table.py").unlink()
    file.write_text(PLANTED.read_text() + "\n")
    with pytest.raises(InputError, match=r"my_losses\.py: a loss's source file is over \d+ MiB$"):
        user.loss_sources(f"{file}:PositiveWeighted")


@pytest.mark.parametrize(("source", "message"), [
    ("import torch\nfrom dcl_core.losses import DCLLoss\nclass L(DCLLoss):\n"
     "    def from_similarities(self, sims):\n        raise RuntimeError('shape trouble')\n",
     "on a batch of 8 pairs it raised RuntimeError: shape trouble"),
    ("import sys\nfrom dcl_core.losses import DCLLoss\nclass L(DCLLoss):\n"
     "    def from_similarities(self, sims):\n        sys.exit(4)\n",
     "on a batch of 8 pairs it raised SystemExit: 4"),  # the study exited 4, silently, before
    ("import sys\nfrom dcl_core.losses import DCLLoss\nclass L(DCLLoss):\n"
     "    def __init__(self, **kw):\n        sys.exit('bye')\n",
     "L(...) failed: SystemExit: bye"),
    ("import torch\nfrom dcl_core.losses import DCLLoss, LossOutput\nclass L(DCLLoss):\n"
     "    def from_similarities(self, sims):\n        return LossOutput(loss=sims.pos.sum() * float('nan'))\n",
     "loss is nan (python -m dcl_core.losses check"),
    ("x = 1\n", "has no L"),
    # the pre-flight runs in a process of its own: a loss that ends it (os._exit) or kills it (a segfault) is
    # refused in one line; in the study's own process it had ended the study with status 0, or 139
    ("import os\nfrom dcl_core.losses import DCLLoss\nclass L(DCLLoss):\n"
     "    def __init__(self, **kw):\n        os._exit(0)\n",
     "the loss's code ended the check's process (exit status 0), as it was loaded, built and run"),
    ("import ctypes\nfrom dcl_core.losses import DCLLoss\nclass L(DCLLoss):\n"
     "    def from_similarities(self, sims):\n        ctypes.string_at(0)\n",
     "the check's process died of signal 11"),
])
def test_a_study_refuses_a_broken_user_loss_before_ray_starts(tmp_path, source, message):
    from dcl_core.study import StudySpec
    from dcl_core.study.plan.prepared import check_user_losses
    from search_spaces import Grid

    file = tmp_path / "bad_loss.py"
    file.write_text(source)
    spec = StudySpec(name="tau", base=config(), grid={"loss.name": Grid(("dcl", f"{file}:L"))},
                     x_key="loss.temperature", x_label="tau")
    with pytest.raises(InputError) as err:
        check_user_losses(spec)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_user_loss_that_hangs_is_refused_after_the_pre_flight_s_time_bound(tmp_path, monkeypatch):
    from dcl_core.losscheck import isolation
    from dcl_core.study import StudySpec
    from dcl_core.study.plan.prepared import check_user_losses
    from search_spaces import Grid

    monkeypatch.setattr(isolation, "STEP_TIMEOUT_S", 3.0)  # the study's bound (120 s), shortened
    spec = StudySpec(name="tau", base=config(), grid={"loss.name": Grid(("dcl", f"{PLANTED}:Hangs"))},
                     x_key="loss.temperature", x_label="tau")
    with pytest.raises(InputError, match=r"no result within 3 s: the loss's code did not return, as it was loaded"):
        check_user_losses(spec)
