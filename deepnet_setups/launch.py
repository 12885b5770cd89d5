"""Stage 3: build and run the ``fairseq-train`` command of a setup (one GPU, many GPUs, many nodes, CPU).

    python -m deepnet_setups.launch CONFIG [key=value ...] --arch deepnet --layers 18,18 \
        [--gpus G] [--nodes N --node-rank R --master-addr HOST] [--cpu --procs P] [--dry-run]

Every hyperparameter comes from the config. ``--update-freq`` is derived so that
``train.max_tokens x world size x update-freq == train.batch_tokens``. Runs live in
``<paths.runs>/<setup>/<arch>/<N>L-<M>L`` (checkpoints/, tb/, train.log); rerunning resumes from
``checkpoints/checkpoint_last.pt``. Each finished run appends a record to ``paths.results``.

Preemption: SIGUSR1 or SIGTERM sent to the launcher is passed on to fairseq-train (to torchrun as
SIGTERM, which torchrun passes on to its workers), which saves ``checkpoint_last.pt`` at the end of
the update and exits with status 75 (``deepnet_fairseq/training/preemption.py``). The launcher then
exits with 75 too and, under SLURM (``SLURM_JOB_ID`` set), first requeues the job with
``scontrol requeue``; the requeued job reruns the same command and resumes (docs/reliability.md).
"""

import argparse
import importlib.util
import json
import os
import resource
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import deepnet_methods

from . import lang_tags, records
from .config import ConfigError, load
from .runner import PREEMPTED_EXIT_STATUS, USER_DIR, TrainLogStats, append_record, fairseq_options, program, run

class LaunchError(ValueError):
    """A bad launch option; one line naming it."""


def fairseq_arch(arch, size):
    """The fairseq --arch of the method named ``arch`` (deepnet_methods) at the config's size variant."""
    if arch not in deepnet_methods.METHODS:
        raise LaunchError(f"--arch '{arch}': unknown (choose {', '.join(deepnet_methods.names())})")
    try:
        return deepnet_methods.METHODS[arch].arch(size)
    except ValueError as err:
        raise LaunchError(f"model.size: {err}") from None


def parse_layers(text):
    parts = str(text).split(",")
    try:
        layers = [int(p) for p in parts]
    except ValueError:
        raise LaunchError(f"--layers '{text}': expected N or N,M (encoder,decoder layers)") from None
    if len(layers) == 1:
        layers *= 2
    if len(layers) != 2 or min(layers) < 1:
        raise LaunchError(f"--layers '{text}': expected N or N,M with positive integers")
    return tuple(layers)


def update_freq(cfg, world_size):
    per_step = cfg["train"]["max_tokens"] * world_size
    freq, rest = divmod(cfg["train"]["batch_tokens"], per_step)
    if rest or freq < 1:
        raise LaunchError(f"{world_size} processes x train.max_tokens {cfg['train']['max_tokens']} = {per_step} tokens "
                          f"per step does not divide train.batch_tokens {cfg['train']['batch_tokens']}; "
                          f"change --gpus/--nodes or override train.max_tokens/train.batch_tokens")
    return freq


