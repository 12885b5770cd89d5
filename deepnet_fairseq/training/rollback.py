"""Roll back instead of dying: ``--divergence-rollback N``, ``--divergence-loss-spike F`` and
``--divergence-fp16-fallback P`` (``ReliabilityConfig``; they need ``--criterion
diagnostic_label_smoothed_cross_entropy --divergence-guard``, whose checks fire them).

Every trigger fires *before* the optimizer step of the update it is in, on every rank at once: a
non-finite or out-of-bound loss (the criterion then makes the update's gradient non-finite, so every
rank sees it after the gradient all-reduce), a non-finite gradient norm (``check_gradient``, right
after fairseq's all-reduce and clipping, before fairseq's own ``FloatingPointError``, whose NaN
detector re-runs the batch and writes ``crash.pt``), one over ``--divergence-grad-bound`` (the
guard's optimizer pre-hook), an update loss over F times the running average of the updates before
(``check_loss_spike``, right after the gradient check; the update's loss is summed over the ranks
with one all-reduce, so every rank decides alike), and the fp16 loss scale at its minimum (the
guard's loss-scaler hook).
So the model and optimizer in memory are still the last good state (the previous update's).
``recover`` drops the gradient, skips the batch (the data iterator has moved past it), optionally
multiplies the learning rate by ``--divergence-rollback-lr-factor`` from then on, logs one line with
the update and the sublayer the guard named, and training goes on with the next batch as the same
update number. After ``N`` rollbacks in one process, the next
divergence stops training with the guard's error, as without rollback.

``--divergence-fp16-fallback bf16|fp32`` acts first at the fp16 minimum loss scale, once:
``fall_back_precision`` skips the batch the same way, casts the model to bf16 or fp32 and drops the
loss scaler; fairseq's fp16 optimizer keeps its fp32 master weights and Adam state, so training goes
on from exactly the last good state. The precision is saved in the optimizer's state, and a run
resumed with the same ``--fp16`` command switches again before its first update (its fp32 master
weights are rebuilt from the checkpoint's half-precision weights, as at every fairseq fp16 resume).

Exact resume after a rollback: the skipped batch is consumed in the data iterator's position, and the
learning-rate factor and the loss average are stored in the optimizer's state, so a checkpoint saved
after a rollback resumes exactly the rolled-back run. A resume from an earlier checkpoint meets the same batch again
and (deterministically) rolls back the same way; the rollback count starts from 0 in each process.
"""

import logging
import math

import torch
from fairseq.distributed import utils as distributed_utils

from ..instrumentation.monitors import DivergenceError, MinimumLossScale, describe_nonfinite

logger = logging.getLogger(__name__)

# in the optimizer's first param group, saved with its state
LR_SCALE_KEY = "deepnet_fairseq_lr_scale"
LOSS_AVERAGE_KEY = "deepnet_fairseq_loss_average"
PRECISION_KEY = "deepnet_fairseq_precision"
LOSS_AVERAGE_DECAY = 0.98  # about the last 50 updates


