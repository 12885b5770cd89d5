"""Beam-search speed of a trained deep deepnet_transformer checkpoint vs fairseq's ``transformer`` of
the same shape (incremental decoding, fairseq's SequenceGenerator), interleaved in one process.

    .venv/bin/python -m benchmarks.inference     # trains both briefly on a Multi30k de-en slice first

Steps (each skipped when its ``.done`` marker exists): binarise a slice of
../shared/data/multi30k_de_en with fairseq-preprocess; train each architecture for
``--max-update`` updates with fairseq-train; then decode the test slice with beam 5 in rounds,
alternating the models (order rotated each round).

Two decoding modes are timed:
- ``fixed``: every hypothesis is forced to exactly ``--fixed-len`` tokens (``min_len = max_len``),
  so both models do identical work per sentence whatever they learnt: the ratio is the cost of the
  architecture itself.
- ``natural``: fairseq's usual stopping (max length 1.2 x source + 10); models this briefly
  trained stop at different lengths, so its ratio mixes architecture cost with output length
  (mean hypothesis length is reported alongside).
"""

import argparse
import sys
import time
from argparse import Namespace
from pathlib import Path

import torch

import deepnet_methods
from deepnet_setups import runner

from .common import BASELINE, ROOT, fuse_deepnorm_residual, machine, quiet_fairseq, summarize, write_json

DATA = ROOT.parent / "shared" / "data" / "multi30k_de_en"
SLICE = (("train", "train", 3000), ("valid", "valid", 200), ("test", "test2016", 100))
ARCHS = (BASELINE, deepnet_methods.METHODS["deepnet"].arch())  # baseline first


def run(cmd, log):
    returncode = runner.run_quiet(cmd, log, env=runner.child_env())
    if returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({returncode}); see {log}")


def prepare(work):
    """A binarised Multi30k de-en slice (joined dictionary); idempotent."""
    out = work / "bin"
    if (work / "bin.done").exists():
        return out
    if not (DATA / "train.de").exists():
        raise FileNotFoundError(f"missing {DATA}/train.de (the benchmark reads ../shared/data/multi30k_de_en)")
    text = work / "text"
    text.mkdir(parents=True, exist_ok=True)
    for split, src, n in SLICE:
        for lang in ("de", "en"):
            lines = (DATA / f"{src}.{lang}").read_text(encoding="utf-8").splitlines()[:n]
            (text / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    tmp = work / "bin.tmp"
    run([runner.program("fairseq-preprocess"), "-s", "de", "-t", "en", "--trainpref", text / "train", "--validpref",
         text / "valid", "--testpref", text / "test", "--destdir", tmp, "--joined-dictionary", "--workers", "1"],
        work / "preprocess.log")
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.replace(out)
    (work / "bin.done").touch()
    return out


def train(work, data, arch, layers, max_update):
    """Train ``arch`` briefly with fairseq-train; returns the last checkpoint. Idempotent."""
    save = work / f"{arch}_{layers}L"
    done = save / ".done"
    if done.exists():
        return save / "checkpoint_last.pt"
    options = {"arch": arch, "cpu": True, "encoder_layers": layers, "decoder_layers": layers, **runner.SHAPES["tiny"],
               "share_decoder_input_output_embed": True, **runner.ADAM, "lr": 5e-4,
               **runner.schedule(50, init_lr=None), "dropout": 0.1, "criterion": "label_smoothed_cross_entropy",
               "label_smoothing": 0.1, "max_tokens": 2000, "max_update": max_update, "seed": 1, "save_dir": save,
               "no_epoch_checkpoints": True, "disable_validation": True, "log_format": "simple", "log_interval": 10}
    run(runner.fairseq_command("fairseq-train", data, options), work / f"train_{arch}_{layers}L.log")
    done.touch()
    return save / "checkpoint_last.pt"


class Decoder:
    """A loaded checkpoint and its beam-search generator."""

    def __init__(self, path, data, beam, **lengths):
        from fairseq import checkpoint_utils, utils

        # as --user-dir: registers and allow-lists
        utils.import_user_module(Namespace(user_dir=str(runner.USER_DIR)))
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(path)], arg_overrides={"data": str(data)})
        self.model = models[0].eval()
        self.task = task
        self.arch = cfg.model._name if hasattr(cfg.model, "_name") else cfg.model.arch
        self.generator = task.build_generator([self.model], Namespace(beam=beam, **lengths))
        if not self.generator.model.has_incremental_states():
            raise RuntimeError(f"{path}: decoder is not incremental")

    def decode(self, batches):
        """Returns (wall seconds, CPU seconds of this thread, sentences, mean hypothesis length)."""
        sentences = tokens = 0
        start, cpu_start = time.perf_counter(), time.thread_time()
        with torch.no_grad():
            for sample in batches:
                hypos = self.task.inference_step(self.generator, [self.model], sample)
                sentences += len(hypos)
                tokens += sum(len(h[0]["tokens"]) for h in hypos)
        return time.perf_counter() - start, time.thread_time() - cpu_start, sentences, tokens / max(sentences, 1)


def load_batches(task, batch_size):
    task.load_dataset("test")
    itr = task.get_batch_iterator(dataset=task.dataset("test"), max_sentences=batch_size, seed=1,
                                  ignore_invalid_inputs=False).next_epoch_itr(shuffle=False)
    return list(itr)