def fit_max_tokens(cfg, world_size, gpu_gib):
    """``train.max_tokens`` for a GPU with ``gpu_gib`` GiB: the config's value was sized for
    ``train.max_tokens_gpu_gib`` GiB; scaled by the ratio, then lowered to the largest value that keeps
    ``max_tokens x world size x update-freq == train.batch_tokens`` (null: the config's value)."""
    train = cfg["train"]
    if train["max_tokens_gpu_gib"] is None or gpu_gib is None:
        return train["max_tokens"]
    cap = int(train["max_tokens"] * gpu_gib / train["max_tokens_gpu_gib"])
    per_process, rest = divmod(train["batch_tokens"], world_size)
    if rest or cap < 1 or per_process < 1:
        raise LaunchError(f"train.batch_tokens {train['batch_tokens']} cannot be split over {world_size} processes "
                          f"with at most {cap} tokens each ({gpu_gib:g} GiB GPUs)")
    freq = -(-per_process // cap)  # the fewest steps per update, then the next that divides evenly
    while per_process % freq:
        freq += 1
    return per_process // freq


def gpu_memory_gib():
    """The smallest visible GPU's memory in GiB (None without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return None
    return min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())) / 2**30


def model_folder(cfg, arch):
    """A run folder's model part: the arch, and its init where it takes one that is not its default."""
    return deepnet_methods.row_name(arch, cfg["model"]["deepnorm_init"])


def run_dir(cfg, arch, layers):
    return Path(cfg["paths"]["runs"]) / cfg["setup"] / model_folder(cfg, arch) / f"{layers[0]}L-{layers[1]}L"


# fp16's dynamic loss scaler: fairseq-train options, given with --fp16 only (precision_args)
FP16_SCALER_KEYS = ("fp16_init_scale", "fp16_scale_window", "fp16_scale_tolerance", "min_loss_scale",
                    "threshold_loss_scale")
# The train keys the launcher reads itself; every other train key is the fairseq-train option of that name.
LAUNCHER_KEYS = frozenset({
    "batch_tokens", "max_tokens_gpu_gib",  # --update-freq and --max-tokens follow from them (update_freq, main)
    "precision", "fp16", *FP16_SCALER_KEYS,  # on GPU only (precision_args); fp16: the old spelling of precision
    "ddp_backend",  # on GPU only: CPU processes need legacy_ddp
    "sampling_temperature",  # multilingual only
    "extra_args",  # verbatim, last, so they win
})
# model key -> fairseq's option, given for the encoder and the decoder alike (null: the architecture's)
SIDE_OPTIONS = {"embed_dim": "embed_dim", "ffn_dim": "ffn_embed_dim", "heads": "attention_heads"}


def train_args(cfg, arch, layers, world_size, on_gpu, save_dir, tensorboard_dir):
    """fairseq-train's options (without the program name) for this setup, arch and depth."""
    data, model, train = cfg["data"], cfg["model"], cfg["train"]
    args = [Path(cfg["paths"]["work"]) / "bin", "--user-dir", USER_DIR,
            "--arch", fairseq_arch(arch, model["size"]),
            "--encoder-layers", layers[0], "--decoder-layers", layers[1]]
    args += fairseq_options({f"{side}_{option}": model[key] for key, option in SIDE_OPTIONS.items()
                             for side in ("encoder", "decoder")})
    args += fairseq_options({key: model[key] for key in ("share_all_embeddings", "share_decoder_input_output_embed",
                                                         "checkpoint_activations")})
    if records.has_init(arch):
        args += ["--deepnorm-init", model["deepnorm_init"]]
    if data["kind"] == "multilingual":
        args += ["--task", "translation_multi_simple_epoch", "--lang-pairs", ",".join(data["lang_pairs"]),
                 "--langs", ",".join(data["langs"]), *fairseq_options(lang_tags.task_options(data["lang_tags"])),
                 "--sampling-method", "temperature", "--sampling-temperature", train["sampling_temperature"]]
    else:
        # fairseq's translation task, resuming bit-exactly after an interruption (docs/reliability.md)
        args += ["--task", "translation_exact_resume",
                 "--source-lang", data["source_lang"], "--target-lang", data["target_lang"]]
    args += fairseq_options({**{key: value for key, value in train.items() if key not in LAUNCHER_KEYS},
                             "update_freq": update_freq(cfg, world_size), "log_format": "json",
                             "save_dir": save_dir, "tensorboard_logdir": tensorboard_dir})
    if on_gpu:
        args += precision_args(train)
        args += ["--ddp-backend", train["ddp_backend"]]
    else:
        args.append("--cpu")
    if world_size > 1:
        args += ["--distributed-world-size", world_size]
        if not on_gpu:  # the flags that work for CPU processes (ENVIRONMENT.md)
            args += ["--distributed-backend", "gloo", "--ddp-backend", "legacy_ddp"]
    return [str(a) for a in args] + [str(a) for a in train["extra_args"]]


def precision_args(train):
    """fairseq's options for ``train.precision`` on GPU; fp16 carries the loss scaler's guard rails."""
    if train["precision"] == "bf16":
        return ["--bf16"]  # no loss scaling: bf16 has fp32's exponent range
    if train["precision"] == "fp32":
        return []
    return fairseq_options({"fp16": True, **{key: train[key] for key in FP16_SCALER_KEYS}})


# optional packages a fairseq option needs: (option, value) -> (module, how to install it)
OPTIONAL_NEEDS = {("--ddp-backend", "fully_sharded"): ("fairscale", "make install EXTRAS=fsdp")}  # requirements-fsdp.txt


def check_optional_needs(fairseq_args):
    """One line, before anything starts, naming a package an option needs and this Python lacks."""
    given = dict(zip(fairseq_args, fairseq_args[1:]))  # the last occurrence wins, as in fairseq's parser
    for (option, value), (module, install) in OPTIONAL_NEEDS.items():
        if given.get(option) == value and importlib.util.find_spec(module) is None:
            raise LaunchError(f"{option} {value} needs {module}, which is not installed in {sys.executable}; "
                              f"run `{install}`")


def launch_commands(opts, fairseq_args):
    """One command per node: plain fairseq-train for one process, torchrun otherwise."""
    fairseq_train = program("fairseq-train")
    per_node = opts.procs if opts.cpu else opts.gpus
    if opts.nodes == 1 and per_node == 1:
        return [[fairseq_train] + fairseq_args]
    cpu_worker = ["-m", "deepnet_setups.cpu_worker"]  # fairseq-train on CPU, rank from the launcher
    if opts.launcher == "slurm":  # one task per process; fairseq (cpu_worker on CPU) reads SLURM's environment
        worker = [sys.executable, *cpu_worker] if opts.cpu else [f"--gpus-per-node={per_node}", fairseq_train]
        return [["srun", f"--nodes={opts.nodes}", f"--ntasks-per-node={per_node}", *worker]
                + fairseq_args + ["--distributed-port", str(opts.master_port)]]
    torchrun = program("torchrun")
    worker = cpu_worker if opts.cpu else [fairseq_train]
    ranks = range(opts.nodes) if opts.dry_run else [opts.node_rank]
    return [[torchrun, f"--nproc_per_node={per_node}", f"--nnodes={opts.nodes}", f"--node_rank={rank}",
             f"--master_addr={opts.master_addr}", f"--master_port={opts.master_port}"] + worker + fairseq_args
            for rank in ranks]


def config_block(cfg, arch, device):
    """The setup's config as resolved for this run (what was asked: data, model and train sections); the DeepNorm
    init only where the method takes one, the precision only on a GPU. What the run computed with is the record's
    ``run`` (run_facts)."""
    data = {key: cfg["data"][key] for key in ("train", "valid", "test", "lang_pairs", "lang_tags") if cfg["data"].get(key)}
    model = {k: v for k, v in cfg["model"].items() if k != "deepnorm_init" or records.has_init(arch)}
    return records.as_given({"data": {**data, "work": cfg["paths"]["work"]}, "model": model, "train": cfg["train"]},
                            device)


def last_checkpoint(folder):
    return folder / "checkpoints" / "checkpoint_last.pt"


def run_facts(folder, cfg, arch, layers, updates):
    """The run's facts: from its checkpoint_last.pt (the options fairseq-train resolved, read by the plugin) where
    it saved one, else what the launcher gave fairseq-train (a --no-save run; a shape the size variant sets is
    then unknown)."""
    last = last_checkpoint(folder)
    if last.exists():
        from deepnet_fairseq.run_facts import checkpoint_facts  # imports fairseq: at run time only

        return checkpoint_facts(last)
    model, train = cfg["model"], cfg["train"]
    return {"width": model["embed_dim"], "ffn": model["ffn_dim"], "heads": model["heads"], "encoder_layers": layers[0],
            "decoder_layers": layers[1], "lr": train["lr"], "warmup_updates": train["warmup_updates"],
            "seed": train["seed"], "updates": updates, "init": model["deepnorm_init"] if records.has_init(arch) else None}


def device_of(on_gpu, precision):
    """(device, GPU name, precision as computed): a CPU run computes in fp32 whatever the config asks."""
    if not on_gpu:
        return "cpu", None, "fp32"
    import torch

    return "cuda", torch.cuda.get_device_name(0), precision


def requeue_if_preempted(returncode, log_stats, env, node_rank=0, updates=None):
    """Status 75 (or torchrun's failure after fairseq's preemption line): requeue under SLURM (node 0's
    launcher). Returns the launcher's exit status, or None if the run was not preempted."""
    if returncode == 0 or not (returncode == PREEMPTED_EXIT_STATUS or log_stats.preempted):
        return None
    at = f" after update {updates}" if updates else ""
    job = env.get("SLURM_JOB_ID")
    if node_rank != 0:
        return PREEMPTED_EXIT_STATUS
    if not job:
        print(f"[train] preempted{at}: checkpoint_last.pt saved; rerun the same command to resume", flush=True)
        return PREEMPTED_EXIT_STATUS
    done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
    if done.returncode != 0:
        print(f"error: preempted{at}, but `scontrol requeue {job}` failed ({done.stderr.strip()}); "
              "resubmit the job to resume", file=sys.stderr)
    else:
        print(f"[train] preempted{at}: checkpoint_last.pt saved; SLURM job {job} requeued", flush=True)
    return PREEMPTED_EXIT_STATUS


def main(argv=None):
    parser = argparse.ArgumentParser(prog="train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*", help="section.key=value (any config value)")
    parser.add_argument("--arch", required=True, help=f"the method: {', '.join(deepnet_methods.names())} "
                        "(python -m deepnet_methods)")
    parser.add_argument("--layers", help="N or N,M encoder,decoder layers (default: the config's)")
    parser.add_argument("--gpus", type=int, default=None, help="GPUs per node (default: all visible, or CPU if none)")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=int(os.environ.get("NODE_RANK", 0)))
    parser.add_argument("--master-addr", default=os.environ.get("MASTER_ADDR", "127.0.0.1"))
    parser.add_argument("--master-port", type=int, default=int(os.environ.get("MASTER_PORT", 29500)))
    parser.add_argument("--launcher", choices=("torchrun", "slurm"), default="torchrun")
    parser.add_argument("--cpu", action="store_true", help="train on CPU (fp32); with --procs P: P gloo processes")
    parser.add_argument("--procs", type=int, default=1, help="CPU processes per node (with --cpu)")
    parser.add_argument("--tensorboard-logdir", help="default: <run folder>/tb")
    parser.add_argument("--run-dir", help="default: <paths.runs>/<setup>/<arch>/<N>L-<M>L")
    parser.add_argument("--gpu-memory-gib", type=float, help="with train.max_tokens_gpu_gib: size max_tokens for GPUs "
                        "of this memory (default: the visible GPUs')")
    parser.add_argument("--dry-run", action="store_true", help="print the commands (all nodes) and exit")
    parser.add_argument("--force", action="store_true", help="train even if the run folder is marked finished")
    opts = parser.parse_intermixed_args(argv)
    try:
        cfg = load(opts.config, opts.overrides)
        layers = parse_layers(opts.layers) if opts.layers else (cfg["model"]["encoder_layers"], cfg["model"]["decoder_layers"])
        cfg["model"]["encoder_layers"], cfg["model"]["decoder_layers"] = layers  # records name the depth trained
        fairseq_arch(opts.arch, cfg["model"]["size"])  # validates --arch
        if opts.gpus is None:
            if opts.cpu or opts.dry_run:
                opts.gpus = 0 if opts.cpu else 1
            else:
                import torch

                opts.gpus = torch.cuda.device_count()
                opts.cpu = opts.gpus == 0
        if not opts.cpu and opts.gpus < 1:
            raise LaunchError("--gpus must be >= 1 (or use --cpu)")
        for name in ("nodes", "procs"):
            if getattr(opts, name) < 1:
                raise LaunchError(f"--{name} must be >= 1")
        world = opts.nodes * (opts.procs if opts.cpu else opts.gpus)
        if cfg["train"]["max_tokens_gpu_gib"] is not None and not opts.cpu:
            gib = opts.gpu_memory_gib if opts.gpu_memory_gib is not None else gpu_memory_gib()
            if gib is None:
                raise LaunchError("train.max_tokens_gpu_gib is set but no GPU is visible; give --gpu-memory-gib")
            sized = fit_max_tokens(cfg, world, gib)
            print(f"[train] max_tokens {cfg['train']['max_tokens']} was sized for {cfg['train']['max_tokens_gpu_gib']:g} GiB; "
                  f"{gib:g} GiB GPUs: max_tokens {sized}", file=sys.stderr)
            cfg["train"]["max_tokens"] = sized
        folder = Path(opts.run_dir) if opts.run_dir else run_dir(cfg, opts.arch, layers)
        tb = opts.tensorboard_logdir or folder / "tb"
        fairseq_args = train_args(cfg, opts.arch, layers, world, not opts.cpu, folder / "checkpoints", tb)
        check_optional_needs(fairseq_args)
        cmds = launch_commands(opts, fairseq_args)
        if opts.dry_run:
            print(f"# {cfg['setup']} {opts.arch} {layers[0]}L-{layers[1]}L: world size {world}, "
                  f"update-freq {update_freq(cfg, world)}, run folder {folder}")
            for rank, cmd in enumerate(cmds):
                if len(cmds) > 1:
                    print(f"# node {rank}:")
                print(" ".join(shlex.quote(c) for c in cmd))
            return 0
        data_bin = Path(cfg["paths"]["work"]) / "bin"
        if not (data_bin / ".done").exists():
            raise LaunchError(f"{data_bin}: binarised data not found; run the prepare and binarize scripts first")
        done = folder / "train.done"
        if done.exists() and done.read_text().strip() == str(cfg["train"]["max_update"]) and not opts.force:
            print(f"[train] {folder}: already trained to max_update {cfg['train']['max_update']}, skipping "
                  f"(--force to rerun)")
            return 0
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.resolved.json").write_text(json.dumps(cfg, indent=1))
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), PYTHONUNBUFFERED="1")
        # where a resumed run starts: its record's wall time is for the updates after it
        resumed_from = run_facts(folder, cfg, opts.arch, layers, None)["updates"] if last_checkpoint(folder).exists() else None
        start = time.time()
        print("[train] " + " ".join(shlex.quote(c) for c in cmds[0]), flush=True)
        log_stats = TrainLogStats()
        # one log per node: a run folder on a shared file system is every node's
        log = folder / ("train.log" if opts.node_rank == 0 else f"train.node{opts.node_rank}.log")
        torchrun = "torchrun" in Path(cmds[0][0]).name  # it ends on SIGUSR1, passes SIGTERM on to its workers
        returncode = run(cmds[0], log, env, log_stats.feed, forward_as=signal.SIGTERM if torchrun else None)
        stats = log_stats.stats
        record = {"kind": "train", "setup": cfg["setup"], "arch": opts.arch, "encoder_layers": layers[0],
                  "decoder_layers": layers[1], "world_size": world, "update_freq": update_freq(cfg, world), "run_dir": str(folder),
                  "diverged": log_stats.diverged(returncode), "returncode": returncode,
                  "preempted": log_stats.preempted,
                  "wall_time_s": round(time.time() - start, 1), "time": time.strftime("%Y-%m-%dT%H:%M:%S"), **stats,
                  # the largest resident set of any process this launcher waited for (Linux reports KiB)
                  "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024),
                  "config": config_block(cfg, opts.arch, "cpu" if opts.cpu else "cuda"), "resumed_from": resumed_from}
        facts = run_facts(folder, cfg, opts.arch, layers, stats["updates"])
        # a run with nothing left to train logs no losses: its checkpoint says where it stands
        record["updates"] = records.recorded_updates(record["updates"], facts.get("updates"), log_stats.preempted)
        if record["valid_loss"] is None:
            record["valid_loss"] = facts.get("valid_loss")
        device, gpu, facts["precision"] = device_of(not opts.cpu, facts.get("precision") or cfg["train"]["precision"])
        record.update(run=records.run_block(opts.arch, facts, device, gpu, cmds[0]),
                      deepnorm=facts.get("deepnorm"), deepnorm_init=facts.get("init"))
        # what evaluate.py adds to its records: the training's device and command
        (folder / "run.json").write_text(json.dumps(record["run"], indent=1))
        if opts.node_rank == 0:
            append_record(cfg["paths"]["results"], record)
        preempted = requeue_if_preempted(returncode, log_stats, os.environ, opts.node_rank, record["updates"])
        if preempted is not None:
            return preempted
        if returncode != 0:
            print(f"error: fairseq-train exited with {returncode} (log: {log})", file=sys.stderr)
            return returncode
        done.write_text(f"{cfg['train']['max_update']}\n")
        progress = "" if opts.node_rank else f"{stats['updates']} updates, loss {stats['final_loss']}, "  # rank 0 logs them
        print(f"[train] finished: {progress}{record['wall_time_s']}s -> {folder}")
    except (ConfigError, LaunchError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
