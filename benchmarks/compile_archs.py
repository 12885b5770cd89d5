"""``fairseq-train --compile-layers`` against eager for every architecture of the plugin, through the
real command line: the same losses within numerical tolerance (fp32 on CPU, dropout off).

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.compile_archs --out benchmarks/results/compile_archs.json

Each architecture trains twice from the same seed on the package's reverse-and-map task
(``deepnet_experiments/synthetic.py``, binarised once), 2L-2L d32 unless ``--layers``/``--dim`` say
otherwise, ``--max-update`` updates, one with ``--compile-layers`` and one without. Reported per
architecture: the training loss logged at the last update (mean over the last ``--log-interval``
updates) of both runs and its relative difference (target: within 1 %), the relative L2 difference
of the final parameters, and both runs' wall time (the compiled one includes compilation).
Language models: ``deepnet_transformer_lm`` on the target side of the same text.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

import deepnet_methods
from deepnet_setups import runner

from .common import ROOT, machine, write_json


def translation_archs():
    from argparse import Namespace

    from fairseq import models, utils

    utils.import_user_module(Namespace(user_dir=str(runner.USER_DIR)))
    from deepnet_fairseq.models.layer_class_model import LayerClassTransformerModel

    return sorted(name for name, cls in models.MODEL_REGISTRY.items()
                  if isinstance(cls, type) and issubclass(cls, LayerClassTransformerModel))


def prepare(work):
    from deepnet_experiments.synthetic import write_reverse_map_task

    text = write_reverse_map_task(work / "text", train=1000, valid=50, test=50)
    dest = work / "bin"
    if not (dest / "train.src-tgt.src.bin").exists():
        subprocess.run([runner.program("fairseq-preprocess"), "-s", "src", "-t", "tgt", "--trainpref", text / "train",
                        "--validpref", text / "valid", "--destdir", dest, "--joined-dictionary", "--workers", "1"],
                       check=True, capture_output=True)
    lm = work / "lm_bin"
    if not (lm / "train.bin").exists():
        subprocess.run([runner.program("fairseq-preprocess"), "--only-source", "--trainpref", text / "train.tgt",
                        "--validpref", text / "valid.tgt", "--destdir", lm, "--workers", "1"],
                       check=True, capture_output=True)
    return dest, lm


def pre_ln(arch):
    """Whether the arch's method is Pre-LN: the command line then keeps its normalize-before flags on."""
    method = deepnet_methods.of_arch(arch)
    return bool(method and method.pre_ln)


