"""``lens-heads explore MODEL``: the local web app (lens_heads.explore)."""

from __future__ import annotations

import argparse
import time

from lens_heads.cli.common import add_model_args, model_from_args
from lens_heads.data import load_task
from lens_heads.errors import LensHeadsError
from lens_heads.explore import Explorer, Server


def register(sub) -> None:
    p = sub.add_parser("explore", help="a local web app: type a prompt, see each head's pattern and scores, "
                                       "switch heads off and watch the answer change")
    add_model_args(p)
    p.add_argument("--sweep", default=None, help="a 'lens-heads sweep' --out folder: its curves on the page")
    p.add_argument("--scores", default=None, help="a scores table from 'lens-heads score': dataset-level colours")
    p.add_argument("--task", action="append", default=[],
                   help="a task the page may pick questions from, besides piqa, mmlu, winogrande "
                        "(a 'file:' spec or a task YAML; repeat for more)")
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0: a free one)")
    p.add_argument("--token", action=argparse.BooleanOptionalAction, default=None,
                   help="require a random token on every request, printed in the URL (default: on when --host is "
                        "not loopback; --no-token serves anyone who can reach the port)")
    p.set_defaults(func=run)


def run(args) -> int:
    if not 0 <= args.port <= 65535:
        raise LensHeadsError(f"--port must be 0..65535, got {args.port}")
    for spec in args.task:  # a bad task fails before the model loads
        load_task(spec)
    Explorer.open(None, sweep=args.sweep, scores=args.scores)  # bad paths fail before the model loads
    model = model_from_args(args)
    explorer = Explorer.open(model, sweep=args.sweep, scores=args.scores, tasks=args.task)
    server = Server(explorer, args.host, args.port, token=args.token).start()
    print(f"lens_heads explorer on {model.name}: {server.url}  (Ctrl-C stops it)", flush=True)
    try:
        while server.thread.is_alive():
            time.sleep(0.5)
    except KeyboardInterrupt:
        server.stop()
    return 0
