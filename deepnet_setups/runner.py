"""The one way the setups and the experiments start fairseq: a command built from fairseq options,
run with its log kept, resumable in stages, and its JSON log read back.

Imports nothing of fairseq or the plugin: the drivers and the launcher start fairseq in subprocesses.

    fairseq_options({"lr": 2e-3, "no_epoch_checkpoints": True})  ->  ["--lr", "0.002", "--no-epoch-checkpoints"]
"""

import json
import math
import os
import re
import signal
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

BIN_DIR = Path(sys.executable).parent  # fairseq-train, fairseq-generate, ... of this Python
# --user-dir: found without importing it (importing the plugin imports fairseq)
USER_DIR = Path(find_spec("deepnet_fairseq").submodule_search_locations[0])
PREEMPTED_EXIT_STATUS = 75  # = deepnet_fairseq.training.preemption.PREEMPTED_EXIT_STATUS
PREEMPTED_MARKER = f"exiting with status {PREEMPTED_EXIT_STATUS}"  # fairseq-train's one line (train_loop.py)
FORWARDED_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)

# The standard small model shapes, as fairseq options. tiny: DeepNet Fig. 5's 64-128-2 (the demo, the
# sweeps, the stability map); table: the CPU-sized small Table 1's 64-256-4 (docs/results/multi30k_table/README.md).
SHAPES = {
    "tiny": {"encoder_embed_dim": 64, "decoder_embed_dim": 64, "encoder_ffn_embed_dim": 128,
             "decoder_ffn_embed_dim": 128, "encoder_attention_heads": 2, "decoder_attention_heads": 2},
    "table": {"encoder_embed_dim": 64, "decoder_embed_dim": 64, "encoder_ffn_embed_dim": 256,
              "decoder_ffn_embed_dim": 256, "encoder_attention_heads": 4, "decoder_attention_heads": 4},
}


def shape_name(shape):
    """A shape as the papers write it: width-FFN-heads, e.g. "64-128-2"."""
    return f"{shape['encoder_embed_dim']}-{shape['encoder_ffn_embed_dim']}-{shape['encoder_attention_heads']}"


def fairseq_options(options):
    """fairseq's command-line form of ``{option_name: value}`` (names as in fairseq's dataclasses, with
    underscores): True is a bare flag, False and None leave the option out, anything else is one value."""
    args = []
    for name, value in options.items():
        if value is None or value is False:
            continue
        args.append("--" + name.replace("_", "-"))
        if value is not True:
            args.append(str(value))
    return args


def fairseq_args(data, options, extra=()):
    """``[data, --user-dir USER_DIR, *options..., *extra]`` as strings: fairseq's arguments without the
    program, for its parser in this process; ``extra`` (verbatim fairseq arguments) comes last, so it wins
    over ``options`` as in fairseq's own parser."""
    return [str(data), "--user-dir", str(USER_DIR), *fairseq_options(options), *map(str, extra)]


def program(name):
    """This Python's ``name`` script (fairseq-train, torchrun, ...), or ``name`` on PATH if it has none."""
    path = BIN_DIR / name
    return str(path) if path.exists() else name


def fairseq_command(name, data, options, extra=()):
    """``[program(name), *fairseq_args(data, options, extra)]``."""
    return [program(name), *fairseq_args(data, options, extra)]


# -- what the drivers' small runs share ----------------------------------------------------------------

ADAM = {"optimizer": "adam", "adam_betas": "(0.9, 0.98)"}  # the papers' Adam (fairseq's IWSLT recipe)
# a small run on this machine: CPU, batches loaded in the trainer's process, the JSON log parse_log reads
CPU_LOG_EVERY_UPDATE = {"cpu": True, "num_workers": 0, "log_format": "json", "log_interval": 1}
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # for jobs run side by side, one core each


def schedule(warmup, init_lr=1e-7):
    """inverse_sqrt after ``warmup`` linear warm-up updates from ``init_lr`` (None: fairseq's default);
    no warm-up (0): a constant lr."""
    if warmup == 0:
        return {"lr_scheduler": "fixed"}
    return {"lr_scheduler": "inverse_sqrt", "warmup_updates": warmup, "warmup_init_lr": init_lr}


