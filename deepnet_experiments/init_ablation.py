"""Which part of DeepNet's init silences the source, and what each fix costs the update bound.

    python -m deepnet_experiments.init_ablation --out DIR [--variants paper,cross_attn,...]
        [--depths 6,18,50,100] [--jobs 2] [--csv docs/figures/init_ablation.csv]

Each variant is DeepNet with one group of the paper's beta-scaled weights left at Xavier gain 1
(``--deepnorm-gains``, ``--deepnorm-{encoder,decoder}-beta 1``, ``--deepnorm-init source``), and
is measured twice:

- **source**: the stability map's cell at 18L-18L (Multi30k de-en through the shipped pipeline,
  64-128-2, lr 2e-3, warm-up 100, 1,000 tokens, seed 1; ``stability_map.run_cell``), 400 updates,
  with ``src_dep`` (bits per target token the true source saves) and the decoder's cross-attention /
  residual ratio (mean of ``xattn_<i>``) probed every 50 updates;
- **bound**: DeepNet Fig. 5's setting (``figures.py``: first 3,000 pairs, lr 5e-4 with 4,000 warm-up
  updates), the largest model update ||F(x,θ_t) − F(x,θ_0)|| over the first 50 updates at each depth,
  against fairseq's Post-LN ``transformer`` in the same setting.

Finished runs are kept (``OUT/*/runs/*/.done``), so an interrupted call resumes and a later call with
more variants adds to the same tables.
"""

import argparse
import math
import sys
from argparse import Namespace
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import deepnet_methods

from . import figures, plateau, stability_map, sweep

# DeepNet's ablations: name -> (label, more fairseq-train options, or a function of the depth giving them). A method of
# deepnet_methods (postln, the default) is a reference of the bound only: fairseq's arch of it, as it comes.
ABLATIONS = {
    "paper": (deepnet_methods.label("deepnet", init_named=True), {}),
    "self_attn": ("decoder self-attn v/out at gain 1", {"deepnorm_gains": "decoder_self_attn=1"}),
    "cross_attn": ("decoder cross-attn v/out at gain 1", {"deepnorm_gains": "decoder_cross_attn=1"}),
    "ffn": ("decoder FFN at gain 1", {"deepnorm_gains": "decoder_ffn=1"}),
    "encoder_beta1": ("encoder beta 1", {"deepnorm_encoder_beta": 1}),
    "decoder_beta1": ("decoder beta 1", {"deepnorm_decoder_beta": 1}),
    "cross_attn_last": ("last layer's cross-attn at gain 1", {"deepnorm_gains": "decoder_cross_attn[-1]=1"}),
    "cross_attn_first": ("first layer's cross-attn at gain 1", {"deepnorm_gains": "decoder_cross_attn[0]=1"}),
    "encoder_beta_quarter": ("encoder beta a quarter of the paper's",
                             lambda depth: {"deepnorm_encoder_beta": f"{quarter_encoder_beta(depth):.6f}"}),
    "source": ("--deepnorm-init source (both: encoder beta / 4, last layer's cross-attn at gain 1)",
               {"deepnorm_init": "source"}),
}
REFERENCE = deepnet_methods.METHODS["postln"]  # every bound is given as a multiple of Post-LN's


def spec(name):
    """(label, fairseq arch, options) of an ablation, or of a method as the bound's reference."""
    if name in ABLATIONS:
        label, options = ABLATIONS[name]
        return label, deepnet_methods.METHODS["deepnet"].arch(sweep.SIZE), options
    method = deepnet_methods.METHODS[name]
    return f"{method.label} (fairseq {method.arch()})", method.arch(sweep.SIZE), {}


def variant_names():
    return [*deepnet_methods.names(), *ABLATIONS]


def quarter_encoder_beta(depth):
    # the formulas' one home is in the plugin, whose import loads fairseq: only when this variant runs
    from deepnet_fairseq.models.deepnorm import deepnorm_constants

    return deepnorm_constants(depth, depth).encoder_beta / 4


SOURCE_CELL = dict(depth=18, lr=2e-3, warmup=100, updates=400, probe_every=50)
SOURCE_MARKS = (50, 100, 200, 350)  # probed before updates 51, ..., 351: the last probe of a 400-update run
BOUND = dict(updates=51, probe_every=5, pairs=3000)  # the probe before update 51 sees 50 updates


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m deepnet_experiments.init_ablation", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="work folder (finished runs are kept and skipped)")
    p.add_argument("--raw-dir", default=str(sweep.DEFAULT_RAW), help="raw Multi30k de-en (default: %(default)s)")
    p.add_argument("--variants", default=",".join([REFERENCE.name, *ABLATIONS]),
                   help=f"of {', '.join(variant_names())}; a method is a reference of the bound only "
                        "(default: %(default)s)")
    p.add_argument("--depths", default="6,18,50,100", help="depths of the bound's runs (default: %(default)s)")
    p.add_argument("--parts", default="source,bound", help="which measurements (default: %(default)s)")
    p.add_argument("--jobs", type=int, default=2, help="runs in parallel, one thread each (default: %(default)s)")
    p.add_argument("--csv", help="also write every measured value here (part, variant, depth, quantity, update, value)")
    args = p.parse_args(argv)
    args.variants = sweep.parse_list(args.variants, str, "--variants")
    unknown = [v for v in args.variants if v not in variant_names()]
    if unknown:
        p.error(f"unknown variant(s) {unknown}; known: {', '.join(variant_names())}")
    args.depths = sweep.parse_list(args.depths, int, "--depths")
    args.parts = sweep.parse_list(args.parts, str, "--parts")
    return args


