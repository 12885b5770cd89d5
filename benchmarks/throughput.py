"""Training throughput and peak memory of deepnet_transformer and preln_transformer against fairseq's
``transformer`` of identical shape, interleaved in one process.

    .venv/bin/python -m benchmarks.throughput                  # CPU default: 6L-6L and 48L-48L at d128
    .venv/bin/python -m benchmarks.throughput --shapes paper --device cuda   # the paper's shapes (GPU)

Each round runs every model for ``--steps`` timed fairseq training steps (forward, backward, Adam),
interleaved step by step in an order rotated every round (ABCABC, BCABCA, ...), so load from other processes and
thermal drift hit all models alike. Ratios are formed within a round, then summarised over rounds
(median, min, max), by wall clock and, on CPU, by the CPU time of the (single) compute thread,
which does not count time spent waiting for a core on a busy machine. Peak memory is measured per model: on CPU as torch's allocator peak during a
step (torch.profiler memory events, see ``Bench.peak_step_bytes``), on CUDA with
``torch.cuda.max_memory_allocated``.
"""

import argparse
import sys

import torch

from .common import BASELINE, FAMILIES, Batch, Bench, Shape, machine, quiet_fairseq, summarize, write_json

THROUGHPUT_TARGET = 0.98  # model words/s divided by transformer's, at least
MEMORY_TARGET = 1.02  # model peak bytes divided by transformer's, at most

# name: (shape, batch). Batches are synthetic and fixed-length (no padding), identical per shape.
SHAPES = {
    "tiny": (Shape(2, 2, 32, 64, 2), Batch(4, 8, 8, 200)),
    "6L-6L-d128": (Shape(6, 6, 128, 512, 4), Batch(16, 32, 32, 8000)),
    "48L-48L-d128": (Shape(48, 48, 128, 512, 4), Batch(16, 32, 32, 8000)),
    # the paper's shapes: WMT-17 base-size 100L-100L (Table 1) and the 102-language 100L-100L d1024
    "100L-100L-d512": (Shape(100, 100, 512, 2048, 8), Batch(128, 32, 32, 32000)),
    "100L-100L-d1024": (Shape(100, 100, 1024, 4096, 16), Batch(128, 32, 32, 32000)),
}
SHAPE_SETS = {
    "cpu": ["6L-6L-d128", "48L-48L-d128"],
    "paper": ["100L-100L-d512", "100L-100L-d1024"],
    "tiny": ["tiny"],
}


def peak_memory(bench, device):
    if device == "cpu":
        return bench.peak_step_bytes()[1]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    bench.step()
    return torch.cuda.max_memory_allocated()


def time_interleaved(benches, rounds, steps, clocks=("wall",), log=print):
    """Seconds per update of each bench, per round: {clock: {arch: [seconds, ...]}}.

    Steps are interleaved one by one (A B C A B C ...) and the order is rotated every round.
    """
    seconds = {clock: {b.label: [] for b in benches} for clock in clocks}
    for r in range(rounds):
        order = benches[r % len(benches):] + benches[: r % len(benches)]
        totals = {clock: {b.label: 0.0 for b in benches} for clock in clocks}
        for _ in range(steps):
            for bench in order:
                totals["wall"][bench.label] += bench.step()
                if "cpu" in totals:
                    totals["cpu"][bench.label] += bench.last_cpu_seconds
        for clock in clocks:
            for arch, total in totals[clock].items():
                seconds[clock][arch].append(total / steps)
        log(f"  round {r + 1}/{rounds}: " + ", ".join(
            f"{a} {seconds['wall'][a][-1]:.3f} s/update" + (f" ({seconds['cpu'][a][-1]:.3f} CPU s)" if "cpu" in seconds else "")
            for a in seconds["wall"]))
    return seconds


def compare(shape_name, families, rounds, steps, warmup, device, extra_args=(), log=print):
    """Build every family at one shape, time them interleaved, measure memory; return a result dict."""
    shape, batch = SHAPES[shape_name]
    benches = []
    for arch in families:
        bench = Bench(arch, shape, batch, extra_args=extra_args, device=device)
        for _ in range(warmup):
            bench.step()
        benches.append(bench)
        log(f"  built {arch} {shape.name}: {bench.parameters:,} parameters in {bench.build_seconds:.2f} s")

    clocks = ("wall", "cpu") if device == "cpu" else ("wall",)
    seconds = time_interleaved(benches, rounds, steps, clocks, log)
    result = {"shape": shape_name, "model": shape.__dict__, "batch": batch.__dict__, "rounds": rounds,
              "steps_per_round": steps, "device": device, "clocks": list(clocks), "models": {}}
    for bench in benches:
        peak = peak_memory(bench, device)
        model = result["models"][bench.arch] = {
            "parameters": bench.parameters,
            "peak_bytes": peak,
            "saved_activation_bytes": bench.saved_activation_bytes(),
            "last_loss": bench.last_loss,
        }
        for clock in clocks:
            per_round = seconds[clock][bench.arch]
            model[f"updates_per_s_{clock}"] = summarize([1 / s for s in per_round])
            model[f"words_per_s_{clock}"] = summarize([batch.target_tokens / s for s in per_round])
    for bench in benches:
        if bench.arch == BASELINE:
            continue
        model = result["models"][bench.arch]
        for clock in clocks:
            base = seconds[clock][BASELINE]
            model[f"throughput_ratio_{clock}"] = summarize([b / s for b, s in zip(base, seconds[clock][bench.arch])])
        model["peak_memory_ratio"] = model["peak_bytes"] / result["models"][BASELINE]["peak_bytes"]
    return result


