"""The explorer's local web server (Starlette + uvicorn; docs/methods.md §11).

One loaded model, kept in memory; requests are served one at a time (a lock around every
computation), so two browser tabs get the answers one tab would. Endpoints:

- ``GET /``: the page (``page.html``); ``GET /circuitsvis.js``: circuitsvis' bundle, served from
  the installed package (no CDN).
- ``GET /api/info``: the model's geometry, the scores, dataset-level scores (``--scores``), the
  sweep's points (``--sweep``), the tasks the page may pick questions from.
- ``POST /api/run``: ``{prompt | task+index, ablation, replacement}`` -> tokens, per-input
  scores and classes, next-token top-k (or a question's log-likelihoods), unablated and ablated.
- ``POST /api/head``: ``{prompt | task+index, layer, head}`` -> that head's pattern and norms.

Every request passes ``explore.guard`` first (the host names and port it was started for, its
token where one is set, same-origin only, JSON bodies of at most 64 KiB), then its body is parsed
into a typed request (``explore.requests``: every field's type and range). Bad input (a foreign
host or origin, a wrong type, an empty or too long prompt, a malformed spec, an unknown head or
task) gets a 4xx with one message; no endpoint reads a path that was not given on the command
line.
"""

from __future__ import annotations

import json
import math
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from lens_heads.data import load_task
from lens_heads.errors import LensHeadsError
from lens_heads.explore import requests, session
from lens_heads.explore.guard import WILDCARD, BodyTooLarge, Guard, Policy, exposure_warning, is_loopback, new_token
from lens_heads.explore.requests import HeadRequest, Input, RunRequest
from lens_heads.scores import HeadScores
from lens_heads.viz.patterns import bundle_js

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel

PAGE = Path(__file__).with_name("page.html")
BUILTIN_TASKS = ("piqa", "mmlu", "winogrande")


