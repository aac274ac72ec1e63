"""After surgery, what happened to every head: drift against the model before surgery, per
checkpoint, and greedy generations (docs/methods.md §7, "Drift of the heads").

A finished (or stopped) repair run -- its ``report.json`` and ``checkpoints/pass{k}/`` -- is
replayed, state by state (``StatePoint``)::

    before            the model before surgery
    p{k}-reinit       pass k right after re-initialisation (rebuilt: the plan, its seed)
    p{k}-step{S}      pass k at each kept checkpoint (``repair --keep-checkpoints``; else the newest)
    p{k}-final        pass k's best weights, when early stopping restored them

Every state is the model before surgery with the trained tensors of the earlier passes' final
states and of its own checkpoint written over it (a checkpoint holds whole trainable tensors).
On fixed probe texts held out from training, each state is measured per head (``measure``):
BOS mass and entropy (the diagnosis' definitions, ``pattern_stats``), output norm (the head
score ``fhon``), the pattern distance to the model before surgery (``pattern_distance``:
mean total-variation distance over query rows t >= 1) and to the state its pass started training
from (``tv_reinit``: the distance to ``pK-reinit``, what training itself moved, apart from what
re-initialisation did at once); plus held-out perplexity on the probes and greedy continuations
of fixed prompts.

The store (``DRIFT_DIR`` = RUN/drift by default) holds one ``points/<point>.csv`` (per head) and
``points/<point>.json`` (perplexity, continuations) per state, written atomically as each is
measured, so a stopped measurement resumes; ``probe.json`` fixes what was measured. A state
stored before ``tv_reinit`` existed gets that column added (its patterns only, nothing else
measured again). Tables
(``drift_tables``) are built from the store only, so they come out byte for byte the same
whether the states were just measured or read back::

    heads.csv        point, pass, kind, step, layer, head, group, the measures and their signed
                     changes (d_bos_mass, d_entropy, d_out_norm), tv, moved, tv_reinit,
                     moved_since_reinit (empty / False for the state before surgery)
    curves.csv       per point: step, held-out perplexity, per group the heads, the heads moved (count,
                     % of the group) and the mean pattern distance, the same since re-initialisation
    generations.csv  per point and prompt: the greedy continuation
    epochs.csv       the run's own held-out perplexity (report.json): before surgery (pass 0, step 0),
                     then per epoch with the training loss, on the same global steps

Groups (per the point's pass): ``target`` (a target head the rule picked), ``target_healthy``
(a healthy head re-initialised by extended surgery), ``frozen_target_layer`` (a frozen head in a
layer holding a target), ``frozen_elsewhere``. A head is *moved* when its pattern distance
exceeds ``MOVED_TV`` (0.05).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import pandas as pd
import torch
from jaxtyping import Float, Int
from safetensors.torch import load_file
from torch import Tensor

from lens_heads import scores as scoring
from lens_heads.errors import LensHeadsError
from lens_heads.files.atomic import atomic_write_csv, atomic_write_text, read_csv_exact
from lens_heads.forward.activations import all_patterns
from lens_heads.models.heads import Head, parse_heads
from lens_heads.models.load import boot, model_digest
from lens_heads.surgery.checkpoint import list_checkpoints
from lens_heads.surgery.diagnose import pattern_stats
from lens_heads.surgery.reinit import named_params, plan_surgery, reinitialise
from lens_heads.surgery.report import RepairPass, RepairReport
from lens_heads.surgery.train import perplexity

if TYPE_CHECKING:
    from lens_heads.models.load import LoadedModel

MOVED_TV = 0.05  # a head is moved when its pattern distance exceeds this (docs/methods.md §7)
GROUPS = ("target", "target_healthy", "frozen_target_layer", "frozen_elsewhere")
FROZEN = ("frozen_target_layer", "frozen_elsewhere")
MEASURES = ("bos_mass", "entropy", "out_norm")
DEFAULT_PROMPTS = ("The capital of France is", "Once upon a time, there was a",
                   "The most important thing to remember about science is", "def add(a, b):")
DRIFT_DIR = "drift"
STORE_VERSION = 1
POINT_COLUMNS = ("layer", "head", "bos_mass", "entropy", "out_norm", "tv", "tv_reinit")  # a stored state's csv


# -----------------------------------------------------------------------------
# Which state: the point's one parser and printer


_POINT = re.compile(r"^(?:before|p([1-9][0-9]*)-(reinit|final|step([0-9]{6,})))$")


@dataclass(frozen=True, order=True)
class StatePoint:
    """One state of a repair run. ``str`` is its one printer (``before``, ``p1-reinit``,
    ``p1-step000040``, ``p1-final``) and ``parse`` its one parser; ordering is replay order."""

    pass_index: int  # 0: before surgery
    rank: int  # 0 reinit, 1 a checkpoint, 2 final (0 for before)
    step: int  # the pass' own step (0 for before / reinit)

    @classmethod
    def before(cls) -> "StatePoint":
        return cls(0, 0, 0)

    @classmethod
    def reinit(cls, k: int) -> "StatePoint":
        return cls(k, 0, 0)

    @classmethod
    def checkpoint(cls, k: int, step: int) -> "StatePoint":
        return cls(k, 1, step)

    @classmethod
    def final(cls, k: int, step: int) -> "StatePoint":
        return cls(k, 2, step)

    @property
    def kind(self) -> str:
        return "before" if self.pass_index == 0 else ("reinit", "step", "final")[self.rank]

    def __str__(self) -> str:
        if self.pass_index == 0:
            return "before"
        tail = {"reinit": "reinit", "final": "final", "step": f"step{self.step:06d}"}[self.kind]
        return f"p{self.pass_index}-{tail}"

    @classmethod
    def parse(cls, text: str, final_step: int = 0) -> "StatePoint":
        """``str(point)`` back to the point (a final point's step is not in its name: ``final_step``)."""
        m = _POINT.match(str(text).strip())
        if not m:
            raise LensHeadsError(f"bad state point {text!r}: write before, pK-reinit, pK-stepNNNNNN or pK-final")
        if m.group(1) is None:
            return cls.before()
        k = int(m.group(1))
        if m.group(2) == "reinit":
            return cls.reinit(k)
        if m.group(2) == "final":
            return cls.final(k, final_step)
        return cls.checkpoint(k, int(m.group(3)))


# -----------------------------------------------------------------------------
# The measures (per head, on one probe)


def pattern_distance(a: Float[Tensor, "layer head q k"], b: Float[Tensor, "layer head q k"]
                     ) -> Float[Tensor, "layer head"]:
    """The pattern distance of docs/methods.md §7: mean over query rows t >= 1 of the
    total-variation distance 1/2 sum_k |a[t,k] - b[t,k]| (row 0 attends to one key in every
    model, so it is left out). In [0, 1]."""
    if a.shape != b.shape or a.shape[-1] < 2:
        raise LensHeadsError(f"pattern distance needs two patterns of one shape with >= 2 tokens, got "
                             f"{tuple(a.shape)} / {tuple(b.shape)}")
    rows = 0.5 * (a.double() - b.double()).abs().sum(-1)  # [layer, head, q]
    return rows[..., 1:].mean(-1).float()


def mean_distance(pats: Sequence[Tensor], ref: Sequence[Tensor]) -> Float[Tensor, "layer head"]:
    """``pattern_distance`` per probe, averaged over the probes."""
    return torch.stack([pattern_distance(p, r) for p, r in zip(pats, ref)]).mean(0)


def bos_and_entropy(pattern: Float[Tensor, "layer head q k"]) -> tuple[Float[Tensor, "layer head"],
                                                                      Float[Tensor, "layer head"]]:
    """BOS mass and entropy of every head on one unpadded input (``pattern_stats``: the diagnosis'
    definitions, docs/methods.md §6)."""
    L, H, T, _ = pattern.shape
    flat: Float[Tensor, "1 lh q k"] = pattern.reshape(1, L * H, T, T)
    bos, ent, _local = pattern_stats(flat, torch.ones(1, T, dtype=torch.long))
    return bos.reshape(L, H), ent.reshape(L, H)


@dataclass
class StateMeasures:
    """One state's per-head measures, each the mean over probes, and its probe perplexity."""

    bos_mass: Float[Tensor, "layer head"]
    entropy: Float[Tensor, "layer head"]
    out_norm: Float[Tensor, "layer head"]
    tv: Float[Tensor, "layer head"]
    ppl: float
    generations: list[str]


def probe_patterns(model: LoadedModel, probes: Sequence[Tensor]) -> list[Float[Tensor, "layer head q k"]]:
    return [all_patterns(model, ids) for ids in probes]


def measure(model: LoadedModel, hf_model, probes: Sequence[Tensor], base: Sequence[Tensor] | None,
            prompts: Sequence[Tensor], max_new_tokens: int, pad_id: int, batch_size: int = 4
            ) -> tuple[StateMeasures, list[Tensor]]:
    """The drift measures of docs/methods.md §7 for ``model`` (booted on ``hf_model``) on
    ``probes``; ``base``: the patterns of the model before surgery (None: this is it, its
    distance is 0). Returns the measures and the patterns (the base of later states when this is
    the model before surgery)."""
    pats = probe_patterns(model, probes)
    stats = [bos_and_entropy(p) for p in pats]
    bos = torch.stack([b for b, _ in stats]).mean(0)
    ent = torch.stack([e for _, e in stats]).mean(0)
    tv = torch.zeros_like(bos) if base is None else mean_distance(pats, base)
    hs = scoring.score_heads(model, list(probes), scores=["fhon"], keep_per_input=True, progress=False,
                             batch_size=batch_size)
    out_norm = hs.per_input["fhon"].double().mean(0).float()
    ppl = perplexity(hf_model, list(probes), batch_size, pad_id)
    gens = [greedy_continuation(hf_model, ids, max_new_tokens) for ids in prompts]
    return StateMeasures(bos, ent, out_norm, tv, ppl, [model.tokenizer.decode(g) for g in gens]), pats


@torch.no_grad()
def greedy_continuation(hf_model, ids: Int[Tensor, "pos"], max_new_tokens: int) -> list[int]:
    """The ``max_new_tokens`` tokens greedy decoding appends to ``ids`` (full forward per token,
    no cache: the same numbers whatever the cache implementation)."""
    was_training = hf_model.training
    hf_model.eval()
    device = next(hf_model.parameters()).device
    seq = ids.to(device)[None]
    try:
        for _ in range(max_new_tokens):
            nxt = hf_model(input_ids=seq).logits[0, -1].float().argmax()
            seq = torch.cat([seq, nxt.view(1, 1)], dim=1)
    finally:
        hf_model.train(was_training)
    return seq[0, ids.numel():].tolist()


# -----------------------------------------------------------------------------
# Replaying a run


@dataclass(frozen=True)
class ProbeSet:
    """What every state is measured on: probe inputs, prompts, and how they were named."""

    probes: tuple[Tensor, ...]
    prompts: tuple[str, ...]
    prompt_ids: tuple[Tensor, ...]
    max_new_tokens: int
    probe_data: str
    probe_len: int

    def identity(self) -> dict:
        digest = hashlib.sha256()
        for t in (*self.probes, *self.prompt_ids):
            digest.update(json.dumps(t.tolist()).encode())
            digest.update(b"|")
        return {"version": STORE_VERSION, "probe_data": self.probe_data, "n_probes": len(self.probes),
                "probe_len": self.probe_len, "prompts": list(self.prompts), "max_new_tokens": self.max_new_tokens,
                "tokens_sha256": digest.hexdigest()}


def heads_of(names: Sequence[str] | None) -> list[Head]:
    """report.json's ``"LAYER.HEAD"`` strings as heads (the one head parser; none -> [])."""
    return parse_heads(",".join(names)) if names else []


def pass_folder(run_dir: Path, k: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"pass{k}"


def best_restored(p: RepairPass, config: dict) -> bool:
    """Whether training restored the best weights at the end of pass ``p`` (train.py's rule:
    keep_best and the last epoch's perplexity above the best epoch's)."""
    epochs = [h["ppl"] for h in (p.history or ())[1:] if h.get("ppl") is not None]
    return bool(config.get("train", {}).get("keep_best", True)) and bool(epochs) and epochs[-1] > min(epochs)


def run_points(run_dir: Path, report: RepairReport) -> list[tuple[StatePoint, Path | None]]:
    """Every state of the run in replay order, with the tensors to load (None: before / reinit)."""
    out: list[tuple[StatePoint, Path | None]] = [(StatePoint.before(), None)]
    for p in report.trained_passes:
        ckpts = list_checkpoints(pass_folder(run_dir, p.index))
        if not ckpts:
            raise LensHeadsError(f"{pass_folder(run_dir, p.index)} holds no checkpoint: the drift of pass "
                                 f"{p.index} cannot be replayed")
        out.append((StatePoint.reinit(p.index), None))
        out += [(StatePoint.checkpoint(p.index, s), f) for s, f in ckpts]
        if best_restored(p, report.config):
            best = ckpts[-1][1].parent / "best.safetensors"
            if not best.is_file():
                raise LensHeadsError(f"{best} is missing: pass {p.index}'s restored best weights cannot be replayed")
            out.append((StatePoint.final(p.index, ckpts[-1][0]), best))
    return out


def global_steps(report: RepairReport) -> dict[int, int]:
    """Pass -> the optimisation steps of the passes before it (curves run over all passes)."""
    offsets, total = {}, 0
    for p in report.trained_passes:
        offsets[p.index] = total
        total += int(p.steps or 0)
    return offsets


def head_groups(report: RepairReport, k: int, n_layers: int, n_heads: int) -> list[list[str]]:
    """[layer][head] -> the head's group at a point of pass ``k`` (pass 1 for the state before)."""
    p = next(p for p in report.trained_passes if p.index == max(k, report.trained_passes[0].index))
    targets, healthy = set(heads_of(p.targets)), set(heads_of(p.healthy_targets))
    layers = {L for L, _ in targets}
    return [["target_healthy" if (L, h) in healthy else "target" if (L, h) in targets
             else "frozen_target_layer" if L in layers else "frozen_elsewhere" for h in range(n_heads)]
            for L in range(n_layers)]


def _load_into(hf_model, tensors: dict[str, Tensor]) -> None:
    params = named_params(hf_model)
    missing = [n for n in tensors if n not in params]
    if missing:
        raise LensHeadsError(f"checkpoint tensor {missing[0]} is not a parameter of the model: another model's run?")
    with torch.no_grad():
        for name, t in tensors.items():
            p = params[name]
            p.copy_(t.to(p.device, p.dtype))


def replay(model: LoadedModel, run_dir: Path, report: RepairReport) -> Iterator[tuple[StatePoint, object]]:
    """(point, the plain HF model in that state) for every state of the run, in order. The same
    HF model is edited in place from state to state: use it before asking for the next."""
    g = model.geometry
    init, policy, seed = report.config.get("init", "xavier_uniform"), report.config.get("gqa_policy", "q_only"), \
        int(report.config.get("seed", 0))
    points = run_points(run_dir, report)
    hf = model.load_hf_model()
    hf.eval()
    for p in hf.parameters():
        p.requires_grad_(False)
    for point, tensors in points:
        if point.kind == "reinit":
            rp = next(p for p in report.trained_passes if p.index == point.pass_index)
            plan = plan_surgery(g, heads_of(rp.targets), policy)
            reinitialise(hf, plan, init, seed=seed + point.pass_index)
        elif tensors is not None:
            _load_into(hf, load_file(tensors))
        yield point, hf


# -----------------------------------------------------------------------------
# The store and its tables


def _point_files(store: Path, point: StatePoint) -> tuple[Path, Path]:
    return store / "points" / f"{point}.csv", store / "points" / f"{point}.json"


def check_store(store: Path, identity: dict) -> None:
    """Refuse a store measured on other probes (its numbers would not compare)."""
    f = store / "probe.json"
    if f.is_file():
        theirs = json.loads(f.read_text(encoding="utf-8"))
        if theirs != identity:
            differ = sorted(k for k in theirs.keys() | identity.keys() if theirs.get(k) != identity.get(k))
            raise LensHeadsError(f"{store} holds drift measured with other probes ({', '.join(differ)} differ); "
                                 "give another --out or the same probe settings")


def measure_run(model: LoadedModel, run_dir: str | Path, probes: ProbeSet, store: str | Path | None = None,
                batch_size: int = 4, progress: bool = True,
                should_stop: Callable[[], bool] | None = None) -> Path:
    """Measure every state of the repair run in ``run_dir`` not yet in ``store`` (default
    RUN/drift); returns the store. ``model``: the model the run repaired (its digest is checked
    against the checkpoints'). ``should_stop()``, asked between states, ends early (resumable)."""
    run_dir = Path(run_dir)
    report = RepairReport.load(run_dir)
    store = Path(store) if store is not None else run_dir / DRIFT_DIR
    identity = probes.identity()
    check_store(store, identity)
    check_model(model, run_dir, report)
    pad = model.tokenizer.pad_token_id or 0
    todo = {p: need for p, _ in run_points(run_dir, report) if (need := _stored_need(store, p)) is not None}
    measuring = "measure" in todo.values()
    base: list[Tensor] | None = None  # the patterns before surgery: measured again whenever a state is missing
    start: list[Tensor] | None = None  # the patterns of the current pass right after re-initialisation
    g = model.geometry
    for point, hf in ([] if not todo else replay(model, run_dir, report)):
        need = todo.get(point)
        csv_file, json_file = _point_files(store, point)
        if point.kind == "before" and not measuring:  # its patterns are not needed: no state is measured
            if need == "top_up":
                _add_tv_reinit(csv_file, torch.full((g.n_layers, g.n_heads), math.nan))
            continue
        if need is None and point.kind in ("step", "final"):
            continue  # whole, and no later state's reference
        if need is not None and point.kind != "before" and should_stop is not None and should_stop():
            break
        booted = boot(copy.deepcopy(hf), model.tokenizer, model.source, model.dtype, model.device)
        if need == "measure" or point.kind == "before":
            m, pats = measure(booted, hf, probes.probes, base, probes.prompt_ids, probes.max_new_tokens, pad,
                              batch_size)
        else:  # the pass' starting patterns, or a stored state that lacks only tv_reinit
            m, pats = None, probe_patterns(booted, probes.probes)
        del booted
        if point.kind == "before":
            base = pats
        elif point.kind == "reinit":
            start = pats
        if need is None:  # measured only as a reference for later states
            continue
        tv_reinit = (torch.full((g.n_layers, g.n_heads), math.nan) if point.kind == "before"
                     else mean_distance(pats, start))
        if need == "top_up":
            _add_tv_reinit(csv_file, tv_reinit)
            if progress:
                print(f"  {point}: distance to the re-initialised state added ({csv_file.name})", flush=True)
            continue
        atomic_write_text(store / "probe.json", json.dumps(identity, indent=1), make_parents=True)
        frame = pd.DataFrame({"layer": [L for L in range(g.n_layers) for _ in range(g.n_heads)],
                              "head": [h for _ in range(g.n_layers) for h in range(g.n_heads)],
                              "bos_mass": m.bos_mass.reshape(-1).double().numpy(),
                              "entropy": m.entropy.reshape(-1).double().numpy(),
                              "out_norm": m.out_norm.reshape(-1).double().numpy(),
                              "tv": m.tv.reshape(-1).double().numpy(),
                              "tv_reinit": tv_reinit.reshape(-1).double().numpy()})
        atomic_write_csv(frame, csv_file, make_parents=True)
        atomic_write_text(json_file, json.dumps(
            {"point": str(point), "step": point.step, "ppl": m.ppl, "generations": m.generations}, indent=1))
        if progress:
            print(f"  {point}: probe perplexity {m.ppl:.3f}, {int((m.tv > MOVED_TV).sum())} heads moved "
                  f"({csv_file.name})", flush=True)
    return store


def _stored_need(store: Path, point: StatePoint) -> str | None:
    """What a state still needs in the store: ``"measure"`` (not there), ``"top_up"`` (stored
    before ``tv_reinit`` existed: only that column to add) or None (whole)."""
    csv_file, json_file = _point_files(store, point)
    if not (csv_file.is_file() and json_file.is_file()):
        return "measure"
    with csv_file.open(encoding="utf-8") as f:
        header = f.readline().strip().split(",")
    return None if "tv_reinit" in header else "top_up"


def _add_tv_reinit(csv_file: Path, tv_reinit: Float[Tensor, "layer head"]) -> None:
    """Add the ``tv_reinit`` column to a state stored before it existed (its other values as stored)."""
    frame = read_csv_exact(csv_file)
    frame["tv_reinit"] = tv_reinit.reshape(-1).double().numpy()
    atomic_write_csv(frame[list(POINT_COLUMNS)], csv_file)


def check_model(model: LoadedModel, run_dir: Path, report: RepairReport) -> None:
    """The model is the one the run repaired: its weights' digest is the checkpoints' (when they
    recorded one) and its geometry holds every target."""
    for p in report.trained_passes:
        for L, h in heads_of(p.targets):
            model.geometry.check_head(L, h)
    latest = pass_folder(run_dir, report.trained_passes[0].index) / "LATEST" if report.trained_passes else None
    if latest is None or not latest.is_file():
        return
    state = torch.load(latest.parent / latest.read_text().strip() / "state.pt", weights_only=False, mmap=True)
    theirs = state.get("identity", {}).get("model_digest")
    if theirs is not None and theirs != model_digest(model):
        raise LensHeadsError(f"{run_dir} was repaired from another model (weights digest {theirs[:12]}...); "
                             f"give the model it repaired (--model)")


def read_point(store: Path, point: StatePoint) -> tuple[pd.DataFrame, dict]:
    csv_file, json_file = _point_files(store, point)
    return read_csv_exact(csv_file), json.loads(json_file.read_text(encoding="utf-8"))


def stored_points(store: Path, report: RepairReport, run_dir: Path) -> list[StatePoint]:
    """The run's states that the store holds, in replay order."""
    return [p for p, _ in run_points(run_dir, report) if all(f.is_file() for f in _point_files(store, p))]


def drift_tables(store: str | Path, run_dir: str | Path) -> dict[str, pd.DataFrame]:
    """heads / curves / generations (see the module docstring) from the store alone."""
    store, run_dir = Path(store), Path(run_dir)
    report = RepairReport.load(run_dir)
    points = stored_points(store, report, run_dir)
    if not points or points[0].kind != "before":
        raise LensHeadsError(f"{store} holds no measurement of the model before surgery: run the drift first")
    base, _ = read_point(store, points[0])
    offsets = global_steps(report)
    heads, curves, gens = [], [], []
    for point in points:
        frame, meta = read_point(store, point)
        if "tv_reinit" not in frame.columns:  # stored before the column existed: measure_run adds it
            frame["tv_reinit"] = math.nan
        n_layers, n_heads = int(frame["layer"].max()) + 1, int(frame["head"].max()) + 1
        groups = head_groups(report, point.pass_index, n_layers, n_heads)
        step = offsets.get(point.pass_index, 0) + point.step
        f = frame.copy()
        f.insert(0, "point", str(point))
        f.insert(1, "pass", point.pass_index)
        f.insert(2, "kind", point.kind)
        f.insert(3, "step", step)
        f.insert(6, "group", [groups[L][h] for L, h in zip(frame["layer"], frame["head"])])
        for m in MEASURES:
            f[f"d_{m}"] = frame[m] - base[m]
        f["moved"] = frame["tv"] > MOVED_TV
        f["moved_since_reinit"] = frame["tv_reinit"] > MOVED_TV  # NaN (before surgery) -> False
        heads.append(f)
        row = {"point": str(point), "pass": point.pass_index, "kind": point.kind, "step": step, "ppl": meta["ppl"]}
        for grp in GROUPS:
            sel = f[f["group"] == grp]
            row[f"n_{grp}"] = len(sel)
            row[f"moved_{grp}"] = int(sel["moved"].sum())
            row[f"pct_moved_{grp}"] = 100 * row[f"moved_{grp}"] / len(sel) if len(sel) else math.nan
            row[f"mean_tv_{grp}"] = float(sel["tv"].mean()) if len(sel) else math.nan
        frozen = f[f["group"].isin(FROZEN)]
        row["moved_frozen"] = int(frozen["moved"].sum())
        row["n_frozen"] = len(frozen)
        for grp in GROUPS:  # the same, against the state the pass started training from
            sel = f[f["group"] == grp]
            row[f"moved_since_reinit_{grp}"] = int(sel["moved_since_reinit"].sum())
            row[f"pct_moved_since_reinit_{grp}"] = (100 * row[f"moved_since_reinit_{grp}"] / len(sel) if len(sel)
                                                    else math.nan)
            row[f"mean_tv_reinit_{grp}"] = float(sel["tv_reinit"].mean()) if len(sel) else math.nan
        row["moved_frozen_since_reinit"] = int(frozen["moved_since_reinit"].sum())
        row["mean_tv_reinit_frozen"] = float(frozen["tv_reinit"].mean()) if len(frozen) else math.nan
        curves.append(row)
        gens += [{"point": str(point), "step": step, "prompt": prompt, "continuation": text}
                 for prompt, text in zip(json.loads((store / "probe.json").read_text())["prompts"], meta["generations"])]
    head_cols = ["point", "pass", "kind", "step", "layer", "head", "group", "bos_mass", "d_bos_mass", "entropy",
                 "d_entropy", "out_norm", "d_out_norm", "tv", "moved", "tv_reinit", "moved_since_reinit"]
    epochs = [{"pass": 0, "epoch": 0, "step": 0, "ppl": report.ppl_before, "train_loss": None}]  # before surgery
    epochs += [{"pass": p.index, "epoch": h["epoch"], "step": offsets[p.index] + int(h["step"]), "ppl": h["ppl"],
               "train_loss": h.get("train_loss")} for p in report.trained_passes for h in (p.history or ())]
    return {"heads": pd.concat(heads, ignore_index=True)[head_cols], "curves": pd.DataFrame(curves),
            "generations": pd.DataFrame(gens, columns=["point", "step", "prompt", "continuation"]),
            "epochs": pd.DataFrame(epochs, columns=["pass", "epoch", "step", "ppl", "train_loss"])}


TABLES = ("heads", "curves", "generations", "epochs")


def write_tables(tables: dict[str, pd.DataFrame], folder: str | Path) -> list[Path]:
    """Each table as ``<name>.csv`` in ``folder``, atomically."""
    return [atomic_write_csv(tables[name], Path(folder) / f"{name}.csv", make_parents=True) for name in TABLES]
