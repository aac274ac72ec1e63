"""``lens-heads explore MODEL`` / ``lens_heads.explore(model)``: a local web app to look at heads
on your own prompt, switch them off and watch the answer change (docs/methods.md §11).

``session`` computes (plain functions, usable from a notebook); ``server`` serves them to the
page (``page.html``) one request at a time, on 127.0.0.1 unless told otherwise.

Floor 10 of docs/architecture.md. May import: the wings below it (up to ``viz``). Imported by:
``cli`` and the public API.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from lens_heads.explore.guard import LOOPBACK
from lens_heads.explore.server import Explorer, Server

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel


def explore(model: LoadedModel, sweep: str | None = None, scores: str | None = None, tasks: list[str] | None = None,
            host: str = "127.0.0.1", port: int = 8765, show: bool = True, token: bool | None = None) -> Server:
    """Start the explorer on ``model`` in a background thread and return its ``Server``
    (``.url``, ``.stop()``). ``port=0`` picks a free port. ``token``: require a random token on
    every request (default: whenever ``host`` is not loopback; ``.url`` carries it). In Jupyter
    (``show``) the page is displayed inline in an iframe."""
    explorer = Explorer.open(model, sweep=sweep, scores=scores, tasks=tasks)
    server = Server(explorer, host, port, token=token).start()
    print(f"lens_heads explorer: {server.url}")
    if show and "ipykernel" in sys.modules:
        from IPython.display import IFrame, display

        display(IFrame(server.url, width="100%", height=900))
    return server


__all__ = ["LOOPBACK", "Explorer", "Server", "explore"]
