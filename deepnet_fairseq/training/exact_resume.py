"""``translation_exact_resume``: fairseq's ``translation`` task whose training resumes bit-exactly.

Why fairseq's own resume drifts: ``FairseqTask.get_batch_iterator`` freezes the batches once, when
the iterator is created, ordering examples under ``numpy_seed(seed + epoch)`` (the random order
breaks ties between equal lengths). An uninterrupted run creates the iterator in epoch 1 and keeps
those batches for every epoch; a run resumed in epoch E creates it in epoch E, so its batches hold
different sentences (same sizes) from the first update after the resume. Model, optimizer, lr
scheduler, dropout seed (``seed + num_updates``) and iterator position are all restored exactly.

The fix: always build the frozen batches as an uninterrupted run does (epoch 1), then set the
iterator's epoch. Before the model is built, a damaged ``checkpoint_last.pt`` (e.g. ``kill -9``
during fairseq's non-atomic copy) is replaced by the newest complete checkpoint, and a damaged
``--restore-file`` stops training with an error naming the file.
"""

import os

from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from .checkpoint_integrity import repair_last_checkpoint, verify_checkpoint

FIRST_EPOCH = 1


class ExactResumeMixin:
    """Task mixin: epoch-independent frozen batches and a checked restore checkpoint."""

    def get_batch_iterator(self, dataset, *args, epoch=1, **kwargs):
        cached = self.dataset_to_epoch_iter.get(dataset)
        epoch_iter = super().get_batch_iterator(dataset, *args, epoch=FIRST_EPOCH, **kwargs)
        if epoch_iter is not cached:  # freshly built: batches as in epoch 1, counter at `epoch`
            epoch_iter.epoch = max(epoch, 1)
        return epoch_iter

    def build_model(self, cfg, from_checkpoint=False):
        if not from_checkpoint:
            check_restore_checkpoint(cfg)
        return super().build_model(cfg, from_checkpoint)


def check_restore_checkpoint(cfg):
    """Verify the checkpoint fairseq-train is about to resume from (legacy models carry its options)."""
    save_dir = getattr(cfg, "save_dir", None)
    restore_file = getattr(cfg, "restore_file", None)
    if save_dir is None or restore_file is None or not _first_rank(cfg):
        return  # rank 0 reads the checkpoint and broadcasts it (fairseq's default)
    if restore_file == "checkpoint_last.pt":
        suffix = getattr(cfg, "checkpoint_suffix", "") or ""
        repair_last_checkpoint(os.path.join(save_dir, f"checkpoint_last{suffix}.pt"))
    elif os.path.exists(restore_file):
        verify_checkpoint(restore_file)


def _first_rank(cfg):
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return getattr(cfg, "distributed_rank", 0) == 0


@register_task("translation_exact_resume", dataclass=TranslationConfig)
class ExactResumeTranslationTask(ExactResumeMixin, TranslationTask):
    """fairseq's ``translation`` task; interrupted training resumes exactly (see module docstring)."""
