"""What every benchmark shares: build a model the way ``fairseq-train --user-dir deepnet_fairseq``
does (fairseq's option parser, task and model registries, ``Trainer``), a synthetic batch, one real
training step, and the peak memory of a step as torch's CPU allocator sees it.

Nothing here is timed against a threshold; the scripts print what they measure.
"""

import json
import os
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import deepnet_methods
from deepnet_setups import runner

ROOT = Path(__file__).resolve().parents[1]

# The paper's three methods compared at identical shape, in table order: fairseq's own Post-LN `transformer` (first)
# is the baseline.
FAMILIES = tuple(m.arch() for m in deepnet_methods.methods(zoo=False))
BASELINE = FAMILIES[0]

# Optimisation settings of fairseq's IWSLT recipe; identical for every model in a comparison.
TRAIN_OPTIONS = {
    "task": "translation", "source_lang": "src", "target_lang": "tgt", **runner.ADAM, "lr": 5e-4,
    **runner.schedule(4000, init_lr=None), "criterion": "label_smoothed_cross_entropy", "label_smoothing": 0.1,
    "dropout": 0.1, "max_tokens": 100000, "seed": 1, "share_decoder_input_output_embed": True,
    "no_progress_bar": True, "log_format": "none",
}


@dataclass(frozen=True)
class Shape:
    """A model shape: layers per stack, width, FFN width, heads."""

    encoder_layers: int
    decoder_layers: int
    dim: int
    ffn: int
    heads: int

    @property
    def name(self):
        return f"{self.encoder_layers}L-{self.decoder_layers}L d{self.dim}"

    def options(self):
        """The shape as fairseq options."""
        return {"encoder_layers": self.encoder_layers, "decoder_layers": self.decoder_layers,
                "encoder_embed_dim": self.dim, "decoder_embed_dim": self.dim,
                "encoder_ffn_embed_dim": self.ffn, "decoder_ffn_embed_dim": self.ffn,
                "encoder_attention_heads": self.heads, "decoder_attention_heads": self.heads}


def width(shape):
    """``{dim, ffn, heads}`` of one of ``runner.SHAPES`` (both stacks alike), for ``Shape(N, M, **width)``."""
    return dict(dim=shape["encoder_embed_dim"], ffn=shape["encoder_ffn_embed_dim"],
                heads=shape["encoder_attention_heads"])


@dataclass(frozen=True)
class Batch:
    """A synthetic batch: ``sentences`` pairs of fixed length (no padding), ``vocab`` types."""

    sentences: int
    src_len: int
    tgt_len: int
    vocab: int

    @property
    def target_tokens(self):
        return self.sentences * self.tgt_len


