"""Training reliability: exact resume after an interruption and checkpoint integrity checks.

Importing this package registers the ``translation_exact_resume`` task and wraps fairseq's checkpoint
loaders (``checkpoint_guard``: a bad file is named, a finished run is not extended); fairseq's idiom:
every module here is imported for its registrations.
"""

import importlib
import pkgutil

from .checkpoint_integrity import CorruptCheckpointError, verify_checkpoint  # noqa: F401

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "__main__":
        importlib.import_module(f"{__name__}.{_module.name}")
