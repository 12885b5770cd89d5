"""What CrossConST costs per update: DeepNet trained with the plugin's criterion at ``--crossconst-alpha`` A against the
same model and criterion at alpha 0 (no second forward) and fairseq's ``transformer`` with its own criterion,
interleaved in one process as benchmarks.throughput does (its shapes, batches and rounds).

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.crossconst_cost --shape 6L-6L-d128 --alpha 0.25 \
        --out benchmarks/results/crossconst_cost_cpu.json

The ratio printed is seconds per update with CrossConST over seconds per update without it (alpha 0), per round,
median (min-max) over rounds; docs/setups.md quotes it.
"""

import argparse
import sys

from .common import BASELINE, Bench, machine, quiet_fairseq, summarize, write_json
from .throughput import SHAPES, time_interleaved

CRITERION = ["--criterion", "diagnostic_label_smoothed_cross_entropy"]
DEEPNET = "deepnet_transformer"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="6L-6L-d128", choices=sorted(SHAPES))
    parser.add_argument("--alpha", type=float, default=0.25, help="CrossConST's weight (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=2, help="timed updates per model per round")
    parser.add_argument("--warmup", type=int, default=2, help="untimed updates per model first")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    if args.alpha <= 0 or min(args.rounds, args.steps) < 1 or args.warmup < 0:
        parser.error("--alpha must be > 0, --rounds and --steps >= 1, --warmup >= 0")
    quiet_fairseq()
    shape, batch = SHAPES[args.shape]
    off, on = f"{DEEPNET}, alpha 0", f"{DEEPNET}, alpha {args.alpha:g}"
    benches = [Bench(BASELINE, shape, batch), Bench(DEEPNET, shape, batch, CRITERION + ["--crossconst-alpha", "0"], label=off),
               Bench(DEEPNET, shape, batch, CRITERION + ["--crossconst-alpha", str(args.alpha)], label=on)]
    for bench in benches:
        for _ in range(args.warmup):
            bench.step()
    seconds = time_interleaved(benches, args.rounds, args.steps, ("wall", "cpu"))
    result = {"shape": args.shape, "alpha": args.alpha, "rounds": args.rounds, "steps_per_round": args.steps,
              "machine": machine(), "seconds_per_update": {}, "ratios": {}}
    for clock in ("wall", "cpu"):
        result["seconds_per_update"][clock] = {label: summarize(s) for label, s in seconds[clock].items()}
        result["ratios"][clock] = {
            "crossconst / alpha 0": summarize([a / b for a, b in zip(seconds[clock][on], seconds[clock][off])]),
            "alpha 0 / transformer": summarize([a / b for a, b in zip(seconds[clock][off], seconds[clock][BASELINE])])}
    for clock, ratios in result["ratios"].items():
        for name, r in ratios.items():
            print(f"{args.shape} {clock:4s} s/update {name}: {r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})")
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
