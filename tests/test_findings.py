"""docs/findings.md and the README's numbers are the committed records' (no training).

Every table on docs/findings.md carries a marker (``<!-- table: NAME -->``) naming the checker below that
rebuilds it from its record (docs/results/**, docs/figures/*.csv, benchmarks/results/*.json); each cell is
compared at the precision it is printed with, so a digit edited by hand fails. Numbers in the text are
*claims*: phrases formatted here from the records that must appear verbatim. What is left of the text once
the checked tables and claims are taken out may hold no measured number (a decimal, a percentage, a ratio
``Nx``): a number added without a record fails too. Integers (layers, updates, seeds: settings) and
learning rates in e-notation are not measurements and are not policed. The README's "What we found"
section is held to the same rule, its demo lines are the demo record's, its alpha/beta table is
``deepnorm_constants``, and the relative links of the README and docs/ lead to files and headings that exist.
"""

import csv
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from conftest import ROOT

DOCS = ROOT / "docs"
FINDINGS = DOCS / "findings.md"
README = ROOT / "README.md"

NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?:e-?\d+)?")
MEASURED = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:e-?\d+)?(?:\s?%|x\b)|(?<![\w.])\d+\.\d+(?:e-?\d+)?")
MARKER = re.compile(r"<!-- table: (\w+) -->")


# --- reading the records ------------------------------------------------------------------------------------

def jsonl(path):
    return [json.loads(line) for line in (ROOT / path).read_text().splitlines() if line.strip()]


def csv_rows(path):
    with open(ROOT / path, newline="") as f:
        return list(csv.DictReader(f))


def one(items, what):
    items = list(items)
    assert len(items) == 1, f"{what}: {len(items)} records"
    return items[0]


# --- reading the page ---------------------------------------------------------------------------------------

def split_row(line):
    cells = re.split(r"(?<!\\)\|", line.strip())
    return [c.strip() for c in cells[1:-1]]


def marked_tables(text):
    """{name: (header cells, [row cells])} of the tables that follow a marker, and the remaining text with
    every table line (marked or not) and every marker taken out."""
    lines, tables, rest, unmarked = text.splitlines(), {}, [], []
    i = 0
    while i < len(lines):
        marker = MARKER.fullmatch(lines[i].strip())
        if marker:
            j = i + 1
            block = []
            while j < len(lines) and lines[j].lstrip().startswith("|"):
                block.append(lines[j])
                j += 1
            assert len(block) >= 3, f"table marker {marker[1]} is not followed by a table"
            assert marker[1] not in tables, f"two tables named {marker[1]}"
            tables[marker[1]] = (split_row(block[0]), [split_row(b) for b in block[2:]])
            i = j
            continue
        if lines[i].lstrip().startswith("|"):
            unmarked.append(lines[i])
        else:
            rest.append(lines[i])
        i += 1
    return tables, "\n".join(rest), unmarked


