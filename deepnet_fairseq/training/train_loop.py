"""fairseq-train's loop, made to survive the cluster: the wrappers that ``training.install`` puts in place.

- ``start_of_training`` (``load_checkpoint``, once, before the first update): rank 0 checks the file it
  resumes from (``checkpoints``); a run already at ``--max-update`` exits without training (fairseq
  checks it only after an update, so a rerun trained and saved one update more); then the signal
  handlers (``preemption``), the lost-rank heartbeat (``lost_rank``) and the divergence rollback
  (``rollback``) start with this run's ``ReliabilityConfig``.
- ``agreed_stop`` (``validate_and_save``, every rank, every update): after fairseq's validation and saves,
  one all-reduce of two flags (a save-and-exit signal arrived, a checkpoint write failed), so every rank
  stops at the same update: on a signal rank 0 saves ``checkpoint_last.pt`` (unless fairseq just did),
  logs one line and every rank exits with status 75; on a failed write every rank stops.
- ``recorded_save`` (``save_checkpoint``): the update saved, or the write error to report once agreed; an
  update checkpoint for an interval update that ends an epoch (``update_checkpoint_at_epoch_end``).
- ``rollback_on_divergence`` (``Trainer.train_step``) and ``checked_gradient`` (``Trainer.clip_grad_norm``,
  after the gradient all-reduce): a diverged update is skipped from the last good state.
"""

import logging
import os
import sys

import torch
from fairseq import checkpoint_utils
from fairseq.distributed import utils as distributed_utils

from . import checkpoints, lost_rank, preemption
from .rollback import Rollback, resume_precision, scaled_step_update
from ..instrumentation.monitors import DivergenceError
from ..instrumentation.reliability_config import ReliabilityConfig

logger = logging.getLogger(__name__)


class _Run:
    """This process's run, as the wrappers share it."""
    saved_update = None  # the update of the last completed save on this rank
    save_failure = None  # a CheckpointWriteError, reported once the ranks agree
    rollback = Rollback(ReliabilityConfig())  # this run's, from the start of training on
    rolled_back = False  # the last train_step was skipped: fairseq's saves for its update are done


def reliability_options(cfg):
    """The run's ``ReliabilityConfig``: the task's or the criterion's (both inherit it and fairseq fills them
    from the same flags; a legacy task's config is the whole argparse namespace), else the defaults."""
    for group in (cfg.task, cfg.criterion):
        if group is not None and "lost_rank_timeout" in group:
            return group
    return ReliabilityConfig()


def _agree(trainer, signal_received, save_failed):
    """(signal on any rank, failed save on any rank): one all-reduce (max) of two flags."""
    flags = [float(signal_received), float(save_failed)]
    if trainer.data_parallel_world_size > 1:
        tensor = torch.tensor(flags, dtype=torch.float32, device=trainer.device)
        flags = distributed_utils.all_reduce(tensor, group=trainer.data_parallel_process_group, op="max").tolist()
    return flags[0] > 0, flags[1] > 0


def _stop_after_failed_save():
    lost_rank.stop()
    if _Run.save_failure is not None:
        raise _Run.save_failure
    logger.error("stopping: rank 0 could not write a checkpoint (its log says why)")
    sys.exit(1)


def agreed_stop(validate_and_save):
    def checked(cfg, trainer, task, epoch_itr, valid_subsets, end_of_epoch):
        if _Run.rolled_back and not end_of_epoch:
            _Run.rolled_back = False  # no update: fairseq's saves at this update are done
            valid_losses, should_stop = [None], False
        else:
            valid_losses, should_stop = validate_and_save(cfg, trainer, task, epoch_itr, valid_subsets, end_of_epoch)
        signal_agreed, save_failed = _agree(trainer, preemption.request.received is not None,
                                            _Run.save_failure is not None)
        if save_failed:
            _stop_after_failed_save()
        if should_stop:
            lost_rank.stop()  # finished: peers may leave while rank 0 still writes
        if not signal_agreed or should_stop:
            return valid_losses, should_stop
        lost_rank.stop()
        updates = trainer.get_num_updates()
        if _Run.saved_update != updates:
            checkpoint_utils.save_checkpoint(cfg.checkpoint, trainer, epoch_itr, None)
        if _agree(trainer, False, _Run.save_failure is not None)[1]:
            _stop_after_failed_save()
        if distributed_utils.is_master(cfg.distributed_training):
            received = preemption.request.received  # a signal may have arrived during the all-reduce
            what = f"{received} received" if received else "a signal reached another rank"
            last = os.path.join(cfg.checkpoint.save_dir, f"checkpoint_last{trainer.checkpoint_suffix}.pt")
            logger.warning(f"{what}: all {trainer.data_parallel_world_size} ranks stop after update {updates}, "
                           f"saved in {last}; exiting with status {preemption.PREEMPTED_EXIT_STATUS} "
                           "(rerun the same command to resume)")
        sys.exit(preemption.PREEMPTED_EXIT_STATUS)

    return checked


def recorded_save(save_checkpoint):
    def save(cfg, trainer, epoch_itr, val_loss):
        try:
            path = save_checkpoint(cfg, trainer, epoch_itr, val_loss)
            update_checkpoint_at_epoch_end(cfg, trainer, epoch_itr)
        except checkpoints.CheckpointWriteError as err:
            _Run.save_failure = err  # no rank may go on alone: reported after the ranks agree
            return None
        _Run.saved_update = trainer.get_num_updates()
        return path

    return save


