"""Where would a throughput difference come from? torch.profiler op counts and CPU time per op of one
fairseq training step of each family at the same shape (interleaved, median over repeats).

    .venv/bin/python -m benchmarks.profile_ops --shape 6L-6L-d128

Prints total self CPU time per model and every op whose call count differs from ``transformer``'s
(deterministic), with its self CPU time: the cost the architecture adds or removes. ``--fused``
also profiles deepnet_transformer with the residual scale folded into the add
(``torch.add(x, residual, alpha=alpha)``, one kernel instead of mul + add), a candidate change for
the model file.
"""

import argparse
import statistics
import sys
from collections import defaultdict

import torch

from .common import BASELINE, FAMILIES, Bench, fuse_deepnorm_residual, machine, quiet_fairseq, write_json
from .throughput import SHAPES


class FusedDeepNet(Bench):
    """deepnet_transformer whose layers compute alpha * residual + x in one torch.add."""

    def __init__(self, shape, batch):
        super().__init__("deepnet_transformer", shape, batch, label="deepnet_transformer (fused add)")
        fuse_deepnorm_residual(self.model)


def profile_step(bench):
    """{op name: (calls, self CPU microseconds)} for one training step."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        bench.step()
    return {e.key: (e.count, e.self_cpu_time_total) for e in prof.key_averages()}


def residual_cost(shape, alpha=2.0, reps=2000):
    """CPU microseconds (this thread) of one residual connection, forward + backward, per variant.

    The three ways a sublayer can join its branch ``x`` to the ``residual``: fairseq's
    ``residual + x``, the plugin's ``residual * alpha + x`` and the fused ``torch.add(x, residual,
    alpha=alpha)``. Interleaved, median of 5 blocks of ``reps`` calls each.
    """
    import time

    variants = {
        "residual + x": lambda x, r: r + x,
        "residual * alpha + x": lambda x, r: r * alpha + x,
        "torch.add(x, residual, alpha=alpha)": lambda x, r: torch.add(x, r, alpha=alpha),
    }
    x = torch.randn(shape, requires_grad=True)
    r = torch.randn(shape, requires_grad=True)
    grad = torch.randn(shape)
    blocks = defaultdict(list)
    for _ in range(5):
        for name, fn in variants.items():
            start = time.thread_time()
            for _ in range(reps):
                fn(x, r).backward(grad)
            blocks[name].append((time.thread_time() - start) / reps * 1e6)
    x.grad = r.grad = None
    return {name: statistics.median(v) for name, v in blocks.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="6L-6L-d128", help=f"one of {sorted(SHAPES)}")
    parser.add_argument("--repeats", type=int, default=5, help="profiled steps per model (default 5)")
    parser.add_argument("--fused", action="store_true", help="also profile the fused-add DeepNorm residual")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    if args.shape not in SHAPES:
        parser.error(f"unknown shape {args.shape!r}; known: {sorted(SHAPES)}")
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    quiet_fairseq()
    shape, batch = SHAPES[args.shape]
    benches = [Bench(arch, shape, batch) for arch in FAMILIES]
    if args.fused:
        benches.append(FusedDeepNet(shape, batch))
    for bench in benches:
        bench.step()
        bench.step()
    samples = defaultdict(list)  # label -> [profile per repeat]
    for r in range(args.repeats):
        order = benches[r % len(benches):] + benches[: r % len(benches)]
        for bench in order:
            samples[bench.label].append(profile_step(bench))

    def median_self_us(label, op):
        return statistics.median(p.get(op, (0, 0))[1] for p in samples[label])

    def calls(label, op):
        return samples[label][0].get(op, (0, 0))[0]

    print(f"# machine: {machine()}\n## {args.shape}, one training step, {args.repeats} profiled steps per model")
    # self CPU time of the step's ops (excluding the profiler's own step annotations)
    totals = {label: statistics.median(sum(t for op, (_, t) in p.items() if op.startswith("aten::")) for p in ps)
              for label, ps in samples.items()}
    result = {"shape": args.shape, "repeats": args.repeats, "aten_self_cpu_ms": {k: v / 1e3 for k, v in totals.items()},
              "differing_ops": {}}
    for label, total in totals.items():
        print(f"{label}: aten self CPU {total / 1e3:.1f} ms per step (median), ratio to {BASELINE} "
              f"{totals[BASELINE] / total:.3f}")
    ops = sorted({op for ps in samples.values() for p in ps for op in p if op.startswith("aten::")})
    for label in samples:
        if label == BASELINE:
            continue
        diff = [(op, calls(label, op) - calls(BASELINE, op), median_self_us(label, op) - median_self_us(BASELINE, op))
                for op in ops if calls(label, op) != calls(BASELINE, op)]
        result["differing_ops"][label] = [{"op": op, "extra_calls": n, "extra_self_cpu_ms": t / 1e3} for op, n, t in diff]
        print(f"\n{label} vs {BASELINE}: ops whose call count differs")
        print("| op | extra calls | extra self CPU ms (median) |\n|---|---|---|")
        for op, n, t in diff:
            print(f"| {op} | {n:+d} | {t / 1e3:+.2f} |")
    # the only ops DeepNorm adds are its residual scale's: price them in isolation, by CPU time
    sublayers = 2 * shape.encoder_layers + 3 * shape.decoder_layers
    cost = residual_cost((batch.tgt_len, batch.sentences, shape.dim))
    result["residual_us_fwd_bwd"] = cost
    result["sublayers"] = sublayers
    print(f"\nresidual connection on a {batch.tgt_len}x{batch.sentences}x{shape.dim} tensor, forward+backward, "
          f"CPU microseconds (median):")
    for name, us in cost.items():
        print(f"  {name}: {us:.1f} us; x {sublayers} sublayers = {us * sublayers / 1e3:.2f} ms per step")
    if args.out:
        write_json(args.out, {"command": " ".join(sys.argv), **result})
    return result


if __name__ == "__main__":
    main()
