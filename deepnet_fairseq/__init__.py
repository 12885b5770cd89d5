"""deepnet_fairseq: very deep Transformers for fairseq (DeepNorm, Pre-LN, stability diagnostics).

Use with any fairseq entry point: ``fairseq-train --user-dir deepnet_fairseq --arch deepnet_transformer``.
Importing the package registers the architectures, criteria and the exact-resume task, and allow-lists fairseq's checkpoint
classes for torch's weights-only loader.
"""

import logging
import os


def _keep_root_logger_off_debug():
    """fairseq 0.12 calls ``logging.basicConfig(level=DEBUG)`` when it imports
    ``fairseq.models.wav2vec.wav2vec2_classification``, so any program that imports fairseq before
    configuring logging prints every library's DEBUG lines (matplotlib's, hydra's). fairseq's CLIs
    configure the root logger first and are unaffected; for everything else the root logger gets
    fairseq's own format and the level in ``LOGLEVEL`` (fairseq's variable, default INFO).
    """
    level = os.environ.get("LOGLEVEL", "INFO").upper()
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
                            datefmt="%Y-%m-%d %H:%M:%S", level=level)
    elif root.level == logging.DEBUG and level != "DEBUG":  # fairseq was imported first
        root.setLevel(level)


_keep_root_logger_off_debug()

from . import criterions, models, optim, training  # noqa: E402,F401  (registration; training.install())
