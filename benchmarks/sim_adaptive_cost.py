"""How many questions an adaptive crossing search reads per curve, by simulation (no model).

    PYTHONPATH=. python benchmarks/sim_adaptive_cost.py

Synthetic curves on the campaign's grid (0-60 % at 1 %, margin 1 point, alpha 0.05 per curve,
batches of 64; docs/methods.md §13): per question, unablated correct with probability 0.64; at
k % of heads, items turn wrong and right in nested sets ("churn": 0.25 of the items flip per
unit fraction, both ways) on top of a net loss that stays within 0.9 point up to the crossing
and then grows by ``slope`` points per %. Prints questions read per curve (per seed, for random
heads) in units of the population N, the mean over 8 item orders. Used for the cost estimates
of analyses/results/README.md ("Table 2 at paper resolution"); the fixed 7-point grid reads 6 N.
"""

from __future__ import annotations

import argparse

import numpy as np

from lens_heads.sweep.adaptive import bisect_crossing, decide_probe, item_order, max_probes

GRID = 61


def curve(rng, N: int, crossing: int, slope: float, churn: float = 0.25):
    base = (rng.random(N) < 0.64).astype(float)
    u, v = rng.random(N), rng.random(N)
    ablated = np.zeros((GRID, N))
    for k in range(GRID):
        net = max(0.0, slope * (k - crossing)) / 100 + 0.009 * min(k, crossing) / max(crossing, 1)
        flip = churn * k / 100
        a = base.copy()
        a[(base == 1) & (u < (flip + net) / 0.64)] = 0
        a[(base == 0) & (v < flip / 0.36)] = 1
        ablated[k] = a
    return base, ablated


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--orders", type=int, default=8, help="item orders per curve (default 8)")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(1)
    for N in (1838, 1267, 2000):
        for crossing, slope in ((1, 2.0), (8, 0.3), (15, 0.2), (30, 0.15)):
            read = []
            for rep in range(args.orders):
                base, ablated = curve(rng, N, crossing, slope)
                order = item_order(list(range(N)), rep)

                def probe(i):
                    got = decide_probe(N, order, lambda ids: ablated[i, ids] - base[ids], 0.05 / max_probes(GRID),
                                       0.01, 64)
                    got.index = i
                    return got

                read.append(sum(p.n for p in bisect_crossing(GRID, probe).probes))
            print(f"N {N}, crossing {crossing} %, slope {slope} pt/%: {np.mean(read) / N:.2f} N per curve")


if __name__ == "__main__":
    main()
