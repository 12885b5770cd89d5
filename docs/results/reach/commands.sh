#!/usr/bin/env bash
# The runs behind docs/results/reach/: DeepNet at 1,000 layers, and each method at its own best rate by width, on
# Multi30k de-en through the shipped scripts/train_iwslt.sh and scripts/evaluate.sh. Every run has its own folder,
# RUNS/reach/<study>/<variant>/seed1/<N>L-<M>L; a stage skips work its marker or an eval record says was done (the
# records start as the committed copy), and a stopped run resumes from its checkpoint_last.pt.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: docs/results/reach/commands.sh LANE [--widths LIST] [--methods LIST] [--runs DIR] [--raw-dir DIR]

  LANE      deep    d64 (FFN 256, 4 heads, 2,000 tokens), warm-up 100, source init: 500L-500L at lr 1e-3, 2e-3
                    and 5e-4 to 300 updates (the probe); at the rate with the lowest valid loss, 100L-100L and 50L-50L
                    to 500 and 1,000, 500L-500L to 500 updates, Pre-LN and Post-LN at 500L-500L to 200, and last
                    500L-500L to 1,000 (hours unbroken on one thread; DEEP_PROCS=2: two gloo processes). A
                    500L-500L run past 500 updates whose folder survived goes on to 1,000 first.
                    A 500L-500L run takes ~15 GB: no second one beside it
            width   18L-18L, warm-up 100, 1,500 updates: Pre-LN, paper init and source init at lr 5e-4, 1e-3, 2e-3
                    at d128 (FFN 512), and 4e-3 where 2e-3 is the best of the three; then at d256 (FFN 1,024)
                    each method's best d128 rate and the next lower one (and one step lower where every rate it
                    ran there stalled on the unigram plateau, BLEU below 1), then d64 at 5e-4, 1e-3 and 4e-3 (its
                    2e-3 is the small Table 1's seed 1; the source init's 4e-3 and Pre-LN's 8e-3 the schemes
                    table's runs)
            fig5    DeepNet Fig. 5 at 250L-250L and 500L-500L (64-128-2, lr 5e-4, warm-up 4,000, 50 updates): Post-LN,
                    Pre-LN, DeepNet paper and source init, rows added to docs/figures/fig5_update_norm.csv
            prepare only prepare and binarise Multi30k
            tables  copy the records here and write the report, the width table and its plot (and Fig. 5, where
                    the fig5 lane ran)
  --widths  the width lane's widths, in order (default 128,256,64)
  --methods the width lane's methods, of source, preln, paper (default: all three), e.g. one a lane to share a
            width's runs between two lanes
  --runs    run folders, prepared data and records (default: /work/runs)
  --raw-dir raw Multi30k de-en (default: ../shared/data/multi30k_de_en)
The probe's rates are the stability map's two best for the source init at its deepest row (50L-50L, 200 updates:
valid NLL 6.30 bits at 2e-3, 6.84 at 1e-3; docs/figures/stability_map.csv).
USAGE
}

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
runs=/work/runs raw=$root/../shared/data/multi30k_de_en lane="" widths=128,256,64 methods=source,preln,paper
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --raw-dir) raw=$2; shift 2 ;;
    --widths) widths=$2; shift 2 ;;
    --methods) methods=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    deep|width|fig5|prepare|tables) lane=$1; shift ;;
    *) echo "commands.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$lane" ] || { usage >&2; exit 2; }
for method in ${methods//,/ }; do
  case "$method" in source|preln|paper) ;;
    *) echo "commands.sh: --methods: unknown method '$method' (of source, preln, paper)" >&2; exit 2 ;; esac
done
records=$runs/reach/results.jsonl committed=$here/results.jsonl tag=reach
source "$root/scripts/lib/multi30k_study.sh"
if [ "$lane" = fig5 ]; then
  fig5_lane reach/fig5 postln,preln,deepnet,deepnet_source 250,500 50 --checkpoint-activations
  exit 0
fi
if [ "$lane" = tables ]; then
  [ -f "$records" ] || { echo "commands.sh: no records at $records" >&2; exit 1; }
  copy_fig5
  cp "$records" "$committed"
  "$py" -m deepnet_setups.records migrate "$committed"  # a record an older launcher wrote, brought to the schema
  "$root/scripts/report" "$committed" --out-dir "$here"
  # the lent GPU's runs (gpu.sh), where copied here: rows of their own (device cuda, fp16)
  gpu=(); while IFS= read -r found; do gpu+=("$found"); done < <(find "$here/gpu" -name results.jsonl 2>/dev/null | sort)
  "$py" -m deepnet_experiments.reach_tables "$committed" ${gpu[@]+"${gpu[@]}"} "$root/docs/results/schemes/results.jsonl" \
    "$root/docs/results/multi30k_table/results.jsonl" "$root/docs/results/multi30k_table/results_source_init.jsonl" --out "$here"
  "$py" -m deepnet_experiments.pages sync "$here/README.md" "$root/docs/setups.md"
  exit 0
