"""Depth scaling of deepnet_transformer up to 500L-500L (1,000 layers) at small width on CPU.

    .venv/bin/python -m benchmarks.depth_scaling            # depths 6 25 50 100 250 500, ckpt off/on

Every configuration runs in a fresh subprocess (so the process's peak RSS belongs to that model
alone) that builds the model through fairseq's registries, takes real fairseq training steps
(Adam) and reports: build seconds, parameters, seconds per update (median of the timed steps),
torch's allocator peak during a step (``Bench.peak_step_bytes``) split into persistent bytes
(parameters, gradients, Adam state) and the step's activation/workspace bytes, the bytes autograd
saves for backward, the process's peak RSS (VmHWM), loss and gradient norm (both must be finite)
and the DeepNorm alpha/beta the plugin logged. Writes a CSV, a plot and a Markdown table.
"""

import argparse
import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import torch

from deepnet_setups.runner import SHAPES

from .common import Batch, Bench, Shape, deepnorm_summary, machine, width, write_json

WIDTH = width(SHAPES["tiny"])  # DeepNet Fig. 5's 64-128-2
BATCH = Batch(sentences=16, src_len=24, tgt_len=24, vocab=1000)
DEPTHS = [6, 25, 50, 100, 250, 500]
FIELDS = [
    "layers_per_stack", "total_layers", "checkpoint_activations", "parameters", "build_s", "s_per_update",
    "cpu_s_per_update",
    "persistent_mib", "step_peak_mib", "activation_mib", "saved_for_backward_mib", "rss_between_steps_mib",
    "rss_step_peak_mib", "rss_step_increase_mib",
    "loss", "grad_norm", "encoder_alpha", "decoder_alpha",
]


def status_mib(field):
    """VmRSS / VmHWM of this process in MiB (Linux /proc)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak_rss():
    """Reset VmHWM to the current RSS (Linux: write 5 to /proc/self/clear_refs)."""
    Path("/proc/self/clear_refs").write_text("5")


# glibc returns blocks >= this size to the OS on free, so RSS follows torch's live tensors
CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def measure_one(layers, checkpoint_activations, timed_steps=2, batch=BATCH, width=WIDTH, profile_max_layers=100):
    """Build one deep model and train it a few steps; every number it returns was measured here."""
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s | %(message)s")
    logging.getLogger("deepnet_fairseq").setLevel(logging.INFO)  # the plugin logs alpha/beta at build
    extra = ["--checkpoint-activations"] if checkpoint_activations else []
    bench = Bench("deepnet_transformer", Shape(layers, layers, **width), batch, extra_args=extra)
    losses, norms, cpu_seconds = [], [], []

    def checked_step():
        seconds = bench.step()
        cpu_seconds.append(bench.last_cpu_seconds)
        losses.append(bench.last_loss)
        norms.append(bench.grad_norm())
        if not (math.isfinite(losses[-1]) and math.isfinite(norms[-1])):
            raise FloatingPointError(f"{layers}L-{layers}L: loss {losses[-1]}, grad norm {norms[-1]}")
        return seconds

    checked_step()  # warm-up: allocates gradients and Adam state
    seconds = sorted(checked_step() for _ in range(timed_steps))
    cpu = sorted(cpu_seconds[1:])
    # process-level step peak: RSS between steps, then the high-water mark of one more step
    rss_between = status_mib("VmRSS")
    reset_peak_rss()
    checked_step()
    rss_step_peak = status_mib("VmHWM")
    persistent = bench.persistent_bytes()
    # torch-allocator peak (exact, but torch.profiler's event log grows with depth: only up to a limit)
    peak = bench.peak_step_bytes()[1] if layers <= profile_max_layers else None
    norms.append(bench.grad_norm())
    saved = bench.saved_activation_bytes()
    summary = deepnorm_summary(bench.model)
    mib = 2**20
    return {
        "layers_per_stack": layers,
        "total_layers": 2 * layers,
        "checkpoint_activations": checkpoint_activations,
        "parameters": bench.parameters,
        "build_s": round(bench.build_seconds, 3),
        "s_per_update": round(seconds[len(seconds) // 2], 4),
        "cpu_s_per_update": round(cpu[len(cpu) // 2], 4),
        "persistent_mib": round(persistent / mib, 2),
        "step_peak_mib": round(peak / mib, 2) if peak is not None else None,
        "activation_mib": round((peak - persistent) / mib, 2) if peak is not None else None,
        "saved_for_backward_mib": round(saved / mib, 2),
        "rss_between_steps_mib": round(rss_between, 1),
        "rss_step_peak_mib": round(rss_step_peak, 1),
        "rss_step_increase_mib": round(rss_step_peak - rss_between, 1),
        "loss": round(losses[-1], 4),
        "grad_norm": round(norms[-1], 5),
        "all_losses_finite": all(math.isfinite(v) for v in losses),
        "all_grad_norms_finite": all(math.isfinite(v) for v in norms),
        "encoder_alpha": summary["encoder_alpha_in_layers"][0],
        "decoder_alpha": summary["decoder_alpha_in_layers"][0],
        "deepnorm": summary["constants"],
    }


def run_in_subprocess(layers, checkpoint_activations, timed_steps, profile_max_layers):
    cmd = [sys.executable, "-m", "benchmarks.depth_scaling", "--one", str(layers), "--timed-steps", str(timed_steps),
           "--profile-max-layers", str(profile_max_layers)]
    if checkpoint_activations:
        cmd.append("--checkpoint-activations")
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), **CHILD_ENV)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[1], env=env)


def collect(proc):
    stdout, stderr = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(proc.args)} failed ({proc.returncode}):\n{stderr[-3000:]}")
    row = json.loads(stdout.strip().splitlines()[-1])
    row["plugin_log"] = [line for line in stderr.splitlines() if "DeepNorm:" in line]
    return row


def linear_fit(xs, ys):
    """Least-squares line y = a + b x; returns (a, b, r_squared)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    ss_res = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys))
    ss_tot = sum((y - my) ** 2 for y in ys)
    return a, b, 1 - ss_res / ss_tot if ss_tot else 1.0


