"""deepnet_fairseq: very deep Transformers for fairseq (DeepNorm, Pre-LN, stability diagnostics).

Use with any fairseq entry point: ``fairseq-train --user-dir deepnet_fairseq --arch deepnet_transformer``.
Importing the package registers the architectures, criteria and the exact-resume task, and allow-lists fairseq's checkpoint
classes for torch's weights-only loader.
"""

from .checkpoint_safety import allow_fairseq_checkpoints

allow_fairseq_checkpoints()

from . import criterions, models, training  # noqa: E402,F401  (registration)
