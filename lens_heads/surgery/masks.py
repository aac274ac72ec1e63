"""Freezing and gradient masks: only the edited slices of a surgery plan can change.

Tensors with no edited slice get ``requires_grad=False`` (autograd then neither computes nor
stores their gradients -- the main saving over a full fine-tune). Tensors holding an edited
slice keep ``requires_grad=True`` with a tensor hook that multiplies their gradient by a 0/1
mask, so the untouched rows/columns get exactly zero gradient. With AdamW and weight decay 0,
a zero gradient gives an exactly zero update (m = v = 0), so they stay bit-identical.
(Weight decay would move them anyway: AdamW decays every parameter whatever its gradient; docs/methods.md §7.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lens_heads.surgery.reinit import SurgeryPlan, named_params


@dataclass
class MaskedParams:
    names: list[str]
    params: list[torch.nn.Parameter]
    masks: dict[str, torch.Tensor]
    handles: list = field(default_factory=list)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()


def freeze_and_mask(hf_model, plan: SurgeryPlan) -> MaskedParams:
    """Freeze everything but the plan's tensors and mask those tensors' gradients."""
    params = named_params(hf_model)
    trainable = set(plan.trainable_names)
    seen: dict[int, str] = {}
    for name, p in params.items():
        p.requires_grad_(False)
        seen.setdefault(id(p), name)
    out = MaskedParams([], [], {})
    for name in plan.trainable_names:
        p = params[name]
        if seen[id(p)] != name and seen[id(p)] in trainable:
            continue  # a tied alias of a tensor already handled
        p.requires_grad_(True)
        mask = plan.mask(name, p.detach())
        out.names.append(name)
        out.params.append(p)
        out.masks[name] = mask
        out.handles.append(p.register_hook(lambda grad, mask=mask: grad * mask))
    return out
