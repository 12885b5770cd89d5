#!/usr/bin/env bash
# Stage 3 of a paper setup: train one architecture at one depth (1 GPU, many GPUs/nodes, or CPU).
set -euo pipefail

usage() {
  local methods  # the registry's (deepnet_methods), in table order
  methods=$(cd "$root" && "$py" -m deepnet_methods list --zoo --sep ', ')
  cat <<USAGE
Usage: scripts/train_setup.sh --config configs/<setup>.yaml --arch A [options] [key=value ...]
   (or scripts/train_{iwslt,iwslt14,wmt17,opus100,m2m_102}.sh [options], which fill in --config)

  --arch A            the method, one of $methods
  --layers N[,M]      encoder,decoder layers (default: the config's model.*_layers)
  --gpus G            GPUs per node (default: all visible; none -> CPU). fp16 is on by default on GPU.
  --nodes N           nodes (torchrun; run the script on every node with --node-rank R --master-addr HOST)
  --node-rank R, --master-addr HOST, --master-port P
  --launcher L        torchrun (default) or slurm (prints/uses srun; fairseq reads SLURM's environment)
  --cpu [--procs P]   train on CPU, P gloo processes (torchrun)
  --tensorboard-logdir DIR   (default: <run folder>/tb)
  --run-dir DIR       (default: runs/<setup>/<arch>/<N>L-<M>L)
  --gpu-memory-gib G  with train.max_tokens_gpu_gib set: size max_tokens for G GiB GPUs (default: the visible GPUs')
  --dry-run           print every command (all nodes) and exit
  --force             retrain a run folder marked finished
  key=value           override any config value, e.g. train.lr=1e-3 train.max_update=2000

--update-freq is derived so that max_tokens x world size x update-freq = train.batch_tokens.
Rerunning resumes from the run folder's checkpoint_last.pt. Each run appends a record to paths.results.
USAGE
}

root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$root/.venv/bin/python}
[ -x "$py" ] || py=python3
config="" ; args=()
need() { [ $# -ge 2 ] || { echo "train: option $1 needs a value (see --help)" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  case "$1" in
    --config) need "$@"; config=$2; shift 2 ;;
    --arch|--layers|--gpus|--nodes|--node-rank|--master-addr|--master-port|--launcher|--procs|--tensorboard-logdir|--run-dir|--gpu-memory-gib)
      need "$@"; args+=("$1" "$2"); shift 2 ;;
    --cpu|--dry-run|--force) args+=("$1"); shift ;;
    -h|--help) usage; exit 0 ;;
    *=*) args+=("$1"); shift ;;
    *) echo "train: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$config" ] || { echo "train: --config FILE is required (see --help)" >&2; exit 2; }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec "$py" -m deepnet_setups.launch "$config" "${args[@]}"
