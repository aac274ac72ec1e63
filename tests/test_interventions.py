"""Typed ablation specs: one parser, one printer, round trips (seeded random specs of every
kind), every spec string in the committed result store printed back unchanged, and one
message naming the grammar for bad specs."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch

from lens_heads import LensHeadsError
from lens_heads.interventions.ablation import bind
from lens_heads.interventions.specs import (ABLATION_FORMS, SPEC_KINDS, NoHeads, RandomHeads, ScoreFraction, ScoreThreshold,
                                      StaticHeads, parse_heads, parse_spec)
from lens_heads.scores import SCORES

STORE = Path(__file__).resolve().parents[1] / "analyses" / "results" / "inactive_heads" / "store"


def _random_float(rnd: random.Random) -> float:
    return rnd.choice([rnd.random(), rnd.uniform(-3, 3), 10 ** rnd.uniform(-9, 6), 0.0, 1.0,
                       float(rnd.randint(0, 9)), rnd.random() * 1e-5])


def random_spec(rnd: random.Random):
    kind = rnd.choice(["none", "static", "threshold", "fraction", "random"])
    if kind == "none":
        return NoHeads()
    if kind == "static":
        return StaticHeads(tuple((rnd.randint(0, 40), rnd.randint(0, 30)) for _ in range(rnd.randint(1, 6))))
    sid = rnd.choice(list(SCORES))
    if kind == "threshold":
        return ScoreThreshold(sid, _random_float(rnd), rnd.random() < 0.5)
    if kind == "fraction":
        return ScoreFraction(sid, rnd.randint(0, 100) / 100)
    return RandomHeads(rnd.random(), rnd.randint(0, 10_000))


@pytest.mark.parametrize("seed", range(4))
def test_round_trip_random_specs(seed):
    rnd = random.Random(seed)
    kinds = set()
    for _ in range(500):
        spec = random_spec(rnd)
        text = str(spec)
        back = parse_spec(text)
        assert back == spec and str(back) == text, text
        assert parse_spec(f"  {text} ") == spec  # surrounding whitespace is not part of it
        kinds.add(type(spec))
    assert kinds == {NoHeads, StaticHeads, ScoreThreshold, ScoreFraction, RandomHeads}


def test_printed_forms_are_the_stored_spec_strings():
    assert str(StaticHeads(((4, 2), (3, 1), (4, 2)))) == "static:3.1,4.2"  # sorted, unique
    assert str(ScoreThreshold("ahon_ln", 0.41)) == "score:ahon_ln@0.41"
    assert str(ScoreThreshold("ahon_ln", 0.1 + 0.2, strict=True)) == "score:ahon_ln@0.30000000000000004:strict"
    assert str(RandomHeads(0.1, 2)) == "random:0.1@2" and str(RandomHeads(0.05)) == "random:0.05@0"
    assert str(ScoreFraction("awft", 0.1)) == "score:awft@10%" and str(NoHeads()) == "none"
    assert set(SPEC_KINDS) == {"none", "static", "score", "random"}


def test_every_committed_spec_string_parses_and_prints_back():
    specs = set()
    for f in STORE.rglob("*.json"):
        config = json.loads(f.read_text())["config"]
        if "ablation" in config:
            specs.add(config["ablation"])
    assert len(specs) >= 5
    for text in specs:
        assert str(parse_spec(text)) == text  # the key of every stored point is unchanged


@pytest.mark.parametrize("text,msg", [
    ("", "empty ablation spec"), ("prune:1.2", "unknown ablation kind 'prune'"), ("static", "bad ablation"),
    ("static:1", "LAYER.HEAD"), ("score:ahon", "score:ID@THRESHOLD"), ("score:nope@0.1", "unknown score 'nope'"),
    ("score:ahon_ln@x", "not a number"), ("score:ahon_ln@0.5:strictly", "not a number"),
    ("score:ahon_ln@120%", r"in \[0, 100\]"), ("random:2@0", r"in \[0, 1\]"), ("random:0.1@x", "not an integer"),
    ("none:1", "takes nothing"),
])
def test_bad_specs_name_the_grammar(text, msg):
    with pytest.raises(LensHeadsError, match=msg) as err:
        parse_spec(text)
    if "kind" in msg or "bad ablation" in msg or "number" in msg:
        assert ABLATION_FORMS in str(err.value)


def test_one_head_parser(tiny_model):
    g = tiny_model("llama").geometry
    assert parse_heads("3.1, L4.H2") == [(3, 1), (4, 2)]
    assert parse_heads("1.0,0.3", g) == [(1, 0), (0, 3)]
    with pytest.raises(LensHeadsError, match="out of range"):
        parse_heads("5.0", g)
    with pytest.raises(LensHeadsError, match="empty head list"):
        parse_heads(" , ")
    from lens_heads.surgery.targets import parse_heads as surgery_heads
    from lens_heads.viz.patterns import parse_heads as view_heads

    assert surgery_heads("1.2,0.1,1.2", g) == [(0, 1), (1, 2)] and view_heads("L1.H2,0.1", g) == [(1, 2), (0, 1)]


def test_bind_builds_the_runtime_ablation(tiny_model):
    g = tiny_model("llama").geometry
    assert bind(parse_spec("static:1.0,0.3"), g).name == "static:0.3,1.0"
    assert bind(parse_spec("score:awft@0.5:strict"), g).strict
    assert math.isclose(bind(parse_spec("random:0.25@3"), g).p, 0.25)
    pct = bind(parse_spec("score:awft@10%"), g)  # calibrated by evaluate_task (test_evaluate), runs nowhere else
    assert pct.needs_task and pct.threshold is None and pct.name == "score:awft@10%"
    with pytest.raises(LensHeadsError, match="not calibrated yet"):
        pct.hooks(tiny_model("llama"), torch.ones(1, 3), [0])
