"""What a study is and what it would cost, all checked before Ray starts: the spec (:mod:`.spec`), its options
(:mod:`.args`, :mod:`.run_options`), its plan (:mod:`.study_plan`), the study script
(:mod:`.script`: its spec built once), the study scripts' presets
(:mod:`.study_presets`), storage URIs, locks and the summary folder (:mod:`.storage`), what a study records to be
resumed (:mod:`.record`), how its tables and figures are written (:mod:`.writers`), the checks of data and options
(:mod:`.checks`), the cost estimate (:mod:`.cost`, :mod:`.flops`) and ``--dry-run`` (:mod:`.dry_run`). No Ray,
MLflow or Optuna."""
