"""What an Optuna search found: the best configuration per series and Optuna's own history/importance plots.

Each search runs inside Ray Tune (``OptunaSearch``); the finished trials are replayed into an in-memory
``optuna.Study`` (``optuna.trial.create_trial``) so Optuna's matplotlib visualizations draw them, whatever
process or cluster ran the search.
"""

from __future__ import annotations

import functools
import logging
import re
import warnings
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna

from dcl_core.files import write_with
from dcl_core.study.analysis.columns import EPOCHS, KNN_TOP1, SERIES, STATUS, TRIAL_ID, Row, Status
from dcl_core.study.analysis.figures import pyplot
from dcl_core.study.execution.space_translation import optuna_distributions
from search_spaces import Space

log = logging.getLogger(__name__)


def replay_study(rows: Sequence[Row], space: Space, name: str = "search") -> Any:
    """An Optuna study holding the rows' trials in creation order (failed trials as FAIL)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    distributions = optuna_distributions(space)
    study = optuna.create_study(direction="maximize", study_name=name)
    for r in sorted(rows, key=lambda r: str(r.get(TRIAL_ID))):
        config = r.get("config") or {}
        params = {k: config[k] for k in distributions if k in config}
        dists = {k: distributions[k] for k in params}
        ok = r[STATUS] == Status.OK and r.get(KNN_TOP1) is not None
        state = optuna.trial.TrialState.COMPLETE if ok else optuna.trial.TrialState.FAIL
        study.add_trial(optuna.trial.create_trial(params=params, distributions=dists, state=state,
                                                  value=float(r[KNN_TOP1]) if ok else None))
    return study


def best_rows(rows: Sequence[Row], series: str = SERIES) -> dict[str, Row]:
    """The best finished trial (final kNN top-1) per series."""
    best: dict[str, Row] = {}
    for r in rows:
        if r[STATUS] != Status.OK or r.get(KNN_TOP1) is None:
            continue
        if r[series] not in best or r[KNN_TOP1] > best[r[series]][KNN_TOP1]:
            best[r[series]] = r
    return best


def format_best(rows: Sequence[Row], space: Space, series: str = SERIES) -> str:
    """``best dcl: kNN 45.1% at loss.temperature=0.2, optim.base_lr=0.07`` per series (DCL Table 3's pair)."""
    keys = list(optuna_distributions(space))
    lines = []
    for name, r in sorted(best_rows(rows, series).items()):
        config = r.get("config") or {}
        pairs = ", ".join(f"{k}={config[k]:.4g}" for k in keys if isinstance(config.get(k), float))
        lines.append(f"best {name}: kNN top-1 {r[KNN_TOP1]:.2f}% at {pairs}")
    return "\n".join(lines)


def write_search_plots(rows: Sequence[Row], space: Space, out_dir: Path, series: str = SERIES) -> list[Path]:
    """Optuna's optimisation-history and hyperparameter-importance plots, one pair per series."""
    plt = pyplot()
    from matplotlib.figure import Figure  # after pyplot(): it chose the backend
    from optuna.visualization import matplotlib as ovm  # matplotlib and scipy: only a search draws these

    groups: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        groups[r[series]].append(r)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for name, members in sorted(groups.items()):
        slug = re.sub(r"[^\w.-]+", "_", str(name))
        study = replay_study(members, space, name=str(name))
        completed = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            for kind, draw, needed in (("history", ovm.plot_optimization_history, 1),
                                       ("importance", ovm.plot_param_importances, 2)):
                if len(completed) < needed or (kind == "importance" and not study.best_params):
                    continue
                try:
                    ax = draw(study)
                except (ValueError, RuntimeError) as err:  # e.g. importance of a parameter with one value
                    log.warning("no Optuna %s plot for %s: %s", kind, name, err)
                    continue
                title = ax.get_title(loc="left") or ax.get_title()
                ax.set_title("")
                ax.set_title(f"{title}: {name}", loc="left")
                path = out_dir / f"optuna_{kind}_{slug}.png"
                fig = ax.figure
                assert isinstance(fig, Figure)  # optuna draws on a figure of its own, not a subfigure
                fig.set_size_inches(6, 4)
                fig.tight_layout()
                try:  # atomically, never through a link planted at the name
                    write_with(path, functools.partial(fig.savefig, format="png", dpi=120))
                finally:
                    plt.close(fig)
                files.append(path)
    return files


def best_per_cell(rows: Sequence[Row], x_key: str, series: str = SERIES) -> list[Row]:
    """The best finished trial of each (series, x) cell: a searched study's table shows tuned cells."""
    best: dict[tuple[Any, Any], Row] = {}
    for r in rows:
        key = (r[series], r[x_key])
        ok = r[STATUS] == Status.OK and r.get(KNN_TOP1) is not None
        cur = best.get(key)
        if cur is None or (ok and (cur[STATUS] != Status.OK or cur.get(KNN_TOP1) is None
                                   or r[KNN_TOP1] > cur[KNN_TOP1])):
            best[key] = r
    return list(best.values())


def format_trials(rows: Sequence[Row], space: Space, series: str = SERIES, top: int = 10) -> str:
    """Each series' best ``top`` trials (kNN top-1 and the sampled values), best first."""
    keys = list(optuna_distributions(space))
    lines = []
    groups: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        groups[r[series]].append(r)
    for name, members in sorted(groups.items()):
        ok = sorted((r for r in members if r[STATUS] == Status.OK and r.get(KNN_TOP1) is not None),
                    key=lambda r: -r[KNN_TOP1])
        failed = len(members) - len(ok)
        lines.append(f"{name}: {len(members)} trials" + (f" ({failed} failed or stopped)" if failed else ""))
        lines.append("  " + "kNN top-1".rjust(10) + "".join(f"{k:>20}" for k in keys) + "epochs".rjust(8))
        for r in ok[:top]:
            config = r.get("config") or {}
            values = "".join(f"{config.get(k, float('nan')):>20.4g}" if isinstance(config.get(k), float)
                             else f"{config.get(k)!s:>20}" for k in keys)
            lines.append("  " + f"{r[KNN_TOP1]:10.2f}" + values + f"{r.get(EPOCHS) or 0:>8}")
    return "\n".join(lines)
