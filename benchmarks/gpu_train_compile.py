"""fairseq-train on real batches, eager against --compile-layers (``benchmarks/gpu_train_compile.sh``, whose
--help this follows): one run per mode of MODES, each stopped after RUN_TIMEOUT seconds, its throughput read
back from fairseq's own log.

    python -m benchmarks.gpu_train_compile DATA_BIN OUT_DIR UPDATES [fairseq-train options...]
"""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from deepnet_setups import runner

MODES = {"eager": {}, "default": {"compile_layers": True},
         "reduce-overhead": {"compile_layers": True, "compile_layers_mode": "reduce-overhead"}}
TIMEOUT_STATUS = 124  # as timeout(1) reports a run it stopped
# DeepNet 18L-18L at IWSLT-14's size and schedule
TRAIN_OPTIONS = {"arch": "deepnet_transformer_iwslt_de_en", "encoder_layers": 18, "decoder_layers": 18,
                 "share_all_embeddings": True, **runner.ADAM, "lr": 5e-4, **runner.schedule(4000),
                 "criterion": "label_smoothed_cross_entropy", "label_smoothing": 0.1, "dropout": 0.3,
                 "max_tokens": 4096, "seed": 1, "no_save": True, "disable_validation": True, "log_format": "json",
                 "log_interval": 25, "num_workers": 0}
PROGRESS = re.compile(r'"num_updates": "[0-9]*"|"ups": "[0-9.]*"|"loss": "[0-9.]*"')


def run_for_at_most(cmd, log_path, seconds):
    """``cmd``'s exit status, or TIMEOUT_STATUS after stopping it (SIGTERM) once ``seconds`` have passed."""
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            return proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            proc.terminate()
            proc.wait()
            return TIMEOUT_STATUS


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    data, out, updates, extra = Path(argv[0]), Path(argv[1]), argv[2], argv[3:]
    if not list(data.glob("dict.*.txt")):
        sys.exit(f"gpu_train_compile.sh: no fairseq dictionaries in {data}")
    out.mkdir(parents=True, exist_ok=True)
    status = 0
    for mode in os.environ.get("MODES", " ".join(MODES)).split():
        if mode not in MODES:
            print(f"gpu_train_compile.sh: unknown mode '{mode}'", file=sys.stderr)
            return 2
        start, log = time.monotonic(), out / f"train_{mode}.log"
        cmd = runner.fairseq_command("fairseq-train", data, {**TRAIN_OPTIONS, "max_update": updates, **MODES[mode]},
                                     extra)
        returncode = run_for_at_most(cmd, log, float(os.environ.get("RUN_TIMEOUT", 110)))
        status = status or int(returncode != 0)
        print(f"{mode}: rc={returncode} ({TIMEOUT_STATUS}: stopped at RUN_TIMEOUT) "
              f"wall={int(time.monotonic() - start)} s")
        text = log.read_text(errors="replace")
        found = PROGRESS.findall(text)
        rows = ["\t".join(found[i:i + 3]) for i in range(0, len(found), 3)]  # loss, ups, num_updates of a line
        for line in rows[-4:] + [line for line in text.splitlines() if "done training" in line][-1:]:
            print(line, flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