def train(arch, data, run_dir, args, compiled):
    run_dir.mkdir(parents=True, exist_ok=True)
    if arch == "deepnet_transformer_lm":
        model = {"task": "language_modeling", "tokens_per_sample": 32, "decoder_layers": args.layers,
                 "decoder_embed_dim": args.dim, "decoder_ffn_embed_dim": 2 * args.dim, "decoder_attention_heads": 2,
                 "criterion": "cross_entropy", "share_decoder_input_output_embed": True}
    else:
        model = {"task": "translation", "source_lang": "src", "target_lang": "tgt", "encoder_layers": args.layers,
                 "decoder_layers": args.layers, "encoder_embed_dim": args.dim, "decoder_embed_dim": args.dim,
                 "encoder_ffn_embed_dim": 2 * args.dim, "decoder_ffn_embed_dim": 2 * args.dim,
                 "encoder_attention_heads": 2, "decoder_attention_heads": 2, "share_all_embeddings": True,
                 "criterion": "label_smoothed_cross_entropy", "label_smoothing": 0.1,
                 "encoder_normalize_before": pre_ln(arch), "decoder_normalize_before": pre_ln(arch)}
    options = {"arch": arch, **model, **runner.ADAM, "lr": args.lr, **runner.schedule(10, init_lr=None),
               "dropout": 0, "attention_dropout": 0, "activation_dropout": 0, "max_tokens": 600,
               "max_update": args.max_update, "seed": 1, **runner.CPU_LOG_EVERY_UPDATE,
               "log_interval": args.log_interval, "validate_interval": 100000, "save_dir": run_dir / "ckpt",
               "no_epoch_checkpoints": True, "save_interval_updates": args.max_update, "keep_interval_updates": 1,
               "no_last_checkpoints": True, "compile_layers": compiled}
    cmd = runner.fairseq_command("fairseq-train", data, options)
    start = time.perf_counter()
    log = run_dir / "train.log"
    env = dict(os.environ, TORCH_LOGS="recompiles,graph_breaks") if compiled else None  # in train.log
    with open(log, "w") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        return {"error": f"fairseq-train exited {proc.returncode}, see {log}", "seconds": seconds}
    records = [json.loads(line[line.index("{"):]) for line in log.read_text().splitlines()
               if "| train_inner |" in line and "{" in line]
    last = records[-1]
    ckpt = run_dir / "ckpt" / f"checkpoint_1_{args.max_update}.pt"
    if not ckpt.exists():
        ckpt = next((run_dir / "ckpt").glob(f"checkpoint_*_{args.max_update}.pt"))
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["model"]
    params = torch.cat([v.float().flatten() for k, v in sorted(state.items()) if v.is_floating_point()])
    lines = log.read_text().splitlines()
    warned = [line for line in lines if "--compile-layers" in line]
    recompiles = sum("Recompiling function" in line for line in lines)
    breaks = sum("Graph break" in line for line in lines)
    return {"update": int(last["num_updates"]), "loss": float(last["loss"]), "seconds": seconds,
            "params": params, "compile_warnings": warned, "recompiles": recompiles, "graph_breaks": breaks}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archs", nargs="*", help="default: every translation architecture + deepnet_transformer_lm")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--max-update", type=int, default=60)
    parser.add_argument("--log-interval", type=int, default=10)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--work", default="/tmp/deepnet_compile_archs")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    archs = args.archs or ["deepnet_transformer"] + [a for a in translation_archs() if a != "deepnet_transformer"] \
        + ["deepnet_transformer_lm"]
    work = Path(args.work)
    data, lm_data = prepare(work)
    result = {"machine": machine(), "command": " ".join(["python -m benchmarks.compile_archs", *sys.argv[1:]]),
              "max_update": args.max_update, "archs": {}}
    print(f"# {result['machine']}", flush=True)
    print("| arch | loss @%d eager | loss @%d compiled | rel. diff | final params rel. diff | eager s | compiled s "
          "| recompiles | graph breaks |" % (args.max_update, args.max_update), flush=True)
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    for arch in archs:
        source = lm_data if arch == "deepnet_transformer_lm" else data
        runs = {label: train(arch, source, work / arch / label, args, label == "compiled")
                for label in ("eager", "compiled")}
        if any("error" in r for r in runs.values()):
            result["archs"][arch] = {label: {k: v for k, v in r.items() if k != "params"} for label, r in runs.items()}
            print(f"| {arch} | {json.dumps(result['archs'][arch])} |", flush=True)
            continue
        e, c = runs["eager"], runs["compiled"]
        rel = abs(c["loss"] - e["loss"]) / abs(e["loss"])
        prel = ((c["params"] - e["params"]).norm() / e["params"].norm()).item()
        result["archs"][arch] = {"loss_eager": e["loss"], "loss_compiled": c["loss"], "loss_rel_diff": rel,
                                 "params_rel_diff": prel, "update": e["update"], "seconds_eager": e["seconds"],
                                 "seconds_compiled": c["seconds"], "within_1pct": rel <= 0.01,
                                 "compile_warnings": c["compile_warnings"], "recompiles": c["recompiles"],
                                 "graph_breaks": c["graph_breaks"]}
        print(f"| {arch} | {e['loss']:.4f} | {c['loss']:.4f} | {rel:.2e} | {prel:.2e} | {e['seconds']:.0f} "
              f"| {c['seconds']:.0f} | {c['recompiles']} | {c['graph_breaks']} |", flush=True)
        if args.out:
            write_json(args.out, result)
    ok = all(r.get("within_1pct") for r in result["archs"].values())
    print(f"every architecture within 1 %: {ok}", flush=True)
    if args.out:
        write_json(args.out, result)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
