#!/usr/bin/env bash
# The runs behind docs/results/zero_shot_tags/ (issue 33): English-centric de/en/fr Multi30k with the de-en and
# en-fr pairs from disjoint halves of the captions, 6L-6L, Pre-LN / DeepNet paper init / source init, through
# python -m deepnet_experiments.zero_shot_study (the shipped OPUS-100 scripts). Every run has its own folder and an
# evaluated_at_<S> marker (or an eval record in the records, which start as the committed copy), so rerunning a
# phase continues it, on a new machine too.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: docs/results/zero_shot_tags/commands.sh PHASE [STRATEGY] [--archs A,B] [--remedies R] [--seeds S] [--gpu]
                                              [--runs DIR] [--dry-run]

  PHASE     screen            each language-tag strategy (s-enc-t-dec, t-enc, t-enc-t-dec), seed 1, 1,500 updates
            remedy STRATEGY   that strategy with and without the remedies, seeds 1-3, 1,500 updates
            long STRATEGY     the best two of those (--archs, --remedies) continued to 3,000 updates
            crossconst STRATEGY CrossConST on that strategy: weights 0.1, 0.25, 0.5, from scratch (1,500 updates) and
                              as a 500-update fine-tune of the 1,500-update run without it, beside the same fine-tune
                              at weight 0; seed 1, the source init (default --archs deepnet_source --seeds 1)
            recipe STRATEGY   the crossconst phase's best remedy (the weight and way nearest issue 49's goal on seed
                              1: zero_shot_study --best-crossconst), alone and with robt (a fine-tune: beside the
                              same at weight 0), seeds 1-3, for the source init and Pre-LN (default --archs
                              deepnet_source,preln --seeds 1,2,3)
  --archs   of deepnet_source, preln, deepnet (default: all three, in this order)
  --remedies of none, residual_drop, robt, crossconst<A>, crossconst<A>_ft, or + of them (default: none,residual_drop;
            the screen uses none; robt: random online back-translation in half the updates from update 750;
            crossconst<A>: CrossConST at weight A; _ft: as a fine-tune)
  --seeds   of 1,2,3 (default: all three; the screen: 1), e.g. one seed a process to share out the runs
  --gpu     train and evaluate on the visible GPU (fp32, as on CPU; the default is CPU)
  --runs    run folders, prepared data and results.jsonl (default: /work/runs)
  --dry-run print the commands only
Tables, plot and a copy of the records go to docs/results/zero_shot_tags/<phase>/.
USAGE
}

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
runs=/work/runs phase="" strategy="" dry=() archs="" remedies="" seeds=""
device=cpu
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --dry-run) dry=(--dry-run); shift ;;
    --archs) archs=$2; shift 2 ;;
    --remedies) remedies=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --gpu) device=gpu; shift ;;
    -h|--help) usage; exit 0 ;;
    screen|remedy|long|crossconst|recipe) phase=$1; shift ;;
    s-enc-t-dec|t-enc|t-enc-t-dec) strategy=$1; shift ;;
    *) echo "commands.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$phase" ] || { usage >&2; exit 2; }
case "$phase" in  # the defaults, where not given
  crossconst) : "${archs:=deepnet_source}" "${seeds:=1}"
              scratch=crossconst0.1,crossconst0.25,crossconst0.5  # then the fine-tunes, weight 0 (the control) first
              : "${remedies:=$scratch,crossconst0_ft,crossconst0.1_ft,crossconst0.25_ft,crossconst0.5_ft}" ;;
  recipe) : "${archs:=deepnet_source,preln}" "${seeds:=1,2,3}" ;;
  *) : "${archs:=deepnet_source,preln,deepnet}" "${remedies:=none,residual_drop}" "${seeds:=1,2,3}" ;;
esac
[ "$phase" = screen ] || [ -n "$strategy" ] || { echo "commands.sh: $phase needs the strategy the screen chose" >&2; exit 2; }
study=("${PYTHON:-$root/.venv/bin/python}" -m deepnet_experiments.zero_shot_study --train-pairs disjoint
       --archs "$archs" --device "$device" --work "$runs/work/zero_shot_disjoint" --runs "$runs/zero_shot_tags"
       "${dry[@]}")
# On a machine without the run folders, the committed records say what already ran: each phase's copy holds all
# the records of the phases before it, so the longest is the latest.
records=$runs/zero_shot_tags/results.jsonl
if [ ! -f "$records" ]; then
  committed=$(wc -l "$here"/{screen,remedy,long,crossconst}/results.jsonl 2>/dev/null | grep -v ' total$' | sort -rn | head -1 \
              | awk '{print $2}' || true)
  if [ -n "$committed" ]; then mkdir -p "$(dirname "$records")" && cp "$committed" "$records"; fi
fi
case "$phase" in
  screen) "${study[@]}" --lang-tags s-enc-t-dec,t-enc,t-enc-t-dec --seeds 1 --stages 1500 --out "$here/screen" ;;
  remedy) "${study[@]}" --lang-tags "$strategy" --remedies "$remedies" --seeds "$seeds" --stages 1500 \
            --out "$here/remedy" ;;
  long)   "${study[@]}" --lang-tags "$strategy" --remedies "$remedies" --seeds "$seeds" --stages 1500,3000 \
            --out "$here/long" ;;
  crossconst) "${study[@]}" --lang-tags "$strategy" --remedies "$remedies" --seeds "$seeds" --stages 1500 \
                --out "$here/crossconst" ;;
  recipe) best=$("${study[@]}" --lang-tags "$strategy" --archs deepnet_source --best-crossconst)
          echo "[commands.sh] the crossconst phase's best remedy: $best"
          controls=""  # a fine-tune compares with the same fine-tune at weight 0
          case "$best" in *_ft) controls=crossconst0_ft,robt+crossconst0_ft, ;; esac
          "${study[@]}" --lang-tags "$strategy" --remedies "${remedies:-$controls$best,robt+$best}" --seeds "$seeds" \
            --stages 1500 --out "$here/crossconst" ;;
esac
# the page's tables, cut from the records just written, and the page's blocks refreshed from them
[ ${#dry[@]} -gt 0 ] || { "${study[0]}" -m deepnet_experiments.pages tables && "${study[0]}" -m deepnet_experiments.pages sync "$here/README.md"; }
