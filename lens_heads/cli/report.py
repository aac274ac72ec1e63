"""``lens-heads report MODEL --data DATA --out report.html``: one self-contained HTML report."""

from __future__ import annotations

from lens_heads.cli.common import add_data_args, add_model_args, add_protocol_args, check_protocol_args
from lens_heads.files.atomic import check_output_dir, check_output_file
from lens_heads.data import load_texts
from lens_heads.errors import LensHeadsError
from lens_heads.viz.study import ReportConfig, build_report
from lens_heads.interventions.specs import parse_heads


def register(sub) -> None:
    p = sub.add_parser("report", help="write one self-contained HTML report (scores, sweep, diagnosis, patterns)")
    add_model_args(p)
    add_data_args(p)
    p.add_argument("--task", default=None, help="run a sweep on this task (mmlu, piqa, winogrande, file:...) "
                                                "when no --sweep is given")
    p.add_argument("--limit", type=int, default=None, help="questions of --task for that sweep")
    p.add_argument("--sweep-scores", default="awft,ahon_ln,lthon_ln",
                   help="score functions of that sweep (default awft,ahon_ln,lthon_ln); it is stored in "
                        "OUT_sweep/ beside the report, and rerunning resumes it")
    p.add_argument("--sweep", default=None, help="finished sweep folder (summary.csv, within_1pt.csv)")
    p.add_argument("--diagnosis", default=None, help="diagnosis CSV from 'lens-heads diagnose' (else computed)")
    p.add_argument("--scores", default=None, help="scores table from 'lens-heads score' (else computed)")
    p.add_argument("--top-k", type=int, default=4, help="heads per view: k most inactive and k most active "
                                                       "by ahon_ln (default 4)")
    p.add_argument("--heads", default=None, help="extra heads to show, e.g. 3.1,4.2")
    p.add_argument("--max-sink-views", type=int, default=8, help="most BOS-sink/DEAD heads shown (default 8)")
    p.add_argument("--view-tokens", type=int, default=40, help="tokens of the text in attention views (default 40)")
    p.add_argument("--prune-run", default=None, help="a 'lens-heads prune' --out folder: adds its pruning section")
    p.add_argument("--out", required=True, help="HTML file to write")
    add_protocol_args(p, thresholds=False)
    p.set_defaults(func=run)


def run(args) -> int:

    from pathlib import Path


    # everything that can be checked without the model, before it loads
    check_protocol_args(args)
    check_output_file(args.out, make_parents=True)
    if args.task is not None and args.sweep is None:
        check_output_dir(Path(args.out).with_name(Path(args.out).stem + "_sweep"), "--out (its sweep folder)")
    for name in ("sweep", "diagnosis", "scores"):
        given = getattr(args, name)
        if given is not None and not Path(given).exists():
            raise LensHeadsError(f"--{name} {given}: no such {'folder' if name == 'sweep' else 'file'}")
    if args.heads is not None:

        parse_heads(args.heads)  # syntax now; ranges once the model is loaded
    if args.scores is None or args.diagnosis is None:
        load_texts(args.data, n=1)  # a bad --data fails now, not after the model loads
    cfg = ReportConfig(
        model=args.model, out=args.out, data=args.data, n_inputs=args.n_inputs, max_len=args.max_len,
        task=args.task, limit=args.limit, sweep_scores=args.sweep_scores, sweep=args.sweep,
        diagnosis=args.diagnosis, scores=args.scores,
        top_k=args.top_k, heads=args.heads, max_sink_views=args.max_sink_views, view_tokens=args.view_tokens,
        dtype=args.dtype, device=args.device, batch_size=args.batch_size, prune_run=args.prune_run,
        protocol={"paper": args.paper_protocol, "add_bos_token": args.add_bos_token,
                  "apply_chat_template": args.apply_chat_template, "fewshot_as_multiturn": args.fewshot_as_multiturn})
    path = build_report(cfg)
    print(f"wrote {path}")
    return 0
