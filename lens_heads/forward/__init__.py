"""Every forward pass lens_heads runs, and what it reads or writes at a head: the engine
(``engine.forward``: hooks, prefix reuse, packing, row scoring), what goes in (``packing``, a
task's requests in ``task_requests``), and per-head values a forward captures or substitutes
(attention patterns in ``activations``; what an ablated head becomes in ``replacement``).

Floor 3 of docs/architecture.md. May import: the root modules, ``files``, ``data`` and
``models``. Imported by: ``scores`` and every wing above it.
"""
