"""Average the parameters of the last K checkpoints of a run (what fairseq's scripts/average_checkpoints.py
does; that script is not installed with fairseq). Checkpoints are read with torch's weights-only
loader after ``deepnet_fairseq`` has allow-listed fairseq's checkpoint classes for torch's weights-only loading.

    python -m deepnet_fairseq.average CHECKPOINT_DIR --last K --output averaged.pt
"""

import argparse
import re
import sys
from pathlib import Path

import deepnet_fairseq  # noqa: F401  (weights-only allow-list)
from deepnet_fairseq.training import CorruptCheckpointError, verify_checkpoint


def last_checkpoints(folder, k):
    """The last ``k`` update checkpoints (``checkpoint_<epoch>_<updates>.pt``), oldest first; else checkpoint_last.pt."""
    folder = Path(folder)
    numbered = sorted((int(m.group(1)), p) for p in folder.glob("checkpoint_*_*.pt")
                      if (m := re.match(r"^checkpoint_\d+_(\d+)\.pt$", p.name)))
    if numbered:
        return [p for _, p in numbered[-k:]]
    if (folder / "checkpoint_last.pt").exists():
        return [folder / "checkpoint_last.pt"]
    raise FileNotFoundError(f"{folder}: no checkpoints")


def average_checkpoints(paths, output):
    """Write the element-wise mean of the models in ``paths`` to ``output`` (atomically); returns ``output``.

    Every checkpoint is verified first (``CorruptCheckpointError`` names a truncated or corrupted file),
    so nothing is written unless all of them are complete."""
    import torch

    output = Path(output)
    for path in paths:
        verify_checkpoint(path)
    total, state = None, None
    for path in paths:
        state = torch.load(path, map_location="cpu")  # weights-only, with the plugin's allow-list
        model = state["model"]
        if total is None:
            total = {k: v.clone().double() if v.is_floating_point() else v.clone() for k, v in model.items()}
        else:
            for key, value in model.items():
                if value.is_floating_point():
                    total[key] += value.double()
    state["model"] = {k: (v / len(paths)).to(state["model"][k].dtype) if v.is_floating_point() else v
                      for k, v in total.items()}
    state.pop("last_optimizer_state", None)  # not needed to translate; keeps the file small
    tmp = output.with_name(f".{output.name}.tmp")
    torch.save(state, tmp)
    tmp.rename(output)
    return output


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint_dir")
    parser.add_argument("--last", type=int, default=5)
    parser.add_argument("--output", required=True)
    args = parser.parse_args(argv)
    try:
        paths = last_checkpoints(args.checkpoint_dir, args.last)
        average_checkpoints(paths, args.output)
    except (FileNotFoundError, CorruptCheckpointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"averaged {', '.join(p.name for p in paths)} -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
