"""Does EqCo make the InfoNCE mutual-information bound independent of the number of negatives? (EqCo Table 5)

EqCo's toy: X ~ N(0, I_20), Y = ρX + √(1−ρ²)ε with true MI −(d/2)·log(1−ρ²) ∈ {2, 4, 6, 8, 10}; two MLPs (one
hidden layer of 256, ReLU) trained with Adam (lr 5e-4, 5000 steps) on batches of K ∈ {64, 128, 256, 512} pairs,
with InfoNCE or EqCo (α = 512); the bound is averaged over 1000 fresh batches. InfoNCE's estimate is capped at
log K and grows with K; EqCo's stays put. Prints our table beside the paper's and logs it (CSV, Parquet, plot)
to MLflow as the study's summary run. The verdict (slope of I_NCE − I_EqCo per doubling of K at the largest true
MI) trains 3 critics per cell there, from different seeds, and takes a t-interval over their slopes: the variance
of training a critic is in it, not only that of the evaluation batches.

    python studies/eqco_mi_toy.py            # the paper's full scale on CPU: 56 runs x 5000 steps
    python studies/eqco_mi_toy.py --preset paper  # the paper's protocol exactly: one critic per cell (40 runs)
    python studies/eqco_mi_toy.py --smoke    # seconds, for tests
    python studies/eqco_mi_toy.py --dry-run  # the runs and their estimated time (times a few steps), no Ray
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dcl_core.study.analysis.paper import PAPER_KS
from dcl_core.study.cli.mi_toy_command import toy_main

# seeds: critics trained per cell at the largest true MI, where the verdict is asked (each seed's slope is one
# draw of training a critic); the other MIs reproduce Table 5 with one critic each.
# The paper's toy is CPU-sized: ``cpu`` (the default) is its full protocol plus the extra critics the verdict's
# interval needs; ``paper`` is the protocol exactly (one critic per cell).
PRESETS = {
    "smoke": dict(mis=(2, 6), ks=(64, 128), steps=60, repeats=10, seeds=2),
    "cpu": dict(mis=(2, 4, 6, 8, 10), ks=PAPER_KS, steps=5000, repeats=1000, seeds=3),
    "paper": dict(mis=(2, 4, 6, 8, 10), ks=PAPER_KS, steps=5000, repeats=1000, seeds=1),
}


def main(argv=None) -> int:
    """Run the MI toy study from the command line; the exit status."""
    return toy_main(__doc__, PRESETS, argv)


if __name__ == "__main__":
    sys.exit(main())
