# What the Multi30k studies' commands.sh share (docs/results/source_init, docs/results/reach): the data, the small
# Table 1's model and batch, preparation, and stage(): train a run folder to U updates through the shipped
# scripts/train_iwslt.sh, then evaluate it through scripts/evaluate.sh. Sourced, not run; the caller sets
#   root (the checkout), runs (run folders), raw (raw Multi30k de-en), records (the study's results.jsonl),
#   committed (the committed copy of those records) and tag (the log prefix).
config=$root/configs/iwslt14_de_en.yaml
py=${PYTHON:-$root/.venv/bin/python}
work=$runs/work/multi30k_de_en
data=(data.layout=plain "data.train=[train]" "data.valid=[valid]" "data.test=[test2016]"
      "paths.work=$work" "paths.results=$records")
# the small Table 1's model and batch (docs/results/multi30k_table/README.md)
model=(model.embed_dim=64 model.ffn_dim=256 model.heads=4 train.dropout=0.1 train.max_tokens=2000
       train.batch_tokens=2000 train.save_interval_updates=100 eval.average_last=5 eval.max_len_a=1.2 eval.max_len_b=10)
short=(train.lr=2e-3 train.warmup_updates=100)
say() { echo "[$tag $(date -u +%FT%TZ)] $*"; }
# stage_done DIR UPDATES: DIR was trained to UPDATES and evaluated (its marker or an eval record says so)
stage_done() {
  "$py" -c 'import sys; from deepnet_setups import runner; sys.exit(not runner.stage_done(*sys.argv[1:]))' \
    "$1" "$2" "$records"
}
# On a machine without the run folders, the committed records say what already ran (stage() skips it).
if [ ! -f "$records" ] && [ -f "$committed" ]; then mkdir -p "$(dirname "$records")" && cp "$committed" "$records"; fi

prepare_multi30k() {
  [ -e "$work/bin/.done" ] && return
  [ -f "$raw/train.de" ] || { echo "commands.sh: no raw Multi30k at $raw (--raw-dir)" >&2; exit 1; }
  "$root/scripts/prepare_iwslt14.sh" --raw-dir "$raw" --workers 1 "${data[@]}"
  "$root/scripts/binarize.sh" --config "$config" --workers 1 "${data[@]}"
}

# stage DIR VARIANT SEED LAYERS UPDATES [key=value ...]: train the run folder RUNS/DIR/VARIANT/seedSEED/<N>L-<M>L
# to UPDATES, then evaluate it; skipped where its marker or an eval record says it was done. VARIANT: an --arch of
# scripts/train_iwslt.sh, or source / paper for DeepNet with that init. PROCS=P: train as P gloo processes.
stage() {
  local study=$1 variant=$2 seed=$3 layers=$4 updates=$5; shift 5
  local arch=$variant extra=()
  case "$variant" in
    paper) arch=deepnet; extra=("model.deepnorm_init=paper") ;;
    source) arch=deepnet; extra=("model.deepnorm_init=source") ;;
  esac
  local dir=$runs/$study/$variant/seed$seed/${layers/,/L-}L
  if stage_done "$dir" "$updates"; then say "$dir: $updates updates already trained and evaluated"; return; fi
  say "$dir: train to $updates updates, then evaluate"
  local all=("${data[@]}" "${model[@]}" "$@" "${extra[@]}" "train.seed=$seed" "train.max_update=$updates")
  "$root/scripts/train_iwslt.sh" --arch "$arch" --layers "$layers" --cpu ${PROCS:+--procs "$PROCS"} --run-dir "$dir" \
    "${all[@]}"
  "$root/scripts/evaluate.sh" --config "$config" --arch "$arch" --run-dir "$dir" --cpu "${all[@]}"
  mkdir -p "$dir/eval" && date -u +%FT%TZ > "$dir/eval/evaluated_at_$updates"
}

# DeepNet Fig. 5's rows, added by scripts/figures.sh --fig5-only to one CSV that every study's fig5 lane shares
# (RUNS/figures; the committed one where this machine has none), copied to docs/figures by copy_fig5.
fig5_dir=$runs/figures fig5_csv=fig5_update_norm.csv
fig5_lane() {  # fig5_lane OUT METHODS DEPTHS UPDATES [figures.sh options]: OUT under RUNS, one run at a time
  local out=$1 methods=$2 depths=$3 updates=$4; shift 4
  mkdir -p "$fig5_dir"
  [ -f "$fig5_dir/$fig5_csv" ] || cp "$root/docs/figures/$fig5_csv" "$fig5_dir/"
  say "Fig. 5: $methods at $depths layers, $updates updates"
  "$root/scripts/figures.sh" --fig5-only --fig5-methods "$methods" --depths "$depths" --updates "$updates" \
    --jobs 1 --out "$runs/$out" --figures "$fig5_dir" "$@"
}
copy_fig5() {  # where a fig5 lane wrote the figure: its CSV, and the summary and plot made from it
  [ -f "$fig5_dir/$fig5_csv" ] || return 0
  cp "$fig5_dir/$fig5_csv" "$root/docs/figures/"
  "$root/scripts/figures.sh" --summary-only --figures "$root/docs/figures"
}
