"""Which heads change and how: typed ablation specs, values only (``specs``: one parser, one
printer, the ``SPEC_KINDS`` registry), their runtime side (``ablation.bind``: hooks on
``hook_z`` and counts) and the score thresholds that turn a target fraction into a spec
(``thresholds``).

Floor 5 of docs/architecture.md. May import: the root modules, ``files``, ``data``, ``models``,
``forward`` and ``scores``. Imported by: ``evaluation``, ``surgery`` and every wing above them.
"""
