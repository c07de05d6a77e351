"""The example loss of docs/own-loss.md (my_losses.py's PositiveWeighted) as a plain loop over the anchors.

For ``python -m dcl_core.losses check ... --reference docs/examples/my_losses_reference.py:positive_weighted``:

    L_i = -s⁺/τ + log(w·exp(s⁺/τ) + Σ_n exp(s_n/τ))

for each of the 2N anchors (both views of each image), its positive the other view of the same image and its
negatives every view of every other image (2N − 2 of them), averaged. No vectorised helper of the project is used:
what the loss computes with a masked matrix, this computes one anchor and one negative at a time, so the two share
no mistake. The checker calls it on float64 inputs; exp without a max shift is fine there down to τ ≈ 0.002.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def positive_weighted(z1: Tensor, z2: Tensor, temperature: float, positive_weight: float = 1.0) -> Tensor:
    """The mean over the 2N anchors of -s⁺/τ + log(w·e^{s⁺/τ} + Σ_n e^{s_n/τ})."""
    views = [F.normalize(z1, dim=1), F.normalize(z2, dim=1)]
    n = z1.shape[0]
    terms = []
    for v in range(2):  # the anchor's view
        for i in range(n):  # the anchor's image
            anchor, positive = views[v][i], views[1 - v][i]
            s_pos = anchor @ positive / temperature
            denominator = positive_weight * torch.exp(s_pos)
            for w in range(2):
                for j in range(n):
                    if j != i:  # every view of every other image is a negative; image i's own two views are not
                        denominator = denominator + torch.exp(anchor @ views[w][j] / temperature)
            terms.append(torch.log(denominator) - s_pos)
    return torch.stack(terms).mean()
