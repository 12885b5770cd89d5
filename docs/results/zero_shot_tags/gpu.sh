#!/usr/bin/env bash
# Issue 33's remedy phase for Pre-LN and the paper init on the project's lent GPU machine (one H200, no network, no
# fairseq: ../shared/device/README.md): 2 models x seeds 1-3 as six commands.sh processes at once on the one GPU
# (fp32, as on CPU), each its own seed, each the remedies in turn (1,500 updates a run; a run the committed records
# hold is skipped). Stops them at a deadline and keeps the records; run it again on the same machine and it
# continues (the runs resume from checkpoint_last.pt).
# Measured there (one H200, six at once): 4.2-5.4 updates/s each before ROBT starts at update 750, 1.3-1.6 after,
# so about 11 minutes to 1,500 updates plus the evaluations: more than one 10-minute device call; give the first
# call DEADLINE_S 480 and rerun at once while the machine is warm (or fewer runs a call: ARCHS, SEEDS).
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: docs/results/zero_shot_tags/gpu.sh OUT_DIR [DEADLINE_S]

From the project root, with these in the checkout (ignored by git, named in the device call's carry):
  .device/    a copy of ../shared/device (fairseq for the GPU image)
  .whl/       py3langid-0.4.0 and sacrebleu-2.6.0 wheels, the language ID and BLEU the CPU runs used
  .zs_data/   the study's prepared data: a copy of /work/runs/work/zero_shot_disjoint, which commands.sh makes
              on CPU (its prep.json names that folder, so the runs there read it from the same path)
Runs commands.sh remedy t-enc-t-dec --remedies REMEDIES --gpu (default REMEDIES robt,residual_drop) for ARCHS
(default "preln deepnet") x SEEDS (default "1 2 3"), skipping runs already recorded, records in /work/runs/zero_shot_tags/results.jsonl, and after DEADLINE_S seconds
(default 480) stops what still runs (a train record marked preempted). OUT_DIR gets results.jsonl,
the processes' logs (logs.tgz) and nvidia-smi's view.
SMOKE=1: only print the commands (commands.sh --dry-run), no GPU needed.
USAGE
}
case "${1:-}" in -h|--help) usage; exit 0 ;; "") usage >&2; exit 2 ;; esac
out=$1 deadline=${2:-480}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
cd "$root"
for need in .device/setup.sh .whl .zs_data/bin/.done; do
  [ -e "$need" ] || { echo "gpu.sh: $need missing (see --help)" >&2; exit 2; }
done
mkdir -p "$out"
runs=/work/runs
dry=()
if [ "${SMOKE:-0}" = 1 ]; then
  dry=(--dry-run) runs=$(mktemp -d)
else
  # shellcheck disable=SC1091
  source .device/setup.sh
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
fi
mkdir -p "$runs/work" "$runs/zero_shot_tags" "$runs/logs"
[ -d "$runs/work/zero_shot_disjoint" ] || cp -a .zs_data "$runs/work/zero_shot_disjoint"
# commands.sh starts a machine's records from the latest committed copy: once here (a dry run), so that the six
# processes don't race for it
bash "$here/commands.sh" remedy t-enc-t-dec --runs "$runs" --dry-run > /dev/null

pids=()
for arch in ${ARCHS:-preln deepnet}; do
  for seed in ${SEEDS:-1 2 3}; do
    setsid bash "$here/commands.sh" remedy t-enc-t-dec --archs "$arch" --remedies "${REMEDIES:-robt,residual_drop}" --seeds "$seed" --gpu \
      --runs "$runs" "${dry[@]}" >> "$runs/logs/gpu_${arch}_seed$seed.log" 2>&1 &
    pids+=($!)
  done
done
end=$((SECONDS + deadline))
while [ $SECONDS -lt $end ] && kill -0 "${pids[@]}" 2>/dev/null; do sleep 5; done
status=0
if kill -0 "${pids[@]}" 2>/dev/null; then
  # SIGTERM to the training launchers alone: each passes it on to fairseq-train, which saves checkpoint_last.pt
  # after the update and exits as preempted, so a rerun resumes there (a signal to the whole process group would
  # reach the data-loader workers first and end fairseq-train with an error, without that checkpoint)
  echo "gpu.sh: deadline after ${deadline}s: stopping the runs (a rerun continues them)" >&2
  pkill -TERM -g "$(IFS=,; echo "${pids[*]}")" -f "deepnet_setups.launch" || true
  for _ in $(seq 12); do kill -0 "${pids[@]}" 2>/dev/null || break; sleep 5; done
  for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done  # evaluations still running
  status=3
fi
for pid in "${pids[@]}"; do wait "$pid" || true; done
cp "$runs/zero_shot_tags/results.jsonl" "$out/"
tar czf "$out/logs.tgz" -C "$runs" logs $(cd "$runs" && find zero_shot_tags -name train.log -o -name scores.json \
  -o -name commands.txt | sort)
grep -h "zero_shot_study\|error\|Traceback\|finished" "$runs"/logs/gpu_*.log | cut -c1-160 | tail -40
echo "gpu.sh: $(grep -c '"kind": "eval"' "$runs/zero_shot_tags/results.jsonl") eval records; exit $status"
exit $status