def _spread(summary, fmt):
    return f"{summary['median']:{fmt}} ({summary['min']:{fmt}}-{summary['max']:{fmt}})"


def table(results):
    """Markdown table; throughput by wall clock and, on CPU, by this thread's CPU time."""
    lines = [
        "| shape | model | params | clock | words/s median (min-max) | updates/s | throughput ratio median (min-max) "
        "| peak MiB | peak ratio | saved activations MiB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        for arch, m in result["models"].items():
            for clock in result["clocks"]:
                ratio = m.get(f"throughput_ratio_{clock}")
                lines.append(
                    f"| {result['shape']} | {arch} | {m['parameters']:,} | {clock} "
                    f"| {_spread(m[f'words_per_s_{clock}'], '.0f')} | {m[f'updates_per_s_{clock}']['median']:.3f} "
                    f"| {_spread(ratio, '.3f') if ratio else '1 (baseline)'} | {m['peak_bytes'] / 2**20:.1f} "
                    f"| {m['peak_memory_ratio']:.4f} | {m['saved_activation_bytes'] / 2**20:.1f} |"
                    if "peak_memory_ratio" in m else
                    f"| {result['shape']} | {arch} | {m['parameters']:,} | {clock} "
                    f"| {_spread(m[f'words_per_s_{clock}'], '.0f')} | {m[f'updates_per_s_{clock}']['median']:.3f} "
                    f"| 1 (baseline) | {m['peak_bytes'] / 2**20:.1f} | 1 (baseline) "
                    f"| {m['saved_activation_bytes'] / 2**20:.1f} |"
                )
    return "\n".join(lines)


def verdicts(results):
    lines = []
    for result in results:
        for arch, m in result["models"].items():
            if arch == BASELINE:
                continue
            p = m["peak_memory_ratio"]
            parts = []
            for clock in result["clocks"]:
                t = m[f"throughput_ratio_{clock}"]["median"]
                parts.append(f"throughput ratio ({clock}) {t:.3f} ({'meets' if t >= THROUGHPUT_TARGET else 'MISSES'} "
                             f">= {THROUGHPUT_TARGET})")
            parts.append(f"peak-memory ratio {p:.4f} ({'meets' if p <= MEMORY_TARGET else 'MISSES'} <= {MEMORY_TARGET})")
            lines.append(f"{result['shape']} {arch}: " + ", ".join(parts))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="cpu", help=f"a set {sorted(SHAPE_SETS)} or comma-separated names {sorted(SHAPES)}")
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated architectures (first = baseline)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    parser.add_argument("--steps", type=int, default=3, help="timed updates per model per round (default 3)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed updates per model first (default 2)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--extra-args", default="", help="extra fairseq-train options for every model, e.g. '--fp16'")
    args = parser.parse_args(argv)

    names = SHAPE_SETS.get(args.shapes, args.shapes.split(","))
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        parser.error(f"unknown shape(s) {unknown}; known: {sorted(SHAPES)} or sets {sorted(SHAPE_SETS)}")
    families = args.families.split(",")
    if families[0] != BASELINE:
        parser.error(f"--families must start with the baseline {BASELINE!r}")
    if min(args.rounds, args.steps) < 1 or args.warmup < 0:
        parser.error("--rounds and --steps must be >= 1, --warmup >= 0")
    quiet_fairseq()
    info = machine()
    print(f"# machine: {info}", flush=True)
    results = []
    for name in names:
        print(f"## {name}", flush=True)
        results.append(compare(name, families, args.rounds, args.steps, args.warmup, args.device,
                               extra_args=args.extra_args.split(), log=lambda s: print(s, flush=True)))
    print(table(results))
    print(verdicts(results))
    if args.out:
        write_json(args.out, {"machine": info, "command": " ".join(sys.argv), "results": results})
    return results


if __name__ == "__main__":
    main()
