"""The study pages' tables: generated files, included in each page between markers, never typed.

    python -m deepnet_experiments.pages tables            # write the pages' own tables (VIEWS) from the records
    python -m deepnet_experiments.pages sync [PAGE ...]   # refresh every marked block from its file
    python -m deepnet_experiments.pages check [PAGE ...]  # exit 1 naming each block that differs from its file

A page (default: every docs/results/<study>/README.md) includes a generated table as a marked block:

    <!-- table: seeds.md -->
    ...exactly the file's text...
    <!-- /table -->

The path is relative to the page's folder. ``<!-- table: results.md section="iwslt14_de_en, 18L-18L: by updates" -->``
includes one section of a Markdown file instead (the lines under that heading, up to the next heading), so that a
page shows scripts/report's tables without its headings. The files come from the studies' own tables commands
(scripts/report, ``deepnet_experiments.seeds_table``, ``deepnet_experiments.zero_shot_study``'s summary) and, where
a page needs a narrower cut of the committed records than those write, from VIEWS below (``tables``).
"""

import argparse
import json
import re
import sys
from pathlib import Path

import deepnet_methods

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
BLOCK = re.compile(r'^<!-- table: (?P<path>[^\s>]+)(?: section="(?P<section>[^"]+)")? -->\n(?P<body>.*?)^<!-- /table -->$',
                   re.MULTILINE | re.DOTALL)


# --- marked blocks ------------------------------------------------------------------------------------------------

def pages():
    return sorted(RESULTS.glob("*/README.md"))


def section(text, heading):
    """The lines under the Markdown heading ``heading`` (any level) up to the next heading, stripped."""
    lines, out, inside = text.splitlines(), [], False
    for line in lines:
        title = re.fullmatch(r"#{1,6} (.*)", line)
        if title:
            if inside:
                break
            inside = title[1].strip() == heading
            continue
        if inside:
            out.append(line)
    if not inside and not out:
        raise ValueError(f"no section {heading!r}")
    return "\n".join(out).strip()


def generated(page, path, heading=None):
    """What the block of ``page`` naming ``path`` (and ``heading``) must hold; ValueError if there is none."""
    file = page.parent / path
    if not file.is_file():
        raise ValueError("not generated yet")
    text = file.read_text(encoding="utf-8")
    return section(text, heading) if heading else text.strip()


def blocks(text):
    """[(path, section or None, body as on the page, stripped)] of every marked block."""
    return [(m["path"], m["section"], m["body"].strip()) for m in BLOCK.finditer(text)]


def marker_count(text):
    opened = re.findall(r"^<!-- table: ", text, flags=re.MULTILINE)
    return len(opened), len(re.findall(r"^<!-- /table -->$", text, flags=re.MULTILINE))


def differences(page):
    """What differs between ``page``'s blocks and their files: a list of messages, empty when none."""
    text = page.read_text(encoding="utf-8")
    opened, closed = marker_count(text)
    found = blocks(text)
    problems = []
    if not opened == closed == len(found):
        problems.append(f"{page.relative_to(ROOT)}: {opened} table markers, {closed} ends, {len(found)} well-formed blocks")
    for path, heading, body in found:
        where = f"{page.relative_to(ROOT)}: {path}" + (f' section "{heading}"' if heading else "")
        try:
            if body != generated(page, path, heading):
                problems.append(f"{where}: differs from the file (python -m deepnet_experiments.pages sync)")
        except ValueError as err:
            problems.append(f"{where}: {err}")
    return problems


def sync(page):
    """Rewrite ``page``'s blocks from their files; a block whose file is not there yet is left as it is.
    Returns the messages about blocks left."""
    text, left = page.read_text(encoding="utf-8"), []

    def fill(match):
        try:
            body = generated(page, match["path"], match["section"])
        except ValueError as err:
            left.append(f"{page.relative_to(ROOT)}: {match['path']}: {err}")
            return match[0]
        head = match[0].split("\n", 1)[0]
        return f"{head}\n\n{body}\n\n<!-- /table -->"

    new = BLOCK.sub(fill, text)
    if new != text:
        page.write_text(new, encoding="utf-8")
    return left


# --- the pages' own tables ----------------------------------------------------------------------------------------

def read_jsonl(path):
    return [json.loads(line) for line in (ROOT / path).read_text(encoding="utf-8").splitlines() if line.strip()]


REMEDY_NAMES = ("none", "residual drop", "ROBT", "CrossConST")  # the tables' order


