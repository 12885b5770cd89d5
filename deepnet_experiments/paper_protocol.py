"""The paper's IWSLT-14 protocol at CPU scale, in stages (``scripts/paper_protocol_multi30k.sh``; USAGE
below is its --help): each stage trains every arch on to S updates through the shipped scripts, evaluates
it, and marks it done with the runner's stage marker, so a rerun continues where it stopped.
"""

import argparse
import re
import shlex
import subprocess
import sys
from pathlib import Path

import deepnet_methods
from deepnet_setups import runner

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
CONFIG = ROOT / "configs" / "iwslt14_de_en.yaml"
# the table's CPU-sized model and checkpoints for the last-5 average: the only departures from the config, but
# for DeepNet's init: the paper's, which the bilingual configs no longer default to
MODEL = ["model.deepnorm_init=paper", "model.embed_dim=64", "model.ffn_dim=256", "model.heads=4", "train.dropout=0.1",
         "train.max_tokens=2000", "train.batch_tokens=2000", "train.save_interval_updates=100", "eval.average_last=5",
         "eval.max_len_a=1.2", "eval.max_len_b=10"]
USAGE = """\
Usage: scripts/paper_protocol_multi30k.sh [--archs {default}] [--layers 18,18]
                                          [--stages 2000,4000,6000,8000] [--work DIR] [--runs DIR]
                                          [--raw-dir DIR] [--dry-run]

For each stage S (in order) and each arch: train with scripts/train_iwslt.sh --cpu to S updates
(the run folder resumes from its last checkpoint, so each stage continues the previous one), then
scripts/evaluate.sh (average of the last 5 update checkpoints, tokenised BLEU on test2016, valid
loss in the train record). Records go to RUNS/results.jsonl. Every step skips finished work, so
rerunning the same command continues an interrupted protocol.

The only departures from configs/iwslt14_de_en.yaml (the table's CPU-sized model, as in
docs/results/multi30k_table/README.md): d64, FFN 256, 4 heads, dropout 0.1, 2,000 tokens per batch,
a checkpoint every 100 updates (for the last-5 average), Multi30k instead of IWSLT-14; and DeepNet
with the paper's init (model.deepnorm_init=paper; the config's default is the source init).

  --archs LIST     of {archs} (default: {default})
  --layers N,M     encoder,decoder layers (default: 18,18)
  --stages LIST    updates at which to stop and evaluate (default: 2000,4000,6000,8000)
  --work DIR       prepared + binarised Multi30k (default: work/multi30k_de_en; built if missing)
  --runs DIR       run folders and results.jsonl (default: runs/paper_protocol)
  --raw-dir DIR    raw Multi30k de-en (default: ../shared/data/multi30k_de_en)
  --dry-run        print the commands only
"""


def fail(message):
    print(f"paper_protocol: {message}", file=sys.stderr)
    sys.exit(2)


class Parser(argparse.ArgumentParser):
    def error(self, message):  # in the shell script's words
        needs = re.match(r"argument (\S+): expected one argument", message)
        fail(f"option {needs.group(1)} needs a value (see --help)" if needs else f"{message} (see --help)")


def parse_args(argv):
    p = Parser(prog="scripts/paper_protocol_multi30k.sh", add_help=False, allow_abbrev=False)
    p.add_argument("-h", "--help", action="store_true")
    p.add_argument("--archs", default=",".join(deepnet_methods.names(zoo=False)))
    p.add_argument("--layers", default="18,18")
    p.add_argument("--stages", default="2000,4000,6000,8000")
    p.add_argument("--work", default="work/multi30k_de_en")
    p.add_argument("--runs", default="runs/paper_protocol")
    p.add_argument("--raw-dir", default=str(ROOT / ".." / "shared" / "data" / "multi30k_de_en"))
    p.add_argument("--dry-run", action="store_true")
    args, unknown = p.parse_known_args(argv)
    if unknown:
        fail(f"unknown option '{unknown[0]}' (see --help)")
    if args.help:
        print(USAGE.format(default=",".join(deepnet_methods.names(zoo=False)),
                           archs=", ".join(deepnet_methods.names())), end="")
        sys.exit(0)
    args.archs, args.stages = [a for a in args.archs.split(",") if a], [s for s in args.stages.split(",") if s]
    for arch in args.archs:
        if arch not in deepnet_methods.METHODS:
            fail(f"unknown arch '{arch}' ({', '.join(deepnet_methods.names())})")
    for stage in args.stages:
        if not re.fullmatch(r"[1-9][0-9]*", stage):
            fail(f"--stages must be positive integers, got '{stage}'")
    if not re.fullmatch(r"[1-9][0-9]*,[1-9][0-9]*", args.layers):
        fail(f"--layers must be N,M, got '{args.layers}'")
    return args


def say(message):
    print(f"[paper_protocol] {message}", flush=True)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    work, runs, raw = args.work, args.runs, args.raw_dir  # as given: they go into the commands verbatim

    def step(cmd):  # run (or with --dry-run print) one command; a failed one ends the protocol with its status
        cmd = [str(c) for c in cmd]
        if args.dry_run:
            print(shlex.join(cmd), flush=True)
            return
        returncode = subprocess.run(cmd).returncode
        if returncode != 0:
            sys.exit(returncode)

    data = ["data.layout=plain", "data.train=[train]", "data.valid=[valid]", "data.test=[test2016]",
            f"paths.work={work}", f"paths.runs={runs}", f"paths.results={runs}/results.jsonl"]
    if not Path(work, "bin", ".done").exists():
        if not Path(raw, "train.de").is_file():
            print(f"paper_protocol: no prepared data in {work} and no raw Multi30k at {raw} (--raw-dir)",
                  file=sys.stderr)
            return 1
        step([SCRIPTS / "prepare_iwslt14.sh", "--raw-dir", raw, "--workers", "2", *data])
        step([SCRIPTS / "binarize.sh", "--config", CONFIG, "--workers", "2", *data])
    layers = args.layers.replace(",", "L-") + "L"
    for stage in args.stages:
        for arch in args.archs:
            run_dir = Path(runs, "iwslt14_de_en", arch, layers)
            if runner.stage_done(run_dir, stage):
                say(f"{arch} {layers}: stage {stage} already trained and evaluated")
                continue
            say(f"{arch} {layers}: train to {stage} updates, then evaluate")
            common = ["--arch", arch, "--layers", args.layers, "--cpu", *data, *MODEL, f"train.max_update={stage}"]
            step([SCRIPTS / "train_iwslt.sh", *common])
            step([SCRIPTS / "evaluate.sh", "--config", CONFIG, *common])
            if not args.dry_run:
                runner.mark_stage(run_dir, stage)
    say(f"done: records in {runs}/results.jsonl (scripts/report {runs}/results.jsonl --out-dir DIR makes the tables)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