def fmt(value, spec):
    return "-" if value is None else format(value, spec)


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ckpt, style in ((False, "o-"), (True, "s--")):
        sel = sorted((r for r in rows if r["checkpoint_activations"] == ckpt), key=lambda r: r["total_layers"])
        label = "checkpoint activations" if ckpt else "no checkpointing"
        x = [r["total_layers"] for r in sel]
        axes[0].plot(x, [r["rss_step_peak_mib"] for r in sel], style, label=f"process peak RSS, {label}")
        axes[0].plot(x, [r["persistent_mib"] for r in sel], ":", color="gray")
        axes[1].plot(x, [r["rss_step_increase_mib"] for r in sel], style, label=f"RSS rise in a step, {label}")
        axes[1].plot(x, [r["saved_for_backward_mib"] for r in sel], style, alpha=0.5, label=f"saved for backward, {label}")
        axes[2].plot(x, [r["cpu_s_per_update"] for r in sel], style, label=label)
    axes[0].set(title="peak RSS during a step (gray: params+grads+Adam)", xlabel="total layers", ylabel="MiB")
    axes[1].set(title="activation memory", xlabel="total layers", ylabel="MiB")
    axes[2].set(title="CPU seconds per update (1 thread)", xlabel="total layers", ylabel="s")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"deepnet_transformer d{WIDTH['dim']} FFN {WIDTH['ffn']}, {BATCH.target_tokens} target tokens/batch")
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp" + path.suffix)
    fig.savefig(tmp, dpi=110)
    tmp.replace(path)


