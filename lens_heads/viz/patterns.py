"""Per-head attention patterns as circuitsvis views that render with no network.

``AttentionView.of(patterns)`` wraps the [head, q, k] patterns that
``activations.head_patterns`` captured in a circuitsvis ``AttentionHeads`` view; it reads
them and computes nothing. The view carries the circuitsvis JavaScript bundle
inline (``local_src``), never the CDN version, so it works from a file on an offline machine.
A report can place several views on one page and inline the ~1.3 MB bundle once
(``bundle_script()`` + ``view.mount_html()``).
"""

from __future__ import annotations

import html
import os
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np
from jaxtyping import Float

from lens_heads.files.atomic import atomic_write_text
from lens_heads.errors import LensHeadsError
from lens_heads.interventions.specs import Head
from lens_heads.interventions.specs import parse_heads  # noqa: F401  (the one head-list grammar, re-exported)

if TYPE_CHECKING:
    from lens_heads.forward.activations import HeadPatterns



def head_label(layer: int, head: int) -> str:
    return f"L{layer}.H{head}"


def bundle_js() -> str:
    """The circuitsvis IIFE bundle (defines the global ``CircuitsVis``), safe to inline."""
    import circuitsvis

    path = Path(circuitsvis.__file__).parent / "dist" / "cdn" / "iife.js"
    return path.read_text(encoding="utf-8").replace("</script>", "")


def bundle_script() -> str:
    """One ``<script>`` tag holding the bundle: put it once, before any ``mount_html()``."""
    return f"<script>{bundle_js()}</script>"


def _safe_json(props: str) -> str:
    """JSON that cannot close the surrounding <script> tag (``</`` -> ``<\\/``, same JS value)."""
    return props.replace("</", "<\\/").replace("<!--", "<\\!--")


@dataclass
class AttentionView:
    """Attention patterns of some heads on one text, as a circuitsvis ``AttentionHeads`` view."""

    tokens: list[str]
    patterns: Float[np.ndarray, "head q k"]
    heads: list[Head]
    names: list[str]
    text: str = ""
    model_name: str = ""
    dom_id: str = field(default_factory=lambda: "lh-cv-" + uuid.uuid4().hex[:12])

    @classmethod
    def of(cls, patterns: "HeadPatterns", titles: Mapping[Head, str] | Sequence[str] | None = None) -> "AttentionView":
        """The view of captured patterns; ``titles`` adds text to each head's name, from a
        mapping (layer, head) -> text or a list parallel to the heads."""
        heads = list(patterns.heads)
        if isinstance(titles, Mapping):
            extra = [titles.get(hd, "") for hd in heads]
        elif titles is not None:
            extra = list(titles)
            if len(extra) != len(heads):
                raise LensHeadsError(f"{len(extra)} titles for {len(heads)} heads")
        else:
            extra = [""] * len(heads)
        names = [head_label(*hd) + (f" | {t}" if t else "") for hd, t in zip(heads, extra)]
        return cls(list(patterns.tokens), patterns.patterns, heads, names, text=patterns.text,
                   model_name=patterns.model_name)

    def props(self) -> dict:
        return {"attention": np.round(self.patterns, 4), "tokens": self.tokens,
                "attention_head_names": self.names, "mask_upper_tri": True}

    def _raw_props_json(self) -> str:
        """The props exactly as circuitsvis serialises them (same key order as its renderer)."""
        from circuitsvis.utils.convert_props import convert_props

        p = self.props()
        return convert_props({"attention": p["attention"], "attentionHeadNames": p["attention_head_names"],
                              "tokens": p["tokens"], "maskUpperTri": p["mask_upper_tri"]})

    def _props_json(self) -> str:
        return _safe_json(self._raw_props_json())

    def rendered(self):
        """The circuitsvis ``RenderedHTML`` (``.local_src`` inlines the bundle)."""
        import circuitsvis.attention

        return circuitsvis.attention.attention_heads(**self.props())

    @property
    def local_src(self) -> str:
        """circuitsvis's self-contained HTML (bundle inlined, no network), with its props made
        safe to sit inside a <script> whatever the tokens contain."""
        src = self.rendered().local_src
        raw = self._raw_props_json()
        if raw not in src:  # a circuitsvis version that serialises differently: build it ourselves
            return (f'<div id="{self.dom_id}" style="margin: 15px 0;"></div>\n'
                    f"{bundle_script()}\n{self._render_call()}")
        src = re.sub(r"circuits-vis-[0-9a-f-]{13}", self.dom_id, src)  # stable id: same view, same HTML
        return src.replace(raw, self._props_json()).replace('style="margin: 15px 0;"/>', 'style="margin: 15px 0;"></div>', 1)

    def _render_call(self) -> str:
        return (f'<script>CircuitsVis.render("{self.dom_id}", CircuitsVis.AttentionHeads, '
                f"{self._props_json()});</script>")

    def mount_html(self) -> str:
        """Div + render call WITHOUT the bundle, for pages that inline ``bundle_script()`` once."""
        return f'<div id="{self.dom_id}" class="lh-circuitsvis"></div>\n{self._render_call()}'

    def to_html(self) -> str:
        """A standalone HTML page."""
        title = html.escape(f"{self.model_name}: attention of {', '.join(self.names)}")
        return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
                f"<title>{title}</title></head>\n<body>\n{self.local_src}\n</body></html>\n")

    def __repr__(self) -> str:  # the patterns' arrays would fill a screen
        return f"AttentionView({self.model_name or 'model'}: {', '.join(self.names)} on {len(self.tokens)} tokens)"

    def _repr_html_(self) -> str:
        """Jupyter: an iframe with srcdoc, so several views (each with its own bundle) coexist."""
        height = 320 + 14 * min(len(self.tokens), 60)
        return (f'<iframe srcdoc="{html.escape(self.to_html(), quote=True)}" '
                f'style="width: 100%; height: {height}px; border: none;"></iframe>')

    def save(self, path: str | os.PathLike) -> Path:
        """Write a standalone HTML file atomically."""
        return atomic_write_text(path, self.to_html())
