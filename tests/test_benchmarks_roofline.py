"""The roofline's verdict: a ratio against a peak cannot exceed 1, and such a ratio never passes."""

from benchmarks.roofline import judge


def test_a_ratio_above_the_peak_is_a_measurement_error_not_a_pass():
    met, note = judge(147.0)  # a step "at 147x" a bf16 GEMM that ran at 0.27 GFLOP/s (no native bf16)
    assert met is False and "measurement error" in note


def test_the_goal_is_half_the_best_measured_rate():
    assert judge(0.5) == (True, "") and judge(0.99) == (True, "") and judge(0.49) == (False, "")