fi
prepare_multi30k
[ "$lane" = prepare ] && exit 0

# the rates the width lane tries, lowest first
rates=(5e-4 1e-3 2e-3)
# width -> FFN: four times the width, as at d64
ffn() { echo $(($1 * 4)); }
# width_rates VARIANT W: from the records' test BLEU of VARIANT at width W, two words ("-" for none): the best rate,
# and the rate one step below the lowest it ran where every rate it ran there stalled (BLEU below the tables'
# STALLED_BLEU: the unigram plateau)
width_rates() {
  "$py" - "$records" "$runs/reach/width/d$2" "$1" <<'PY'
import sys
from deepnet_experiments.reach_tables import STALLED_BLEU
from deepnet_setups.report import read_records
records, prefix, variant = sys.argv[1:]
bleu = {r["run_dir"].split("/")[-4].removeprefix("lr"): r["bleu"] for r in read_records([records])
        if r.get("kind") == "eval" and r["run_dir"].startswith(prefix + "/") and r["run_dir"].split("/")[-3] == variant}
lower = "-"
if bleu and max(bleu.values()) < STALLED_BLEU:
    mantissa, exponent = f"{min(map(float, bleu)) / 2:e}".split("e")  # the folders' spelling: 5e-4, 2.5e-4
    lower = f"{float(mantissa):g}e{int(exponent)}"
print(max(bleu, key=bleu.get, default="-"), lower)
PY
}
best_rate() { local best _; read -r best _ <<< "$(width_rates "$@")"; [ "$best" = - ] || echo "$best"; }
below_stalled() { local _ lower; read -r _ lower <<< "$(width_rates "$@")"; [ "$lower" = - ] || echo "$lower"; }
width_stage() {  # width_stage WIDTH RATE VARIANT
  stage "reach/width/d$1/lr$2" "$3" 1 18,18 1500 "model.embed_dim=$1" "model.ffn_dim=$(ffn "$1")" \
    "train.lr=$2" train.warmup_updates=100
}

# eval.max_tokens: a 500L-500L beam keeps ~11 MB of attention state per hypothesis (500 layers' keys and values):
# at fairseq-generate's 8,000 tokens a batch, lr 5e-4's decode reached 21.6 GB and was killed on a 23 GB machine
# (1e-3's 500-update row, decoded before, fit); at 1,000 it decoded with 9.6 GB in use, a width run beside it
deep=(train.warmup_updates=100 train.validate_interval_updates=100 eval.max_tokens=1000)
PROBE_UPDATES=300
# probe RATE: the 500L-500L source init trained to PROBE_UPDATES at RATE, not evaluated (its valid loss picks the
# rate); skipped where its folder or a record says it was trained
probe() {
  local dir=$runs/reach/deep/lr$1/source/seed1/500L-500L
  if "$py" - "$records" "$dir" "$PROBE_UPDATES" <<'PY'
import sys
from deepnet_setups.report import read_records
records, run_dir, updates = sys.argv[1:]
sys.exit(not any(r.get("kind") == "train" and r["run_dir"] == run_dir and (r.get("updates") or 0) >= int(updates)
                 for r in read_records([records])))
PY
  then say "$dir: probe already trained"; return; fi
  say "$dir: probe to $PROBE_UPDATES updates"
  "$root/scripts/train_iwslt.sh" --arch deepnet --layers 500,500 --cpu --run-dir "$dir" "${data[@]}" "${model[@]}" \
    "${deep[@]}" "train.lr=$1" model.deepnorm_init=source train.seed=1 "train.max_update=$PROBE_UPDATES"
}
# the probed rate whose 500L-500L run had the lowest valid loss at the probe's end
probed_rate() {
  "$py" - "$records" "$runs/reach/deep" "$PROBE_UPDATES" <<'PY'
import sys
from deepnet_setups.report import read_records
records, deep, updates = sys.argv[1:]
loss = {r["run_dir"]: r["valid_loss"] for r in read_records([records]) if r.get("kind") == "train"
        and r["run_dir"].startswith(deep + "/lr") and r["run_dir"].endswith("/source/seed1/500L-500L")
        and r.get("updates") == int(updates) and r.get("valid_loss") is not None}
print(min(loss, key=loss.get).split("/")[-4].removeprefix("lr") if loss else "")
PY
}

