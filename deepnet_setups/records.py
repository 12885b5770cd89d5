"""The run records' schema: what every train and eval record says of the run as it ran, and the migration that
brings older records to it.

A record (one JSON object a line in ``paths.results``) carries ``run``, the run as it ran:

    device          cpu | cuda                      gpu         the GPU's name (None on CPU)
    precision       fp32 | fp16 | bf16              width, ffn, heads, encoder_layers, decoder_layers
    lr, warmup_updates, seed, updates               init        DeepNet's --deepnorm-init (DeepNet records only)
    command         the fairseq-train command, a list of arguments
    git_commit      the plugin's commit             versions    {torch, fairseq, sacrebleu}

and ``config``, the setup's config as it was resolved (what was asked, which ``run`` may refine: a CPU run
computes in fp32 whatever ``train.precision`` says). A value the code could not know is None. Summaries pool
records only where ``pool_key`` agrees (device, width, precision).

    python -m deepnet_setups.records check FILE.jsonl ...     # every record against the schema
    python -m deepnet_setups.records migrate FILE.jsonl ...   # older records: ``run`` derived, in place

Imports nothing of fairseq.
"""

import argparse
import json
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path

RUN_KEYS = ("device", "gpu", "precision", "width", "ffn", "heads", "encoder_layers", "decoder_layers", "lr",
            "warmup_updates", "seed", "updates", "init", "command", "git_commit", "versions")
DEVICES = ("cpu", "cuda")
PRECISIONS = ("fp32", "fp16", "bf16")
DISTRIBUTIONS = {"torch": "torch", "fairseq": "fairseq-fixed", "sacrebleu": "sacrebleu"}
PACKAGE_ROOT = Path(__file__).resolve().parent.parent
# train keys the launcher gives fairseq-train on a GPU only (launch.precision_args): a CPU run's config omits them
GPU_ONLY_TRAIN_KEYS = ("precision", "fp16", "fp16_init_scale", "fp16_scale_window", "fp16_scale_tolerance",
                       "min_loss_scale", "threshold_loss_scale")


def as_given(config, device):
    """``config`` without the train keys a run on ``device`` was not given (a CPU run computes in fp32)."""
    if device != "cpu" or not config.get("train"):
        return config
    return {**config, "train": {k: v for k, v in config["train"].items() if k not in GPU_ONLY_TRAIN_KEYS}}


def has_init(arch):
    """Whether the method named ``arch`` (a setups --arch or a fairseq --arch) takes --deepnorm-init."""
    return str(arch).startswith("deepnet")


def versions():
    found = {}
    for name, distribution in DISTRIBUTIONS.items():
        try:
            found[name] = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def git_commit(root=PACKAGE_ROOT):
    """The checkout's commit, with ``+dirty`` where tracked files differ from it; None outside a checkout."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "diff", "--quiet", "HEAD", "--"], capture_output=True)
        return head.stdout.strip() + ("+dirty" if dirty.returncode == 1 else "")
    except OSError:
        return None


def run_block(arch, facts, device, gpu, command):
    """``run`` of a new record: ``facts`` (deepnet_fairseq.run_facts.checkpoint_facts, or what the launcher knows
    of a run that saved nothing), where it ran, the exact command, this checkout's commit and the versions."""
    block = {key: facts.get(key) for key in RUN_KEYS}
    block.update(device=device, gpu=gpu, command=[str(c) for c in command] if command else None,
                 git_commit=git_commit(), versions=versions())
    if not has_init(arch):
        del block["init"]
    return block


def recorded_updates(logged, saved, preempted):
    """A train record's update count: where a preempted run's checkpoint was saved (where it stopped: the last logged
    update is up to a log interval older), else the last logged one, else the checkpoint's (a run with nothing left
    to train logs none)."""
    if preempted and saved is not None:
        return saved
    return logged if logged is not None else saved


def problems(record):
    """What is wrong with ``record`` against the schema (an empty list: nothing); None values are allowed."""
    run = record.get("run")
    if not isinstance(run, dict):
        return ["no run block"]
    wanted = set(RUN_KEYS) - (set() if has_init(record.get("arch")) else {"init"})
    found = [f"missing run.{key}" for key in RUN_KEYS if key in wanted and key not in run]
    found += [f"run.{key} is not a field of the schema" for key in run if key not in wanted]
    for key, allowed in (("device", DEVICES), ("precision", PRECISIONS)):
        if run.get(key) is not None and run[key] not in allowed:
            found.append(f"run.{key} {run[key]!r} is not one of {', '.join(allowed)}")
    if run.get("device") == "cpu" and run.get("precision") not in (None, "fp32"):
        found.append(f"a CPU run computes in fp32, not {run['precision']}")
    for key in ("encoder_layers", "decoder_layers"):
        if run.get(key) is not None and record.get(key) is not None and run[key] != record[key]:
            found.append(f"run.{key} {run[key]} disagrees with the record's {record[key]}")
    if record.get("kind") == "train" and record.get("preempted") and None not in (run.get("updates"), record.get("updates")) \
            and run["updates"] != record["updates"]:
        found.append(f"a preempted run stopped at its checkpoint's update {run['updates']}, not {record['updates']}")
    if "settings" in record:
        found.append("settings: the config block is named config")
    if run.get("device") == "cpu" and set(GPU_ONLY_TRAIN_KEYS) & set((record.get("config") or {}).get("train") or {}):
        found.append("a CPU run's config names GPU-only keys (precision, fp16 loss scale)")
    return found


def pool_key(record):
    """Records may share a mean only where these agree: where it ran, how wide, in what precision."""
    run = record.get("run") or {}
    return run.get("device"), run.get("width"), run.get("precision")