@dataclass
class Explorer:
    """What the server holds: the model, what was passed on the command line, and the lock."""

    model: LoadedModel
    sweep: object = None  # a pandas frame of the sweep's summary.csv
    scores: object = None  # HeadScores of --scores
    tasks: list[str] = field(default_factory=list)  # task specs the page may pick questions from
    max_tokens: int = session.MAX_TOKENS
    lock: threading.Lock = field(default_factory=threading.Lock)
    _loaded_tasks: dict = field(default_factory=dict)
    _cache: OrderedDict = field(default_factory=OrderedDict)
    _thresholds: OrderedDict = field(default_factory=OrderedDict)

    @classmethod
    def open(cls, model: LoadedModel, sweep: str | None = None, scores: str | None = None,
             tasks: list[str] | None = None, max_tokens: int = session.MAX_TOKENS) -> "Explorer":
        """Read what the command line names (before the server starts: a bad path fails here)."""
        frame = hs = None
        if sweep is not None:
            import pandas as pd

            path = Path(sweep)
            summary = path / "summary.csv" if path.is_dir() else path
            if not summary.is_file():
                raise LensHeadsError(f"--sweep {sweep}: no summary.csv there (a 'lens-heads sweep' --out folder)")
            frame = pd.read_csv(summary)
        if scores is not None:
            hs = HeadScores.load(scores)
        return cls(model, frame, hs, list(dict.fromkeys([*BUILTIN_TASKS, *(tasks or [])])), max_tokens)

    # --- request bodies ---------------------------------------------------------------------
    def info(self) -> dict:
        g = self.model.geometry
        out = {"model": self.model.name, "n_layers": g.n_layers, "n_heads": g.n_heads, "n_kv_heads": g.n_kv_heads,
               "group_size": [g.group_size_of(L) for L in range(g.n_layers)],
               "heads_in": [g.heads_in(L) for L in range(g.n_layers)] if g.pruned else None,
               "scores": session.describe_scores(), "tasks": self.tasks, "max_tokens": self.max_tokens,
               "attention": self.model.attention, "dataset_scores": None, "sweep": None}
        if self.scores is not None:
            out["dataset_scores"] = {s: session._rows(self.scores.mean[s]) for s in self.scores.score_ids}
        if self.sweep is not None:
            cols = [c for c in ("score_fn", "fraction", "seed", "spec", "pct_zeroed", "accuracy", "ci_low",
                                "ci_high") if c in self.sweep.columns]
            out["sweep"] = [{c: _json_value(r[c]) for c in cols} for _, r in self.sweep.iterrows()]
        return out

    def run(self, req: RunRequest) -> dict:
        with self.lock:
            abl = session.ablation_of(self.model, req.ablation, req.replacement, calibrated=self._calibrated)
            task, rec, text = self._input(req.input)
            doc_id = None if rec is None else rec.doc_id
            ids = session.tokenize(self.model, text, self.max_tokens)
            known = self._unablated(ids, task, doc_id)  # an ablation toggle on the same input: one forward
            out = {"input": text, **known["scores"]}
            if task is not None:
                out["question"] = session.question(self.model, task, doc_id, ablation=abl, base=known["base"])
                out["question"]["choices"] = list(rec.choices)
            else:
                out["next"] = session.next_token(self.model, ids, abl, base=known["base"])
            out["code"] = _code(self.model, req, abl)
            return out

    def _calibrated(self, score_id: str, fraction: float) -> str:
        """A percentage spec's threshold spec, calibrated once per (score, fraction)."""
        key = (score_id, float(fraction))
        if key not in self._thresholds:
            self._thresholds[key] = session.calibrate(self.model, score_id, fraction)
            while len(self._thresholds) > 64:  # each is one scoring pass: keep the latest 64
                self._thresholds.popitem(last=False)
        self._thresholds.move_to_end(key)
        return self._thresholds[key]

    def _unablated(self, ids, task, doc_id) -> dict:
        """The input's scores and unablated answer, computed once per input (the last 32 kept)."""
        key = (task.spec.name if task is not None else None, doc_id, tuple(ids.tolist()))
        if key not in self._cache:
            scores = session.input_scores(self.model, ids)
            if task is not None:
                base = session.question(self.model, task, doc_id)
                base = {**base["base"], "gold": base["gold"]}
            else:
                base = session.next_token(self.model, ids)["base"]
            self._cache[key] = {"scores": scores, "base": base}
            while len(self._cache) > 32:
                self._cache.popitem(last=False)
        self._cache.move_to_end(key)
        return self._cache[key]

    def head(self, req: HeadRequest) -> dict:
        with self.lock:
            _, _, text = self._input(req.input)
            g = self.model.geometry
            if not 0 <= req.layer < g.n_layers:
                raise LensHeadsError(f"layer must be 0..{g.n_layers - 1}, got {req.layer}")
            if not 0 <= req.head < g.n_heads:
                raise LensHeadsError(f"head must be 0..{g.n_heads - 1}, got {req.head}")
            ids = session.tokenize(self.model, text, self.max_tokens)
            return session.head_view(self.model, ids, req.layer, req.head)

    def question_text(self, inp: Input) -> dict:
        with self.lock:
            task, rec, context = self._input(inp)
            return {"task": inp.task, "index": inp.index, "doc_id": rec.doc_id, "question": rec.question,
                    "choices": list(rec.choices), "gold": rec.gold, "context": context}

    # --- helpers ----------------------------------------------------------------------------
    def _input(self, inp: Input):
        """(task, record, the text the model reads) of a request: a prompt (no task, no record),
        or a task question (its context as the model reads it, shots included)."""
        if inp.task is not None:
            task = self._task(inp.task)
            if not 0 <= inp.index < len(task.records):
                raise LensHeadsError(f"{inp.task} has questions 0..{len(task.records) - 1}, not {inp.index}")
            rec = task.records[inp.index]
            return task, rec, task.build(rec, task.spec.n_shot)[0][0]
        return None, None, inp.prompt

    def _task(self, name: str):
        if name not in self.tasks:
            raise LensHeadsError(f"unknown task {name!r}: this explorer serves {', '.join(self.tasks)} "
                                 f"(more with --task on the command line)")
        if name not in self._loaded_tasks:
            self._loaded_tasks[name] = load_task(name)
        return self._loaded_tasks[name]


def _json_value(v):
    if isinstance(v, float) and math.isnan(v):
        return None
    return v.item() if hasattr(v, "item") else v


def _code(model: LoadedModel, req: RunRequest, abl=None) -> dict:
    """The command line and the Python call that reproduce a view (``abl``: the view's ablation,
    a percentage already calibrated as the explorer does, so a task question's lines use its
    threshold instead of calibrating on other questions)."""
    spec = (req.ablation or "").strip()
    rep = (req.replacement or "").strip()
    full = spec if not rep or rep == "zero" or not spec else f"{spec}|{rep}"
    task = req.input.task
    if task is not None:
        full = abl.name if full and abl is not None else full
        cli = f"lens-heads evaluate {model.name} --task {task}" + (f" --ablate '{full}'" if full else "")
        py = (f"lh.evaluate_task(model, {task!r}, doc_ids=[DOC_ID]"
              + (f", ablation=lh.parse_ablation({full!r}, model.geometry)" if full else "") + ")")
    else:
        cli = f"lens-heads explore {model.name}"
        py = ("from lens_heads.explore import session; "
              f"session.next_token(model, session.tokenize(model, PROMPT), "
              f"session.ablation_of(model, {spec!r}, {rep!r}))" if spec else
              "from lens_heads.explore import session; session.next_token(model, session.tokenize(model, PROMPT))")
    return {"cli": cli, "python": f"import lens_heads as lh; model = lh.load_model({model.name!r}); {py}"}


