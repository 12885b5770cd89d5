"""``--compile-layers`` against eager, in one process: seconds per training step after compilation,
the compilation cost, aten ops dispatched per step, and where the step's CPU time goes.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.compile_speed --shapes cpu \\
        --out benchmarks/results/compile_layers_cpu.json

``--against adam_foreach`` measures ``--optimizer adam_foreach`` against fairseq's ``adam`` the same way.

Two ``deepnet_transformer`` models with identical weights (the compiled one loads the eager one's
state dict) take real fairseq training steps (forward, backward, Adam) on the same fixed synthetic
batch. The first compiled steps compile (timed separately); then both are timed interleaved step by
step, the order swapped every round, ratios formed within a round and summarised as median
(min-max), by wall clock and by the CPU time of the compute thread, with the load average beside
them (other processes share the machine). One profiled step per model counts the ``aten::`` ops
(every dispatcher call torch.profiler records, nested ones included) and lists the ops with the
most self CPU time.

Shapes: ``18L-18L-d64`` (FFN 128, 2 heads; small batch: dominated by per-op overhead, like the
launch-bound GPU case) and ``18L-18L-iwslt`` (DeepNet 18L-18L at the IWSLT size, 512/1024/4).
"""

import argparse
import dataclasses
import os
import sys
import time
from collections import Counter

import torch

from deepnet_setups.runner import SHAPES

from .common import Batch, Bench, Shape, machine, quiet_fairseq, summarize, width, write_json

SHAPES = {
    "tiny": (Shape(2, 2, 32, 64, 2), Batch(4, 8, 8, 200)),
    "18L-18L-d64": (Shape(18, 18, **width(SHAPES["tiny"])), Batch(16, 20, 20, 1000)),
    "18L-18L-iwslt": (Shape(18, 18, 512, 1024, 4), Batch(16, 24, 24, 8000)),
    # GPU: scripts/train_iwslt.sh's model and batch size (--max-tokens 4096), and the paper's WMT shape
    "18L-18L-iwslt-4096": (Shape(18, 18, 512, 1024, 4), Batch(128, 32, 32, 10000)),
    "100L-100L-d512": (Shape(100, 100, 512, 2048, 8), Batch(256, 32, 32, 32000)),
}
SHAPE_SETS = {"cpu": ["18L-18L-d64", "18L-18L-iwslt"], "tiny": ["tiny"], "d64": ["18L-18L-d64"],
              "gpu": ["18L-18L-iwslt-4096", "100L-100L-d512"]}
ARCH = "deepnet_transformer"
# what the second model of a comparison adds: (its label, fairseq options), against the first model's label
AGAINST = {"compile_layers": ("eager", ["--compile-layers"]),
           "adam_foreach": ("adam", ["--optimizer", "adam_foreach"]),
           # GPU: fp16 without fairseq's fp32 master copy (no per-parameter copies), stepped with foreach ops
           "adam_foreach_mefp16": ("adam", ["--optimizer", "adam_foreach", "--memory-efficient-fp16"])}


def load():
    return os.getloadavg()[0]


