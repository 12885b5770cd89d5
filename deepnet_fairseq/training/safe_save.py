"""Checkpoint writes that a full disk cannot turn into a damaged checkpoint.

fairseq writes the first file of a save to ``<name>.tmp`` and renames it, retrying a failed write
twice (2.5 s apart, a traceback logged each time) and leaving the ``.tmp`` behind; then it *copies*
that file to the others (``checkpoint_last.pt``, ``checkpoint_best.pt``) in place, so a disk that
fills during the copy truncates the previous ``checkpoint_last.pt``. Here (``train_loop`` installs
both into fairseq's ``checkpoint_utils``):

- ``persistent_save``: ``torch.save`` to ``<name>.tmp``, fsync, rename; a failed write removes the
  ``.tmp`` and raises ``CheckpointWriteError`` at once;
- ``CheckpointFiles``: fairseq's ``PathManager`` whose ``copy`` of a local file is atomic the same way
  (``checkpoint_integrity.atomic_copy``).

So every name ``checkpoint*.pt`` holds a complete file or its previous version. The error's one line
names the file, the space a checkpoint needs and the space free; ``train_loop`` stops every rank.
"""

import logging
import os
import shutil

import torch
from fairseq.file_io import PathManager

from .checkpoint_integrity import atomic_copy

logger = logging.getLogger(__name__)


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, quota, I/O error); the message is one line."""


def _space_line(path, needed):
    folder = os.path.dirname(os.path.abspath(path))
    try:
        free = f"{shutil.disk_usage(folder).free / 2**20:.1f} MiB free there"
    except OSError:
        free = "free space unknown"
    return f"a checkpoint needs {needed / 2**20:.1f} MiB, {free}"


def _tensor_bytes(obj):
    """Bytes of the tensors in a (nested) state dict: what the checkpoint file needs, roughly."""
    if torch.is_tensor(obj):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def _remove(path):
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def write_failed(path, err, needed):
    """The one-line error for a checkpoint that could not be written, naming what is still intact."""
    last = os.path.join(os.path.dirname(os.path.abspath(path)), "checkpoint_last.pt")
    kept = f"{last} is unchanged" if os.path.exists(last) else "no checkpoint_last.pt was written yet"
    cause = err  # torch's zip writer turns the OSError of a failed write into a RuntimeError
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__cause__ or cause.__context__
    reason = f"[Errno {cause.errno}] {cause.strerror}" if cause is not None and cause.strerror else \
        f"{type(err).__name__}: {str(err).splitlines()[0]}"
    return CheckpointWriteError(f"could not write checkpoint {path} ({reason}); "
                                f"{_space_line(path, needed)}; {kept}; free space and rerun to resume")


def persistent_save(obj, filename, async_write=False):
    """fairseq's ``checkpoint_utils.torch_persistent_save`` for local files: complete or absent."""
    if async_write or PathManager.path_requires_pathmanager(filename):
        return _fairseq_persistent_save(obj, filename, async_write)
    temp = filename + ".tmp"
    try:
        with open(temp, "wb") as handle:
            torch.save(obj, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, filename)
    except (OSError, RuntimeError) as err:  # torch's zip writer reports a failed write as a RuntimeError
        _remove(temp)
        raise write_failed(filename, err, _tensor_bytes(obj)) from None


class CheckpointFiles(PathManager):
    """fairseq's ``PathManager`` as ``checkpoint_utils`` uses it, with atomic copies of local files."""

    @staticmethod
    def copy(src_path, dst_path, overwrite=False):
        if PathManager.path_requires_pathmanager(src_path) or PathManager.path_requires_pathmanager(dst_path):
            return PathManager.copy(src_path, dst_path, overwrite)
        try:
            atomic_copy(src_path, dst_path)
        except OSError as err:
            _remove(f"{dst_path}.tmp")
            raise write_failed(dst_path, err, os.path.getsize(src_path)) from None
        return True


_fairseq_persistent_save = None  # fairseq's own, for remote paths and async writes (set by train_loop.install)
