"""The training methods (normalisation schemes), each named once: the setups' ``--arch`` name, the fairseq ``--arch``
family the plugin registers (deepnet_fairseq/models/), the label of tables and plots, how deepnet_fairseq.export
makes it plain fairseq, and DeepNet's inits; and the named init variants the tables use (``deepnet_source``).

    python -m deepnet_methods list [--field name|family|arch|label] [--zoo] [--variants] [--size S] [--sep SEP]

Every driver, setup, benchmark and script takes its method names, choices, default set and labels from here
(tests/test_method_registry.py fails on a hand-written list elsewhere). Imports nothing of fairseq: the drivers and
setups read it at start-up, and it sits below every other package (.importlinter).
"""

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

# fairseq's own Post-LN arch for each size variant of deepnet_fairseq.models.sizes (whose SIZE_VARIANTS take their
# defaults from these): what the setups and drivers train for Post-LN, so that its checkpoints need no plugin
POSTLN_ARCHS = MappingProxyType({
    "": "transformer", "iwslt_de_en": "transformer_iwslt_de_en", "wmt_en_de": "transformer_wmt_en_de",
    "wmt_en_de_big": "transformer_vaswani_wmt_en_de_big", "opus100": "transformer",
    "m2m_102": "transformer_vaswani_wmt_en_de_big"})
SIZES = tuple(POSTLN_ARCHS)

# how deepnet_fairseq.export turns a checkpoint into fairseq's plain ``transformer`` (None: refused, no exact equal)
FOLD = "fold"  # a DeepNorm residual: each branch's output projection divided by its layer's alpha
SCALE = "scale"  # LayerNorm Scaling: each scaled LayerNorm's weight and bias times its lns_scale buffer (Pre-LN)
AS_IS = "as_is"  # fairseq's own layers: the weights pass through, --*-normalize-before as trained


@dataclass(frozen=True)
class Method:
    name: str  # the setups' --arch (scripts/train_iwslt.sh --arch NAME); a run folder's and a table row's name
    family: str  # the plugin's fairseq model; a size variant's arch is <family>_<size>
    label: str  # in tables and plots
    export: str | None = None  # FOLD, SCALE, AS_IS or None
    no_export: str = ""  # where export is None: why no plain fairseq model equals it (export's refusal says it)
    pre_ln: bool = False  # LayerNorm at the start of each branch: fairseq's --*-normalize-before on (else Post-LN-like)
    zoo: bool = False  # a Table 1 baseline; the others (Post-LN, Pre-LN, DeepNet) are every driver's default set
    inits: tuple = ()  # the --deepnorm-init names it takes, the default first (deepnorm.DEEPNORM_INITS: their home)
    fairseq_archs: Mapping[str, str] | None = None  # size -> the arch trained instead of the family's (Post-LN)
    year: int = 0  # published (baselines.md cites each): a study of one era lists its methods by it

    def arch(self, size=""):
        """The fairseq --arch of this method at a size variant ('': none); ValueError for an unknown size."""
        if size not in SIZES:
            raise ValueError(f"size variant '{size}': not one of {', '.join(map(repr, SIZES))}")
        if self.fairseq_archs is not None:
            return self.fairseq_archs[size]
        return f"{self.family}_{size}" if size else self.family

    def models(self):
        """The fairseq model names its checkpoints carry: its family's, and fairseq's own where it trains that."""
        return (self.family,) + ((self.fairseq_archs[""],) if self.fairseq_archs is not None else ())


@dataclass(frozen=True)
class Variant:
    """A method at one of its inits, a row of its own in tables: named <method>_<init>."""

    method: str
    init: str
    label: str
    aliases: tuple = ()  # the names older records, run folders and CSVs gave it; they stay readable

    @property
    def name(self):
        return f"{self.method}_{self.init}"