def op_profile(bench, top=12, device="cpu"):
    """aten op count of one step, profiler events of compiled regions, the top ops by self CPU time,
    and on CUDA the number of GPU kernels launched and their summed GPU time."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        bench.step()
    kernels = {}
    if device == "cuda":
        gpu_events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        kernels = {"gpu_kernels_per_step": len(gpu_events),
                   "gpu_kernel_ms_per_step": sum(getattr(e, "device_time", None) or getattr(e, "cuda_time", 0.0)
                                                 for e in gpu_events) / 1e3}
    events = prof.key_averages()
    aten = {e.key: e.count for e in events if e.key.startswith("aten::")}
    compiled = {e.key: e.count for e in events if "Compiled" in e.key or "compiled" in e.key}
    total_self = sum(e.self_cpu_time_total for e in events)
    tops = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return {
        "aten_ops_per_step": sum(aten.values()),
        "distinct_aten_ops": len(aten),
        "aten_op_counts": dict(Counter(aten).most_common()),
        "compiled_region_events": compiled,
        "profiled_self_cpu_ms": total_self / 1e3,
        "top_self_cpu": [{"op": e.key, "calls": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3,
                          "share": e.self_cpu_time_total / total_self if total_self else 0.0} for e in tops],
        **kernels,
    }


def graph_stats():
    from torch._dynamo.utils import counters

    return {"unique_graphs": int(counters["stats"]["unique_graphs"]),
            "graph_breaks": int(sum(counters["graph_break"].values()))}


def compare(shape_name, rounds, steps, warmup, extra_args=(), log=print, device="cpu", against="compile_layers"):
    import torch._dynamo

    from torch._dynamo.utils import counters

    shape, batch = SHAPES[shape_name]
    torch._dynamo.reset()
    counters.clear()  # graph counts per shape (before 05:20 UTC 2026-11-30 they accumulated over shapes)
    torch.manual_seed(1)
    base, options = AGAINST[against]
    bench_a = Bench(ARCH, shape, batch, extra_args=extra_args, label=base, device=device)
    bench_b = Bench(ARCH, shape, batch, extra_args=[*extra_args, *options], label=against, device=device)
    bench_b.model.load_state_dict(bench_a.model.state_dict())
    layers = len(bench_b.model.encoder.layers) + len(bench_b.model.decoder.layers)
    first = {}
    for bench in (bench_a, bench_b):
        start, cpu = time.perf_counter(), time.thread_time()
        bench.step()
        first[bench.label] = {"wall_s": time.perf_counter() - start, "cpu_s": time.thread_time() - cpu,
                              "loss": bench.last_loss}
        for _ in range(warmup):
            bench.step()
    log(f"  first step: {base} {first[base]['wall_s']:.2f} s, {against} {first[against]['wall_s']:.1f} s "
        f"(compilation, if any), losses {first[base]['loss']:.4f} / {first[against]['loss']:.4f}")
    stats = graph_stats()
    log(f"  compiled graphs: {stats['unique_graphs']} for {layers} layers, graph breaks: {stats['graph_breaks']}")
    seconds = {clock: {base: [], against: []} for clock in ("wall", "cpu")}
    loads = []
    for r in range(rounds):
        order = (bench_a, bench_b) if r % 2 == 0 else (bench_b, bench_a)
        totals = {clock: {base: 0.0, against: 0.0} for clock in seconds}
        loads.append(load())
        for _ in range(steps):
            for bench in order:
                totals["wall"][bench.label] += bench.step()
                totals["cpu"][bench.label] += bench.last_cpu_seconds
        for clock in seconds:
            for label, total in totals[clock].items():
                seconds[clock][label].append(total / steps)
        log(f"  round {r + 1}/{rounds} (load {loads[-1]:.2f}): "
            + ", ".join(f"{label} {seconds['wall'][label][-1]:.3f} s ({seconds['cpu'][label][-1]:.3f} CPU s)"
                        for label in (base, against)))
    profiles = {bench.label: op_profile(bench, device=device) for bench in (bench_a, bench_b)}
    assert graph_stats()["unique_graphs"] == stats["unique_graphs"], "timed steps recompiled"
    out = {
        "shape": shape.name, "arch": ARCH, "labels": [base, against], "target_tokens_per_step": batch.target_tokens,
        "batch": dataclasses.asdict(batch), "layers": layers,
        "parameters": bench_a.parameters, "extra_args": list(extra_args),
        "first_step": first, "compiled_graphs": stats, "rounds": rounds, "steps_per_round": steps,
        "load_average_1min": summarize(loads),
        "last_loss": {base: bench_a.last_loss, against: bench_b.last_loss},
    }
    for clock in seconds:
        out[f"s_per_update_{clock}"] = {label: summarize(v) for label, v in seconds[clock].items()}
        out[f"speedup_{clock}"] = summarize([e / c for e, c in zip(seconds[clock][base], seconds[clock][against])])
    out["profile"] = profiles
    out["overflow_skips"] = {base: bench_a.overflow_skips, against: bench_b.overflow_skips}
    if device == "cuda":
        from .gpu import peak_tflops, step_flops

        flops = step_flops(bench_a)  # same math in both; counted eagerly (a dispatch mode would recompile)
        peak = peak_tflops(torch.cuda.get_device_name())
        out["step_flops"], out["peak_tflops"] = flops, peak
        for label in (base, against):
            tflops = flops / out["s_per_update_wall"][label]["median"] / 1e12
            out.setdefault("achieved_tflops", {})[label] = tflops
            out.setdefault("share_of_peak", {})[label] = tflops / peak if peak else None
            out.setdefault("target_words_per_s", {})[label] = batch.target_tokens / out["s_per_update_wall"][label]["median"]
    out["aten_ops_ratio"] = profiles[base]["aten_ops_per_step"] / max(1, profiles[against]["aten_ops_per_step"])
    return out


def render(result):
    """Markdown rows: one per shape."""
    base, against = next(iter(result["shapes"].values())).get("labels", ["eager", "compile_layers"])
    lines = [f"| shape | tokens/step | {base} s/update (wall) | {against} s/update (wall) | speed-up wall median (min-max) "
             f"| speed-up CPU time median (min-max) | aten ops/step {base} | aten ops/step {against} | graphs (layers) "
             f"| first {against} step s | load avg |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["shapes"].values():
        sw, sc = r["speedup_wall"], r["speedup_cpu"]
        lines.append(
            f"| {r['shape']} | {r['target_tokens_per_step']} | {r['s_per_update_wall'][base]['median']:.3f} "
            f"| {r['s_per_update_wall'][against]['median']:.3f} | {sw['median']:.2f}x ({sw['min']:.2f}-{sw['max']:.2f}) "
            f"| {sc['median']:.2f}x ({sc['min']:.2f}-{sc['max']:.2f}) | {r['profile'][base]['aten_ops_per_step']:,} "
            f"| {r['profile'][against]['aten_ops_per_step']:,} | {r['compiled_graphs']['unique_graphs']} ({r['layers']}) "
            f"| {r['first_step'][against]['wall_s']:.0f} | {r['load_average_1min']['median']:.1f} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="cpu", choices=sorted(SHAPE_SETS) + sorted(SHAPES))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps after the first (compiling) one")
    parser.add_argument("--extra-args", default="", help="more fairseq-train options for both models")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--against", default="compile_layers", choices=sorted(AGAINST),
                        help="what the second model adds: --compile-layers, or --optimizer adam_foreach")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    quiet_fairseq()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("benchmarks.compile_speed: no CUDA device visible")
    names = SHAPE_SETS.get(args.shapes, [args.shapes])
    result = {"machine": machine(), "command": " ".join(["python -m benchmarks.compile_speed", *sys.argv[1:]]),
              "shapes": {}}
    print(f"# machine: {result['machine']}", flush=True)
    for name in names:
        print(f"## {name}", flush=True)
        result["shapes"][name] = res = compare(name, args.rounds, args.steps, args.warmup, args.extra_args.split(),
                                               log=lambda s: print(s, flush=True), device=args.device,
                                               against=args.against)
        for label in res["labels"]:
            p = res["profile"][label]
            print(f"  {label}: {p['aten_ops_per_step']} aten ops/step ({p['distinct_aten_ops']} distinct); top self CPU: "
                  + ", ".join(f"{t['op'][:60]} {t['share']:.0%}" for t in p["top_self_cpu"][:6]), flush=True)
            if args.device == "cuda":
                print(f"  {label}: {p['gpu_kernels_per_step']} GPU kernels/step, {p['gpu_kernel_ms_per_step']:.1f} ms GPU "
                      f"kernel time/step; {res['target_words_per_s'][label]:.0f} target words/s; "
                      f"{res['achieved_tflops'][label]:.1f} TFLOP/s"
                      + (f" ({res['share_of_peak'][label]:.1%} of peak)" if res["share_of_peak"][label] else ""), flush=True)
        if args.out:
            write_json(args.out, result)
    print(render(result), flush=True)
    if args.out:
        write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
