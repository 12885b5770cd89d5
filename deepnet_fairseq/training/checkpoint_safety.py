"""Let torch's weights-only unpickler load fairseq checkpoints, without turning it off.

torch >= 2.6 loads with ``weights_only=True`` by default; fairseq checkpoints then fail with
``Unsupported global: argparse.Namespace``. Importing this plugin allow-lists exactly the
(non-tensor) classes that fairseq checkpoints hold, found with
``torch.serialization.get_unsafe_globals_in_checkpoint`` on real checkpoints:

- every training checkpoint: ``argparse.Namespace`` (the legacy model args inside ``cfg``);
- with ``--eval-bleu`` (meters hold numpy values): numpy's array reconstructor, ``ndarray``,
  ``dtype`` and the Int64/Float64 dtype classes;
- distributed resume (rank 0 broadcasts state through ``torch.save``/``torch.load``): omegaconf's
  containers and their metadata (which name the types ``dict``, ``int`` and ``list``),
  ``collections.defaultdict``, ``typing.Any`` and fairseq's ``_TensorPlaceholder``.

Anything else (for instance an object whose ``__reduce__`` runs a shell command) is still refused.
"""

import argparse
import collections
import typing

import numpy as np
import torch


def _numpy_globals():
    core = getattr(np, "_core", None) or np.core  # numpy 2 moved numpy.core to numpy._core
    found = [core.multiarray._reconstruct, np.ndarray, np.dtype]
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        found += [dtypes.Int64DType, dtypes.Float64DType]
    # numpy 1.x pickles name numpy.core.multiarray._reconstruct; numpy 2 can read both spellings.
    found.append((core.multiarray._reconstruct, "numpy.core.multiarray._reconstruct"))
    return found


def fairseq_checkpoint_globals():
    """The exact list of classes and functions allow-listed for fairseq checkpoints."""
    from omegaconf import DictConfig, ListConfig
    from omegaconf.base import ContainerMetadata, Metadata
    from omegaconf.nodes import AnyNode

    from fairseq.distributed.utils import _TensorPlaceholder

    return [
        argparse.Namespace,
        dict,
        int,
        list,
        collections.defaultdict,
        typing.Any,
        DictConfig,
        ListConfig,
        ContainerMetadata,
        Metadata,
        AnyNode,
        _TensorPlaceholder,
    ] + _numpy_globals()


def allowed_global_names():
    """The allow-list as the dotted names torch reports (``get_unsafe_globals_in_checkpoint``)."""
    names = set()
    for entry in fairseq_checkpoint_globals():
        names.add(entry[1] if isinstance(entry, tuple) else f"{entry.__module__}.{entry.__qualname__}")
    return names


def allow_fairseq_checkpoints():
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is not None:  # torch < 2.4 has no weights-only default to work with
        add(fairseq_checkpoint_globals())
