"""Turn run records (``paths.results``, one JSON object per line) into the paper's kind of tables.

    python -m deepnet_fairseq.setups.report RESULTS.jsonl [...] [--out-dir DIR]

For every setup: a table of BLEU with one row per architecture and one column per depth (the
latest evaluation of each run; "diverged" where training diverged), written as Markdown and CSV,
plus ``runs.csv`` listing every record.
"""

import argparse
import csv
import io
import json
import sys
from pathlib import Path

ARCH_ORDER = {"postln": 0, "preln": 1, "deepnet": 2}
ARCH_NAMES = {"postln": "Post-LN", "preln": "Pre-LN", "deepnet": "DeepNet"}
RUN_FIELDS = ["kind", "setup", "arch", "encoder_layers", "decoder_layers", "updates", "final_loss", "valid_loss",
              "bleu", "copy_source_bleu", "sacrebleu", "signature", "diverged", "wall_time_s", "run_dir", "time"]


def read_records(paths):
    records = []
    for path in paths:
        for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    raise ValueError(f"{path}:{number}: not a JSON record") from None
    return records


def depth(record):
    return f"{record['encoder_layers']}L-{record['decoder_layers']}L"


def tables(records):
    """setup -> (depth columns, {arch: {depth: cell}}, signature)."""
    out = {}
    for r in records:
        if r.get("encoder_layers") is None or r.get("arch") is None:
            continue
        setup = out.setdefault(r["setup"], {"cells": {}, "signatures": set()})
        cell = setup["cells"].setdefault(r["arch"], {})
        key = depth(r)
        if r["kind"] == "train" and r.get("diverged"):
            cell[key] = "diverged"
        elif r["kind"] == "eval" and cell.get(key) != "diverged":
            cell[key] = f"{r['bleu']:.2f}"
            setup["signatures"].add(r.get("signature", ""))
    result = {}
    for name, setup in out.items():
        depths = sorted({d for cells in setup["cells"].values() for d in cells}, key=lambda d: int(d.split("L")[0]))
        archs = sorted(setup["cells"], key=lambda a: (ARCH_ORDER.get(a, 9), a))
        rows = [[ARCH_NAMES.get(a, a)] + [setup["cells"][a].get(d, "-") for d in depths] for a in archs]
        result[name] = (["model"] + depths, rows, sorted(s for s in setup["signatures"] if s))
    return result


def markdown(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def write_atomic(path, text):
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.rename(path)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="scripts/report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", help="results files (JSON lines)")
    parser.add_argument("--out-dir", default="report", help="where the tables go (default: report/)")
    args = parser.parse_args(argv)
    try:
        for path in args.results:
            if not Path(path).is_file():
                raise ValueError(f"{path}: results file not found")
        records = read_records(args.results)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not records:
        print(f"error: {', '.join(args.results)}: no records", file=sys.stderr)
        return 2
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sections = []
    for setup, (header, rows, signatures) in sorted(tables(records).items()):
        sections.append(f"## {setup}\n\nBLEU by depth (encoder-decoder layers)\n\n{markdown(header, rows)}\n")
        if signatures:
            sections[-1] += "\n" + "\n".join(f"sacreBLEU signature: `{s}`" for s in signatures) + "\n"
        buffer = io.StringIO()
        csv.writer(buffer).writerows([header] + rows)
        write_atomic(out / f"{setup}.csv", buffer.getvalue())
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=RUN_FIELDS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(records)
    write_atomic(out / "runs.csv", buffer.getvalue())
    text = "# Results\n\n" + "\n".join(sections)
    write_atomic(out / "results.md", text)
    print(text)
    print(f"[report] {len(records)} records -> {out}/results.md, {out}/runs.csv and one CSV per setup")
    return 0


if __name__ == "__main__":
    sys.exit(main())