case "$lane" in
  deep)
    # the map's two best rates at its deepest row, then 5e-4: at both, 500L-500L stayed on the unigram plateau
    # through the probe, and 5e-4 is where both DeepNet inits left it at d256 (docs/results/source_init)
    for rate in 1e-3 2e-3 5e-4; do probe "$rate"; done
    rate=$(probed_rate)
    [ -n "$rate" ] || { echo "commands.sh: no probe record with a valid loss at $PROBE_UPDATES updates" >&2; exit 1; }
    say "500L-500L goes on at lr $rate"
    deep_stage() { stage "reach/deep/lr$rate" "$1" 1 "$2" "$3" "${deep[@]}" "train.lr=$rate" "${@:4}"; }
    # 500L-500L to 1,000 updates; DEEP_PROCS=2 (both cores free) trains it as two gloo processes of 1,000 tokens
    # each, the same batch: measured 21 s/update on both cores, 23-31 on one thread beside another lane
    deep_1000() {
      PROCS=${DEEP_PROCS:-} deep_stage source 500,500 1000 ${DEEP_PROCS:+"train.max_tokens=$((2000 / DEEP_PROCS))"}
    }
    # A 500L-500L run past 500 updates whose checkpoint survived holds hours of work: it goes on to 1,000 first.
    dir=$runs/reach/deep/lr$rate/source/seed1/500L-500L
    if [ -f "$dir/checkpoints/checkpoint_last.pt" ] && stage_done "$dir" 500; then deep_1000; fi
    # A stopped run resumes only where its folder survives, and a new machine may come without it: the rows that
    # fit what is left of a sitting after the probe come next (100L-100L to 1,000 updates: ~1.3 h on one thread),
    # then 500 updates at 500L-500L (~2.3 h; where the rate is the probe's, 200 more), and 1,000 (~5 h unbroken) last
    for layers in 100,100 50,50; do for updates in 500 1000; do deep_stage source "$layers" "$updates"; done; done
    deep_stage source 500,500 500
    deep_stage preln 500,500 200
    # Post-LN's vanishing gradients cross float32's denormal range, where CPU arithmetic is several times slower
    deep_stage postln 500,500 200 train.flush_denormal=true
    deep_1000 ;;
  width)
    read -ra variants <<< "${methods//,/ }"
    for width in ${widths//,/ }; do
      planned=()  # each variant's rates at this width, as a space-separated list
      for variant in "${variants[@]}"; do
        case "$width" in
          # and the small Table 1's 2e-3: the map's best at 18L is 4e-3 or above; the source init's 4e-3 (its best
          # map rate) is the schemes table's run, which the tables read
          64) chosen=(5e-4 1e-3 4e-3); [ "$variant" = source ] && chosen=(5e-4 1e-3) ;;
          128) chosen=("${rates[@]}") ;;
          *) best=$(best_rate "$variant" 128)
             if [ -z "$best" ]; then say "d$width $variant: no d128 records yet, skipped"; chosen=()
             else case "$best" in 5e-4) chosen=(5e-4) ;; 1e-3) chosen=(1e-3 5e-4) ;; 2e-3) chosen=(2e-3 1e-3) ;;
               *) chosen=(4e-3 2e-3) ;; esac; fi ;;
        esac
        planned+=("${chosen[*]-}")
      done
      # rank by rank across the variants: at d256 every variant's best d128 rate runs before any next-lower one
      for rank in 0 1 2; do
        for i in "${!variants[@]}"; do
          read -ra chosen <<< "${planned[$i]}"
          if [ "$rank" -lt "${#chosen[@]}" ]; then width_stage "$width" "${chosen[$rank]}" "${variants[$i]}"; fi
        done
      done
      # a best rate at the grid's top is not bracketed: one step up at d128
      for variant in "${variants[@]}"; do
        if [ "$width" = 128 ] && [ "$(best_rate "$variant" 128)" = 2e-3 ]; then width_stage 128 4e-3 "$variant"; fi
      done
      # wider, a method that stalled at every rate it ran (the GPU's d256 DeepNet at 2e-3): one step lower
      if [ "$width" -ge 256 ]; then
        for variant in "${variants[@]}"; do
          lower=$(below_stalled "$variant" "$width")
          if [ -n "$lower" ]; then width_stage "$width" "$lower" "$variant"; fi
        done
      fi
    done ;;
esac
say "lane $lane done: records in $records"