# -----------------------------------------------------------------------------
# The app


def app(explorer: Explorer, policy: Policy | None = None):
    """The Starlette application serving ``explorer``, every request first through the ``Guard``
    of ``policy`` (default: loopback, no token)."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.middleware import Middleware
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import Route

    page = PAGE.read_text(encoding="utf-8")
    bundle = bundle_js()

    async def index(request: Request):
        return HTMLResponse(page)

    async def circuitsvis(request: Request):
        return Response(bundle, media_type="application/javascript")

    def guarded(kind: str, fn):
        async def endpoint(request: Request):
            try:
                if request.method == "POST":
                    raw = await request.body()  # capped by the guard: BodyTooLarge past MAX_BODY
                    body = json.loads(raw.decode("utf-8"))  # JSON is UTF-8 (RFC 8259)
                else:
                    body = {k: v for k, v in request.query_params.items() if k != "token"}
                req = requests.parse(kind, body)
            except BodyTooLarge as e:
                return JSONResponse({"error": str(e)}, status_code=413)
            except ClientDisconnect:  # the caller left mid-body: nobody reads the answer
                return Response(status_code=400)
            except (ValueError, RecursionError):  # not JSON (UnicodeDecodeError is a ValueError)
                return JSONResponse({"error": "the request body must be JSON"}, status_code=400)
            except LensHeadsError as e:
                return JSONResponse({"error": str(e)}, status_code=400)
            try:
                return JSONResponse(await run_in_threadpool(fn, req))
            except session.TooLong as e:
                return JSONResponse({"error": str(e)}, status_code=413)
            except LensHeadsError as e:
                return JSONResponse({"error": str(e)}, status_code=400)
            except Exception as e:  # noqa: BLE001 -- the page shows it; the server stays up
                return JSONResponse({"error": f"{type(e).__name__}: {e}"}, status_code=500)
        return endpoint

    routes = [Route("/", index), Route("/circuitsvis.js", circuitsvis),
              Route("/api/info", guarded("info", lambda req: explorer.info())),
              Route("/api/question", guarded("question", explorer.question_text)),
              Route("/api/run", guarded("run", explorer.run), methods=["POST"]),
              Route("/api/head", guarded("head", explorer.head), methods=["POST"])]
    return Starlette(routes=routes, middleware=[Middleware(Guard, policy=policy or Policy())])


class Server:
    """uvicorn serving the app in a background thread (``start`` returns once it listens)."""

    def __init__(self, explorer: Explorer, host: str = "127.0.0.1", port: int = 8765, token: bool | None = None):
        """``token``: require a random token on every request (None: whenever ``host`` is not loopback)."""
        import uvicorn

        self.policy = Policy(host, new_token() if (not is_loopback(host) if token is None else token) else None)
        self.config = uvicorn.Config(app(explorer, self.policy), host=host, port=port, log_level="warning",
                                     access_log=False)
        self.server = uvicorn.Server(self.config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        host = self.config.host if self.config.host not in WILDCARD else "127.0.0.1"
        host = f"[{host}]" if ":" in host and not host.startswith("[") else host
        query = f"?token={self.policy.token}" if self.policy.token else ""
        return f"http://{host}:{self.port}/{query}"

    @property
    def base_url(self) -> str:
        """The URL without the token (for API clients that send it as a header)."""
        return self.url.split("?")[0]

    @property
    def port(self) -> int:
        servers = getattr(self.server, "servers", None) or []
        for s in servers:
            for sock in s.sockets:
                return sock.getsockname()[1]
        return self.config.port

    def start(self, timeout: float = 30.0) -> "Server":
        """Listen (in a background thread), after saying on stderr who can reach the server when it
        is bound beyond loopback (``guard.exposure_warning``)."""
        import time

        message = exposure_warning(self.config.host, self.policy.token is not None)
        if message:
            print(message, file=sys.stderr)
        self.thread.start()
        t0 = time.monotonic()
        while not self.server.started:
            if not self.thread.is_alive():
                raise LensHeadsError(f"the explorer could not listen on {self.config.host}:{self.config.port}")
            if time.monotonic() - t0 > timeout:
                raise LensHeadsError("the explorer did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