def source_run(args, data, variant):
    """The 18L-18L map cell for ``variant``: {quantity: {update: value}}."""
    options = ABLATIONS[variant][1]
    options = options(SOURCE_CELL["depth"]) if callable(options) else options
    out = Path(args.out) / "source" / variant
    cell = Namespace(out=out, max_tokens=1000, updates=SOURCE_CELL["updates"], probe_every=SOURCE_CELL["probe_every"],
                     seed=1, options=options)
    name, result, curves = stability_map.run_cell(cell, data, "deepnet", SOURCE_CELL["depth"], SOURCE_CELL["lr"],
                                                  SOURCE_CELL["warmup"])
    values = plateau.series(curves)
    values["valid NLL (bits)"] = {result["updates"]: stability_map.valid_nll_of(out / "runs" / name)}
    return values


def bound_run(args, data, variant, depth):
    """{updates taken: model update} over the first 50 updates, Fig. 5's setting."""
    _, arch, options = spec(variant)
    out = Path(args.out) / "bound"
    run = figures.run_args(out, dict(BOUND), figures.PAPER_SCHEDULE["warmup"])
    run.options = options(depth) if callable(options) else options
    sweep.train_one(run, data, arch, depth, 1, name=f"{variant}_L{depth}")
    return figures.update_norms(figures.read_curves(out / "runs" / f"{variant}_L{depth}"))


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    rows = []
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        if "bound" in args.parts:
            bound_data = sweep.build_default_data(Path(args.out) / "bound", BOUND["pairs"])
            names = [REFERENCE.name, *[v for v in args.variants if v != REFERENCE.name]]
            jobs = sorted(((v, d) for v in names for d in args.depths), key=lambda job: -job[1])
            bound = dict(zip(jobs, pool.map(lambda job: bound_run(args, bound_data, *job), jobs)))
        if "source" in args.parts:
            map_args = Namespace(out=Path(args.out) / "source", raw_dir=args.raw_dir)
            data = stability_map.build_data(map_args)
            variants = [v for v in args.variants if v in ABLATIONS]
            source = dict(zip(variants, pool.map(lambda v: source_run(args, data, v), variants)))
    if "source" in args.parts:
        print(f"\n18L-18L, lr {SOURCE_CELL['lr']:g}, warm-up {SOURCE_CELL['warmup']}: src_dep (bits per target token) "
              "after u updates, the decoder's cross-attention / residual at initialisation and after 200 updates, "
              f"and the validation NLL (bits) after {SOURCE_CELL['updates']}\n")
        print("| variant | " + " | ".join(f"src_dep u={u}" for u in SOURCE_MARKS)
              + " | xattn u=0 | xattn u=200 | valid NLL |\n|---|" + "---|" * (len(SOURCE_MARKS) + 3))
        for v, values in source.items():
            src, xattn = values["src_dep (bits/token)"], values["cross-attention / residual"]
            nll = next(iter(values["valid NLL (bits)"].values()))
            # a probe logged with update u ran before it: it measured the model after u - 1 updates
            print(f"| {spec(v)[0]} | " + " | ".join(f"{plateau.at(src, u + 1):.3f}" for u in SOURCE_MARKS)
                  + f" | {plateau.at(xattn, 1):.4f} | {plateau.at(xattn, 201):.4f} | {nll:.3f} |")
            rows += [["source", v, SOURCE_CELL["depth"], q, u, round(x, 6)]
                     for q, series in values.items() for u, x in sorted(series.items())]
    if "bound" in args.parts:
        peak = {job: max(series.values(), default=math.nan) for job, series in bound.items()}
        first, last = args.depths[0], args.depths[-1]
        print(f"\nFig. 5 setting: the largest model update in the first {BOUND['updates'] - 1} updates "
              f"(Post-LN's over it), and its growth from {first}L to {last}L\n")
        print("| variant | " + " | ".join(f"{d}L-{d}L" for d in args.depths) + f" | {last}L / {first}L |\n|---|"
              + "---|" * (len(args.depths) + 1))
        for v in names:
            cells = [f"{peak[v, d]:.3f} ({figures.ratio(peak[REFERENCE.name, d], peak[v, d]):.1f}x)"
                     for d in args.depths]
            print(f"| {spec(v)[0]} | " + " | ".join(cells)
                  + f" | {figures.ratio(peak[v, last], peak[v, first]):.2f}x |")
            rows += [["bound", v, d, "update_norm", u, x] for d in args.depths for u, x in sorted(bound[v, d].items())]
    if args.csv:
        sweep.write_csv(Path(args.csv), ["part", "variant", "depth", "quantity", "update", "value"], rows)
        print(f"wrote {args.csv}")


if __name__ == "__main__":
    main()
