"""Architectures registered with fairseq; every module in this folder is imported (fairseq's idiom)."""

import importlib
import pkgutil

from .deepnorm import DeepNormConstants, deepnorm_constants  # noqa: F401

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