def report(rows):
    lines = ["| layers | ckpt | params | build s | s/update | CPU s/update | persistent MiB | torch step peak MiB "
             "| torch activation MiB | saved-for-backward MiB | RSS between steps MiB | RSS step peak MiB "
             "| RSS rise in step MiB | loss | grad norm | enc alpha | dec alpha |",
             "|" + "---|" * 17]
    for r in sorted(rows, key=lambda r: (r["checkpoint_activations"], r["total_layers"])):
        lines.append(
            f"| {r['layers_per_stack']}L-{r['layers_per_stack']}L | {'on' if r['checkpoint_activations'] else 'off'} "
            f"| {r['parameters']:,} | {r['build_s']:.2f} | {r['s_per_update']:.2f} | {r['cpu_s_per_update']:.2f} "
            f"| {r['persistent_mib']:.1f} | {fmt(r['step_peak_mib'], '.1f')} | {fmt(r['activation_mib'], '.1f')} "
            f"| {r['saved_for_backward_mib']:.1f} | {r['rss_between_steps_mib']:.0f} | {r['rss_step_peak_mib']:.0f} "
            f"| {r['rss_step_increase_mib']:.0f} | {r['loss']:.3f} | {r['grad_norm']:.4f} | {r['encoder_alpha']:.3f} "
            f"| {r['decoder_alpha']:.3f} |")
    lines.append("")
    for ckpt in (False, True):
        sel = [r for r in rows if r["checkpoint_activations"] == ckpt]
        if len(sel) >= 3:
            x = [r["total_layers"] for r in sel]
            for key, what in (("rss_step_peak_mib", "process peak RSS"), ("saved_for_backward_mib", "saved for backward"),
                              ("persistent_mib", "params+grads+Adam")):
                a, b, r2 = linear_fit(x, [r[key] for r in sel])
                lines.append(f"- checkpointing {'on' if ckpt else 'off'}: {what} = {a:.1f} MiB + {b:.3f} MiB/layer "
                             f"x layers, R^2 = {r2:.5f}")
    deepest = max(r["total_layers"] for r in rows)
    on = {r["total_layers"]: r for r in rows if r["checkpoint_activations"]}
    off = {r["total_layers"]: r for r in rows if not r["checkpoint_activations"]}
    if deepest in on and deepest in off:
        lo, hi = on[deepest], off[deepest]
        lines.append(f"- at {deepest} layers checkpointing cuts the bytes saved for backward from "
                     f"{hi['saved_for_backward_mib']:.0f} to {lo['saved_for_backward_mib']:.0f} MiB, the RSS rise during a "
                     f"step from {hi['rss_step_increase_mib']:.0f} to {lo['rss_step_increase_mib']:.0f} MiB and the "
                     f"process peak from {hi['rss_step_peak_mib']:.0f} to {lo['rss_step_peak_mib']:.0f} MiB, for "
                     f"{lo['cpu_s_per_update'] / hi['cpu_s_per_update']:.2f}x CPU time per update")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depths", default=",".join(map(str, DEPTHS)), help="layers per stack, comma-separated")
    parser.add_argument("--timed-steps", type=int, default=2, help="timed updates per configuration (default 2)")
    parser.add_argument("--profile-max-layers", type=int, default=100,
                        help="measure torch's allocator peak with torch.profiler up to this depth (default 100)")
    parser.add_argument("--out-dir", default="benchmarks/results", help="where the CSV, plot and JSON go")
    parser.add_argument("--name", default="depth_scaling", help="file stem of the outputs")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # child mode: one configuration, JSON on stdout
    parser.add_argument("--checkpoint-activations", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one is not None:
        print(json.dumps(measure_one(args.one, args.checkpoint_activations, args.timed_steps,
                                     profile_max_layers=args.profile_max_layers)))
        return None
    try:
        depths = [int(d) for d in args.depths.split(",")]
    except ValueError:
        parser.error(f"--depths must be comma-separated integers, got {args.depths!r}")
    if not depths or min(depths) < 1:
        parser.error("--depths must be positive")
    info = machine()
    print(f"# machine: {info}", flush=True)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    done_rows = out / f"{args.name}.rows.jsonl"  # one finished configuration per line: reruns skip them
    rows = [json.loads(line) for line in done_rows.read_text().splitlines()] if done_rows.exists() else []
    for layers in depths:
        todo = [ckpt for ckpt in (False, True)
                if not any(r["layers_per_stack"] == layers and r["checkpoint_activations"] == ckpt for r in rows)]
        procs = [(ckpt, run_in_subprocess(layers, ckpt, args.timed_steps, args.profile_max_layers)) for ckpt in todo]
        for ckpt, proc in procs:  # checkpointing off and on run side by side, one thread each
            row = collect(proc)
            print(f"  {layers}L-{layers}L ckpt={'on' if ckpt else 'off'}: {row['parameters']:,} params, "
                  f"build {row['build_s']:.1f} s, {row['s_per_update']:.2f} s/update ({row['cpu_s_per_update']:.2f} CPU s), "
                  f"peak RSS {row['rss_step_peak_mib']:.0f} MiB, loss {row['loss']:.3f}, grad norm {row['grad_norm']:.4f}; "
                  f"plugin log: {row['plugin_log']}", flush=True)
            rows.append(row)
            with open(done_rows, "a") as f:
                f.write(json.dumps(row) + "\n")
    rows = [r for r in rows if r["layers_per_stack"] in depths]
    tmp = out / f"{args.name}.csv.tmp"
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(sorted(rows, key=lambda r: (r["checkpoint_activations"], r["total_layers"])))
    tmp.replace(out / f"{args.name}.csv")
    plot(rows, out / f"{args.name}.png")
    write_json(out / f"{args.name}.json", {"machine": info, "command": " ".join(sys.argv), "width": WIDTH,
                                           "batch": BATCH.__dict__, "rows": rows})
    print(report(rows))
    return rows


if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    main()
