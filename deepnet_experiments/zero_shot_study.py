"""Zero-shot study at small scale (issues 28, 33): Post-LN, Pre-LN and DeepNet trained English-centric on the
shared Multi30k (de<->en, en<->fr), tested on the three-way parallel test2016 in all six directions,
zero-shot de<->fr included: sacreBLEU, chrF++, target-language accuracy and the pivot through English, with
the spread over seeds, for each language-tag strategy and remedy asked for.

    python -m deepnet_experiments.zero_shot_study [--archs postln,preln,deepnet,deepnet_source] [--layers 6,6 ...]
        [--lang-tags s-enc-t-dec,t-enc,t-enc-t-dec] [--remedies none,residual_drop,robt,crossconst0.25,...]
        [--train-pairs disjoint]
        [--seeds 1,2,3] [--stages 1500,3000,4500] [--work DIR] [--runs DIR] [--out DIR] [--dry-run]
        [--summary-only] [key=value ...]

Everything goes through the shipped OPUS-100 scripts (configs/opus100.yaml): the Multi30k files are laid
out in OPUS-100's raw layout under WORK/raw, then scripts/prepare_opus100.sh, binarize.sh, and for each
stage S, each depth, seed and variant, train_opus100.sh to S updates (a run resumes from its
checkpoint_last.pt, so each stage continues the previous one) and evaluate.sh (average of the last 5
update checkpoints). Each run has its own folder RUNS/seed<k>/opus100/<variant>[_<tags>][_rdrop<K>|_robt]/<N>L-<M>L
(the tags where they are not s-enc-t-dec, fairseq's recipe and the study's default; K the encoder layer without
its self-attention residual; robt: random online back-translation, ``ROBT``); the records go
to RUNS/results.jsonl. A marker eval/evaluated_at_<S> skips finished work, so rerunning the same
command continues an interrupted study. The stages show where the supervised directions stop improving.

The summary (written after every evaluation, or alone with --summary-only) goes to OUT: results.md
(per direction mean +- sample standard deviation over seeds, at each stage), summary.csv, zero_shot.png
(supervised BLEU, zero-shot BLEU and zero-shot target-language accuracy by updates), results.jsonl (a
copy of the records) and commands.txt (the command lines run).

Settings (the issue's): d64, FFN 256, 4 heads, dropout 0.1, lr 2e-3, 400 warm-up updates, 2,000 tokens a
batch, a checkpoint every 100 updates, 8,000 SentencePiece pieces; all can be overridden with key=value.
"""

import argparse
import csv
import json
import math
import re
import shlex
import subprocess
import sys
from pathlib import Path

import deepnet_methods
from deepnet_setups import runner
from deepnet_setups.records import labelled, migrate, pool_key

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
CONFIG = ROOT / "configs" / "opus100.yaml"
# deepnet_setups.lang_tags.STRATEGIES; the first (fairseq's recipe) is the study's default and adds no folder suffix
LANG_TAGS = ("s-enc-t-dec", "t-enc", "t-enc-t-dec")
REMEDIES = ("none", "residual_drop", "robt", "crossconst<A>", "crossconst<A>_ft")  # residual_drop:
# --encoder-drop-residual-layer at the middle encoder layer; robt: random online back-translation (the plugin's
# translation_multi_robt task) in half the updates from update 750 on, the first stage's second half (Zhang et al.
# fine-tune a trained model with it); crossconst<A>: CrossConST (Gao et al. 2023) at weight A from the first update;
# crossconst<A>_ft: a fine-tuning stage with it of FINETUNE_UPDATES, from the run without it at the first stage, as
# its authors do (fairseq's --finetune-from-model: optimizer and schedule start anew); crossconst0_ft, the same
# fine-tune without it, is what a fine-tune's supervised BLEU compares with. Joined with +, e.g. robt+crossconst0.25.
REMEDY = re.compile(r"none|residual_drop|robt|crossconst(\d*\.?\d+)(_ft)?")
ROBT = ["--task", "translation_multi_robt", "--robt-share", "0.5", "--robt-from-update", "750"]
CROSSCONST = ["train.criterion=diagnostic_label_smoothed_cross_entropy"]  # the criterion that takes its weight
FINETUNE_UPDATES, FINETUNE = 500, ["train.warmup_updates=100"]
SUPERVISED = ("de-en", "en-de", "en-fr", "fr-en")
ZERO_SHOT = ("de-fr", "fr-de")
DATA = ["data.langs=[de,en,fr]", "data.lang_pairs=[de-en,en-de,en-fr,fr-en]", "data.zero_shot_pairs=[de-fr,fr-de]"]
SETTINGS = ["prep.spm_vocab_size=8000", "prep.spm_sample_sentences=200000",
            "model.embed_dim=64", "model.ffn_dim=256", "model.heads=4", "model.share_all_embeddings=true",
            "train.dropout=0.1", "train.lr=2e-3", "train.warmup_updates=400", "train.max_tokens=2000",
            "train.batch_tokens=2000", "train.max_epoch=null", "train.save_interval_updates=100",
            "train.validate_interval_updates=500", "train.log_interval=100",
            "eval.average_last=5", "eval.max_len_a=1.2", "eval.max_len_b=10"]
