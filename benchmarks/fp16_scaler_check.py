"""fp16 guard rail on GPU (``benchmarks/fp16_scaler_check.sh``, whose --help this follows): a deep DeepNet
trained with fairseq's --fp16 and a deliberately huge initial loss scale must overflow, let the dynamic loss
scaler back off, and then train with finite, falling loss.

    python -m benchmarks.fp16_scaler_check [OUT_DIR]     # LAYERS (default 50), UPDATES (default 150)
"""

import json
import math
import os
import re
import sys
import tempfile
from pathlib import Path

from deepnet_setups import runner

INIT_SCALE = 2**20
SHAPE = {"encoder_embed_dim": 256, "decoder_embed_dim": 256, "encoder_ffn_embed_dim": 1024,
         "decoder_ffn_embed_dim": 1024, "encoder_attention_heads": 4, "decoder_attention_heads": 4}


def train_options(layers, updates):
    return {"arch": "deepnet_transformer", "encoder_layers": layers, "decoder_layers": layers, **SHAPE,
            "share_all_embeddings": True, "fp16": True, "fp16_init_scale": INIT_SCALE, **runner.ADAM, "lr": 5e-4,
            **runner.schedule(50, init_lr=None), "criterion": "label_smoothed_cross_entropy", "label_smoothing": 0.1,
            "max_tokens": 8192, "max_update": updates, "no_save": True, "disable_validation": True,
            "log_format": "json", "log_interval": 10, "seed": 1}


def check(text):
    """True when the log shows an overflow, a loss scale that settled below the initial one, and a final loss
    that is finite and lower than the first logged one."""
    overflows = len(re.findall(r"gradient overflow detected", text))
    records = [json.loads(m) for m in re.findall(r"\| train_inner \| (\{.*\})", text)]
    if not records:
        sys.exit("fp16_scaler_check: no train_inner records in the log")
    losses = [float(r["loss"]) for r in records]
    scales = [float(r.get("loss_scale", "nan")) for r in records]
    print(f"fp16_scaler_check: {overflows} overflow notes; loss scale {scales[0]:g} -> {scales[-1]:g}; "
          f"loss {losses[0]:.3f} -> {losses[-1]:.3f} over {records[-1]['num_updates']} updates")
    ok = overflows >= 1 and scales[-1] < INIT_SCALE and math.isfinite(losses[-1]) and losses[-1] < losses[0]
    print("fp16_scaler_check: " + ("PASS: the scaler backed off and training recovered" if ok else "FAIL"))
    return ok


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    out_dir = Path(argv[0] if argv else "benchmarks/results")
    layers, updates = int(os.environ.get("LAYERS", 50)), int(os.environ.get("UPDATES", 150))
    import torch

    if not torch.cuda.is_available():
        sys.exit("fp16_scaler_check.sh: torch sees no CUDA device (fp16 training needs a GPU)")
    from deepnet_experiments.synthetic import write_reverse_map_task

    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        text = write_reverse_map_task(Path(work) / "text", train=20000)
        data, preprocess_log = Path(work) / "bin", Path(work) / "preprocess.log"
        if runner.run_quiet([runner.program("fairseq-preprocess"), "-s", "src", "-t", "tgt", "--trainpref",
                             text / "train", "--validpref", text / "valid", "--destdir", data, "--joined-dictionary",
                             "--workers", 4], preprocess_log, env=dict(os.environ)) != 0:
            sys.exit(f"fp16_scaler_check.sh: fairseq-preprocess failed:\n{preprocess_log.read_text()}")
        log = out_dir / "fp16_scaler.log"
        partial = Path(f"{log}.tmp")
        partial.unlink(missing_ok=True)
        returncode = runner.run(runner.fairseq_command("fairseq-train", data, train_options(layers, updates)),
                                partial, env=None)
        if returncode != 0:
            return returncode
        partial.replace(log)
    return 0 if check(log.read_text()) else 1


if __name__ == "__main__":
    sys.exit(main())
