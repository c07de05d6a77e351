"""dcl_core.study.plan.record: one comparison of a study's recorded fingerprint with its spec now
(study_changes), read by --resume (which takes more seeds) and by re-analysis (which exempts the data folder),
each with its own messages."""

import re
from pathlib import Path

import pytest

from dcl_core.config import ConfigError, preset
from dcl_core.study import StudySpec
from dcl_core.study.execution.reanalysis import _check_same_study
from dcl_core.study.plan.record import StudyChange, check_same_study, spec_fingerprint, study_changes
from dcl_core.study.plan.spec import with_base
from search_spaces import Grid


def spec(seeds=(0,), losses=("dcl",)):
    return StudySpec(name="s", base=preset("smoke"), x_key="loss.temperature", x_label="tau",
                     grid={"loss.name": Grid(losses), "seed": Grid(seeds), "loss.temperature": Grid((0.1,))})


def test_study_changes_in_order_with_exempt_keys():
    before = spec_fingerprint(spec())
    now = spec_fingerprint(with_base(spec(losses=("dcl", "infonce")), {"optim.epochs": 3, "data.root": "/x"}))
    changes = study_changes(before, now)
    assert {(c.part, c.key) for c in changes[:2]} == {("base", "data.root"), ("base", "optim.epochs")}
    assert [c.part for c in changes] == ["base", "base", "grids"]  # base keys first, as the checks report them
    assert StudyChange("base", "optim.epochs", 2, 3) in changes
    assert all(c.key != "data.root" for c in study_changes(before, now, exempt=("data.root",)))
    assert study_changes(before, spec_fingerprint(spec())) == []


def test_resume_and_reanalysis_keep_their_own_messages():
    before = spec_fingerprint(spec())
    assert check_same_study(spec(seeds=(0, 1, 2)), before) == (1, 2)  # more seeds: the one change a resume takes
    for changed, needle in ((with_base(spec(), {"optim.epochs": 3}), re.escape(
                             "--resume must run the study it continues: optim.epochs was 2, now 3")),
                            (spec(seeds=(1,)), "can add seeds, not drop them"),
                            (spec(losses=("dcl", "infonce")), "its grids changed")):
        with pytest.raises(ConfigError, match=needle):
            check_same_study(changed, before)
    path = Path("/out/summary/s/study_options.json")
    _check_same_study(with_base(spec(), {"data.root": "/elsewhere"}), {"spec": before}, path)  # exempt
    _check_same_study(spec(seeds=(0, 1)), {}, path)  # nothing recorded: nothing to compare
    with pytest.raises(ConfigError, match=re.escape("--reanalyze must describe the study that ran in /out/summary/s: "
                                                    "optim.epochs was 2, now 3")):
        _check_same_study(with_base(spec(), {"optim.epochs": 3}), {"spec": before}, path)
    with pytest.raises(ConfigError, match="its grids differ"):
        _check_same_study(spec(seeds=(0, 1)), {"spec": before}, path)  # re-analysis takes no added seeds


def test_a_resume_in_a_moved_folder_is_refused_only_when_the_folder_s_own_paths_matter(tmp_path):
    """--resume in a folder moved or copied from where the study ran: refused (one line, with what works here) when
    the study used the folder's own MLflow store or Tune storage, whose absolute paths point at the old place; a
    study with an MLflow server and storage elsewhere resumes from any folder."""
    import json

    from dcl_core.study.plan.record import check_not_moved, read_recorded
    from dcl_core.study.plan.storage import default_tracking_uri

    def check(out):
        check_not_moved(read_recorded(out, "s"), out, "s")

    def record(out, **options):
        d = out / "summary" / "s"
        d.mkdir(parents=True)
        (d / "study_options.json").write_text(json.dumps(options))
        return out.resolve()

    old = tmp_path / "old"
    here = record(tmp_path / "a", output_dir=str(old), tracking_uri=default_tracking_uri(old),
                  storage=str(old / "ray_results"))
    with pytest.raises(ConfigError, match=f"ran in {old} and this folder is a move or copy") as err:
        check(here)
    assert f"python -m dcl_core.study answer {here} --name s --tracking-uri sqlite:///{here}/mlflow-here.db" in str(
        err.value) and "\n" not in str(err.value)
    own_storage = record(tmp_path / "b", output_dir=str(old), tracking_uri="http://mlflow:5000",
                         storage=str(old / "ray_results"))
    with pytest.raises(ConfigError, match="move or copy"):
        check(own_storage)
    check(record(tmp_path / "c", output_dir=str(old), tracking_uri="http://mlflow:5000",
                 storage="s3://bucket/studies"))  # nothing of the old folder: resumes here
    check(record(tmp_path / "d", output_dir=str((tmp_path / "d").resolve())))  # not moved
    planted = record(tmp_path / "e", output_dir="/old\x1b[2J", tracking_uri=default_tracking_uri(Path("/old\x1b[2J")))
    with pytest.raises(ConfigError, match="ran in another folder"):
        check(planted)
