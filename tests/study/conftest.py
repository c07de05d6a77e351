"""Fixtures the study tests share."""

from typing import Any

import pytest


class FakeTrial:
    """What MLflowTrialCallback reads of a Tune trial."""

    def __init__(self, trial_id: str, config: dict) -> None:
        self.trial_id, self.config = trial_id, config
        self.last_result: dict = {}
        self.checkpoint = None

    def __str__(self) -> str:
        return f"trial_{self.trial_id}"


@pytest.fixture
def fake_trial() -> Any:
    """Makes stand-ins for Tune trials: ``fake_trial(trial_id, config)``."""
    return FakeTrial
