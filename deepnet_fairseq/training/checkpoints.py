"""Checkpoint files that load safely, are never half-written, and belong to one trainer.

- **Weights-only loading.** torch >= 2.6 loads with ``weights_only=True``; fairseq checkpoints then fail
  with ``Unsupported global: argparse.Namespace``. ``allow_fairseq_checkpoints`` allow-lists exactly the
  (non-tensor) classes fairseq checkpoints hold, found with ``get_unsafe_globals_in_checkpoint`` on real
  ones: ``argparse.Namespace`` (every checkpoint); numpy's array reconstructor, ``ndarray``, ``dtype`` and
  the Int64/Float64 dtypes (meters of ``--eval-bleu``); omegaconf's containers and their metadata,
  ``defaultdict``, ``typing.Any`` and ``_TensorPlaceholder`` (rank 0's broadcast at a distributed resume).
  Anything else (an object whose ``__reduce__`` runs a shell command) is still refused.
- **Integrity.** torch's reader notices a truncated zip but never checks a record's CRC-32, so flipped
  bytes load silently; ``verify_checkpoint`` reads every record through ``zipfile`` and raises
  ``CorruptCheckpointError`` naming the file. Every fairseq loader verifies first
  (``checked_load_checkpoint_to_cpu``); before fairseq-train resumes, rank 0 replaces a damaged
  ``checkpoint_last.pt`` by the newest complete checkpoint (``repair_last_checkpoint``: the damaged file
  goes to ``*.corrupt``), or an intact one by a newer complete ``checkpoint<E>.pt`` /
  ``checkpoint_<E>_<U>.pt`` whose copy to it was stopped (``catch_up_last_checkpoint``).
- **Atomic writes.** fairseq writes the first file of a save to ``.tmp`` and renames it (retrying a
  failed write twice, a traceback each time, the ``.tmp`` left behind), then *copies* it in place to
  ``checkpoint_last.pt`` / ``checkpoint_best.pt``, so a ``kill -9`` or a full disk during the copy left
  a truncated ``checkpoint_last.pt``. Here both are temp file, fsync, rename (``atomic_persistent_save``,
  ``CheckpointFiles``); a failed write removes its temp file and raises ``CheckpointWriteError``, one
  line whose advice matches its cause.
- **One trainer per save dir.** Two trainers in one folder overwrite each other's ``.tmp`` files; rank 0
  holds ``<save-dir>/.trainer.lock`` (``hold_save_dir``) from its start to its exit.
"""

import argparse
import collections
import errno
import fcntl
import logging
import multiprocessing.util
import os
import pickle
import re
import shutil
import socket
import sys
import time
import typing
import zipfile

import numpy as np
import torch
from fairseq.file_io import PathManager

logger = logging.getLogger(__name__)

CHECKPOINT_NAME = re.compile(r"checkpoint.*\.pt")
FIRST_OF_A_SAVE = re.compile(r"checkpoint(\d+|_\d+_\d+)\.pt")  # the file fairseq writes, then copies to _last
LOCK_NAME = ".trainer.lock"


class CorruptCheckpointError(RuntimeError):
    """A checkpoint file that must not be loaded (truncated, not a torch zip archive, bad CRC, foreign)."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, quota, a vanished file, I/O error); one line."""


class SaveDirInUse(RuntimeError):
    """Another trainer holds this --save-dir; one line naming it."""


# -- weights-only loading ----------------------------------------------------------------------------

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

    return [argparse.Namespace, dict, int, list, collections.defaultdict, typing.Any, DictConfig, ListConfig,
            ContainerMetadata, Metadata, AnyNode, _TensorPlaceholder] + _numpy_globals()


def allowed_global_names():
    """The allow-list as the dotted names torch reports (``get_unsafe_globals_in_checkpoint``)."""
    return {entry[1] if isinstance(entry, tuple) else f"{entry.__module__}.{entry.__qualname__}"
            for entry in fairseq_checkpoint_globals()}


def allow_fairseq_checkpoints():
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is not None:  # torch < 2.4 has no weights-only default to work with
        add(fairseq_checkpoint_globals())


# -- integrity -----------------------------------------------------------------------------------------

def verify_checkpoint(path):
    """Raise ``CorruptCheckpointError`` unless ``path`` is a complete torch zip checkpoint."""
    path = str(path)
    size = os.path.getsize(path)
    if size == 0:
        raise CorruptCheckpointError(f"{path}: empty checkpoint file (0 bytes); it was never written completely")
    try:
        with zipfile.ZipFile(path) as archive:
            bad_record = archive.testzip()  # reads every record and checks its CRC-32
    except zipfile.BadZipFile as err:
        raise CorruptCheckpointError(
            f"{path}: truncated or not a torch checkpoint ({size} bytes; {err})"
        ) from None
    except (OSError, EOFError, ValueError, zipfile.LargeZipFile, NotImplementedError) as err:
        raise CorruptCheckpointError(f"{path}: unreadable checkpoint ({type(err).__name__}: {err})") from None
    if bad_record is not None:
        raise CorruptCheckpointError(f"{path}: corrupted checkpoint (CRC mismatch in record {bad_record!r})")