def zero_shot_parts(folder):
    """('deepnet_source', 't-enc-t-dec', 'residual drop 3') for a zero-shot study run folder's name; remedies
    combined are joined with ' + ' ('ROBT + CrossConST 0.25')."""
    from deepnet_experiments import zero_shot_study as study

    variant = study.variant_of(folder)
    tags, remedies = study.LANG_TAGS[0], []
    for part in filter(None, folder[len(variant):].split("_")):
        if part in study.LANG_TAGS:
            tags = part
        elif label := study.remedy_label(part):
            remedies.append(label)
    return variant, tags, " + ".join(remedies) or "none"


def is_remedy(remedy, names):
    """Whether a table's remedy ('residual drop 3', 'CrossConST 0.25, fine-tuned') is one of ``names`` ('residual
    drop', 'CrossConST') or starts with one."""
    return any(remedy == name or remedy.startswith(name + " ") for name in names)


ZERO_SHOT_COLUMNS = {  # the study's summary column -> (the page's header, digits)
    "supervised bleu": ("supervised BLEU", 2), "zero-shot bleu": ("zero-shot BLEU", 2),
    "zero-shot chrf": ("zero-shot chrF++", 2), "zero-shot on-target": ("zero-shot on target (%)", 1),
    "de-fr on-target": ("de-fr on target (%)", 1), "fr-de on-target": ("fr-de on target (%)", 1),
    "pivot bleu": ("pivot BLEU", 2), "zero-shot / pivot": ("zero-shot / pivot", 3)}
TAGGED = ["supervised bleu", "zero-shot bleu", "zero-shot chrf", "zero-shot on-target", "pivot bleu", "zero-shot / pivot"]


def zero_shot_table(records, columns, seeds=None, updates=None, tags=None, models=None, remedies=None):
    """A zero-shot study's runs as ``zero_shot_study.summarise`` aggregates them (each run's mean over its
    directions, then mean ± sample standard deviation over the seeds; one seed: the value alone), restricted to
    ``seeds``, ``updates``, language-tag strategies ``tags``, ``models`` (study variants) and ``remedies`` (None:
    all). Rows by updates, model, tags and remedy; the tags and remedy columns only where they differ."""
    from deepnet_experiments import zero_shot_study as study

    def kept(record):
        seed = study.seed_of(record.get("run_dir", ""))
        if seed is None or (seeds is not None and seed not in seeds):
            return False
        if updates is not None and record.get("kind") == "eval" and record.get("updates") not in updates:
            return False
        model, tag, remedy = zero_shot_parts(Path(record["run_dir"]).parent.name)
        return ((tags is None or tag in tags) and (models is None or model in models)
                and (remedies is None or is_remedy(remedy, remedies)))

    rows = []
    for row in study.summarise([r for r in records if kept(r)]):
        model, tag, remedy = zero_shot_parts(row["arch"])
        order = (row["updates"], deepnet_methods.order(model), study.LANG_TAGS.index(tag),
                 next(i for i, name in enumerate(REMEDY_NAMES) if is_remedy(remedy, [name])), remedy)
        pool = row["model"].partition(" [")[2]
        label = deepnet_methods.label(model, init_named=True)  # the paper init named beside the source init
        rows.append((order, [label + (f" [{pool}" if pool else ""), tag, remedy, str(row["updates"]),
                             row["seeds"]], row))
    rows.sort(key=lambda item: item[0])
    header = ["model", "tags", "remedy", "updates", "seeds"] + [ZERO_SHOT_COLUMNS[c][0] for c in columns]
    shown = [i for i in range(len(header)) if i not in (1, 2) or len({cells[i] for _, cells, _ in rows}) > 1]
    lines = ["| " + " | ".join(header[i] for i in shown) + " |", "|" + "---|" * len(shown)]
    for _, cells, row in rows:
        for column in columns:
            mean, sd = row[column]
            digits = ZERO_SHOT_COLUMNS[column][1]
            cells.append("-" if mean is None else f"{mean:.{digits}f}" if "," not in row["seeds"]
                         else f"{mean:.{digits}f} ± {sd:.{digits}f}")
        lines.append("| " + " | ".join(cells[i] for i in shown) + " |")
    return "\n".join(lines) + "\n"


def seeds_view(paths, unrecorded, lr):
    """``deepnet_experiments.seeds_table``'s table over ``paths``, the rows at peak learning rate ``lr`` only."""
    from deepnet_experiments import seeds_table

    records = [r for path in paths for r in read_jsonl(path)]
    rows = [row for row in seeds_table.table(seeds_table.runs(records, unrecorded)) if row["lr"] == lr]
    note = "\n\n`*`: a run whose record carries no settings (seed, lr, warm-up from `--unrecorded`).\n" if any(
        "*" in row["per_seed"] for row in rows) else "\n"
    return seeds_table.markdown(rows) + note


