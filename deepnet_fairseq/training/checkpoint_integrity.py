"""Detect truncated or corrupted checkpoints before fairseq loads them; repair ``checkpoint_last.pt``.

torch checkpoints are zip archives. torch's reader notices a missing end (truncation) but never
checks the CRC-32 of a record, so flipped bytes inside a tensor load silently. ``verify_checkpoint``
reads every record through Python's ``zipfile`` (which checks each CRC) and raises
``CorruptCheckpointError`` naming the file.

fairseq writes the first checkpoint of a save atomically (``.tmp`` + rename) but then *copies* it to
the others (``checkpoint_last.pt``, ``checkpoint_best.pt``) with a plain, non-atomic copy, so a
``kill -9`` during that copy left a truncated ``checkpoint_last.pt`` beside the complete file it
was copied from. The plugin's copies are atomic now (``safe_save``), so such a kill leaves the
previous ``checkpoint_last.pt`` in place, older than the file being copied:
``catch_up_last_checkpoint`` then puts that newer file in its place. ``repair_last_checkpoint``
still handles a damaged ``checkpoint_last.pt`` (a file damaged later, or written without the
plugin): it moves the file aside (``*.corrupt``) and puts a verified copy of the newest complete
checkpoint in its place (temp name, fsync, rename).
"""

import logging
import os
import re
import shutil
import zipfile

logger = logging.getLogger(__name__)

CHECKPOINT_NAME = re.compile(r"checkpoint.*\.pt")
FIRST_OF_A_SAVE = re.compile(r"checkpoint(\d+|_\d+_\d+)\.pt")  # the file fairseq writes, then copies to _last


class CorruptCheckpointError(RuntimeError):
    """A checkpoint file that must not be loaded (truncated, not a torch zip archive, bad CRC)."""


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


def newest_complete_checkpoint(save_dir, exclude=()):
    """The most recently written checkpoint in ``save_dir`` that passes ``verify_checkpoint`` (or None)."""
    excluded = {os.path.abspath(p) for p in exclude}
    candidates = [
        os.path.join(save_dir, name)
        for name in os.listdir(save_dir)
        if CHECKPOINT_NAME.fullmatch(name) and os.path.abspath(os.path.join(save_dir, name)) not in excluded
    ]
    for candidate in sorted(candidates, key=os.path.getmtime, reverse=True):
        try:
            verify_checkpoint(candidate)
        except CorruptCheckpointError as err:
            logger.warning(f"skipping {err}")
            continue
        return candidate
    return None


def atomic_copy(source, destination):
    """Copy ``source`` to ``destination`` so that ``destination`` is either absent/old or complete."""
    temp = f"{destination}.tmp"
    with open(source, "rb") as src, open(temp, "wb") as dst:
        shutil.copyfileobj(src, dst, length=16 * 1024 * 1024)
        dst.flush()
        os.fsync(dst.fileno())
    os.replace(temp, destination)


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
    newer = [os.path.join(save_dir, name) for name in os.listdir(save_dir) if FIRST_OF_A_SAVE.fullmatch(name)
             and os.path.getmtime(os.path.join(save_dir, name)) > last_written]
    for candidate in sorted(newer, key=os.path.getmtime, reverse=True):
        try:
            verify_checkpoint(candidate)
        except CorruptCheckpointError as err:
            logger.warning(f"skipping {err}")
            continue
        atomic_copy(candidate, last_path)
        logger.warning(f"{candidate} is newer than {last_path} (a save stopped while copying it there); "
                       f"resuming from {candidate}")
        return candidate
    return None


def main(argv=None):
    """``python -m deepnet_fairseq.training.checkpoint_integrity FILE...``: exit 1 if any file is damaged."""
    import argparse
    import sys

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


if __name__ == "__main__":
    raise SystemExit(main())
