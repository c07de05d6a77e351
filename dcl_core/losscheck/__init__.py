"""The check of a loss (``python -m dcl_core.losses check LOSS``): the properties the built-in losses are tested
for, run on any loss, each a row with the error it measured and its tolerance; docs/own-loss.md says what each
catches and what a pass does not cover.

- ``contract`` (:mod:`.properties`): ``loss(z1, z2)`` returns a :class:`~dcl_core.losses.base.LossOutput` whose
  ``loss`` is a finite 0-d float tensor with a gradient, with finite detached diagnostics: what the trainer reads.
- ``finite fp32`` / ``finite bf16``: finite at each τ on adversarial embeddings (and under ``no_grad``); under CPU
  bf16 autocast, close to fp32 on the same rounded embeddings.
- ``permutation``: the batch permuted alike in both views gives the same loss and the permuted gradients.
- ``gradient``: autograd against float64 central differences at each τ, on spread and nearly saturated embeddings.
- ``layout``, ``excluded``, ``frameworks`` (:mod:`.layout`): the loss depends on the negatives it is handed and on
  nothing else of the matrix that holds them, in SimCLR's matrix and in MoCo's, NNCLR's and SiMo's.
- ``reference`` (:mod:`.reference`, with ``--reference``): value and gradient against a plain-loop transcription.
- ``ddp`` (:mod:`.ddp`): 2 gloo processes with half the batch each equal one process on the full batch.

:mod:`.suite` runs them in order in this process; :mod:`.isolation` runs them in a child process with a time bound
each, as the command does, so that the user's code can neither exit nor hang it into a false success.
"""
