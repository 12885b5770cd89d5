"""Roll back instead of dying: ``--divergence-rollback N`` of ``diagnostic_label_smoothed_cross_entropy``.

Every trigger fires *before* the optimizer step of the update it is in, on every rank at once: a
non-finite or out-of-bound loss (the criterion then makes the update's gradient non-finite, so every
rank sees it after the gradient all-reduce), a non-finite gradient norm (``check_gradient``, right
after fairseq's all-reduce and clipping, before fairseq's own ``FloatingPointError``, whose NaN
detector re-runs the batch and writes ``crash.pt``), one over ``--divergence-grad-bound`` (the
guard's optimizer pre-hook), and the fp16 loss scale at its minimum (the guard's loss-scaler hook).
So the model and optimizer in memory are still the last good state (the previous update's).
``recover`` drops the gradient, skips the batch (the data iterator has moved past it), optionally
multiplies the learning rate by ``--divergence-rollback-lr-factor`` from then on, logs one line with
the update and the sublayer the guard named, and training goes on with the next batch as the same
update number. After ``N`` rollbacks in one process, the next
divergence stops training with the guard's error, as without rollback.

Exact resume after a rollback: the skipped batch is consumed in the data iterator's position, and the
learning-rate factor is stored in the optimizer's state, so a checkpoint saved after a rollback
resumes exactly the rolled-back run. A resume from an earlier checkpoint meets the same batch again
and (deterministically) rolls back the same way; the rollback count starts from 0 in each process.
"""

import logging

import torch

from ..diagnostics.monitors import DivergenceError, describe_nonfinite

logger = logging.getLogger(__name__)

LR_SCALE_KEY = "deepnet_fairseq_lr_scale"  # in the optimizer's param groups, saved with its state


def enabled(trainer):
    return getattr(trainer.criterion, "rollback_limit", 0) > 0


def check_gradient(trainer, grad_norm):
    """Raise ``DivergenceError`` for a non-finite gradient norm (after the all-reduce: on every rank)."""
    if torch.isfinite(grad_norm).all():
        return
    criterion = trainer.criterion
    reason = criterion.take_divergence()
    monitor = getattr(criterion, "_grad_monitor", None)
    if reason is None and monitor is not None:
        reason = describe_nonfinite(monitor._norms([(i, p.grad) for i, p in enumerate(monitor.params)])[0])
    criterion._divergence = reason or "non-finite gradient norm"
    raise DivergenceError(f"training diverged at update {trainer.get_num_updates() + 1}: {criterion._divergence}")


def recover(trainer, err):
    """Skip the diverged update (the state is still the previous update's), or raise past the bound."""
    criterion = trainer.criterion
    update = trainer.get_num_updates() + 1
    reason = criterion.take_divergence() or str(err).split(": ", 1)[-1].split(". The last saved")[0]
    criterion.rollbacks += 1
    if criterion.rollbacks > criterion.rollback_limit:
        raise DivergenceError(f"training diverged at update {update}: {reason}; rolled back "
                              f"{criterion.rollback_limit} times already (--divergence-rollback). "
                              "The last saved checkpoint is untouched.") from None
    trainer.zero_grad()
    scaler = getattr(trainer.optimizer, "scaler", None)  # fp16: leave the minimum loss scale
    if scaler is not None and getattr(scaler, "loss_scale", None) is not None:
        scaler.loss_scale = max(scaler.loss_scale, trainer.cfg.common.fp16_init_scale)  # untested on GPU
    lr = ""
    if criterion.rollback_lr_factor != 1.0:
        for group in trainer.optimizer.param_groups:
            group[LR_SCALE_KEY] = group.get(LR_SCALE_KEY, 1.0) * criterion.rollback_lr_factor
        trainer.lr_step_update()
        lr = f", learning rate x{trainer.optimizer.param_groups[0][LR_SCALE_KEY]:g} from now on"
    logger.warning(f"divergence rollback {criterion.rollbacks}/{criterion.rollback_limit}: update {update}: "
                   f"{reason}; model and optimizer stay at update {update - 1}, batch skipped{lr}")


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