def child_env(**extra):
    """The environment for a fairseq child: one thread unless set (two busy threads on two cores run ~30x
    slower), unbuffered output, this Python's scripts first on PATH; ``extra`` (e.g. ``**ONE_THREAD``) last."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    env.update(extra)
    env["PATH"] = f"{BIN_DIR}{os.pathsep}{env.get('PATH', '')}"
    return env


# -- stages: a run trained and evaluated up to S updates is marked, so a rerun skips it ----------------

def stage_marker(run_dir, stage):
    return Path(run_dir) / "eval" / f"evaluated_at_{stage}"


def stage_done(run_dir, stage, records=None):
    """Whether ``run_dir`` was trained and evaluated to ``stage`` updates: its marker, or else an eval record
    of it at that stage in the results file ``records`` (a committed copy outlives the run folder)."""
    if stage_marker(run_dir, stage).exists():
        return True
    if records is None or not Path(records).exists():
        return False
    with open(records, encoding="utf-8") as handle:
        return any(r.get("kind") == "eval" and r.get("run_dir") == str(run_dir) and r.get("updates") == int(stage)
                   for r in map(json.loads, filter(str.strip, handle)))


def mark_stage(run_dir, stage):
    import time

    marker = stage_marker(run_dir, stage)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + "\n")


# -- the log ------------------------------------------------------------------------------------------

LOG_LINE = re.compile(r"\| (train_inner|train|valid) \| (\{.*\})\s*$")  # --log-format json
DIVERGENCE_MARKERS = ("FloatingPointError", "Minimum loss scale reached", "gradients are Nan/Inf")


class TrainLogStats:
    """What the run record needs from fairseq-train's ``--log-format json`` output, read line by line.

    Keeps the last train/valid loss, the update count and whether a divergence message was seen;
    never the output itself.
    """

    def __init__(self):
        self.stats = {"final_loss": None, "valid_loss": None, "updates": None}
        self.divergence_message = False
        self.preempted = False

    def feed(self, line):
        self.divergence_message |= any(m in line for m in DIVERGENCE_MARKERS)
        self.preempted |= PREEMPTED_MARKER in line
        match = LOG_LINE.search(line)
        if not match:
            return
        tag, stats = match.group(1), json.loads(match.group(2))
        if tag == "train_inner":
            self.stats["final_loss"], self.stats["updates"] = float(stats["loss"]), int(float(stats["num_updates"]))
        elif tag == "train":
            self.stats["final_loss"] = float(stats["train_loss"])
            self.stats["updates"] = int(float(stats["train_num_updates"]))
        else:
            self.stats["valid_loss"] = float(stats["valid_loss"])

    def diverged(self, returncode):
        loss = self.stats["final_loss"]
        blown = loss is not None and not math.isfinite(loss)
        return blown or (returncode != 0 and self.divergence_message)


def append_record(path, record):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, sort_keys=True) + "\n")


def run(cmd, log_path, env, on_line=None, forward_as=None):
    """Run ``cmd``, echoing each output line and appending it to ``log_path`` as it comes (flushed, so
    ``tail -f`` follows the run and a killed launcher loses nothing); ``on_line(line)`` sees every line.
    SIGUSR1 and SIGTERM sent to the launcher go on to ``cmd`` (as ``forward_as`` if given). Returns the
    exit status."""
    with open(log_path, "a", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        previous = {sig: signal.signal(sig, lambda signum, frame: proc.send_signal(forward_as or signum))
                    for sig in FORWARDED_SIGNALS}
        try:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                sys.stdout.write(line)
                sys.stdout.flush()
                if on_line is not None:
                    on_line(line)
        except KeyboardInterrupt:
            proc.terminate()
            raise
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return proc.wait()


def run_quiet(cmd, log_path, env=None):
    """Run ``cmd`` with its output in ``log_path`` only (overwritten): a driver's job, one thread unless
    ``env`` says otherwise. Returns the exit status."""
    with open(log_path, "w", encoding="utf-8") as log:
        return subprocess.run([str(c) for c in cmd], stdout=log, stderr=subprocess.STDOUT,
                              env=child_env(**ONE_THREAD) if env is None else env).returncode


def parse_log(text):
    """(per-update train records, last valid record) from a ``--log-format json`` log's text."""
    inner, valid = [], None
    for line in text.splitlines():
        match = LOG_LINE.search(line)
        if not match:
            continue
        record = json.loads(match.group(2))
        if match.group(1) == "train_inner":
            inner.append(record)
        elif match.group(1) == "valid":
            valid = record
    return inner, valid


def diverged_reason(text, inner, returncode):
    """Why a run diverged or failed ("" if it did neither), from its log text and train records."""
    match = re.search(r"DivergenceError: (.*)", text)
    if match:
        return match.group(1).strip()
    if "FloatingPointError" in text:
        return "non-finite gradients (fairseq FloatingPointError)"
    if returncode != 0:
        last = [line for line in text.splitlines() if line.strip()][-1:] or ["?"]
        return f"exit code {returncode}: {last[0][:200]}"
    losses = [float(r["loss"]) for r in inner if "loss" in r]
    if losses and not all(math.isfinite(v) for v in losses):
        return "non-finite loss"
    return ""