# in DeepNet's Table 1 order, the order of every table's rows
METHODS = {m.name: m for m in (
    Method("postln", "postln_transformer", "Post-LN", AS_IS, fairseq_archs=POSTLN_ARCHS, year=2017),
    Method("dsinit", "dsinit_transformer", "DS-Init", zoo=True, year=2019),
    Method("admin", "admin_transformer", "Admin", zoo=True, year=2020),
    Method("rezero", "rezero_transformer", "ReZero", zoo=True, year=2020),
    Method("tfixup", "tfixup_transformer", "T-Fixup", zoo=True, year=2020),
    Method("preln", "preln_transformer", "Pre-LN", AS_IS, pre_ln=True, year=2020),
    Method("dlcl", "dlcl_transformer", "DLCL", pre_ln=True, zoo=True, year=2019),
    Method("normformer", "normformer_transformer", "NormFormer", pre_ln=True, zoo=True, year=2021),
    Method("subln", "subln_transformer", "Sub-LN", pre_ln=True, zoo=True, year=2022),
    Method("b2t", "b2t_transformer", "B2T", zoo=True, year=2023),
    Method("residual", "residual_transformer", "ResiDual", zoo=True, year=2023),
    Method("periln", "periln_transformer", "Peri-LN", pre_ln=True, zoo=True,
           no_export="its LayerNorm on each branch's output has no place in fairseq's layers", year=2025),
    Method("mixln", "mixln_transformer", "Mix-LN", pre_ln=True, zoo=True,
           no_export="Post-LN and Pre-LN layers in one stack; fairseq's --*-normalize-before is one per stack", year=2025),
    Method("lns", "lns_transformer", "LayerNorm Scaling", SCALE, pre_ln=True, zoo=True, year=2025),
    Method("dyt", "dyt_transformer", "DyT", pre_ln=True, zoo=True,
           no_export="DyT has no LayerNorm (tanh(alpha*x) in its place), and fairseq's layers have no DyT", year=2025),
    Method("deepnet", "deepnet_transformer", "DeepNet", FOLD, inits=("paper", "torchscale", "source"), year=2022),
)}
VARIANTS = {v.name: v for v in (
    Variant("deepnet", "paper", "DeepNet, paper init"),
    Variant("deepnet", "torchscale", "DeepNet, torchscale's init", aliases=("deepnet_torchscale_init",)),
    Variant("deepnet", "source", "DeepNet, source init", aliases=("deepnet_source_init",)),
)}


def methods(zoo=True):
    """The methods in table order; zoo=False: the paper's three, every driver's default."""
    return [m for m in METHODS.values() if zoo or not m.zoo]


def names(zoo=True, variants=False, aliases=False):
    """Method names in table order, each followed by its init variants' (and their older aliases); zoo=False: the
    paper's three, every driver's default set."""
    out = []
    for m in methods(zoo):
        out.append(m.name)
        for v in VARIANTS.values():
            if variants and v.method == m.name:
                out += [v.name, *(v.aliases if aliases else ())]
    return out


def variant(name):
    """The Variant a variant name or an older alias names; None for anything else."""
    return VARIANTS.get(name) or next((v for v in VARIANTS.values() if name in v.aliases), None)


def resolve(name):
    """(Method, init or None) of a method name, a variant name or an alias; KeyError if it is none."""
    found = variant(name)
    if found:
        return METHODS[found.method], found.init
    return METHODS[name], None


def canonical(name):
    """A variant's name for an older alias; any other name as it is."""
    found = variant(name)
    return found.name if found else name


def label(name, init_named=False):
    """A method's, variant's or alias's table label (an unknown name: itself). init_named: a method that takes inits
    is labelled with its default init ('DeepNet, paper init'), for tables that set it beside another init."""
    method = METHODS.get(name)
    if method and init_named and method.inits:
        name = f"{name}_{method.inits[0]}"
    found = variant(name) or METHODS.get(name)
    return found.label if found else name


def order(name):
    """A row's position in tables (aliases as their variant); unknown names after every known one."""
    rows = names(variants=True)
    name = canonical(name)
    return rows.index(name) if name in rows else len(rows)


def row_name(method, init=None):
    """A run's row in tables and its run folder's model part: the method, and its init where it takes inits and
    this one is not the default (so that two inits never share, and resume, one folder)."""
    taken = METHODS[method].inits if method in METHODS else ()
    return f"{method}_{init}" if taken and init not in (None, taken[0]) else method


def of_arch(arch):
    """The method a fairseq --arch belongs to (its family, a size variant of it, or fairseq's own arch it trains
    instead); None for an arch of no method."""
    for m in methods():
        if arch in {m.arch(size) for size in SIZES} | {f"{m.family}_{size}" if size else m.family for size in SIZES}:
            return m
    return None


def exports():
    """{fairseq model name: FOLD, SCALE or AS_IS} of every method deepnet_fairseq.export can make plain fairseq."""
    return {model: m.export for m in methods() if m.export for model in m.models()}
