"""A study on Ray Tune: the Tuners, resume and overwrite (:mod:`.tuning`), one trial (:mod:`.trainable`), what a
study sets in Ray's environment (:mod:`.ray_env`), its search spaces as Tune and Optuna take them
(:mod:`.space_translation`), the console's progress line (:mod:`.console`), a prepared study's run and the rounds
of ``--until-resolved`` (:mod:`.rounds`), the results rows and the summary (:mod:`.results`, what a search found in
:mod:`.search_findings`), re-analysis from stored rows (:mod:`.reanalysis`) and the EqCo MI toy
(:mod:`.mi_toy_runs`)."""