def crossconst_view(records):
    """The CrossConST phase's table: its runs and the same models' runs without a remedy and with ROBT, alone or
    combined (the phase's records start as a copy of the other phases'), at 1,500 updates and at the fine-tune's end."""
    from deepnet_experiments import zero_shot_study as study

    parts = {zero_shot_parts(Path(r["run_dir"]).parent.name) for r in records}
    models = {model for model, _, remedy in parts if is_remedy(remedy, ["CrossConST"])}
    return zero_shot_table(records, TAGGED, updates={1500, study.FINETUNE_UPDATES}, tags={"t-enc-t-dec"},
                           models=models, remedies={"none", "CrossConST", "ROBT"})


TAGS_DIR = "docs/results/zero_shot_tags"
# file written -> (what it shows, a function of nothing returning its text)
VIEWS = {
    f"{TAGS_DIR}/screen/seed1.md": (
        "the screen: every model and tag strategy, seed 1, 1,500 updates",
        lambda: zero_shot_table(read_jsonl(f"{TAGS_DIR}/screen/results.jsonl"), TAGGED, seeds={1}, updates={1500},
                                remedies={"none"})),
    f"{TAGS_DIR}/remedy/t-enc-t-dec.md": (
        "the remedy phase: T-ENC-T-DEC with and without each remedy, every recorded seed, 1,500 updates",
        lambda: zero_shot_table(read_jsonl(f"{TAGS_DIR}/remedy/results.jsonl"), TAGGED, updates={1500},
                                tags={"t-enc-t-dec"})),
    f"{TAGS_DIR}/remedy/seeds_1-2.md": (
        "the residual drop on matched seeds: the paper init and Pre-LN, seeds 1-2, 1,500 updates",
        lambda: zero_shot_table(read_jsonl(f"{TAGS_DIR}/remedy/results.jsonl"), TAGGED, seeds={1, 2}, updates={1500},
                                tags={"t-enc-t-dec"}, models={"deepnet", "preln"})),  # method-list: chosen
    f"{TAGS_DIR}/long/t-enc-t-dec.md": (
        "the long phase: the source init with and without the residual drop, seeds 1-3, 1,500 and 3,000 updates",
        lambda: zero_shot_table(read_jsonl(f"{TAGS_DIR}/long/results.jsonl"), TAGGED, seeds={1, 2, 3},
                                tags={"t-enc-t-dec"}, models={"deepnet_source"},
                                remedies={"none", "residual drop"})),
    f"{TAGS_DIR}/crossconst/t-enc-t-dec.md": (
        "CrossConST: T-ENC-T-DEC without it, with ROBT, and at each weight, from scratch (1,500 updates) and as a "
        "fine-tune of the run without it, alone and with ROBT, every recorded seed, for the models it ran with",
        lambda: crossconst_view(read_jsonl(f"{TAGS_DIR}/crossconst/results.jsonl"))),
    "docs/results/zero_shot/summary.md": (
        "shared training pairs: each model's means over the seeds at each update count",
        lambda: zero_shot_table(read_jsonl("docs/results/zero_shot/results.jsonl"),
                                ["supervised bleu", "zero-shot bleu", "zero-shot on-target", "de-fr on-target",
                                 "fr-de on-target"])),
    "docs/results/source_init/protocol.md": (
        "the paper's protocol (lr 5e-4, 4,000 warm-up updates), 18L-18L: the source init beside the paper_protocol runs",
        lambda: seeds_view(["docs/results/paper_protocol/results.jsonl", "docs/results/source_init/results.jsonl"],
                           {"seed": 1, "lr": 0.0005, "warmup_updates": 4000, "width": 64}, 0.0005)),
}


def write_views():
    for path, (_, make) in VIEWS.items():
        (ROOT / path).write_text(make(), encoding="utf-8")
        print(f"[pages] {path}")


# --- command line -------------------------------------------------------------------------------------------------

def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m deepnet_experiments.pages", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("tables", "sync", "check"))
    parser.add_argument("pages", nargs="*", type=Path, help="pages (default: docs/results/*/README.md)")
    args = parser.parse_args(argv)
    if args.action == "tables":
        write_views()
        return 0
    chosen = [p.resolve() for p in args.pages] or pages()
    messages = []
    for page in chosen:
        messages += sync(page) if args.action == "sync" else differences(page)
    for message in messages:
        print(f"[pages] {message}", file=sys.stderr)
    return 1 if messages and args.action == "check" else 0


if __name__ == "__main__":
    sys.exit(main())
