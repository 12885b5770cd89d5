"""fairseq-train's loop, made to survive the cluster: the one place where the plugin wraps it.

Importing the plugin wraps (once per process, any task):

- ``fairseq_cli.train.validate_and_save``, called by every rank after every update: after fairseq's
  own validation and saves, one all-reduce of two flags (a save-and-exit signal was received, a
  checkpoint write failed) so every rank stops at the same update. On a signal rank 0 saves
  ``checkpoint_last.pt`` (unless fairseq just did), logs one line and all ranks exit with status 75
  (``preemption``); on a failed write all ranks stop with rank 0's one-line error (``safe_save``).
- ``fairseq.trainer.Trainer.train_step`` and ``clip_grad_norm``: with ``--divergence-rollback N`` a
  diverged update is skipped from the last good state (``rollback``), past ``N`` it raises as before;
  ``--divergence-loss-spike`` is checked after the gradient all-reduce; at the fp16 minimum loss scale
  ``--divergence-fp16-fallback`` goes on in bf16 or fp32.
- ``checkpoint_utils.torch_persistent_save`` and ``checkpoint_utils.PathManager``: checkpoint files
  are written and copied atomically; a failed write leaves no partial file (``safe_save``).
- ``checkpoint_utils.load_checkpoint`` (fairseq-train only, before the first update): installs the
  signal handlers (``--save-on-signals``) and starts the lost-rank heartbeat (``--lost-rank-timeout``);
  both options belong to the ``translation_exact_resume`` task, other tasks get their defaults.
- ``sys.excepthook``: a failed collective waits for the heartbeat to name the lost rank (``lost_rank``);
  ``CheckpointWriteError`` prints as one ``error:`` line.
"""

import logging
import os
import sys

import torch
import fairseq_cli.train as fairseq_train
from fairseq import checkpoint_utils
from fairseq.distributed import utils as distributed_utils
from fairseq.trainer import Trainer

from . import lost_rank, preemption, rollback, safe_save
from ..instrumentation.monitors import DivergenceError

logger = logging.getLogger(__name__)

DEFAULT_LOST_RANK_TIMEOUT = 60.0  # ExactResumeTranslationConfig.lost_rank_timeout


class _SaveRecord:
    """The update of the last completed save on this rank, and a save failure to report."""
    update = None
    failure = None


def _agree(trainer, signal_received, save_failed):
    """(signal on any rank, failed save on any rank): one all-reduce (max) of two flags."""
    flags = [float(signal_received), float(save_failed)]
    if trainer.data_parallel_world_size > 1:
        tensor = torch.tensor(flags, dtype=torch.float32, device=trainer.device)
        flags = distributed_utils.all_reduce(tensor, group=trainer.data_parallel_process_group, op="max").tolist()
    return flags[0] > 0, flags[1] > 0


def _stop_after_failed_save(trainer):
    lost_rank.stop()
    if _SaveRecord.failure is not None:
        raise _SaveRecord.failure
    logger.error("stopping: rank 0 could not write a checkpoint (its log says why)")
    sys.exit(1)


def _validate_and_save(validate_and_save):
    def checked(cfg, trainer, task, epoch_itr, valid_subsets, end_of_epoch):
        if getattr(trainer, "_deepnet_fairseq_rolled_back", False) and not end_of_epoch:
            trainer._deepnet_fairseq_rolled_back = False  # no update: fairseq's saves at this update are done
            valid_losses, should_stop = [None], False
        else:
            valid_losses, should_stop = validate_and_save(cfg, trainer, task, epoch_itr, valid_subsets, end_of_epoch)
        received = preemption.request.received
        signal_agreed, save_failed = _agree(trainer, received is not None, _SaveRecord.failure is not None)
        if save_failed:
            _stop_after_failed_save(trainer)
        if should_stop:
            lost_rank.stop()  # finished: peers may leave while rank 0 still writes
        if not signal_agreed or should_stop:
            return valid_losses, should_stop
        lost_rank.stop()
        updates = trainer.get_num_updates()
        if _SaveRecord.update != updates:
            checkpoint_utils.save_checkpoint(cfg.checkpoint, trainer, epoch_itr, None)
        if _agree(trainer, False, _SaveRecord.failure is not None)[1]:
            _stop_after_failed_save(trainer)
        if distributed_utils.is_master(cfg.distributed_training):
            received = preemption.request.received  # a signal may have arrived during the all-reduce
            what = f"{received} received" if received else "a signal reached another rank"
            last = os.path.join(cfg.checkpoint.save_dir, f"checkpoint_last{trainer.checkpoint_suffix}.pt")
            logger.warning(f"{what}: all {trainer.data_parallel_world_size} ranks stop after update {updates}, "
                           f"saved in {last}; exiting with status {preemption.PREEMPTED_EXIT_STATUS} "
                           "(rerun the same command to resume)")
        sys.exit(preemption.PREEMPTED_EXIT_STATUS)

    return checked


