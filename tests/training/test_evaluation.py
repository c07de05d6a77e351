"""kNN monitor and linear probe on a run's data (dcl_core.training.probes), against the pure functions."""

import torch
import torch.nn.functional as F
from torch import nn

from dcl_core.eval import LINEAR_PRESETS, knn_top1, linear_probe
from dcl_core.training.probes import evaluate_knn, linear_eval


class TwoClusters:
    """A :class:`~dcl_core.training.builders.TrainingData` stand-in: two separated Gaussian clusters in 8-d."""

    num_classes = 2

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = {}, {}
        for split, n in (("bank", 40), ("test", 20)):
            y = torch.arange(n) % 2
            centre = torch.zeros(n, 8)
            centre[:, 0] = 4.0 * (2 * y - 1)  # +-4 along the first axis
            self.x[split], self.y[split] = centre + torch.randn(n, 8, generator=g), y

    def features(self, backbone, split, batch_size, device, normalize=True):
        f = backbone(self.x[split].to(device)).cpu()
        return F.normalize(f, dim=1) if normalize else f

    def labels(self, split):
        return self.y[split]


def test_evaluate_knn_is_knn_top1_on_normalized_bank_and_test_features():
    data, backbone = TwoClusters(), nn.Identity()
    top1 = evaluate_knn(backbone, data, k=5, temperature=0.1, batch_size=16, device=torch.device("cpu"))
    bank, test = F.normalize(data.x["bank"], dim=1), F.normalize(data.x["test"], dim=1)
    assert top1 == knn_top1(test, data.y["test"], bank, data.y["bank"], 2, k=5, temperature=0.1) == 100.0


def test_linear_eval_is_the_preset_probe_on_raw_features():
    data, backbone = TwoClusters(), nn.Identity()
    res = linear_eval(backbone, data, preset="smoke", seed=3, batch_size=16, device=torch.device("cpu"))
    ref = linear_probe(data.x["bank"], data.y["bank"], data.x["test"], data.y["test"], 2,
                       LINEAR_PRESETS["smoke"], seed=3, device=torch.device("cpu"))
    assert res == {"eval/linear_top1": ref["linear_top1"], "eval/linear_train_top1": ref["linear_train_top1"]}
    assert res["eval/linear_top1"] == 100.0
