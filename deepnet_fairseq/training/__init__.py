"""Training reliability: safe checkpoints, exact resume, and a training loop that survives the cluster.

Importing this package (``--user-dir deepnet_fairseq``, or ``import deepnet_fairseq`` before the hub
API) registers the ``translation_exact_resume`` task and calls ``install``, the one place that patches
fairseq. The options are ``ReliabilityConfig`` (``instrumentation/reliability_config.py``).
"""

import sys

import fairseq_cli.train as fairseq_train
from fairseq import checkpoint_utils
from fairseq.trainer import Trainer

from . import checkpoints, exact_resume, lost_rank, robt, train_loop  # noqa: F401  (exact_resume, robt: tasks)
from .checkpoints import CheckpointWriteError, CorruptCheckpointError, SaveDirInUse, verify_checkpoint  # noqa: F401

ONE_LINE_ERRORS = (CorruptCheckpointError, CheckpointWriteError, SaveDirInUse)  # their message says it all


def excepthook(previous):
    def hook(kind, value, traceback):
        if issubclass(kind, ONE_LINE_ERRORS):
            print(f"error: {value}", file=sys.stderr)
            return  # exit status 1, as for any uncaught exception
        if lost_rank.collective_failed(kind, value):
            lost_rank.wait_for_verdict()  # a peer died: the heartbeat names it and ends the process
        previous(kind, value, traceback)

    hook.deepnet_fairseq = True
    return hook


def install():
    """Patch fairseq, once per process. Every target, and why:"""
    if getattr(checkpoint_utils, "_deepnet_fairseq", False):
        return
    checkpoint_utils._deepnet_fairseq = True
    checkpoints.allow_fairseq_checkpoints()  # torch's weights-only loader: exactly what fairseq checkpoints hold
    for owner, name, wrap in (
        # every loader (train's resume, generate, interactive, hub): a damaged or foreign file is one line naming it
        (checkpoint_utils, "load_checkpoint_to_cpu", checkpoints.checked_load_checkpoint_to_cpu),
        # ... and a torch file that holds no fairseq checkpoint is named, not a KeyError
        (checkpoint_utils, "_upgrade_state_dict", checkpoints.checked_upgrade_state_dict),
        # fairseq-train before the first update: the save dir held by rank 0 (unless --no-save); resume from a
        # complete file, not past --max-update; start guards
        (checkpoint_utils, "load_checkpoint", train_loop.start_of_training),
        # a checkpoint file is complete or absent; a failed write stops at once with one line
        (checkpoint_utils, "torch_persistent_save", checkpoints.atomic_persistent_save),
        # a failed save is reported once every rank knows, so that no rank goes on alone
        (checkpoint_utils, "save_checkpoint", train_loop.recorded_save),
        # every rank stops at the same update on a signal (saved, status 75) or a failed save
        (fairseq_train, "validate_and_save", train_loop.agreed_stop),
        # a diverged update is skipped from the last good state (--divergence-rollback)
        (Trainer, "train_step", train_loop.rollback_on_divergence),
        # after the gradient all-reduce: a non-finite gradient or a loss spike diverged, on every rank alike
        (Trainer, "clip_grad_norm", train_loop.checked_gradient),
    ):
        setattr(owner, name, wrap(getattr(owner, name)))
    checkpoint_utils.PathManager = checkpoints.CheckpointFiles  # its copy to checkpoint_last.pt is atomic
    if not getattr(sys.excepthook, "deepnet_fairseq", False):  # one-line errors; a lost rank named
        sys.excepthook = excepthook(sys.excepthook)


install()