_verified = {}  # path -> (size, mtime) of the last verified version, so a resume reads the file once more only


def verify_once(path):
    stat = os.stat(path)
    key, version = os.path.realpath(path), (stat.st_size, stat.st_mtime_ns)
    if _verified.get(key) != version:
        verify_checkpoint(path)
        _verified[key] = version


def _first_complete(candidates):
    for candidate in sorted(candidates, key=os.path.getmtime, reverse=True):
        try:
            verify_checkpoint(candidate)
        except CorruptCheckpointError as err:
            logger.warning(f"skipping {err}")
            continue
        return candidate
    return None


def newest_complete_checkpoint(save_dir, exclude=()):
    """The most recently written checkpoint in ``save_dir`` that passes ``verify_checkpoint`` (or None)."""
    excluded = {os.path.abspath(p) for p in exclude}
    return _first_complete(os.path.join(save_dir, name) for name in os.listdir(save_dir)
                           if CHECKPOINT_NAME.fullmatch(name)
                           and os.path.abspath(os.path.join(save_dir, name)) not in excluded)


def repair_last_checkpoint(last_path):
    """Check ``checkpoint_last.pt``; if damaged, replace it by the newest complete checkpoint.

    Returns the path that was used as the replacement (None if nothing needed repair). Raises
    ``CorruptCheckpointError`` naming the file when there is nothing complete to fall back to.
    """
    if not os.path.exists(last_path):
        return None
    try:
        verify_checkpoint(last_path)
        return None
    except CorruptCheckpointError as err:
        damage = str(err)
    save_dir = os.path.dirname(last_path) or "."
    replacement = newest_complete_checkpoint(save_dir, exclude=[last_path])
    if replacement is None:
        raise CorruptCheckpointError(
            f"{damage}; no complete checkpoint in {save_dir} to resume from "
            "(delete the file to start from scratch, or pass --restore-file)"
        )
    os.replace(last_path, last_path + ".corrupt")
    atomic_copy(replacement, last_path)
    logger.warning(f"{damage}; moved it to {last_path}.corrupt and resuming from {replacement}")
    return replacement


def catch_up_last_checkpoint(last_path):
    """If a complete ``checkpoint<E>.pt`` / ``checkpoint_<E>_<U>.pt`` is newer than ``checkpoint_last.pt``
    (fairseq copies it there last, so a save stopped during that copy), put it in its place; returns it
    (None if ``checkpoint_last.pt`` is the newest)."""
    save_dir = os.path.dirname(last_path) or "."
    last_written = os.path.getmtime(last_path)
    newer = _first_complete(os.path.join(save_dir, name) for name in os.listdir(save_dir)
                            if FIRST_OF_A_SAVE.fullmatch(name)
                            and os.path.getmtime(os.path.join(save_dir, name)) > last_written)
    if newer is not None:
        atomic_copy(newer, last_path)
        logger.warning(f"{newer} is newer than {last_path} (a save stopped while copying it there); "
                       f"resuming from {newer}")
    return newer


def check_resume_file(cfg):
    """fairseq-train's rank 0, before it loads (``cfg``: the checkpoint config): the file it resumes from is
    complete, repaired or caught up (``checkpoint_last.pt``), or named in the error (``--restore-file``)."""
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


class _NotFairseqCheckpoint(ValueError):
    pass


def checked_upgrade_state_dict(upgrade):
    """fairseq's ``_upgrade_state_dict`` (called on every loaded file): a torch file without a model is named."""
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


def checked_load_checkpoint_to_cpu(load):
    """fairseq's ``load_checkpoint_to_cpu`` (fairseq-train's resume, generate, interactive, the hub API):
    the file is verified first; a refused or foreign file raises ``CorruptCheckpointError`` naming it."""
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


def main(argv=None):
    """``python -m deepnet_fairseq.training.checkpoints FILE...``: exit 1 if any file is damaged."""
    parser = argparse.ArgumentParser(description="Check that checkpoints are complete (every record's CRC-32).")
    parser.add_argument("checkpoints", nargs="+")
    damaged = 0
    for path in parser.parse_args(argv).checkpoints:
        try:
            verify_checkpoint(path)
            print(f"ok: {path}")
        except (CorruptCheckpointError, OSError) as err:
            print(f"error: {err}", file=sys.stderr)
            damaged += 1
    return 1 if damaged else 0


# -- atomic writes -------------------------------------------------------------------------------------

def _remove(path):
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def atomic_copy(source, destination):
    """Copy ``source`` to ``destination`` so that ``destination`` is either absent/old or complete."""
    temp = f"{destination}.tmp"
    with open(source, "rb") as src, open(temp, "wb") as dst:
        shutil.copyfileobj(src, dst, length=16 * 1024 * 1024)
        dst.flush()
        os.fsync(dst.fileno())
    os.replace(temp, destination)


