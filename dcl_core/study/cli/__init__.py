"""The study layer's command lines, one module a command: a study script's (:mod:`.script`, its options declared
once in :mod:`.options`), ``python -m dcl_core.study answer``, ``sync``, ``export`` and ``calibrate``, and the EqCo MI
toy's (:mod:`.mi_toy_command`)."""
