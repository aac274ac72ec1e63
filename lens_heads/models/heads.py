"""Heads as values: ``Head`` = (layer, head), the one head-list parser and printer."""

from __future__ import annotations

import re

from lens_heads.errors import LensHeadsError

Head = tuple[int, int]

_HEAD = re.compile(r"^\s*[Ll]?\s*(-?[0-9]{1,9})\s*\.\s*[Hh]?\s*(-?[0-9]{1,9})\s*$")  # ASCII digits, int() takes them


def parse_heads(text: str, geometry=None) -> list[Head]:
    """``"3.1,4.2"`` (or ``"L3.H1,L4.H2"``) -> [(3, 1), (4, 2)], in the order given, duplicates
    kept; each checked against ``geometry`` when one is given (else only the syntax)."""
    heads: list[Head] = []
    for item in str(text).split(","):
        if not item.strip():
            continue
        m = _HEAD.match(item)
        if not m:
            raise LensHeadsError(f"bad head {item.strip()!r}: write heads as LAYER.HEAD, e.g. 3.1,4.2")
        layer, head = int(m.group(1)), int(m.group(2))
        if geometry is not None:
            geometry.check_head(layer, head)
        heads.append((layer, head))
    if not heads:
        raise LensHeadsError("empty head list: give heads as LAYER.HEAD,LAYER.HEAD")
    return heads


def format_heads(heads) -> str:
    return ",".join(f"{L}.{h}" for L, h in heads)