def pool_label(key):
    """A pool_key as a table shows it: 'cpu, d64, fp32'."""
    device, width, precision = key
    return f"{device}, d{width}, {precision}"


def labelled(name, key, keys):
    """``name`` with its pool where the table holds records of several pools (``keys``), so rows never merge."""
    return f"{name} [{pool_label(key)}]" if len(set(keys)) > 1 else name


# -- migration of records written before ``run`` ----------------------------------------------------------------

def _option(command, name):
    """The last value of ``--name`` in an argument list, or None."""
    values = [command[i + 1] for i, arg in enumerate(command[:-1]) if arg == name]
    return values[-1] if values else None


def _logged_run(record, records_file):
    """The command and GPU name in the committed train log beside ``records_file`` (the GPU runs keep theirs as
    <variant>_<N>L-<M>L.train.log): its ``[train] <command>`` line and fairseq's ``name = <GPU>`` line."""
    parts = Path(record["run_dir"]).parts
    log = Path(records_file).parent / f"{parts[-2]}_{parts[-1]}.train.log"
    command = gpu = None
    if log.exists():
        for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("[train] ") and command is None and "fairseq-train" in line:
                command = shlex.split(line[len("[train] "):])
            if " name = " in line and gpu is None:
                gpu = line.split(" name = ", 1)[1].strip()
    return command, gpu


def derived_run(record, records_file):
    """``run`` for a record written before it, from what the record says and what its run's command shows:
    the launcher's ``device`` where the record has one; else a run folder under /tmp is one of the lent-GPU runs
    (docs/results/source_init/gpu.sh trained there), any other folder a CPU lane's (their commands pass --cpu).
    Precision: fp32 on CPU (the launcher passes no precision option there), the config's on GPU. The shape,
    lr, warm-up and seed: the command where a log keeps it, else the config block with its extra arguments
    (which fairseq reads last). Whatever none of these shows stays None."""
    config = record.get("config") or record.get("settings") or {}
    model, train = config.get("model") or {}, config.get("train") or {}
    command, gpu = _logged_run(record, records_file)
    device = record.get("device")
    if device is None:
        device = "cuda" if record["run_dir"].startswith("/tmp/") else "cpu"
    device = "cpu" if device == "cpu" else "cuda"
    extra = [str(a) for a in train.get("extra_args") or []]
    args = command or extra

    def value(option, configured, kind):
        found = _option(args, option)
        return kind(found) if found is not None else configured

    run = {"device": device, "gpu": gpu if device == "cuda" else None,
           "precision": "fp32" if device == "cpu" else (train.get("precision") if config else None),
           "width": value("--encoder-embed-dim", model.get("embed_dim"), int),
           "ffn": value("--encoder-ffn-embed-dim", model.get("ffn_dim"), int),
           "heads": value("--encoder-attention-heads", model.get("heads"), int),
           "encoder_layers": record.get("encoder_layers"), "decoder_layers": record.get("decoder_layers"),
           "lr": value("--lr", train.get("lr"), float), "warmup_updates": value("--warmup-updates", train.get("warmup_updates"), int),
           "seed": value("--seed", train.get("seed"), int), "updates": record.get("updates"),
           "command": command, "git_commit": None, "versions": None}
    if has_init(record.get("arch")):
        init = (record.get("deepnorm") or {}).get("init") or record.get("deepnorm_init")
        run["init"] = init or value("--deepnorm-init", model.get("deepnorm_init") if config else None, str)
    return {key: run[key] for key in RUN_KEYS if key in run}


def migrate(record, records_file):
    """``record`` in the schema: ``settings`` renamed ``config``, ``run`` derived where it has none, the
    launcher's loose ``device`` field folded into it, a preempted run's updates its checkpoint's. A record already in
    the schema comes back unchanged."""
    record = dict(record)
    if "settings" in record:
        record["config"] = record.pop("settings")
    if "run" not in record:
        record["run"] = derived_run(record, records_file)
    if "config" in record:
        record["config"] = as_given(record["config"], record["run"].get("device"))
    if record.get("kind") == "train" and record.get("preempted"):  # launchers before 2026-12-07: the last logged one
        record["updates"] = recorded_updates(record.get("updates"), record["run"].get("updates"), preempted=True)
    if "device" in record:
        if record.get("kind") == "eval" and record.get("device") is not None:
            record["eval_device"] = "cpu" if record["device"] == "cpu" else "cuda"
        record.pop("device", None)
    return record


def with_training_device(records):
    """Evaluations whose run folder kept no run.json (trained by a launcher older than it) know no training device:
    the same run folder's train record in the file says where it trained, and with what command."""
    trained = {r["run_dir"]: r["run"] for r in records if r.get("kind") == "train" and r.get("run")}
    out = []
    for r in records:
        source = trained.get(r.get("run_dir"))
        if r.get("kind") == "eval" and source and r["run"].get("device") is None:
            r = dict(r, run={**r["run"], **{key: source.get(key) for key in ("device", "gpu", "command")}})
        out.append(r)
    return out


def read(path):
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="records", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("check", "migrate"))
    parser.add_argument("files", nargs="+")
    opts = parser.parse_args(argv)
    bad = 0
    for path in opts.files:
        records = read(path)
        if opts.action == "migrate":
            migrated = with_training_device([migrate(r, path) for r in records])
            changed = sum(a != b for a, b in zip(records, migrated))
            Path(path).write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in migrated), encoding="utf-8")
            print(f"{path}: {changed} of {len(records)} records migrated")
            records = migrated
        for number, record in enumerate(records, 1):
            for problem in problems(record):
                print(f"{path}:{number}: {problem}", file=sys.stderr)
                bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