class Rollback:
    """The ``--divergence-*`` options of this run (``ReliabilityConfig``) and the rollbacks done so far.

    It reads the criterion through three methods only: ``take_update_loss()`` (this update's loss sum
    and size), ``take_divergence()`` (what the loss check found, or None) and ``sublayer_grad_norms()``.
    """

    def __init__(self, options):
        self.limit = options.divergence_rollback
        self.lr_factor = options.divergence_rollback_lr_factor
        self.loss_spike = options.divergence_loss_spike
        fallback = str(options.divergence_fp16_fallback)
        self.fp16_fallback = None if fallback == "none" else fallback
        self.count = 0

    def check_gradient(self, trainer, grad_norm):
        """Raise ``DivergenceError`` for a non-finite gradient norm (after the all-reduce: on every rank)."""
        if torch.isfinite(grad_norm).all():
            return
        criterion = trainer.criterion
        reason = criterion.take_divergence()
        norms = criterion.sublayer_grad_norms()
        if reason is None and norms is not None:
            reason = describe_nonfinite(norms)
        raise DivergenceError(f"training diverged at update {trainer.get_num_updates() + 1}: "
                              f"{reason or 'non-finite gradient norm'}")

    def check_loss_spike(self, trainer):
        """Raise ``DivergenceError`` if this update's loss per token (all ranks) is over ``--divergence-loss-spike``
        times the running average of the updates before it; else fold it into that average."""
        loss_sum, size = trainer.criterion.take_update_loss()
        if trainer.data_parallel_world_size > 1:
            total = torch.tensor([loss_sum, size], dtype=torch.float64, device=trainer.device)
            loss_sum, size = distributed_utils.all_reduce(total, group=trainer.data_parallel_process_group).tolist()
        if size == 0:
            return
        per_token = loss_sum / size / math.log(2)
        group = trainer.optimizer.param_groups[0]
        average = group.get(LOSS_AVERAGE_KEY)
        if average is not None and per_token > self.loss_spike * average:
            norms = trainer.criterion.sublayer_grad_norms() or {}
            top = max(norms, key=norms.get) if norms else "(none)"
            raise DivergenceError(f"training diverged at update {trainer.get_num_updates() + 1}: loss {per_token:.4g} "
                                  f"per token > {self.loss_spike:g} x its running average {average:.4g} "
                                  f"(--divergence-loss-spike); largest gradient in sublayer {top} "
                                  f"({norms.get(top, float('nan')):.4g}). The last saved checkpoint is untouched.")
        group[LOSS_AVERAGE_KEY] = per_token if average is None else (
            LOSS_AVERAGE_DECAY * average + (1 - LOSS_AVERAGE_DECAY) * per_token)

    def recover(self, trainer, err):
        """Whether the diverged update was handled: skipped (the state is still the previous update's), in
        another precision at the fp16 minimum loss scale; raises past the rollback bound."""
        criterion = trainer.criterion
        update = trainer.get_num_updates() + 1
        reason = criterion.take_divergence() or str(err).split(": ", 1)[-1].split(". The last saved")[0]
        criterion.take_update_loss()
        if isinstance(err, MinimumLossScale) and self.fp16_fallback and trainer.cfg.common.fp16:
            fall_back_precision(trainer, self.fp16_fallback)
            logger.warning(f"fp16 fall-back: update {update}: {reason}; model and optimizer stay at update "
                           f"{update - 1}, batch skipped; training goes on in {self.fp16_fallback} "
                           "(--divergence-fp16-fallback)")
            return True
        if not self.limit:
            return False
        self.count += 1
        if self.count > self.limit:
            raise DivergenceError(f"training diverged at update {update}: {reason}; rolled back "
                                  f"{self.limit} times already (--divergence-rollback). "
                                  "The last saved checkpoint is untouched.") from None
        trainer.zero_grad()
        scaler = getattr(trainer.optimizer, "scaler", None)  # fp16: leave the minimum loss scale
        if scaler is not None and getattr(scaler, "loss_scale", None) is not None:
            scaler.loss_scale = max(scaler.loss_scale, trainer.cfg.common.fp16_init_scale)  # untested on GPU
        lr = ""
        if self.lr_factor != 1.0:
            for group in trainer.optimizer.param_groups:
                group[LR_SCALE_KEY] = group.get(LR_SCALE_KEY, 1.0) * self.lr_factor
            trainer.lr_step_update()
            lr = f", learning rate x{trainer.optimizer.param_groups[0][LR_SCALE_KEY]:g} from now on"
        logger.warning(f"divergence rollback {self.count}/{self.limit}: update {update}: "
                       f"{reason}; model and optimizer stay at update {update - 1}, batch skipped{lr}")
        return True


def fall_back_precision(trainer, precision):
    """Train on in ``precision`` (bf16 or fp32) instead of fp16, from the same fp32 master weights."""
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[precision]
    trainer.zero_grad()
    for module in (trainer._model, trainer._criterion):
        module.to(dtype)  # the same Parameter objects: fairseq's fp16 optimizer still holds them
    trainer._wrapped_model = trainer._wrapped_criterion = None  # rewrapped (DDP buckets) at the next use
    trainer.optimizer.scaler = None  # as fairseq builds its fp16 optimizer for --bf16
    trainer.cfg.common.fp16, trainer.cfg.common.bf16 = False, precision == "bf16"  # batches cast to match
    trainer.optimizer.param_groups[0][PRECISION_KEY] = precision


def resume_precision(trainer):
    """A run that fell back from fp16 and is resumed with its ``--fp16`` command: fall back again."""
    precision = trainer.optimizer.param_groups[0].get(PRECISION_KEY)
    if precision and trainer.cfg.common.fp16:
        fall_back_precision(trainer, precision)
        logger.warning(f"fp16 fall-back: this run went on in {precision} before it was saved; so does the resumed "
                       "run (--divergence-fp16-fallback)")


def scaled_step_update(step_update, optimizer):
    """An lr scheduler's ``step_update`` followed by the rollbacks' learning-rate factor."""
    def step(num_updates):
        lr = step_update(num_updates)
        scale = optimizer.param_groups[0].get(LR_SCALE_KEY, 1.0)
        if scale == 1.0 or isinstance(lr, dict):
            return lr
        optimizer.set_lr(lr * scale)
        return lr * scale

    return step
