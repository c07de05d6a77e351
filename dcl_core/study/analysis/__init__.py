"""A study's answer as pure functions of its results rows: the intervals (:mod:`.intervals`), sequential designs
(:mod:`.sequential`) and verdicts (:mod:`.verdicts`), what each question measures (:mod:`.measures`), the questions
and answers (:mod:`.answer`, as text, metrics and tags in :mod:`.answer_output`), the papers' numbers
(:mod:`.paper`), the intervals checked on simulated studies (:mod:`.calibration`), the results table's columns
(:mod:`.columns`), tables and figures (:mod:`.report`, colours in :mod:`.colours`) and the EqCo MI toy's table
and figure (:mod:`.mi_toy_answer`). Nothing here imports Ray, MLflow or Optuna, or writes a file: a figure comes back
unsaved, and :mod:`dcl_core.study.plan.writers` writes it."""