def write_dictionary(folder, vocab):
    """dict.src.txt / dict.tgt.txt with ``vocab`` types in all (fairseq adds 4 specials)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lines = "".join(f"w{i} 1\n" for i in range(vocab - 4))
    for lang in ("src", "tgt"):
        (folder / f"dict.{lang}.txt").write_text(lines)
    return folder


class Bench:
    """One model with its criterion and fairseq ``Trainer`` (so a step is exactly fairseq's step)."""

    def __init__(self, arch, shape, batch, extra_args=(), device="cpu", workdir=None, label=None):
        from fairseq import options, tasks, utils
        from fairseq.dataclass.utils import convert_namespace_to_omegaconf
        from fairseq.trainer import Trainer

        self._tmp = None
        if workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="deepnet_bench_")
            workdir = self._tmp.name
        data = write_dictionary(Path(workdir) / "dict", batch.vocab)
        argv = runner.fairseq_args(data, {"arch": arch, "save_dir": Path(workdir) / "ckpt", **TRAIN_OPTIONS,
                                          **shape.options(), "cpu": device == "cpu"}, extra_args)
        parser = options.get_training_parser()
        args = options.parse_args_and_arch(parser, input_args=argv)
        if device != "cpu":
            args.tpu = False  # fairseq 0.12 makes --bf16 imply --tpu (torch_xla); keep bf16 on the GPU instead
        cfg = convert_namespace_to_omegaconf(args)
        utils.import_user_module(cfg.common)
        self.arch, self.shape, self.batch, self.cfg = arch, shape, batch, cfg
        self.label = label or arch
        self.task = tasks.setup_task(cfg.task)
        start = time.perf_counter()
        if device == "cpu":
            self.model = self.task.build_model(cfg.model)
        else:  # allocate and initialise parameters on the accelerator directly
            with torch.device(device):
                self.model = self.task.build_model(cfg.model)
        self.build_seconds = time.perf_counter() - start
        self.criterion = self.task.build_criterion(cfg.criterion)
        self.trainer = Trainer(cfg, self.task, self.model, self.criterion)
        self.sample = synthetic_sample(self.task.source_dictionary, batch)
        self.overflow_skips = 0

    @property
    def parameters(self):
        return sum(p.numel() for p in self.model.parameters())

    # fp16: retries of a step fairseq skipped on gradient overflow before the step counts as failed
    MAX_OVERFLOW_RETRIES = 32

    def step(self):
        """One fairseq training step (forward, backward, Adam update); returns its wall seconds.

        Also keeps ``last_cpu_seconds``: the CPU time of this thread during the step. With one
        intra-op thread on CPU all of torch's work runs on this thread, so it is the step's cost
        without the time spent waiting for a core that other processes hold.

        With ``--fp16`` fairseq skips a step whose gradients overflowed (``train_step`` returns None
        and the update count does not advance) and halves the loss scale: normal while the scale
        settles. Such a step is retried (up to ``MAX_OVERFLOW_RETRIES`` times) and counted in
        ``overflow_skips``; the seconds returned are those of the step that updated. Out of memory is
        not a skipped step: ``raise_oom=True`` makes fairseq raise it (see ``is_oom``).
        """
        for _ in range(self.MAX_OVERFLOW_RETRIES + 1):
            updates = self.trainer.get_num_updates()
            start, cpu_start = time.perf_counter(), time.thread_time()
            logging_output = self.trainer.train_step([self.sample], raise_oom=True)
            if self.trainer.cuda:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            self.last_cpu_seconds = time.thread_time() - cpu_start
            if logging_output is not None:
                self.last_loss = float(logging_output["loss"])
                return seconds
            if self.trainer.get_num_updates() != updates:
                raise RuntimeError(f"{self.label} {self.shape.name}: fairseq returned no logging output for an update")
            self.overflow_skips += 1  # gradient overflow: fairseq lowered the loss scale, try again
        raise RuntimeError(f"{self.label} {self.shape.name}: {self.MAX_OVERFLOW_RETRIES + 1} consecutive steps "
                           "skipped on gradient overflow (the fp16 loss scale does not settle)")

    def grad_norm(self):
        """L2 norm of the gradients left by the last step (fairseq zeroes them at the next one)."""
        grads = [p.grad.detach().float().norm() for p in self.model.parameters() if p.grad is not None]
        return float(torch.stack(grads).norm()) if grads else float("nan")

    def persistent_bytes(self):
        """Bytes of tensors alive between steps: parameters, gradients, buffers, optimizer state."""
        tensors = list(self.model.parameters()) + list(self.model.buffers())
        tensors += [p.grad for p in self.model.parameters() if p.grad is not None]
        for state in self.trainer.optimizer.optimizer.state.values():
            tensors += [v for v in state.values() if torch.is_tensor(v)]
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
        return sum(storages.values())

    def peak_step_bytes(self):
        """Peak bytes held by torch's CPU allocator during one training step: (persistent, peak).

        torch.profiler records every allocation and free (with its size) of torch's CPU allocator.
        Sizes of blocks allocated before a profiler ever ran are unknown to it, so their frees
        (last step's gradients, dropped by fairseq's ``zero_grad``) would be missed: a first
        profiled step makes every block known, the second is measured. Peak = bytes alive between
        steps + the maximum of the running sum of allocations minus frees during the step.
        """
        from torch._C._profiler import _EventType

        for _ in range(2):  # the first profiled step only makes every live block known
            persistent = self.persistent_bytes()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
                self.step()
        changes = []
        stack = list(prof.profiler.kineto_results.experimental_event_tree())
        while stack:
            node = stack.pop()
            if node.tag == _EventType.Allocation:
                changes.append((node.start_time_ns, node.extra_fields.alloc_size))
            stack.extend(node.children)
        changes.sort()
        running = running_max = 0
        for _, size in changes:
            running += size
            running_max = max(running_max, running)
        return persistent, persistent + running_max

    def saved_activation_bytes(self):
        """Bytes of the distinct tensors autograd saves for backward in one forward pass."""
        storages = {}

        def pack(tensor):
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
            return tensor

        self.model.train()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            loss, _, _ = self.trainer.criterion(self.trainer.model, self.trainer._prepare_sample(self.sample)[0])
        del loss
        return sum(storages.values())


