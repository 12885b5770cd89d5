"""GPU checks, in one go (run by benchmarks/gpu_check.sh; about 10 minutes on one GPU):

1. fp16 and bf16 fairseq training steps of deepnet_transformer vs ``transformer`` at the paper's
   WMT-17 base shape (100L-100L d512), interleaved: words/s ratio, peak-memory ratio, tokens/s and
   achieved TFLOP/s (FLOPs counted by torch.utils.flop_counter on a real step) vs the device's peak.
2. apex on/off (fused LayerNorm + fused Adam vs torch's), where NVIDIA apex is installed.
3. The largest depth (NL-NL) that trains a step at d512 with --checkpoint-activations (bf16),
   searched within a time budget.

``--smoke`` runs the same code on CPU with a tiny shape in fp32 (no fp16/bf16, no OOM search) so
the script can be checked where no GPU is available.
"""

import argparse
import gc
import json
import sys
import time

import torch

from .common import BASELINE, Batch, Bench, Shape, is_oom, machine, quiet_fairseq, summarize
from .throughput import time_interleaved

# Dense fp16/bf16 tensor-core peak TFLOP/s from the vendors' data sheets (no sparsity), by name fragment.
PEAK_TFLOPS = [
    ("H200", 989.0), ("H100 SXM", 989.0), ("H100 NVL", 835.0), ("H100 PCIe", 756.0), ("H100", 756.0),
    ("A100", 312.0), ("L40S", 362.0), ("A10G", 125.0), ("A10", 125.0), ("L4", 121.0), ("V100", 125.0),
]
A_B_SHAPE = (Shape(100, 100, 512, 2048, 8), Batch(256, 32, 32, 32000))  # 8,192 target tokens per step
SEARCH_WIDTH = dict(dim=512, ffn=2048, heads=8)
SEARCH_BATCH = Batch(128, 32, 32, 32000)
SMOKE_SHAPE = (Shape(2, 2, 32, 64, 2), Batch(4, 8, 8, 200))


def peak_tflops(name):
    for fragment, tflops in PEAK_TFLOPS:
        if fragment in name:
            return tflops
    return None


