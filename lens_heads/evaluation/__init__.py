"""lm-eval-exact scoring under an intervention: the evaluation protocol (``protocol``: BOS,
chat template, threshold rule), multiple-choice accuracy and perplexity on the engine
(``evaluate``), lm-eval's rolling perplexity tasks (``rolling``), what an evaluation cost
(``timing``: wall and CPU seconds) and lens_heads as an lm-eval model (``lm_eval_model``,
imported only when used: lm-eval is optional).

Floor 6 of docs/architecture.md. May import: the wings below it (the root modules, ``files``,
``data``, ``models``, ``forward``, ``scores``, ``interventions``), not ``surgery`` on its floor.
Imported by: ``results`` and every wing above it.
"""