def prose_of(text):
    """The text without fenced code, images, link targets and HTML comments, whitespace collapsed."""
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    text = re.sub(r"!\[[^\]]*\]\([^)]*\)", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    return re.sub(r"\s+", " ", text)


def printed(value, text):
    """``value`` printed with the digits of ``text`` (e.g. '0.702', '4.4e-5', '1,000') is ``text``."""
    text = text.replace(",", "")
    mantissa = text.split("e")[0]
    digits = len(mantissa.split(".")[1]) if "." in mantissa else 0
    return float(format(value, f".{digits}{'e' if 'e' in text else 'f'}")) == float(text)


def check_cell(where, cell, expected, words=()):
    """``cell`` holds exactly the numbers ``expected`` (in order, at their printed precision) and ``words``;
    ``expected`` None: the cell is empty ('–' or blank)."""
    if expected is None:
        assert cell in ("", "–"), f"{where}: {cell!r} has no record"
        return
    found = NUMBER.findall(cell.replace("**", ""))
    assert len(found) == len(expected), f"{where}: {cell!r}, the record has {expected}"
    for text, value in zip(found, expected):
        assert printed(value, text), f"{where}: {cell!r}, the record has {expected}"
    for word in words:
        assert word in cell, f"{where}: {cell!r} should say {word!r}"


def check_table(name, tables, header, expected):
    """``expected``: {row label: [(numbers or None, words), ...]} for every row, in the page's order."""
    assert name in tables, f"docs/findings.md has no table {name}"
    got_header, rows = tables[name]
    assert got_header == header, f"table {name}: header {got_header}"
    assert [r[0] for r in rows] == list(expected), f"table {name}: rows {[r[0] for r in rows]}"
    for row in rows:
        specs = expected[row[0]]
        assert len(row) == len(specs) + 1, f"table {name}, {row[0]}: {len(row) - 1} cells"
        for column, cell, spec in zip(header[1:], row[1:], specs):
            values, words = spec if isinstance(spec, tuple) else (spec, ())
            check_cell(f"table {name}, {row[0]}, {column}", cell, values, words)


class Claims:
    """Phrases formatted from the records; each must be in the prose, and is taken out of it once found."""

    def __init__(self, prose):
        self.prose = prose

    def __call__(self, phrase):
        assert phrase in self.prose, f"not on the page (the records say): {phrase!r}"
        self.prose = self.prose.replace(phrase, " ")

    def assert_nothing_else_measured(self, where):
        stray = MEASURED.findall(re.sub(r"`[^`]*`", " ", self.prose))
        stray = [s for s in stray if "e" not in s]  # learning rates, eps: settings
        assert not stray, f"{where}: numbers without a record (or without a check here): {stray}"


def lr_name(lr):
    mantissa, exponent = f"{lr:e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"


# --- the page's tables --------------------------------------------------------------------------------------

DEMO = "docs/results/demo"
MAP = "docs/figures/stability_map.csv"
ABLATION = "docs/figures/init_ablation.csv"
M30K = "docs/results/multi30k/results.jsonl"
TABLE = ("docs/results/multi30k_table/results.jsonl", "docs/results/multi30k_table/results_source_init.jsonl")
PROTOCOL = "docs/results/paper_protocol/results.jsonl"
GPU = "docs/results/source_init/gpu"
SOURCE_INIT = "docs/results/source_init/results.jsonl"  # issue 34's lanes; seed 1 of 18L-18L is TABLE's
ZERO_SHOT = "docs/results/zero_shot"
ZERO_SHOT_TAGS = "docs/results/zero_shot_tags"  # issue 33's study
DEPLOY = "benchmarks/results/deploy_cpu.json"

MAP_LABELS = {"postln": "Post-LN", "preln": "Pre-LN", "deepnet": "DeepNet",
              "deepnet_torchscale_init": "DeepNet, torchscale's init", "deepnet_source_init": "DeepNet, source init"}
ABLATION_LABELS = {
    "postln": "Post-LN (fairseq's `transformer`)",
    "paper": "DeepNet, paper init",
    "self_attn": "decoder self-attention v/out at gain 1",
    "cross_attn": "decoder cross-attention v/out at gain 1",
    "ffn": "decoder FFN at gain 1",
    "encoder_beta1": "encoder beta 1",
    "decoder_beta1": "decoder beta 1",
    "cross_attn_last": "last layer's cross-attention at gain 1",
    "cross_attn_first": "first layer's cross-attention at gain 1",
    "encoder_beta_quarter": "encoder beta a quarter of the paper's",
    "source": "`--deepnorm-init source` (both: encoder beta / 4, last layer's cross-attention at gain 1)",
}
TRANSLATION_LABELS = {"postln": "Post-LN (fairseq's `transformer`)", "preln": "Pre-LN", "deepnet": "DeepNet",
                      "deepnet_source_init": "DeepNet, `--deepnorm-init source`"}


def demo_summary():
    return json.loads((ROOT / DEMO / "summary.json").read_text())


def demo_line(label, depth, model):
    from deepnet_experiments.demo import LABEL_WIDTH

    return (f"{label:{LABEL_WIDTH}} {depth}: final loss {model['final_loss']:.3f} bits/token, "
            f"held-out accuracy {model['heldout']:.1f}%")


def comparison():
    """comparison.txt: {(model, 'loss' | 'update'): [values at @10 ... @400]}, {model: held-out accuracy text}."""
    lines = (ROOT / DEMO / "comparison.txt").read_text().splitlines()
    marks = [int(m) for m in re.findall(r"@(\d+)", lines[0])]
    series, accuracy = {}, {}
    labels = sorted(demo_summary()["models"], key=len, reverse=True)  # a label as wide as the column: one space
    for line in lines[2:]:
        model = next((label for label in labels if line.startswith(label + " ")), None)
        fields = re.split(r"\s{2,}", line[len(model or ""):].strip())
        if model is None or len(fields) < 1 + len(marks):
            continue
        metric, *values = fields
        kind = "loss" if metric.startswith("train loss") else "update"
        series[model, kind] = [float(v) for v in values[:len(marks)]]
        if len(values) > len(marks):
            accuracy[model] = values[len(marks)]
    return marks, series, accuracy


def check_demo(tables, claim):
    summary = demo_summary()
    marks, series, accuracy = comparison()
    for model in summary["models"]:  # comparison.txt and summary.json are the same run
        assert printed(summary["models"][model]["heldout"], accuracy[model].rstrip("%")), model
    header = ["model", "measured", *[f"@{m}" for m in marks], "held-out accuracy"]
    assert "demo" in tables, "docs/findings.md has no table demo"
    _, rows = tables["demo"]
    assert [(r[0], r[1].split()[0]) for r in rows] == [(m, k) for m in summary["models"]
                                                       for k in ("train", "update")], "table demo: rows"
    assert tables["demo"][0] == header, f"table demo: header {tables['demo'][0]}"
    for row in rows:
        model, kind = row[0], "loss" if row[1].startswith("train loss") else "update"
        for column, cell, value in zip(header[2:], row[2:], series[model, kind]):
            check_cell(f"table demo, {model} {kind}, {column}", cell, [value])
        heldout = [summary["models"][model]["heldout"]] if kind == "loss" else None
        check_cell(f"table demo, {model}, held-out", row[-1], heldout)
    settings = summary["settings"]
    claim(f"at {summary['depth']}, d64 (FFN 128, 2 heads), {settings['updates']} updates each with the same seed, "
          f"lr {lr_name(settings['lr'])} and {settings['warmup']} warm-up updates")
    claim(f"scores {summary['unigram_entropy_bits']:.2f} bits")
    claim(f"moved {series['Post-LN', 'update'][0]:.3f} from its initial output and DeepNet's "
          f"{series['DeepNet, paper init', 'update'][0]:.3f}")


def check_stability_map(tables, claim):
    rows = [r for r in csv_rows(MAP) if r["warmup"] == "100"]
    lrs = sorted({float(r["lr"]) for r in rows})
    header = ["method", "layers", *[f"lr {lr_name(lr)}" for lr in lrs]]
    assert "stability_map" in tables, "docs/findings.md has no table stability_map"
    assert tables["stability_map"][0] == header, f"table stability_map: header {tables['stability_map'][0]}"
    _, page = tables["stability_map"]
    claim(f"peak learning rates from {lr_name(lrs[0])} to {lr_name(lrs[-1])}")
    cells = {(r["method"], int(r["depth"]), float(r["lr"])): r for r in rows}
    keys = [(m, d) for m in MAP_LABELS for d in sorted({int(r["depth"]) for r in rows if r["method"] == m})]
    assert [(r[0], r[1]) for r in page] == [(MAP_LABELS[m], f"{d}L-{d}L") for m, d in keys]
    for (method, depth), row in zip(keys, page):
        for column, cell, lr in zip(header[2:], row[2:], lrs):
            record = cells.get((method, depth, lr))
            where = f"table stability_map, {row[0]} {row[1]}, {column}"
            if record is None:
                check_cell(where, cell, None)
            else:
                check_cell(where, cell, [float(record["valid_nll"]), float(record["src_dep"])], [record["status"]])
    for method, label in MAP_LABELS.items():
        mine = [r for r in rows if r["method"] == method]
        n = Counter(r["status"] for r in mine)
        claim(f"{label}: {n['trains']} train, {n['stalls']} stall, {n['diverges']} diverge (of {len(mine)})")
    # the rule's thresholds, as the classifier wrote them into each cell's reason
    margin = {m.groups() for r in rows for m in [re.search(r"not ([\d.]+) below unigram ([\d.]+)", r["reason"])] if m}
    min_src_dep = {m[1] for r in rows for m in [re.search(r"< ([\d.]+) bits", r["reason"])] if m}
    (margin, unigram), = margin
    (min_src_dep,) = min_src_dep
    claim(f"not {margin} bits below the targets' unigram entropy ({unigram} bits)")
    claim(f"is below {min_src_dep} bits")

    def trains(method, depth):
        return sorted(lr for (m, d, lr), r in cells.items() if m == method and d == depth and r["status"] == "trains")

    def every(depth):
        return sorted(lr for (m, d, lr) in cells if m == "preln" and d == depth)

    assert trains("postln", 18) == trains("postln", 50) == []
    post = trains("postln", 6)
    claim(f"trains only at 6L-6L (lr {lr_name(post[0])} to {lr_name(post[-1])})")
    pre6, pre18, pre50 = trains("preln", 6), trains("preln", 18), trains("preln", 50)
    assert pre18 == every(18) and len(pre50) == 1
    claim(f"({lr_name(pre6[0])} to {lr_name(pre6[-1])} at 6L-6L, every rate at 18L-18L, "
          f"{lr_name(pre50[0])} at 50L-50L)")
    deepnet = [float(r["src_dep"]) for r in rows if r["method"] == "deepnet"]
    assert not any(r["status"] == "diverges" for r in rows if r["method"] == "deepnet")
    claim(f"stays at {min(deepnet):.3f}-{max(deepnet):.3f} bits")
    return cells


def ablation_values():
    peak, source = {}, {}
    for r in csv_rows(ABLATION):
        if r["part"] == "bound":
            key = r["variant"], int(r["depth"])
            peak[key] = max(peak.get(key, float("-inf")), float(r["value"]))
        else:
            source[r["variant"], r["quantity"], int(r["update"])] = float(r["value"])
    return peak, source


def check_init_ablation(tables, claim, map_cells):
    peak, source = ablation_values()
    depths = sorted({d for _, d in peak})
    assert depths == [6, 18, 50, 100]

    def src_dep(variant, updates):  # the probe logged with update u + 1 measured the model after u updates
        return source[variant, "src_dep (bits/token)", updates + 1]

    def update(variant, depth):
        return [peak[variant, depth], peak["postln", depth] / peak[variant, depth]]

    expected = {}
    for variant, label in ABLATION_LABELS.items():
        if variant == "postln":
            first = [None, None, None]
        else:
            nll = one((v for (var, q, _), v in source.items() if var == variant and q == "valid NLL (bits)"),
                      f"{variant} valid NLL")
            first = [[src_dep(variant, 200)], [src_dep(variant, 350)], [nll]]
        expected[label] = first + [update(variant, d) for d in depths]
    check_table("init_ablation", tables, ["variant", "`src_dep` u=200", "`src_dep` u=350", "valid NLL",
                                          "update 6L-6L", "18L-18L", "50L-50L", "100L-100L"], expected)
    claim(f"only {update('decoder_beta1', 100)[1]:.1f}x theirs at 100L-100L, against "
          f"{update('paper', 100)[1]:.1f}x with the paper's init")
    claim(f"(`src_dep` {src_dep('source', 200):.3f} bits, where the paper's init measures "
          f"{src_dep('paper', 350):.3f} even after 350)")
    assert src_dep("paper", 200) == src_dep("paper", 350)
    claim(f"stays {update('source', 100)[1]:.1f}x above its own at 100L-100L")
    mine = [r for (m, _, _), r in map_cells.items() if m == "deepnet_source_init"]
    n = Counter(r["status"] for r in mine)
    paper = Counter(r["status"] for (m, _, _), r in map_cells.items() if m == "deepnet")
    assert paper["trains"] == 0 and n["diverges"] == 0
    claim(f"trains in {n['trains']} of {len(mine)} cells (the paper's init in none) and diverges in none")


def translation_records():
    records = [r for path in TABLE for r in jsonl(path)]
    evals = {}
    for r in records:
        if r["kind"] == "eval":
            evals.setdefault((r["arch"], r["encoder_layers"], r["max_update"]), []).append(r)
    trains = {}
    for r in records:
        if r["kind"] == "train":
            # a train record names the arch; the source init's runs live in a folder of that name
            arch = "deepnet_source_init" if "deepnet_source_init" in r["run_dir"] else r["arch"]
            trains.setdefault((arch, r["encoder_layers"], r["updates"]), []).append(r)
    return evals, trains


def check_multi30k(tables, claim):
    m30k = jsonl(M30K)
    averaged = [r for r in m30k if r["kind"] == "eval" and len(r["averaged"]) == 5]
    assert len({r["bleu"] for r in averaged}) == 1
    claim(f"**BLEU {averaged[0]['bleu']:.2f}**")
    claim(f"copying the source scores {one({r['copy_source_bleu'] for r in averaged}, 'copy BLEU'):.2f}")
    evals, trains = translation_records()
    columns = [(6, 1500), (18, 1500), (18, 3000)]
    expected = {}
    for arch, label in TRANSLATION_LABELS.items():
        cells = []
        for layers, updates in columns:
            if (arch, layers, updates) not in evals:
                cells.append(None)
                continue
            bleu = one(evals[arch, layers, updates], f"{arch} {layers}L {updates} eval")["bleu"]
            loss = one(trains[arch, layers, updates], f"{arch} {layers}L {updates} train")["valid_loss"]
            cells.append(([bleu, loss], ("stalled",) if bleu < 1 else ()))
        expected[label] = cells
    check_table("multi30k_short", tables, ["model", "6L-6L, 1,500 updates", "18L-18L, 1,500 updates",
                                           "18L-18L, 3,000 updates"], expected)
    return evals


def check_paper_protocol(tables, claim, short_evals):
    records = jsonl(PROTOCOL)
    evals = {(r["arch"], r["max_update"]): r for r in records if r["kind"] == "eval"}
    trains = {(r["arch"], r["updates"]): r for r in records if r["kind"] == "train"}
    assert len(evals) == len([r for r in records if r["kind"] == "eval"])
    marks = sorted({u for _, u in evals})
    expected = {label: [[evals[arch, u]["bleu"], trains[arch, u]["valid_loss"]] for u in marks]
                for arch, label in TRANSLATION_LABELS.items() if arch != "deepnet_source_init"}
    check_table("paper_protocol", tables, ["model", *[f"{u:,}" for u in marks]], expected)
    last = marks[-1]
    bleu = {arch: evals[arch, last]["bleu"] for arch in ("postln", "preln", "deepnet")}
    claim(f"ends {bleu['deepnet'] - bleu['postln']:.2f} BLEU behind DeepNet")
    claim(f"({abs(bleu['preln'] - bleu['deepnet']):.2f} BLEU apart)")
    short = {r["bleu"] for (arch, layers, _), rs in short_evals.items() if arch == "postln" and layers == 18
             for r in rs}
    claim(f"left it at BLEU {one(short, 'Post-LN 18L short warm-up BLEU'):.2f}")
    checkpoints = {tuple(evals[arch, 6000]["averaged"]) for arch in bleu}
    updates = [int(re.search(r"_(\d+)\.pt$", c)[1]) for c in one(checkpoints, "6,000 averaged")]
    claim(f"updates {updates[0]:,}-{updates[-1]:,}")


ZERO_SHOT_MODELS = {"postln": "Post-LN", "preln": "Pre-LN", "deepnet": "DeepNet",
                    "deepnet_source": "DeepNet, source init"}


def mean_sd(values):
    mean = sum(values) / len(values)
    sd = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else 0.0
    return mean, sd


def zero_shot_runs():
    """results.jsonl: {(model folder, updates): {seed: the latest eval record}}."""
    runs = {}
    for r in jsonl(f"{ZERO_SHOT}/results.jsonl"):
        if r["kind"] == "eval":
            folder = Path(r["run_dir"])
            seed = int(re.fullmatch(r"seed(\d+)", folder.parents[2].name)[1])
            runs.setdefault((folder.parent.name, r["updates"]), {})[seed] = r
    return runs


ZERO_SHOT_COLUMNS = (("supervised bleu", "bleu", False), ("zero-shot bleu", "bleu", True),
                     ("zero-shot on-target", "target_lang_acc", True))


def zero_shot_summary():
    """{(model, updates, seeds): {column: (mean, sd)}} from the per-direction records: each run's mean over
    its supervised (zero-shot) directions, then the mean and sample standard deviation over the seeds.
    summary.csv holds the same, rounded to 3 digits."""
    runs = zero_shot_runs()
    csv_summary = {(r["model"], int(r["updates"])): r for r in csv_rows(f"{ZERO_SHOT}/summary.csv")}
    assert len(csv_summary) == len(runs)
    out = {}
    for folder, updates in sorted(runs, key=lambda k: (k[1], list(ZERO_SHOT_MODELS).index(k[0]))):
        seeds, model = runs[folder, updates], ZERO_SHOT_MODELS[folder]
        row = out[model, str(updates), ",".join(map(str, sorted(seeds)))] = {}
        for name, field, zero_shot in ZERO_SHOT_COLUMNS:
            per_run = [mean_sd([d[field] for d in r["directions"] if d["zero_shot"] == zero_shot])[0]
                       for r in seeds.values()]
            row[name] = mean_sd(per_run)
            record = csv_summary[model, updates]
            assert tuple(round(x, 3) for x in row[name]) == (float(record[f"{name} mean"]),
                                                             float(record[f"{name} sd"])), (model, updates, name)
    return out


def check_zero_shot(tables, claim):
    header = ["model", "updates", "seeds", "supervised BLEU", "zero-shot BLEU", "zero-shot on target (%)"]
    runs = zero_shot_runs()
    summary = zero_shot_summary()
    expected = {key: [list(row[name]) if "," in key[2] else [row[name][0]] for name, _, _ in ZERO_SHOT_COLUMNS]
                for key, row in summary.items()}
    assert "zero_shot" in tables, "docs/findings.md has no table zero_shot"
    assert tables["zero_shot"][0] == header, f"table zero_shot: header {tables['zero_shot'][0]}"
    _, rows = tables["zero_shot"]
    assert [tuple(r[:3]) for r in rows] == list(expected), [tuple(r[:3]) for r in rows]
    for row, specs in zip(rows, expected.values()):
        for column, cell, values in zip(header[3:], row[3:], specs):
            check_cell(f"table zero_shot, {row[0]} {row[1]}, {column}", cell, values)
    evals = [r for seeds in runs.values() for r in seeds.values()]
    zero_shot = [d for r in evals for d in r["directions"] if d["zero_shot"]]
    claim(f"BLEU at most {max(d['bleu'] for d in zero_shot):.2f} in any direction of any run")
    claim(f"copying the source scores {one({d['copy_source_bleu'] for d in zero_shot}, 'copy BLEU'):.2f}")
    deepnet = [d["target_lang_acc"] for r in runs["deepnet", 1500].values() for d in r["directions"] if d["zero_shot"]]
    assert len(deepnet) == 6  # 3 seeds x de-fr, fr-de
    claim(f"range from {min(deepnet):.1f} to {max(deepnet):.1f} % on target")


def check_deploy(tables, claim):
    record = json.loads((ROOT / DEPLOY).read_text())
    res = record["results"]
    rounds = record["rounds"]
    fairseq = res["fairseq"]["median_sentences_per_s"]

    def row(key, timed=True):
        r = res[key]
        speed = [[r["median_sentences_per_s"]], [r["median_sentences_per_s"] / fairseq]] if timed else [None, None]
        diff = r.get("max_abs_log_prob_difference_vs_original", 0)
        return speed + [[r["bleu"]], [r["same_hypotheses_as_fairseq"], record["sentences"]], [diff]]

    expected = {
        "fairseq-generate, DeepNet checkpoint (`--user-dir`)": row("fairseq"),
        "fairseq-generate, exported `transformer` (no plugin)": row("fairseq_plain_transformer", timed=False),
        "CTranslate2 float32": row("ct2_float32"),
        "CTranslate2 int8": row("ct2_int8"),
    }
    for key in ("ct2_float32", "ct2_int8"):  # the record's own rounding of the ratio
        assert printed(res[key]["median_sentences_per_s"] / fairseq, str(res[key]["speedup_vs_fairseq"]))
    check_table("deploy", tables, ["engine", f"sentences/s (median of {rounds})", "vs fairseq-generate", "BLEU",
                                   "hypotheses = fairseq-generate's", r"max \|log-prob diff\|"], expected)
    claim(f"({record['sentences']} sentences), beam {record['decoding']['beam']}")
    claim(f"{rounds} interleaved rounds")
    return record


def findings():
    text = FINDINGS.read_text()
    tables, rest, unmarked = marked_tables(text)
    assert not unmarked, f"docs/findings.md: tables without a marker (and a check): {unmarked[:2]}"
    return text, tables, Claims(prose_of(rest))


def test_findings_page_tables_and_numbers_are_the_records():
    text, tables, claim = findings()
    summary = demo_summary()
    for label, model in summary["models"].items():
        assert demo_line(label, summary["depth"], model) in text, demo_line(label, summary["depth"], model)
    check_demo(tables, claim)
    map_cells = check_stability_map(tables, claim)
    check_init_ablation(tables, claim, map_cells)
    short = check_multi30k(tables, claim)
    check_paper_protocol(tables, claim, short)
    check_zero_shot(tables, claim)
    check_deploy(tables, claim)
    checked = {"demo", "stability_map", "init_ablation", "multi30k_short", "paper_protocol", "zero_shot", "deploy"}
    assert set(tables) == checked, f"tables without a checker: {set(tables) - checked}"
    claim.assert_nothing_else_measured("docs/findings.md")


def readme_section(text, title):
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert match, f"README has no section '{title}'"
    return match[1]


def test_readme_numbers_are_the_records():
    text = README.read_text()
    assert len(text.splitlines()) <= 150, "the README is read to the end: at most 150 lines"
    summary = demo_summary()
    for label, model in summary["models"].items():
        assert demo_line(label, summary["depth"], model) in text, demo_line(label, summary["depth"], model)
    found = readme_section(text, "What we found")
    assert "(docs/findings.md)" in found
    claim = Claims(prose_of(found))
    evals, _ = translation_records()
    bleu = {arch: one(evals[arch, 18, 3000], arch)["bleu"] for arch in TRANSLATION_LABELS}
    claim(f"Multi30k BLEU {bleu['postln']:.2f} after 3,000 updates")
    claim(f"Pre-LN reaches {bleu['preln']:.2f} and DeepNet {bleu['deepnet']:.2f}")
    claim(f"`--deepnorm-init source` reaches {bleu['deepnet_source_init']:.2f}")
    cells = [r for r in csv_rows(MAP) if r["warmup"] == "100"]
    source = [r for r in cells if r["method"] == "deepnet_source_init"]
    paper = [r for r in cells if r["method"] == "deepnet"]
    assert not any(r["status"] == "diverges" for r in paper)
    claim(f"trains in {sum(r['status'] == 'trains' for r in source)} of {len(source)} cells of the stability map "
          f"(paper init: {sum(r['status'] == 'trains' for r in paper)})")
    from deepnet_experiments import schemes_tables

    schemes_map = schemes_tables.read_map(ROOT / MAP)
    protocol = {(r["arch"], r["max_update"]): r["bleu"] for r in jsonl(PROTOCOL) if r["kind"] == "eval"}
    claim(f"ends at {protocol['postln', 8000]:.2f}; DeepNet ({protocol['deepnet', 8000]:.2f}) and "
          f"Pre-LN ({protocol['preln', 8000]:.2f}) end level")
    assert abs(protocol["deepnet", 8000] - protocol["preln", 8000]) < 0.5
    by_stage = {r["max_update"]: r["bleu"] for r in jsonl(SOURCE_INIT)
                if r["kind"] == "eval" and "/protocol/" in r["run_dir"]}
    claim(f"the source init keeps up with the paper's there ({by_stage[8000]:.2f} against {protocol['deepnet', 8000]:.2f} "
          "at 8,000)")
    assert all(bleu > protocol["deepnet", updates] - 0.5 for updates, bleu in by_stage.items())  # at every stage
    from deepnet_experiments import seeds_table

    records = [r for path in (*TABLE, SOURCE_INIT) for r in jsonl(path)]
    depth = {(row["method"], row["depth"]): row for row in seeds_table.table(seeds_table.runs(
        records, {"seed": 1, "lr": 0.002, "warmup_updates": 100, "width": 64})) if row["updates"] == 1500 and row["lr"] == 0.002}
    source18, paper18 = depth["deepnet_source", "18L-18L"], depth["deepnet", "18L-18L"]
    claim(f"the source init scores {depth['deepnet_source', '6L-6L']['bleu_mean']:.2f} at 6L-6L, "
          f"{source18['bleu_mean']:.2f} at 18L-18L ({source18['seeds']} seeds, {source18['bleu_min']:.2f}-"
          f"{source18['bleu_max']:.2f}) and {depth['deepnet_source', '50L-50L']['bleu_mean']:.2f} at 50L-50L")
    claim(f"the paper init falls to {paper18['bleu_mean']:.2f} at 18L-18L ({paper18['seeds']} seeds) and "
          f"{depth['deepnet', '50L-50L']['bleu_mean']:.2f} at 50L-50L, Pre-LN to {depth['preln', '50L-50L']['bleu_mean']:.2f} "
          f"and Post-LN to {depth['postln', '50L-50L']['bleu_mean']:.2f} there")
    from deepnet_setups import report

    gpu = {(r["run"]["lr"], report.model_name(r)): r for path in (GPU, f"{GPU}/lr5e-4")
           for r in jsonl(f"{path}/results.jsonl") if r["kind"] == "eval"}
    stalled = [gpu[0.002, name] for name in ("deepnet", "deepnet_source")]
    assert {(r["encoder_layers"], r["run"]["width"], r["run"]["precision"], r["run"]["device"])
            for r in stalled} == {(50, 256, "fp16", "cuda")}
    assert len({f"{r['bleu']:.2f}" for r in stalled}) == 1  # "both inits stall (BLEU x)": one figure for both
    claim(f"On a GPU at d256 (50L-50L, fp16, {stalled[0]['updates']} updates) that lr is too high for DeepNet: both inits "
          f"stall (BLEU {stalled[0]['bleu']:.2f}; Pre-LN {gpu[0.002, 'preln']['bleu']:.2f}) and train at 5e-4")
    trained = {r["run_dir"]: r["valid_loss"] for r in jsonl(f"{GPU}/lr5e-4/results.jsonl") if r["kind"] == "train"}
    plateau = min(r["valid_loss"] for r in jsonl(f"{GPU}/results.jsonl")
                  if r["kind"] == "train" and r["arch"] == "deepnet")
    assert len(trained) == 2 and max(trained.values()) < plateau - 1  # both inits leave the plateau at 5e-4
    from deepnet_experiments import zero_shot_study

    tags = {(row["model"], row["updates"]): row
            for row in zero_shot_study.summarise(jsonl(f"{ZERO_SHOT_TAGS}/remedy/results.jsonl"))}
    default, plain = tags["DeepNet, source init", 1500], tags["DeepNet, source init, t-enc-t-dec", 1500]
    assert (default["seeds"], plain["seeds"]) == ("1", "1,2,3")
    claim(f"answers in the asked language {plain['zero-shot on-target'][0]:.1f} % of the time (fairseq's tags, seed 1: "
          f"{default['zero-shot on-target'][0]:.1f} %), but with {plain['zero-shot / pivot'][0]:.2f} of the BLEU")
    robt = tags["DeepNet, source init, t-enc-t-dec, ROBT", 1500]
    assert robt["seeds"] == plain["seeds"]  # the supervised cost is against the same seeds without a remedy
    claim(f"back-translating online gives {robt['zero-shot on-target'][0]:.1f} % and {robt['zero-shot / pivot'][0]:.2f} "
          f"for {plain['supervised bleu'][0] - robt['supervised bleu'][0]:.1f} supervised BLEU")
    crossconst = {row["model"]: row for row in zero_shot_study.summarise(jsonl(f"{ZERO_SHOT_TAGS}/crossconst/results.jsonl"))
                  if row["updates"] == 1500}["DeepNet, source init, t-enc-t-dec, CrossConST 0.1"]
    assert crossconst["seeds"] == plain["seeds"]
    claim(f"CrossConST (weight 0.1, from scratch) {crossconst['zero-shot on-target'][0]:.1f} % and "
          f"{crossconst['zero-shot / pivot'][0]:.2f} for "
          f"{plain['supervised bleu'][0] - crossconst['supervised bleu'][0]:.2f}, short of "
          f"{zero_shot_study.GOAL_OVER_PIVOT:g} for at most {zero_shot_study.GOAL_SUPERVISED_COST:g}")
    assert crossconst["zero-shot / pivot"][0] < zero_shot_study.GOAL_OVER_PIVOT  # "short of"
    from deepnet_experiments import figures

    fig5 = figures.read_fig5(ROOT / "docs/figures/fig5_update_norm.csv")

    def post_over(method, depth, u):  # Post-LN's largest update up to update u over the method's
        return figures.ratio(*(max(v for k, v in fig5[m, depth].items() if k <= u) for m in ("postln", method)))

    shallow = [post_over("deepnet", depth, 50) for depth in (6, 18, 50, 100)]
    claim(f"Post-LN's early update is {min(shallow):.1f}-{max(shallow):.1f}x DeepNet's in the first 50 updates")
    deep = {(m, d, u): post_over(m, d, u) for m in ("deepnet", "deepnet_source", "preln") for d in (250, 500) for u in (25, 50)}
    claim(f"at 250L-250L and 500L-500L {deep['deepnet', 250, 25]:.1f}x and {deep['deepnet', 500, 25]:.1f}x in the first "
          f"25, {deep['deepnet', 250, 50]:.1f}x and {deep['deepnet', 500, 50]:.1f}x in the first 50")
    reach = jsonl("docs/results/reach/results.jsonl")
    run500 = [r for r in reach if r["run_dir"].endswith("/deep/lr1e-3/source/seed1/500L-500L")]
    bleu500 = one({r["bleu"] for r in run500 if r["kind"] == "eval" and r["updates"] == 500}, "500L BLEU at 500")
    loss500 = one({r["valid_loss"] for r in run500 if r["kind"] == "train" and r["updates"] == 500}, "500L valid loss")
    run5e4 = [r for r in reach if r["run_dir"].endswith("/deep/lr5e-4/source/seed1/500L-500L") and r["updates"] == 500]
    loss5e4 = one({r["valid_loss"] for r in run5e4 if r["kind"] == "train"}, "500L valid loss at 5e-4")
    assert loss5e4 < loss500 - 0.5  # below the plateau
    bleu5e4 = one({r["bleu"] for r in run5e4 if r["kind"] == "eval"}, "500L BLEU at 5e-4")
    run1000 = [r for r in reach if r["run_dir"].endswith("/deep/lr5e-4/source/seed1/500L-500L") and r["updates"] == 1000]
    bleu1000 = one({r["bleu"] for r in run1000 if r["kind"] == "eval"}, "500L BLEU at 1,000")
    loss1000 = one({r["valid_loss"] for r in run1000 if r["kind"] == "train"},
                   "500L valid loss at 1,000")
    bleu100 = one({r["bleu"] for r in reach if r["kind"] == "eval" and r["updates"] == 1000
                   and r["run_dir"].endswith("/deep/lr5e-4/source/seed1/100L-100L")}, "100L BLEU at 1,000")
    claim(f"At lr 5e-4 the source init's 100L-100L reaches BLEU {bleu100:.2f} after 1,000 updates, 500L-500L only "
          f"{bleu5e4:.2f} after 500 and {bleu1000:.2f} after 1,000 (valid loss {loss5e4:.3f}, {loss1000:.3f}; at 1e-3 "
          f"{loss500:.3f}, BLEU {bleu500:.2f}: the unigram plateau;")
    from deepnet_experiments import reach_tables

    others = [r for path in ("docs/results/schemes/results.jsonl", *TABLE) for r in jsonl(path)]  # d64 cells
    rows = [r for r in reach_tables.width_rows(reach + others) if r["device"] == "cpu"]
    best = {(r["width"], r["method"]): r for r in rows if r["best_rate"]}
    assert all(best[w, "deepnet_source"]["best_of_width"] for w in (64, 128))
    gap = {w: best[w, "deepnet_source"]["bleu"] - best[w, "preln"]["bleu"] for w in (64, 128)}
    assert (best[64, "deepnet_source"]["lr"], best[64, "preln"]["lr"]) == (4e-3, 8e-3)
    assert best[128, "deepnet_source"]["lr"] == best[128, "preln"]["lr"] == 2e-3
    claim(f"the source init leads Pre-LN by {gap[64]:.2f} BLEU at d64 ({best[64, 'deepnet_source']['bleu']:.2f} at")
    claim(f"4e-3, {best[64, 'preln']['bleu']:.2f} at 8e-3) and {gap[128]:.2f} at d128 "
          f"({best[128, 'deepnet_source']['bleu']:.2f}, {best[128, 'preln']['bleu']:.2f}, both 2e-3)")
    width = {(r["width"], r["method"], r["lr"]): r["bleu"] for r in rows}
    claim(f"it stalls at d128 4e-3 ({width[128, 'deepnet_source', 0.004]:.2f}) and d256 2e-3 "
          f"({width[256, 'deepnet_source', 0.002]:.2f})")
    assert max(width[w, "deepnet_source", lr] for w, lr in ((128, 0.004), (256, 0.002))) < reach_tables.STALLED_BLEU
    import csv

    table = {(r["depth"], r["method"]): float(r["bleu"])
             for r in csv.DictReader((ROOT / "docs/results/schemes/table.csv").open())}  # the records': test_schemes_tables
    new = [m for d, m in table if d == "18L-18L" and m not in ("deepnet_source", "preln")]
    assert all(table[d, "lns"] == max(table.get((d, m), 0) for m in new) for d in ("18L-18L", "50L-50L"))
    claim(f"LayerNorm Scaling comes closest: {table['18L-18L', 'lns']:.2f} at 18L-18L and {table['50L-50L', 'lns']:.2f} "
          f"at 50L-50L")
    claim(f"against the source init's {table['18L-18L', 'deepnet_source']:.2f} and {table['50L-50L', 'deepnet_source']:.2f}; "
          f"Peri-LN scores {table['18L-18L', 'periln']:.2f} and {table['50L-50L', 'periln']:.2f}, Mix-LN "
          f"{table['18L-18L', 'mixln']:.2f} at 18L-18L")
    assert all(schemes_tables.best_rate(schemes_map["dyt", d]) is None for d in (18, 50))  # "trains at no rate"
    deploy = json.loads((ROOT / DEPLOY).read_text())
    ct2 = deploy["results"]["ct2_float32"]
    assert ct2["same_hypotheses_as_fairseq"] == deploy["sentences"]
    claim(f"{ct2['speedup_vs_fairseq']}x faster than fairseq-generate on CPU, with the same "
          f"{deploy['sentences']} hypotheses")
    claim.assert_nothing_else_measured("README.md, What we found")
    # the install paragraph's versions are the ones the installer pins
    install = (ROOT / "scripts" / "install.sh").read_text()
    for pin in re.findall(r"`((?:torch|fairseq-fixed)==[\d.]+)`", text):
        assert pin in install, pin
    assert "torchscale 0.3.0" in text and "torchscale==0.3.0" in (ROOT / "requirements.no-deps.txt").read_text()


def formula(text):
    """'0.81 (N⁴M)^(1/16)' -> a function of N and M; '–' -> None."""
    if text == "–":
        return None
    expr = text.replace("⁴", "^4").replace("−", "-").replace("^", "**")
    expr = re.sub(r"(?<=[\dNM)])\s*(?=[(NM])", "*", expr)
    assert re.fullmatch(r"[\d.*()/+\-NM ]+", expr), text
    return lambda n, m: eval(expr, {"__builtins__": {}}, {"N": n, "M": m})  # noqa: S307 (digits, N, M only)


def test_readme_alpha_beta_table_is_deepnorm_py():
    from deepnet_fairseq.models.deepnorm import deepnorm_constants

    lines = [line for line in README.read_text().splitlines() if line.startswith("| ")]
    header = [line for line in lines if line.startswith("| architecture |")]
    assert header and split_row(header[0])[1:] == ["encoder alpha", "encoder beta", "decoder alpha", "decoder beta"]
    rows = {split_row(line)[0].split(" (")[0]: [formula(c) for c in split_row(line)[1:]] for line in lines
            if line.startswith(("| encoder-decoder", "| encoder-only", "| decoder-only"))}
    shapes = {"encoder-decoder": [(6, 6), (18, 18), (100, 100), (12, 3)], "encoder-only": [(6, 0), (48, 0)],
              "decoder-only": [(0, 6), (0, 64)]}
    assert set(rows) == set(shapes)
    for kind, cells in rows.items():
        for n, m in shapes[kind]:
            constants = deepnorm_constants(n, m)
            for cell, name in zip(cells, ("encoder_alpha", "encoder_beta", "decoder_alpha", "decoder_beta")):
                value = getattr(constants, name)
                if cell is None:
                    assert value is None, (kind, name)
                else:
                    assert value == pytest.approx(cell(n, m), rel=1e-12), (kind, name, n, m)


def slug(heading):
    """GitHub's anchor of a Markdown heading."""
    heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", heading).replace(" ", "-")


def anchors(path):
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    seen, out = Counter(), set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        s = slug(heading)
        out.add(s if not seen[s] else f"{s}-{seen[s]}")
        seen[s] += 1
    return out


def test_readme_and_docs_links_lead_somewhere():
    pages = [README, *sorted(DOCS.glob("*.md")), *sorted(DOCS.glob("*/README.md")), *sorted(DOCS.glob("results/*/README.md")),
             ROOT / "benchmarks" / "README.md"]
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target, anchor in re.findall(r"\]\((?!https?:|mailto:)([^)#\s]*)(?:#([^)\s]*))?\)", text):
            path = (page.parent / target).resolve() if target else page
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{page.relative_to(ROOT)}: {target}#{anchor}")
    assert not broken, broken
