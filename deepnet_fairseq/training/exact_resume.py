"""``translation_exact_resume``: fairseq's ``translation`` task whose training resumes bit-exactly.

Why fairseq's own resume drifts: ``FairseqTask.get_batch_iterator`` freezes the batches once, when
the iterator is created, ordering examples under ``numpy_seed(seed + epoch)`` (the random order
breaks ties between equal lengths). An uninterrupted run creates the iterator in epoch 1 and keeps
those batches for every epoch; a run resumed in epoch E creates it in epoch E, so its batches hold
different sentences (same sizes) from the first update after the resume. Model, optimizer, lr
scheduler, dropout seed (``seed + num_updates``) and iterator position are all restored exactly.

The fix: always build the frozen batches as an uninterrupted run does (epoch 1), then set the
iterator's epoch. A damaged ``checkpoint_last.pt`` (e.g. ``kill -9`` during fairseq's non-atomic
copy) is replaced by the newest complete checkpoint for every task (``checkpoints``).

Its config also holds the reliability options (``ReliabilityConfig``: ``--save-on-signals``,
``--lost-rank-timeout``, ``--divergence-*``); under other tasks they take their defaults unless the
criterion holds them.
"""

from dataclasses import dataclass

from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask

from ..instrumentation.reliability_config import ReliabilityConfig

FIRST_EPOCH = 1


class ExactResumeMixin:
    """Task mixin: frozen batches that do not depend on the epoch the iterator was created in."""

    def get_batch_iterator(self, dataset, *args, epoch=1, **kwargs):
        cached = self.dataset_to_epoch_iter.get(dataset)
        epoch_iter = super().get_batch_iterator(dataset, *args, epoch=FIRST_EPOCH, **kwargs)
        if epoch_iter is not cached:  # freshly built: batches as in epoch 1, counter at `epoch`
            epoch_iter.epoch = max(epoch, 1)
        return epoch_iter


@dataclass
class ExactResumeTranslationConfig(TranslationConfig, ReliabilityConfig):
    pass


@register_task("translation_exact_resume", dataclass=ExactResumeTranslationConfig)
class ExactResumeTranslationTask(ExactResumeMixin, TranslationTask):
    """fairseq's ``translation`` task; interrupted training resumes exactly (see module docstring)."""