FUSED = "deepnet_transformer (fused add)"


def benchmark(checkpoints, data, beam, fixed_len, rounds, batch_size, modes=("fixed", "natural"), fused=False,
              log=print):
    all_modes = {
        "fixed": dict(max_len_a=0, max_len_b=fixed_len, min_len=fixed_len),
        "natural": dict(max_len_a=1.2, max_len_b=10, min_len=1),
    }
    results = {}
    for mode in modes:
        lengths = all_modes[mode]
        decoders = {arch: Decoder(checkpoints[arch], data, beam, **lengths) for arch in ARCHS}
        if fused:  # the deep checkpoint again, with the candidate one-kernel residual
            decoders[FUSED] = Decoder(checkpoints[ARCHS[1]], data, beam, **lengths)
            fuse_deepnorm_residual(decoders[FUSED].model)
        labels = list(decoders)
        batches = load_batches(decoders[ARCHS[0]].task, batch_size)
        for d in decoders.values():
            d.decode(batches[:1])  # warm-up
        timings = {label: {"wall": [], "cpu": [], "length": []} for label in labels}
        for r in range(rounds):
            for label in labels[r % len(labels):] + labels[: r % len(labels)]:
                wall, cpu, sentences, length = decoders[label].decode(batches)
                timings[label]["wall"].append(sentences / wall)
                timings[label]["cpu"].append(sentences / cpu)
                timings[label]["length"].append(length)
            log(f"  {mode} round {r + 1}/{rounds}: " + ", ".join(
                f"{a} {t['wall'][-1]:.2f} sent/s ({t['cpu'][-1]:.2f} per CPU s)" for a, t in timings.items()))
        base = timings[ARCHS[0]]
        results[mode] = {
            "sentences": sentences,
            "lengths": lengths,
            "models": {label: {"sentences_per_s_wall": summarize(t["wall"]), "sentences_per_s_cpu": summarize(t["cpu"]),
                               "mean_hypothesis_tokens": t["length"][-1]} for label, t in timings.items()},
        }
        for label in labels[1:]:
            for clock in ("wall", "cpu"):
                ratio = summarize([d / b for d, b in zip(timings[label][clock], base[clock])])
                key = f"ratio_{clock}" if label == ARCHS[1] else f"fused_ratio_{clock}"
                results[mode][key] = ratio
                results[mode]["models"][label][f"ratio_{clock}"] = ratio
    return results


def table(results, layers):
    lines = ["| mode | model | sentences/s wall median (min-max) | sentences per CPU s | mean hyp. tokens "
             "| ratio wall median (min-max) | ratio CPU median (min-max) |", "|---|---|---|---|---|---|---|"]
    for mode, res in results.items():
        for label, m in res["models"].items():
            w, c = m["sentences_per_s_wall"], m["sentences_per_s_cpu"]
            if label == ARCHS[0]:
                ratios = "1 (baseline) | 1 (baseline) |"
            else:
                rw = m.get("ratio_wall", res.get("ratio_wall"))
                rc = m.get("ratio_cpu", res.get("ratio_cpu"))
                ratios = (f"{rw['median']:.3f} ({rw['min']:.3f}-{rw['max']:.3f}) "
                          f"| {rc['median']:.3f} ({rc['min']:.3f}-{rc['max']:.3f}) |")
            lines.append(f"| {mode} | {label} {layers}L-{layers}L | {w['median']:.2f} ({w['min']:.2f}-{w['max']:.2f}) "
                         f"| {c['median']:.2f} | {m['mean_hypothesis_tokens']:.1f} | {ratios}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=12, help="layers per stack of both models (default 12)")
    parser.add_argument("--max-update", type=int, default=60, help="training updates per model (default 60)")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--fixed-len", type=int, default=20, help="tokens per hypothesis in the fixed mode")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=50, help="sentences per batch")
    parser.add_argument("--work", default="runs/benchmarks/inference", help="data and checkpoints (not committed)")
    parser.add_argument("--modes", default="fixed,natural", help="decoding modes to time: fixed, natural")
    parser.add_argument("--fused", action="store_true",
                        help="also time the deep checkpoint with the one-kernel residual (torch.add with alpha)")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    if not modes or any(m not in ("fixed", "natural") for m in modes):
        parser.error(f"--modes: comma-separated fixed/natural, got {args.modes!r}")
    if min(args.layers, args.max_update, args.beam, args.fixed_len, args.rounds, args.batch_size) < 1:
        parser.error("every numeric option must be >= 1")
    quiet_fairseq()
    info = machine()
    print(f"# machine: {info}", flush=True)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    data = prepare(work)
    checkpoints = {}
    for arch in ARCHS:
        start = time.perf_counter()
        checkpoints[arch] = train(work, data, arch, args.layers, args.max_update)
        print(f"  {arch} {args.layers}L-{args.layers}L checkpoint ready ({time.perf_counter() - start:.0f} s): "
              f"{checkpoints[arch]}", flush=True)
    results = benchmark(checkpoints, data, args.beam, args.fixed_len, args.rounds, args.batch_size, modes, args.fused,
                        log=lambda s: print(s, flush=True))
    print(table(results, args.layers))
    if args.out:
        write_json(args.out, {"machine": info, "command": " ".join(sys.argv), "layers": args.layers,
                              "max_update": args.max_update, "beam": args.beam, "results": results})
    return results


if __name__ == "__main__":
    main()