def is_oom(error):
    """True for an out-of-memory error, whichever way torch or fairseq raised it."""
    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", ())
    return isinstance(error, oom_type) or "out of memory" in str(error).lower()


def fuse_deepnorm_residual(model):
    """Candidate change, for measurement only: each DeepNorm layer computes ``alpha * residual + x``
    with one ``torch.add(x, residual, alpha=alpha)`` instead of a multiply and an add."""
    from deepnet_fairseq.models.deepnet_transformer import DeepNormDecoderLayer, DeepNormEncoderLayer

    def residual_connection(self, x, residual):
        return torch.add(x, residual, alpha=float(self.deepnorm_alpha))

    layers = [m for m in model.modules() if isinstance(m, (DeepNormEncoderLayer, DeepNormDecoderLayer))]
    for layer in layers:
        layer.residual_connection = residual_connection.__get__(layer)
    return len(layers)


def synthetic_sample(dictionary, batch, seed=0):
    """A fixed random batch in fairseq's sample format (source ends with EOS, target shifted)."""
    generator = torch.Generator().manual_seed(seed)
    low, high = dictionary.nspecial, len(dictionary)
    src = torch.randint(low, high, (batch.sentences, batch.src_len), generator=generator)
    tgt = torch.randint(low, high, (batch.sentences, batch.tgt_len), generator=generator)
    src[:, -1] = dictionary.eos()
    tgt[:, -1] = dictionary.eos()
    prev = torch.cat([torch.full((batch.sentences, 1), dictionary.eos()), tgt[:, :-1]], dim=1)
    return {
        "id": torch.arange(batch.sentences),
        "nsentences": batch.sentences,
        "ntokens": batch.target_tokens,
        "net_input": {
            "src_tokens": src,
            "src_lengths": torch.full((batch.sentences,), batch.src_len),
            "prev_output_tokens": prev,
        },
        "target": tgt,
    }


def deepnorm_summary(model):
    """The alpha each built layer actually uses, and the paper's constants for the model's depth."""
    from deepnet_fairseq.models import deepnorm_constants

    def alphas(layers):
        return sorted({round(float(getattr(layer, "deepnorm_alpha", float("nan"))), 6) for layer in layers})

    constants = deepnorm_constants(len(model.encoder.layers), len(model.decoder.layers))
    return {
        "encoder_alpha_in_layers": alphas(model.encoder.layers),
        "decoder_alpha_in_layers": alphas(model.decoder.layers),
        "constants": constants.describe(),
    }


def summarize(values):
    """Median and spread (min, max) of repeated measurements."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def machine():
    """nproc, CPU model, torch version and UTC date, for the tables."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def quiet_fairseq():
    import logging

    logging.getLogger("fairseq").setLevel(logging.WARNING)
    logging.getLogger("deepnet_fairseq").setLevel(logging.WARNING)


def write_json(path, payload):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    tmp.replace(path)
