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