# Multi30k: train 29,000, valid 1,014, test2016 1,000 lines; de/en/fr three-way parallel
SPLITS = {"train": "train", "dev": "valid", "test": "test2016"}


class StudyError(Exception):
    pass


def opus_layout(shared, raw, max_train=None, test_lines=None, train_pairs="shared"):
    """Multi30k de-en and en-fr in OPUS-100's raw layout under ``raw`` (supervised train/dev/test), de-fr's
    test as zero-shot; ``max_train`` / ``test_lines`` cut the files (None: all lines). ``train_pairs``
    "disjoint" trains de-en on the first half of the captions and en-fr on the second, so that no English
    target of one pair is an English source of the other, as in real English-centric data ("shared": both
    on all of them, issue 28's study). Skipped if done."""
    marker = raw / ".done"
    wanted = json.dumps({"max_train": max_train, "test_lines": test_lines}
                        | ({"train_pairs": train_pairs} if train_pairs != "shared" else {}))
    if marker.exists():
        if marker.read_text() != wanted:
            raise StudyError(f"{raw} was laid out with {marker.read_text()}, not {wanted}: use another --work")
        return
    files = {"de": shared / "multi30k_de_en", "en": shared / "multi30k_de_en", "fr": shared / "multi30k_en_fr"}
    for group, corpus, splits in (("supervised", "de-en", SPLITS), ("supervised", "en-fr", SPLITS),
                                  ("zeroshot", "de-fr", {"test": "test2016"})):
        folder = raw / group / corpus
        folder.mkdir(parents=True, exist_ok=True)
        for split, stem in splits.items():
            limit = max_train if split == "train" else test_lines if split == "test" else None
            for lang in corpus.split("-"):
                source = files[lang] / f"{stem}.{lang}"
                if not source.exists():
                    raise StudyError(f"{source}: missing (--shared-data)")
                lines = source.read_text(encoding="utf-8").splitlines()[:limit]
                if split == "train" and train_pairs == "disjoint":
                    half = len(lines) // 2
                    lines = lines[:half] if corpus == "de-en" else lines[half:]
                (folder / f"opus.{corpus}-{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    marker.write_text(wanted)


class Runner:
    """Runs (or with ``dry`` prints) commands, logging them to ``log``."""

    def __init__(self, log, dry):
        self.log, self.dry = log, dry

    def __call__(self, cmd):
        line = " ".join(shlex.quote(str(c)) for c in cmd)
        print(f"[zero_shot_study] {line}", flush=True)
        if self.dry:
            return
        with open(self.log, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
        if subprocess.run([str(c) for c in cmd]).returncode != 0:
            raise StudyError(f"failed: {line}")


def remedy_ok(remedy):
    parts = remedy.split("+")
    return all(REMEDY.fullmatch(part) for part in parts) and sum(part.endswith("_ft") for part in parts) <= 1


def finetune_base(remedy):
    """The remedy of the run a fine-tuning remedy starts from (``none`` for crossconst0.25_ft), None for others."""
    parts = remedy.split("+")
    if not any(part.endswith("_ft") for part in parts):
        return None
    return "+".join(part for part in parts if not part.endswith("_ft")) or "none"


def run_variant(variant, lang_tags, remedy, encoder_layers):
    """(folder name, the setups' --arch, its overrides) of one study run: the variant, its language tags
    where they are not the setups' default, and the remedies where there are any."""
    method, init = deepnet_methods.resolve(variant)
    extra = ["--deepnorm-init", init] if init else []
    name = variant + ("" if lang_tags == LANG_TAGS[0] else f"_{lang_tags}")
    overrides = []
    for part in remedy.split("+"):
        if part == "residual_drop":  # Liu et al. 2021 drop it in a middle encoder layer
            extra = [*extra, "--encoder-drop-residual-layer", str(encoder_layers // 2)]
            name += f"_rdrop{encoder_layers // 2}"
        elif part == "robt":
            extra, name = [*extra, *ROBT], name + "_robt"
        elif part != "none":
            alpha, finetune = REMEDY.fullmatch(part).groups()
            name += f"_cc{alpha}" + ("ft" if finetune else "")
            overrides += [f"train.crossconst_alpha={alpha}", *CROSSCONST, *(FINETUNE if finetune else [])]
    return name, method.name, [f"data.lang_tags={lang_tags}", f"train.extra_args=[{','.join(extra)}]", *overrides]


def base_checkpoint(folder, stage):
    """The checkpoint a fine-tune starts from: its base run's at ``stage`` updates (None where it has none)."""
    found = sorted((folder / "checkpoints").glob(f"checkpoint_*_{stage}.pt"))
    return found[-1] if found else None


def variants():
    """What --archs takes, a run folder's first part: every method (the setups' --arch) and init variant."""
    return deepnet_methods.names(variants=True)


def variant_of(folder_name):
    """The variant a run folder's name starts with (deepnet_source_t-enc_rdrop3: deepnet_source), or the name."""
    return next((v for v in sorted(variants(), key=len, reverse=True) if folder_name.startswith(v)), folder_name)


def remedy_label(part):
    """A run folder's remedy part as the tables name it (rdrop3: 'residual drop 3', robt: 'ROBT', cc0.25ft:
    'CrossConST 0.25, fine-tuned'); None for a part that is no remedy."""
    if part.startswith("rdrop"):
        return f"residual drop {part[5:]}"
    if part == "robt":
        return "ROBT"
    if part.startswith("cc"):
        return f"CrossConST {part[2:].removesuffix('ft')}" + (", fine-tuned" if part.endswith("ft") else "")
    return None


def model_name(folder_name):
    """'DeepNet, source init, t-enc, residual drop 3' for a run folder named deepnet_source_t-enc_rdrop3."""
    variant = variant_of(folder_name)
    parts = [deepnet_methods.label(variant)]
    parts += [remedy_label(part) or part for part in filter(None, folder_name[len(variant):].split("_"))]
    return ", ".join(parts)


def seed_of(run_dir):
    match = re.search(r"seed(\d+)", str(run_dir))
    return int(match.group(1)) if match else None


def mean_sd(values):
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return mean, sd


def summarise(records):
    """Rows (arch, depth, updates) of the latest eval record of each (run, updates), aggregated over seeds."""
    latest, walls = {}, {}
    for record in records:
        seed = seed_of(record.get("run_dir", ""))
        if record.get("setup") != "opus100" or seed is None:
            continue
        # runs of another device, width or precision are another row, never pooled into one mean
        key = (Path(record["run_dir"]).parent.name, record["encoder_layers"], record["decoder_layers"],
               pool_key(record))
        if record.get("kind") == "eval" and record.get("updates") is not None:
            latest[key + (record["updates"], seed)] = record
        elif record.get("kind") == "train" and record.get("updates") is not None:
            walls[key + (record["updates"], seed)] = record.get("wall_time_s")
    groups = {}
    for (arch, enc, dec, pool, updates, seed), record in latest.items():
        groups.setdefault((arch, enc, dec, updates, pool), []).append((seed, record))
    pools = [key[4] for key in groups]
    rows = []
    for (arch, enc, dec, updates, pool), runs in sorted(groups.items(), key=lambda x: (
            x[0][1], deepnet_methods.order(x[0][0]), x[0][3], str(x[0][4]))):
        row = {"arch": arch, "model": labelled(model_name(arch), pool, pools), "layers": f"{enc}L-{dec}L",
               "updates": updates,
               "seeds": ",".join(str(s) for s, _ in sorted(runs))}
        per_direction = {}
        for _, record in runs:
            for d in record.get("directions", []):
                per_direction.setdefault(d["direction"], []).append(d)
        for direction in SUPERVISED + ZERO_SHOT:
            found = per_direction.get(direction, [])
            row[f"{direction} bleu"] = mean_sd([d["bleu"] for d in found])
            row[f"{direction} on-target"] = mean_sd([d.get("target_lang_acc") for d in found])
        for name, directions, field in AGGREGATES:
            per_run = []
            for _, record in runs:
                values = [d.get(field) for d in record.get("directions", []) if d["direction"] in directions]
                values = [v for v in values if v is not None]
                per_run.append(sum(values) / len(values) if values else None)
            row[name] = mean_sd(per_run)
        row["train wall s (this stage)"] = mean_sd([walls.get((arch, enc, dec, pool, updates, s)) for s, _ in runs])
        rows.append(row)
    return rows


# (column, directions, the direction record's field): each run's mean over the directions, then over seeds
AGGREGATES = (("supervised bleu", SUPERVISED, "bleu"), ("zero-shot bleu", ZERO_SHOT, "bleu"),
              ("zero-shot chrf", ZERO_SHOT, "chrf"), ("pivot bleu", ZERO_SHOT, "pivot_bleu"),
              ("zero-shot / pivot", ZERO_SHOT, "zero_shot_over_pivot"),
              ("zero-shot on-target", ZERO_SHOT, "target_lang_acc"), ("pivot on-target", ZERO_SHOT, "pivot_target_lang_acc"))
COLUMNS = ([f"{d} bleu" for d in SUPERVISED] + [f"{d} bleu" for d in ZERO_SHOT]
           + [f"{d} on-target" for d in SUPERVISED + ZERO_SHOT]
           + [name for name, _, _ in AGGREGATES] + ["train wall s (this stage)"])


# issue 49's goal for a zero-shot remedy: zero-shot on target, zero-shot BLEU over pivot BLEU, and the supervised BLEU
# it may cost against the same model without it
GOAL_ON_TARGET, GOAL_OVER_PIVOT, GOAL_SUPERVISED_COST = 95.0, 0.8, 0.5


def best_crossconst(records, variant, lang_tags, seed=1, stage=1500):
    """The CrossConST remedy (``crossconst0.25``, ``crossconst0.1_ft``) whose ``seed`` run of ``variant`` on
    ``lang_tags`` meets the goal's on-target and zero-shot / pivot parts at the lowest supervised cost; where none
    meets them, the highest zero-shot / pivot. The cost is against the same seed without it: the run without it at
    ``stage`` updates for one from scratch, the same fine-tune at weight 0 (``crossconst0_ft``: as many more updates)
    for a fine-tune. None if no run has both."""
    rows = {(row["arch"], row["updates"]): row
            for row in summarise([r for r in records if seed_of(r.get("run_dir", "")) == seed])}
    plain = run_variant(variant, lang_tags, "none", 0)[0]
    found = []
    for (arch, updates), row in rows.items():
        match = re.fullmatch(re.escape(plain) + r"_cc(\d*\.?\d+)(ft)?", arch)
        if match and float(match.group(1)) > 0:
            without = rows.get((plain + "_cc0ft", FINETUNE_UPDATES) if match.group(2) else (plain, stage))
            if without is not None:
                found.append((match, row, without))
    if not found:
        return None

    def rank(item):
        _, row, without = item
        on_target, over_pivot = row["zero-shot on-target"][0], row["zero-shot / pivot"][0]
        meets = on_target >= GOAL_ON_TARGET and over_pivot >= GOAL_OVER_PIVOT
        return meets, row["supervised bleu"][0] - without["supervised bleu"][0] if meets else over_pivot

    match = max(found, key=rank)[0]
    return f"crossconst{match.group(1)}" + ("_ft" if match.group(2) else "")


def fmt(value, digits):
    mean, sd = value
    return "-" if mean is None else f"{mean:.{digits}f} ± {sd:.{digits}f}"


def write_summary(records, out):
    rows = summarise(records)
    out.mkdir(parents=True, exist_ok=True)
    head = ["model", "layers", "updates", "seeds"]
    with open(out / "summary.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(head + [f"{c} {part}" for c in COLUMNS for part in ("mean", "sd")])
        for row in rows:
            writer.writerow([row[h] for h in head] + [x if x is None else round(x, 3) for c in COLUMNS for x in row[c]])
    names = [c.replace(" bleu", "").replace("de-fr", "de-fr*").replace("fr-de", "fr-de*") if c.endswith(" bleu")
             and c[:5] in SUPERVISED + ZERO_SHOT else c for c in COLUMNS]
    lines = ["BLEU: detokenised sacreBLEU (13a) on Multi30k test2016; on-target: % of hypotheses identified as the "
             "target language (py3langid over de/en/fr); mean ± sample standard deviation over the seeds; "
             "* zero-shot.", "",
             "| " + " | ".join(head + names) + " |", "|" + "---|" * (len(head) + len(names))]
    for row in rows:
        cells = [row["model"], row["layers"], str(row["updates"]), row["seeds"]]
        cells += [fmt(row[c], 0 if c.startswith("train wall") else 1 if "on-target" in c else 3 if "/" in c else 2)
                  for c in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    (out / "results.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    plot(rows, out / "zero_shot.png")
    with open(out / "results.jsonl", "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(r, sort_keys=True) + "\n" for r in records)
    return rows


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("supervised bleu", "supervised BLEU (4 directions)"),
              ("zero-shot bleu", "zero-shot BLEU (de-fr, fr-de)"), ("zero-shot on-target", "zero-shot on target (%)"))
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    lines = list(dict.fromkeys((r["model"], r["layers"]) for r in rows))
    shift = 0.015 * max((r["updates"] for r in rows), default=0)  # side by side, so that error bars don't hide
    for (field, title), ax in zip(panels, axes):
        for i, (model, layers) in enumerate(lines):
            ours = [r for r in rows if (r["model"], r["layers"]) == (model, layers) and r[field][0] is not None]
            if ours:
                x, y, err = zip(*[(r["updates"] + (i - (len(lines) - 1) / 2) * shift, *r[field]) for r in ours])
                ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=f"{model} {layers}",
                            linestyle="-" if len({r["seeds"] for r in ours}) == 1 else ":")
        ax.set_title(title)
        ax.set_xlabel("updates (mean ± sd over seeds; dotted: other seeds)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.rename(path)


def read_records(path):
    """RUNS/results.jsonl, each record in the schema (migrate: one an older launcher wrote, brought to it)."""
    if not path.exists():
        return []
    return [migrate(json.loads(line), path) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]


def commands_run(out, runs):
    """The commands behind OUT's records, once each: those OUT/commands.txt lists below its first line (runs of
    other machines, whose RUNS/commands.txt is gone), then this machine's RUNS/commands.txt."""
    listed, log = out / "commands.txt", runs / "commands.txt"
    lines = listed.read_text(encoding="utf-8").splitlines()[1:] if listed.exists() else []
    lines += log.read_text(encoding="utf-8").splitlines() if log.exists() else []
    return "".join(f"{line}\n" for line in dict.fromkeys(lines) if line)


def csv_list(text, kind=str):
    return [kind(x) for x in text.split(",") if x]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m deepnet_experiments.zero_shot_study", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="section.key=value for every stage (after the study's own)")
    parser.add_argument("--archs", default=",".join(deepnet_methods.names(zoo=False)),
                        help=f"of {', '.join(variants())}")
    parser.add_argument("--layers", action="append", help="N,M (repeat for more depths; default 6,6)")
    parser.add_argument("--lang-tags", default=LANG_TAGS[0], help=f"language-tag strategies, of {', '.join(LANG_TAGS)}")
    parser.add_argument("--remedies", default="none", help=f"of {', '.join(REMEDIES)}, or + of them (residual_drop: "
                        "no residual around the self-attention of the middle encoder layer, N // 2; robt: random "
                        "online back-translation in half the updates from update 750; crossconst<A>: CrossConST at "
                        f"weight A; crossconst<A>_ft: a {FINETUNE_UPDATES}-update fine-tune with it from the run "
                        "without it at the first stage)")
    parser.add_argument("--train-pairs", choices=("shared", "disjoint"), default="shared",
                        help="disjoint: de-en and en-fr trained on disjoint halves of the captions (default: both "
                             "on all, as issue 28's study)")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--stages", default="1500,3000,4500", help="updates at which to stop and evaluate")
    parser.add_argument("--work", default="work/zero_shot_m30k", help="raw layout, prepared and binarised data")
    parser.add_argument("--runs", default="runs/zero_shot", help="run folders and results.jsonl")
    parser.add_argument("--out", default="docs/results/zero_shot", help="tables, plot, records")
    parser.add_argument("--shared-data", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--max-train", type=int, help="training lines per corpus (default: all 29,000)")
    parser.add_argument("--test-lines", type=int, help="test lines per direction (default: all 1,000)")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                        help="train and evaluate on CPU (default) or on the visible GPUs, in fp32 as on CPU "
                             "so that the rows compare")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    parser.add_argument("--summary-only", action="store_true", help="rewrite OUT from RUNS/results.jsonl")
    parser.add_argument("--best-crossconst", action="store_true",
                        help="print the CrossConST remedy nearest issue 49's goal on seed 1 of the first --archs and "
                             "--lang-tags in RUNS/results.jsonl (see best_crossconst) and exit")
    opts = parser.parse_intermixed_args(argv)
    try:
        archs = csv_list(opts.archs)
        if not archs or set(archs) - set(variants()):
            raise StudyError(f"--archs: of {', '.join(variants())}, got {opts.archs!r}")
        tag_choices, remedies = csv_list(opts.lang_tags), csv_list(opts.remedies)
        if not tag_choices or set(tag_choices) - set(LANG_TAGS) or not remedies or not all(map(remedy_ok, remedies)):
            raise StudyError(f"--lang-tags of {', '.join(LANG_TAGS)}; --remedies of {', '.join(REMEDIES)}, "
                             "joined with + (one _ft at most)")
        layers = opts.layers or ["6,6"]
        if not all(re.fullmatch(r"[1-9]\d*,[1-9]\d*", x) for x in layers):
            raise StudyError(f"--layers must be N,M, got {layers}")
        try:
            seeds, stages = csv_list(opts.seeds, int), sorted(csv_list(opts.stages, int))
        except ValueError:
            raise StudyError("--seeds and --stages are comma-separated integers") from None
        if not seeds or not stages or min(stages) < 1:
            raise StudyError("--seeds and --stages need at least one positive value each")
        work, runs, out = Path(opts.work).resolve(), Path(opts.runs).resolve(), Path(opts.out).resolve()
        results = runs / "results.jsonl"
        if opts.best_crossconst:
            best = best_crossconst(read_records(results), archs[0], tag_choices[0])
            if best is None:
                raise StudyError(f"{results}: no seed-1 CrossConST run of {archs[0]} on {tag_choices[0]} beside one "
                                 "without it")
            print(best)
            return 0
        if not opts.summary_only:
            runs.mkdir(parents=True, exist_ok=True)
            run = Runner(runs / "commands.txt", opts.dry_run)
            cpu = opts.device == "cpu"
            common = DATA + SETTINGS + [f"paths.work={work}", f"paths.results={results}"] + \
                ([] if cpu else ["train.precision=fp32"])
            device = ["--cpu"] if cpu else []
            if not opts.dry_run:
                opus_layout(Path(opts.shared_data), work / "raw", opts.max_train, opts.test_lines, opts.train_pairs)
            run(["bash", SCRIPTS / "prepare_opus100.sh", "--raw-dir", work / "raw", "--workers", "2", *common,
                 *opts.overrides])
            run(["bash", SCRIPTS / "binarize.sh", "--config", CONFIG, "--workers", "2", *common, *opts.overrides])
            for stage in stages:
                for depth in layers:
                    for seed in seeds:
                        for variant, lang_tags, remedy in ((v, t, r) for v in archs for t in tag_choices for r in remedies):
                            base = finetune_base(remedy)
                            if base is not None and stage != stages[0]:
                                continue  # a fine-tune is one stage, from its base run at the first stage
                            encoder_layers = int(depth.split(",")[0])
                            name, arch, variant_args = run_variant(variant, lang_tags, remedy, encoder_layers)
                            folder = runs / f"seed{seed}" / "opus100" / name / f"{depth.replace(',', 'L-')}L"
                            updates = stage if base is None else FINETUNE_UPDATES
                            if runner.stage_done(folder, updates, results):
                                print(f"[zero_shot_study] {folder}: stage {updates} done", flush=True)
                                continue

                            def train(run_args, max_update, run_dir):
                                args = [*common, f"train.seed={seed}", *run_args, *opts.overrides,
                                        f"train.max_update={max_update}", "--run-dir", run_dir]
                                run(["bash", SCRIPTS / "train_opus100.sh", "--arch", arch, "--layers", depth,
                                     *device, *args])
                                return args

                            if base is not None:
                                base_name, _, base_args = run_variant(variant, lang_tags, base, encoder_layers)
                                base_folder = folder.parents[1] / base_name / folder.name
                                if base_checkpoint(base_folder, stage) is None:  # not on this machine: train it
                                    train(base_args, stage, base_folder)
                                start = base_checkpoint(base_folder, stage)
                                if start is None and not opts.dry_run:
                                    raise StudyError(f"{base_folder}: no checkpoint at update {stage} to fine-tune")
                                start = start or base_folder / "checkpoints" / f"checkpoint_*_{stage}.pt"
                                variant_args = [*variant_args, f"train.finetune_from_model={start}"]
                            args = train(variant_args, updates, folder)
                            run(["bash", SCRIPTS / "evaluate.sh", "--config", CONFIG, "--arch", arch, "--layers",
                                 depth, *device, *args])
                            if not opts.dry_run:
                                runner.mark_stage(folder, updates)
                                write_summary(read_records(results), out)
            if opts.dry_run:
                return 0
        rows = write_summary(read_records(results), out)
        if not rows:
            raise StudyError(f"{results}: no evaluation records of the study")
        print((out / "results.md").read_text(encoding="utf-8"))
        (out / "commands.txt").write_text(
            "python -m deepnet_experiments.zero_shot_study " + " ".join(shlex.quote(a) for a in (
                argv if argv is not None else sys.argv[1:])) + "\n\n" + commands_run(out, runs))
    except StudyError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
