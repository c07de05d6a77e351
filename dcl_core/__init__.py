"""Decoupled Contrastive Learning (DCL) and EqCo: losses, frameworks, training, evaluation and the study platform."""