def step_flops(bench):
    """FLOPs of one training step's forward and backward, counted by torch on a real step."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        bench.step()
    return counter.get_total_flops()


def free(*benches):
    for bench in benches:
        bench.trainer = bench.model = bench.criterion = None
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def precision_ab(precision_args, device, shape, batch, rounds, steps, log):
    """deepnet_transformer vs transformer at one precision; ratios, tokens/s, TFLOP/s."""
    benches = [Bench(arch, shape, batch, extra_args=precision_args, device=device)
               for arch in (BASELINE, "deepnet_transformer")]
    for bench in benches:
        for _ in range(2):
            bench.step()
    seconds = time_interleaved(benches, rounds, steps, ("wall",), log)["wall"]
    out = {}
    for bench in benches:
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            bench.step()
            peak = torch.cuda.max_memory_allocated()
        else:
            peak = bench.peak_step_bytes()[1]
        flops = step_flops(bench)
        median = summarize(seconds[bench.label])["median"]
        out[bench.label] = {"parameters": bench.parameters, "s_per_update": summarize(seconds[bench.label]),
                            "tokens_per_s": batch.target_tokens / median, "step_flops": flops,
                            "achieved_tflops": flops / median / 1e12, "peak_bytes": peak, "loss": bench.last_loss,
                            "overflow_skips": bench.overflow_skips}
    base, deep = seconds[BASELINE], seconds["deepnet_transformer"]
    out["throughput_ratio"] = summarize([b / d for b, d in zip(base, deep)])
    out["peak_memory_ratio"] = out["deepnet_transformer"]["peak_bytes"] / out[BASELINE]["peak_bytes"]
    free(*benches)
    return out


def apex_ab(precision_args, device, shape, batch, rounds, steps, log):
    """deepnet_transformer with apex's fused LayerNorm/Adam vs torch's (fairseq picks apex when present)."""
    try:
        from apex.normalization import FusedLayerNorm  # noqa: F401  (NVIDIA apex, not PyPI's 'apex')
    except ImportError:
        return {"skipped": "NVIDIA apex is not installed (fairseq falls back to torch's LayerNorm and Adam)"}
    import fairseq.modules.layer_norm as layer_norm

    on = Bench("deepnet_transformer", shape, batch, extra_args=precision_args, device=device, label="apex_on")
    saved = layer_norm.has_fused_layernorm
    layer_norm.has_fused_layernorm = False
    try:
        off = Bench("deepnet_transformer", shape, batch, extra_args=[*precision_args, "--use-old-adam"],
                    device=device, label="apex_off")
    finally:
        layer_norm.has_fused_layernorm = saved
    for bench in (on, off):
        for _ in range(2):
            bench.step()
    seconds = time_interleaved([on, off], rounds, steps, ("wall",), log)["wall"]
    out = {"apex_on_s_per_update": summarize(seconds["apex_on"]), "apex_off_s_per_update": summarize(seconds["apex_off"]),
           "speedup_apex_on": summarize([o / a for a, o in zip(seconds["apex_on"], seconds["apex_off"])])}
    free(on, off)
    return out


def try_depth(layers, precision_args, device, batch):
    """Build NL-NL d512 with activation checkpointing and take one step; returns a record or raises."""
    start = time.perf_counter()
    bench = Bench("deepnet_transformer", Shape(layers, layers, **SEARCH_WIDTH), batch,
                  extra_args=[*precision_args, "--checkpoint-activations"], device=device)
    try:
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        seconds = bench.step()
        record = {"layers_per_stack": layers, "parameters": bench.parameters, "build_s": bench.build_seconds,
                  "s_per_update": seconds, "loss": bench.last_loss, "grad_norm": bench.grad_norm(),
                  "overflow_skips": bench.overflow_skips,
                  "total_s": time.perf_counter() - start}
        if device == "cuda":
            record["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        return record
    finally:
        free(bench)


def largest_depth(precision_args, device, batch, budget_s, candidates, log):
    """Largest NL-NL that fits: try ``candidates`` in order until one fails, then bisect, within budget_s."""
    start = time.perf_counter()
    fit, fail, records = 0, None, []

    def attempt(layers):
        nonlocal fit, fail
        try:
            record = try_depth(layers, precision_args, device, batch)
            fit = max(fit, layers)
            records.append(record)
            log(f"  {layers}L-{layers}L fits: {json.dumps(record)}")
        except Exception as error:  # noqa: BLE001 - OOM can surface as several error types
            if not is_oom(error):
                raise
            fail = layers if fail is None else min(fail, layers)
            records.append({"layers_per_stack": layers, "oom": str(error).splitlines()[0][:200]})
            log(f"  {layers}L-{layers}L: out of memory")
        free()  # outside the except block, so the traceback no longer holds the failed model's tensors

    for layers in candidates:
        if time.perf_counter() - start > budget_s:
            break
        attempt(layers)
        if fail is not None:
            break
    while fail is not None and fail - fit > max(25, fit // 20) and time.perf_counter() - start < budget_s:
        attempt((fit + fail) // 2)
    return {"largest_fit_layers_per_stack": fit, "smallest_oom_layers_per_stack": fail, "attempts": records,
            "search_s": time.perf_counter() - start}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny CPU run of the same code paths (fp32)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--search-budget-s", type=float, default=240, help="time for the depth search (default 240)")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    quiet_fairseq()
    if args.smoke:
        device, (shape, batch), search_batch = "cpu", SMOKE_SHAPE, SMOKE_SHAPE[1]
        precisions = {"fp32 (smoke)": []}
        candidates, search_precision = [2, 4], []
    else:
        if not torch.cuda.is_available():
            sys.exit("benchmarks.gpu: no CUDA device visible (use --smoke to check the code on CPU)")
        device, (shape, batch), search_batch = "cuda", A_B_SHAPE, SEARCH_BATCH
        precisions = {"fp16": ["--fp16"], "bf16": ["--bf16"]}
        candidates, search_precision = [250, 500, 750, 1000, 1500], ["--bf16"]
    info = machine()
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(gpu_memory_gib=props.total_memory / 2**30, capability=f"{props.major}.{props.minor}",
                    cuda=torch.version.cuda)
    peak = peak_tflops(info.get("gpu") or "")
    print(f"# machine: {info}; dense fp16/bf16 peak: {peak or 'unknown'} TFLOP/s", flush=True)
    log = lambda s: print(s, flush=True)  # noqa: E731
    results = {"machine": info, "peak_tflops": peak, "precision": {}}
    for name, precision_args in precisions.items():
        print(f"## {name}: deepnet_transformer vs transformer, {shape.name}, {batch.target_tokens} tokens/step", flush=True)
        res = results["precision"][name] = precision_ab(precision_args, device, shape, batch, args.rounds, args.steps, log)
        for arch in (BASELINE, "deepnet_transformer"):
            m = res[arch]
            print(f"  {arch}: {m['s_per_update']['median']:.4f} s/update, {m['tokens_per_s']:.0f} tokens/s, "
                  f"{m['achieved_tflops']:.4g} TFLOP/s ({m['step_flops'] / 1e12:.4g} TFLOP/step)" + (f" ({m['achieved_tflops'] / peak:.1%} of peak)" if peak else "")
                  + f", peak memory {m['peak_bytes'] / 2**30:.2f} GiB"
                  + f", {m['overflow_skips']} step(s) skipped on fp16 overflow and retried", flush=True)
        print(f"  throughput ratio deepnet/transformer: {res['throughput_ratio']['median']:.3f} "
              f"({res['throughput_ratio']['min']:.3f}-{res['throughput_ratio']['max']:.3f}); "
              f"peak-memory ratio {res['peak_memory_ratio']:.4f}", flush=True)
    first = next(iter(precisions.values()))
    print("## apex on/off (deepnet_transformer)", flush=True)
    results["apex"] = apex_ab(first, device, shape, batch, args.rounds, args.steps, log)
    print(f"  {json.dumps(results['apex'])}", flush=True)
    if args.smoke:  # the tiny CPU check uses the tiny width, not d512
        SEARCH_WIDTH.update(dim=32, ffn=64, heads=2)
    print(f"## largest depth at d{SEARCH_WIDTH['dim']} with --checkpoint-activations ({' '.join(search_precision) or 'fp32'}, "
          f"{search_batch.target_tokens} tokens/step, budget {args.search_budget_s:.0f} s)", flush=True)
    results["depth_search"] = largest_depth(search_precision, device, search_batch, args.search_budget_s, candidates, log)
    print(f"  largest fit: {results['depth_search']['largest_fit_layers_per_stack']}L-"
          f"{results['depth_search']['largest_fit_layers_per_stack']}L; first OOM: "
          f"{results['depth_search']['smallest_oom_layers_per_stack']}", flush=True)
    if args.out:
        from .common import write_json

        write_json(args.out, results)
    return results


if __name__ == "__main__":
    main()