def update_checkpoint_at_epoch_end(cfg, trainer, epoch_itr):
    """fairseq names an update checkpoint (``checkpoint_<E>_<U>.pt``) only inside an epoch; at an epoch's last
    update it writes ``checkpoint<E>.pt`` instead, which ``--no-epoch-checkpoints`` (the setups' default) turns off,
    so averaging the last K update checkpoints left that update out, even a run's final one, and reached one
    interval further back. That update gets its update checkpoint too: a copy of ``checkpoint_last.pt``, dated as
    its source, since a resume takes a checkpoint newer than ``checkpoint_last.pt`` for a save stopped midway."""
    updates = trainer.get_num_updates()
    if (cfg.no_save or cfg.no_last_checkpoints or cfg.save_interval_updates <= 0 or updates % cfg.save_interval_updates
            or not epoch_itr.end_of_epoch() or not trainer.should_save_checkpoint_on_current_rank):
        return
    suffix = trainer.checkpoint_suffix
    last = os.path.join(cfg.save_dir, f"checkpoint_last{suffix}.pt")
    named = os.path.join(cfg.save_dir, f"checkpoint_{epoch_itr.epoch}_{updates}{suffix}.pt")
    if not os.path.exists(named):
        checkpoints.CheckpointFiles.copy(last, named)
        if os.path.isfile(named):  # a local file (PathManager's remote ones keep their own dates)
            written = os.stat(last)
            os.utime(named, ns=(written.st_atime_ns, written.st_mtime_ns))


def rollback_on_divergence(train_step):
    def step(self, samples, raise_oom=False):
        if hasattr(self.criterion, "take_update_loss"):
            self.criterion.take_update_loss()  # nothing left from an update fairseq skipped (fp16 overflow)
        try:
            return train_step(self, samples, raise_oom)
        except DivergenceError as err:
            if not _Run.rollback.recover(self, err):
                raise
            _Run.rolled_back = True
            return None  # fairseq's loop: no update (as after an OOM), on to the next batch

    return step


def checked_gradient(clip_grad_norm):
    """Called by ``train_step`` after the gradient all-reduce, before fairseq checks the norm."""
    def clip(self, clip_norm):
        grad_norm = clip_grad_norm(self, clip_norm)
        if self.cfg.common.amp:  # amp skips non-finite steps by itself
            return grad_norm
        if _Run.rollback.limit:
            _Run.rollback.check_gradient(self, grad_norm)
        if _Run.rollback.loss_spike:
            _Run.rollback.check_loss_spike(self)
        return grad_norm

    return clip


def start_of_training(load_checkpoint):
    def load(cfg, trainer, **passthrough_args):
        options = reliability_options(trainer.cfg)
        rollback = Rollback(options)
        if (rollback.limit or rollback.loss_spike or rollback.fp16_fallback) and not getattr(trainer.criterion,
                                                                                              "guard", False):
            raise ValueError("--divergence-rollback/--divergence-loss-spike/--divergence-fp16-fallback need "
                             "--criterion diagnostic_label_smoothed_cross_entropy --divergence-guard")
        # before the load: resuming mid-epoch forks the DataLoader workers there, and a worker forked before the
        # handler would die of a process-group signal, making the trainer raise instead of saving
        signals = preemption.parse_signals(options.save_on_signals)
        preemption.request.install(signals)
        if signals:
            logger.info(f"on {', '.join(s.name for s in signals)}: save checkpoint_last.pt at the end of the update "
                        f"and exit with status {preemption.PREEMPTED_EXIT_STATUS} (--save-on-signals)")
        if trainer.data_parallel_rank == 0:  # rank 0 reads the checkpoint and broadcasts it (fairseq's default)
            if not cfg.no_save:  # the save dir is this trainer's alone; a run that writes nothing needs no lock
                checkpoints.hold_save_dir(cfg.save_dir)
            checkpoints.check_resume_file(cfg)
        extra_state, epoch_itr = load_checkpoint(cfg, trainer, **passthrough_args)
        max_update = trainer.cfg.optimization.max_update
        if extra_state is not None and max_update and trainer.get_num_updates() >= max_update:
            logger.info(f"nothing to train: the checkpoint is at update {trainer.get_num_updates()}, "
                        f"--max-update is {max_update}")
            sys.exit(0)
        lost_rank.start(trainer.data_parallel_rank, trainer.data_parallel_world_size, options.lost_rank_timeout)
        if options.flush_denormal:
            if not torch.set_flush_denormal(True):
                raise ValueError("--flush-denormal: this CPU cannot flush denormals (torch.set_flush_denormal)")
            logger.info("float32 denormals are flushed to zero (--flush-denormal)")
        _Run.rollback = rollback
        resume_precision(trainer)
        if rollback.limit:
            trainer.lr_scheduler.step_update = scaled_step_update(trainer.lr_scheduler.step_update, trainer.optimizer)
            trainer.lr_step_update()  # a factor saved in the checkpoint applies from the first update on
        return extra_state, epoch_itr

    return load