def _recorded_save(save_checkpoint):
    """fairseq's ``save_checkpoint``: remembers the update it saved, or the failure (reported after the
    ranks agree, so that no rank goes on alone)."""
    def save(cfg, trainer, epoch_itr, val_loss):
        try:
            path = save_checkpoint(cfg, trainer, epoch_itr, val_loss)
        except safe_save.CheckpointWriteError as err:
            _SaveRecord.failure = err
            return None
        _SaveRecord.update = trainer.get_num_updates()
        return path

    return save


def _train_step(train_step):
    def step(self, samples, raise_oom=False):
        if hasattr(self.criterion, "take_update_loss"):
            self.criterion.take_update_loss()  # nothing left from an update fairseq skipped (fp16 overflow)
        try:
            return train_step(self, samples, raise_oom)
        except DivergenceError as err:
            if not rollback.recover(self, err):
                raise
            self._deepnet_fairseq_rolled_back = True
            return None  # fairseq's loop: no update (as after an OOM), on to the next batch

    return step


def _clip_grad_norm(clip_grad_norm):
    """Called by ``train_step`` after the gradient all-reduce, before fairseq checks the norm."""
    def clip(self, clip_norm):
        grad_norm = clip_grad_norm(self, clip_norm)
        if self.cfg.common.amp:  # amp skips non-finite steps by itself
            return grad_norm
        if rollback.enabled(self):
            rollback.check_gradient(self, grad_norm)
        if getattr(self.criterion, "loss_spike", 0):
            rollback.check_loss_spike(self)
        return grad_norm

    return clip


def _start_guards(load_checkpoint):
    """fairseq-train's ``load_checkpoint`` (run once, right before training): signals and heartbeat."""
    def load(cfg, trainer, **passthrough_args):
        result = load_checkpoint(cfg, trainer, **passthrough_args)
        task_cfg = trainer.task.cfg
        signals = preemption.parse_signals(getattr(task_cfg, "save_on_signals", preemption.DEFAULT_SIGNALS))
        preemption.request.install(signals)
        if signals:
            logger.info(f"on {', '.join(s.name for s in signals)}: save checkpoint_last.pt at the end of the update "
                        f"and exit with status {preemption.PREEMPTED_EXIT_STATUS} (--save-on-signals)")
        lost_rank.start(trainer.data_parallel_rank, trainer.data_parallel_world_size,
                        getattr(task_cfg, "lost_rank_timeout", DEFAULT_LOST_RANK_TIMEOUT))
        rollback.resume_precision(trainer)
        if rollback.enabled(trainer):
            trainer.lr_scheduler.step_update = rollback.scaled_step_update(trainer.lr_scheduler.step_update,
                                                                           trainer.optimizer)
            trainer.lr_step_update()  # a factor saved in the checkpoint applies from the first update on
        return result

    return load


def _collective_failed(kind, value):
    if not issubclass(kind, RuntimeError) or issubclass(kind, DivergenceError):
        return False
    text = str(value)
    return (issubclass(kind, getattr(torch.distributed, "DistError", ())) or "gloo" in text or "NCCL" in text
            or any(word in text for word in ("Connection closed", "Connection reset", "Broken pipe", "Timed out")))


def _excepthook(previous):
    def excepthook(kind, value, traceback):
        if issubclass(kind, safe_save.CheckpointWriteError):
            print(f"error: {value}", file=sys.stderr)
            return
        if _collective_failed(kind, value):
            lost_rank.wait_for_verdict()  # a peer died: the heartbeat names it and ends the process
        previous(kind, value, traceback)

    excepthook.deepnet_fairseq_train_loop = True
    return excepthook


def install():
    if getattr(fairseq_train, "_deepnet_fairseq_train_loop", False):
        return
    fairseq_train.validate_and_save = _validate_and_save(fairseq_train.validate_and_save)
    Trainer.train_step = _train_step(Trainer.train_step)
    Trainer.clip_grad_norm = _clip_grad_norm(Trainer.clip_grad_norm)
    safe_save._fairseq_persistent_save = checkpoint_utils.torch_persistent_save
    checkpoint_utils.torch_persistent_save = safe_save.persistent_save
    checkpoint_utils.PathManager = safe_save.CheckpointFiles
    checkpoint_utils.save_checkpoint = _recorded_save(checkpoint_utils.save_checkpoint)
    checkpoint_utils.load_checkpoint = _start_guards(checkpoint_utils.load_checkpoint)
    fairseq_train._deepnet_fairseq_train_loop = True
    if not getattr(sys.excepthook, "deepnet_fairseq_train_loop", False):
        sys.excepthook = _excepthook(sys.excepthook)


install()
