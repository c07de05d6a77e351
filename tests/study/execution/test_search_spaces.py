"""Search spaces are data; every key they can produce must be a valid config key of the right type."""

import pickle

import optuna
import pytest

from dcl_core.config import CONFIG_KEYS, Config, apply_overrides
from dcl_core.study.execution.space_translation import to_optuna, to_tune
from search_spaces import (
    ALPHA,
    LR,
    PAPER_TAU_GRID,
    SIGMA,
    SPACES,
    TAU,
    Conditional,
    Grid,
    LogUniform,
    keys_of,
)


@pytest.mark.parametrize("name", sorted(SPACES))
def test_every_key_a_space_can_produce_is_a_config_key(name):
    space = SPACES[name]
    keys = keys_of(space)
    assert keys and keys <= set(CONFIG_KEYS), keys - set(CONFIG_KEYS)

    # ... and every value it can produce is accepted by the config (bounds and grid values).
    def values(dist):
        if isinstance(dist, LogUniform):
            return [dist.low, dist.high]
        if isinstance(dist, Grid):
            return list(dist.values)
        return [dist]

    def visit(sub):
        for key, dist in sub.items():
            if isinstance(dist, Conditional):
                visit(dist.params)
            else:
                for v in values(dist):
                    base = {"loss.name": "eqco"} if key == "loss.alpha" else {}
                    apply_overrides(Config(), {**base, key: v})

    visit(space)


def test_paper_grid_is_table_18():
    assert PAPER_TAU_GRID == (0.07, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
    assert to_tune({"loss.temperature": Grid(PAPER_TAU_GRID)}) == {
        "loss.temperature": {"grid_search": list(PAPER_TAU_GRID)}
    }


def test_conditional_parameters_only_for_their_loss():
    space = {**TAU, **LR, **SIGMA, **ALPHA}
    for loss, extra in (("dcl", set()), ("dclw", {"loss.sigma"}), ("eqco", {"loss.alpha"})):
        study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0))
        define = to_optuna(space, {"loss.name": loss, "seed": 3})
        for _ in range(3):
            trial = study.ask()
            constants = define(trial)
            assert constants == {"loss.name": loss, "seed": 3}
            assert set(trial.params) == {"loss.temperature", "optim.base_lr"} | extra
            assert 0.05 <= trial.params["loss.temperature"] <= 1.0
            cfg = apply_overrides(Config(), {**constants, **trial.params})  # a valid config every time
            assert cfg.loss.name == loss
            study.tell(trial, 1.0)


def test_optuna_sampling_is_seeded():
    def sample(seed):
        study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed))
        define = to_optuna(TAU)
        out = []
        for _ in range(4):
            t = study.ask()
            define(t)
            out.append(t.params["loss.temperature"])
            study.tell(t, 0.0)
        return out

    assert sample(0) == sample(0) and sample(0) != sample(1)


def test_conditional_space_rejected_for_plain_tune():
    with pytest.raises(ValueError, match="conditional"):
        to_tune(SIGMA)


def test_define_by_run_function_pickles():
    # Tune pickles the searcher (and this function) with the experiment state so studies can resume.
    define = pickle.loads(pickle.dumps(to_optuna({**TAU, **SIGMA}, {"loss.name": "dclw"})))
    trial = optuna.create_study().ask()
    assert define(trial) == {"loss.name": "dclw"} and set(trial.params) == {"loss.temperature", "loss.sigma"}