def _tensor_bytes(obj):
    """Bytes of the tensors in a (nested) state dict: what the checkpoint file needs, roughly."""
    if torch.is_tensor(obj):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def write_failed(path, err, needed):
    """The one-line error for a checkpoint that could not be written: what failed, and advice for that cause."""
    folder = os.path.dirname(os.path.abspath(path))
    last = os.path.join(folder, "checkpoint_last.pt")
    kept = f"{last} is unchanged" if os.path.exists(last) else "no checkpoint_last.pt was written yet"
    cause = err  # torch's zip writer turns the OSError of a failed write into a RuntimeError
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__cause__ or cause.__context__
    reason = f"[Errno {cause.errno}] {cause.strerror}" if cause is not None and cause.strerror else \
        f"{type(err).__name__}: {str(err).splitlines()[0]}"
    code = getattr(cause, "errno", None)
    if code in (errno.ENOSPC, errno.EDQUOT):
        try:
            free = f"{shutil.disk_usage(folder).free / 2**20:.1f} MiB free there"
        except OSError:
            free = "free space unknown"
        advice = f"a checkpoint needs {needed / 2**20:.1f} MiB, {free}; {kept}; free space and rerun to resume"
    elif code == errno.ENOENT:  # our temp file was renamed or removed under us
        advice = (f"a file vanished while it was written: another process is writing to {folder} or deleted it "
                  "(one trainer per --save-dir); stop it and rerun to resume")
    elif cause is not None:
        advice = f"{kept}; rerun to resume once {folder} can be written again"
    else:  # not the disk: e.g. a DataLoader worker's death raised by torch's SIGCHLD handler during the save
        advice = f"{kept}; the error is not the disk's; rerun to resume"
    return CheckpointWriteError(f"could not write checkpoint {path} ({reason}); {advice}")


def atomic_persistent_save(fairseq_save):
    """fairseq's ``torch_persistent_save`` for local files: complete or absent, a failed write stops at once."""
    def persistent_save(obj, filename, async_write=False):
        if async_write or PathManager.path_requires_pathmanager(filename):
            return fairseq_save(obj, filename, async_write)
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

    return persistent_save


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


# -- one trainer per save dir --------------------------------------------------------------------------

class SaveDirLock:
    """``<save_dir>/.trainer.lock``, held with ``flock`` and naming its holder (pid, host, since when).

    The kernel drops a ``flock`` when its process ends, even by ``kill -9``, so a dead holder never
    blocks a rerun; a normal exit also removes the file, so a file that still names a holder we could
    lock was left by a process that was killed (taken over with a warning). On file systems whose
    ``flock`` is local to a host (NFS ``local_lock``, Lustre ``localflock``) this guards one host only.
    """

    def __init__(self, save_dir):
        self.path = os.path.join(save_dir, LOCK_NAME)
        while True:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = self._holder() or "a trainer that is just starting"
                self._close()
                raise SaveDirInUse(f"{save_dir} is in use by another trainer: {holder} ({self.path}); wait for it "
                                   "to end, or stop it, or pass another --save-dir") from None
            except OSError:
                self._close()
                raise
            if self._still_at_path():
                break
            self._close()  # its holder removed it (released) after we opened it: lock the new one
        previous = self._holder()
        if previous:
            logger.warning(f"taking over {self.path} from {previous}, which ended without releasing it")
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"pid {os.getpid()} on {socket.gethostname()} since "
                           f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
        # a multiprocessing finalizer runs at a normal exit both in a plain process (atexit) and in the
        # workers fairseq spawns for several GPUs (which leave by os._exit, skipping atexit)
        multiprocessing.util.Finalize(self, self.release, exitpriority=0)

    def _still_at_path(self):
        try:
            here, there = os.fstat(self.fd), os.stat(self.path)
        except FileNotFoundError:
            return False
        return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)

    def _holder(self):
        return os.pread(self.fd, 256, 0).decode(errors="replace").strip()

    def _close(self):
        os.close(self.fd)
        self.fd = None

    def release(self):
        if self.fd is not None:
            _remove(self.path)  # while still locked: one that opened it meanwhile sees it gone, opens anew
            self._close()


_held = {}  # real path of a save dir -> this process's SaveDirLock


def hold_save_dir(save_dir):
    """Hold ``save_dir`` for this process (once per folder); ``SaveDirInUse`` names another holder."""
    key = os.path.realpath(save_dir)
    if key not in _held or _held[key].fd is None:
        try:
            _held[key] = SaveDirLock(save_dir)
        except OSError as err:  # a file system without flock: train as before, unguarded
            logger.warning(f"cannot lock {os.path.join(save_dir, LOCK_NAME)} ({err}); a second trainer "
                           f"started on {save_dir} would not be refused")
            return None
    return _held[key]


if __name__ == "__main__":
    raise SystemExit(main())
