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

from lens_heads.explore.guard import LOOPBACK, is_loopback
from lens_heads.explore.server import Explorer, Server

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel


def exposure_warning(host: str, token: bool) -> str | None:
    """What to tell a user who binds the explorer beyond loopback (None on loopback)."""
    if is_loopback(host):
        return None
    if token:
        return (f"note: the explorer listens on {host}: whoever can reach this machine and has the URL with its "
                f"token can use the model (and see what you type)")
    return (f"warning: the explorer listens on {host} without a token: anyone who can reach this machine can use "
            f"the model (and see what you type), and any web page can drive it; an SSH tunnel to 127.0.0.1 "
            f"keeps it local")


def explore(model: LoadedModel, sweep: str | None = None, scores: str | None = None, tasks: list[str] | None = None,
            host: str = "127.0.0.1", port: int = 8765, show: bool = True, token: bool | None = None) -> Server:
    """Start the explorer on ``model`` in a background thread and return its ``Server``
    (``.url``, ``.stop()``). ``port=0`` picks a free port. ``token``: require a random token on
    every request (default: whenever ``host`` is not loopback; ``.url`` carries it). In Jupyter
    (``show``) the page is displayed inline in an iframe."""
    explorer = Explorer.open(model, sweep=sweep, scores=scores, tasks=tasks)
    server = Server(explorer, host, port, token=token)
    message = exposure_warning(host, server.policy.token is not None)
    if message:
        print(message, file=sys.stderr)
    server.start()
    print(f"lens_heads explorer: {server.url}")
    if show and "ipykernel" in sys.modules:
        from IPython.display import IFrame, display

        display(IFrame(server.url, width="100%", height=900))
    return server


__all__ = ["LOOPBACK", "Explorer", "Server", "explore"]
