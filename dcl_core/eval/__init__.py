"""Evaluation of frozen backbones: feature extraction, weighted kNN monitor and linear probe."""

from dcl_core.eval.features import extract_features
from dcl_core.eval.knn import knn_predict, knn_top1
from dcl_core.eval.linear import LINEAR_PRESETS, LinearProtocol, linear_probe

__all__ = ["LINEAR_PRESETS", "LinearProtocol", "extract_features", "knn_predict", "knn_top1", "linear_probe"]
