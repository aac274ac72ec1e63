"""lm-eval-exact scoring under an intervention: the evaluation protocol (``protocol``: BOS,
chat template, threshold rule), multiple-choice accuracy and perplexity on the engine
(``evaluate``), lm-eval's rolling perplexity tasks (``rolling``) and lens_heads as an lm-eval
model (``lm_eval_model``, imported only when used: lm-eval is optional).

May import: the root modules, ``files``, ``data``, ``models``, ``forward``, ``scores`` and
``interventions``. Imported by: results, sweep and the wings above them.
"""
