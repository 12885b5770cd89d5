"""fairseq's checkpoint loaders, checked: a bad file is one line naming it; a finished run is not extended.

Importing the plugin (``--user-dir deepnet_fairseq``, or ``import deepnet_fairseq`` before the hub
API) wraps two functions of ``fairseq.checkpoint_utils``, so every entry point gets the checks:

- ``load_checkpoint_to_cpu`` (fairseq-train's resume, fairseq-generate, fairseq-interactive,
  ``TransformerModel.from_pretrained``, ...): the file is verified first (``verify_checkpoint``:
  truncated, empty, not a zip, CRC mismatch), and a file torch's weights-only loader refuses or
  that holds no fairseq checkpoint raises ``CorruptCheckpointError`` naming the file. Uncaught,
  that error prints as one ``error: <file>: <what is wrong>`` line (exit status 1).
- ``load_checkpoint`` (fairseq-train only): before loading, rank 0 replaces a damaged
  ``checkpoint_last.pt`` by the newest complete checkpoint (``repair_last_checkpoint``), or an intact
  one by a newer complete checkpoint whose copy to it was interrupted (``catch_up_last_checkpoint``),
  or stops on a damaged ``--restore-file``; after loading, a run already at ``--max-update`` exits without
  training. fairseq itself checks ``--max-update`` only after an update, so rerunning a finished
  command trained one update more (update 61 after a 60-update run) and saved it.
"""

import logging
import os
import pickle
import re
import sys

from fairseq import checkpoint_utils

from .checkpoint_integrity import (
    CorruptCheckpointError,
    catch_up_last_checkpoint,
    repair_last_checkpoint,
    verify_checkpoint,
)

logger = logging.getLogger(__name__)

_verified = {}  # path -> (size, mtime) of the last verified version, so a resume reads the file once more only


def verify_once(path):
    stat = os.stat(path)
    key, version = os.path.realpath(path), (stat.st_size, stat.st_mtime_ns)
    if _verified.get(key) != version:
        verify_checkpoint(path)
        _verified[key] = version


class _NotFairseqCheckpoint(ValueError):
    pass


def _check_upgrade_state_dict(upgrade):
    def checked(state):
        if not isinstance(state, dict) or "model" not in state:
            what = f"keys {sorted(map(str, state))[:5]}" if isinstance(state, dict) else type(state).__name__
            raise _NotFairseqCheckpoint(f"not a fairseq checkpoint (no 'model' entry; it holds {what})")
        return upgrade(state)

    return checked


def _weights_only_reason(err):
    """The paragraph of torch's message that says what was refused (not the advice to switch it off)."""
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", str(err)) if p.strip()] or [repr(err)]
    reasons = [p for p in paragraphs[1:] if not p.startswith("Check the documentation")] or paragraphs
    return reasons[0].splitlines()[0].replace("WeightsUnpickler error: ", "")


def _checked_load_checkpoint_to_cpu(load):
    def load_checkpoint_to_cpu(path, *args, **kwargs):
        if os.path.isfile(path):  # remote paths are left to fairseq's PathManager
            verify_once(path)
        try:
            return load(path, *args, **kwargs)
        except pickle.UnpicklingError as err:
            raise CorruptCheckpointError(
                f"{path}: refused by torch's weights-only loader (Weights only load failed: {_weights_only_reason(err)}); "
                "it holds objects no fairseq checkpoint holds"
            ) from None
        except _NotFairseqCheckpoint as err:
            raise CorruptCheckpointError(f"{path}: {err}") from None

    return load_checkpoint_to_cpu


def _guarded_load_checkpoint(load):
    def load_checkpoint(cfg, trainer, **passthrough_args):
        if trainer.data_parallel_rank == 0:  # rank 0 reads the checkpoint and broadcasts it (fairseq's default)
            last = os.path.join(cfg.save_dir, f"checkpoint_last{cfg.checkpoint_suffix or ''}.pt")
            if cfg.restore_file == "checkpoint_last.pt" and os.path.isfile(last):
                try:
                    verify_once(last)
                except CorruptCheckpointError:
                    repair_last_checkpoint(last)
                else:
                    catch_up_last_checkpoint(last)
            elif os.path.isfile(cfg.restore_file):
                verify_once(cfg.restore_file)
        extra_state, epoch_itr = load(cfg, trainer, **passthrough_args)
        max_update = trainer.cfg.optimization.max_update
        if extra_state is not None and max_update and trainer.get_num_updates() >= max_update:
            logger.info(f"nothing to train: the checkpoint is at update {trainer.get_num_updates()}, "
                        f"--max-update is {max_update}")
            sys.exit(0)
        return extra_state, epoch_itr

    return load_checkpoint


def _one_line_excepthook(previous):
    def excepthook(kind, value, traceback):
        if issubclass(kind, CorruptCheckpointError):
            print(f"error: {value}", file=sys.stderr)
        else:
            previous(kind, value, traceback)

    excepthook.deepnet_fairseq = True
    return excepthook


def install():
    """Wrap fairseq's loaders (once per process)."""
    if getattr(checkpoint_utils, "_deepnet_fairseq_guarded", False):
        return
    checkpoint_utils.load_checkpoint_to_cpu = _checked_load_checkpoint_to_cpu(checkpoint_utils.load_checkpoint_to_cpu)
    checkpoint_utils._upgrade_state_dict = _check_upgrade_state_dict(checkpoint_utils._upgrade_state_dict)
    checkpoint_utils.load_checkpoint = _guarded_load_checkpoint(checkpoint_utils.load_checkpoint)
    checkpoint_utils._deepnet_fairseq_guarded = True
    if not getattr(sys.excepthook, "deepnet_fairseq", False):
        sys.excepthook = _one_line_excepthook(sys.excepthook)


install()
