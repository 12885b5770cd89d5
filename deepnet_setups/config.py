"""One loader for the setup configs (``configs/<setup>.yaml``), on OmegaConf (fairseq's config library).

A config has fixed sections and typed keys (the dataclasses below, one per section; OmegaConf's struct
mode refuses any other key); an unknown or mistyped key is an error naming the key and the file.
``assumed:`` lists the dotted keys whose values the papers do not state (taken from fairseq's
recipes), so "what is assumed" is machine-readable. Any value can be overridden with
``section.key=value`` (the value is parsed as YAML: ``train.lr=1e-3``, ``data.test=[test2016]``).

Command line::

    python -m deepnet_setups.config CONFIG [key=value ...] --get train.lr
    python -m deepnet_setups.config CONFIG [key=value ...] --shell   # cfg_train_lr=0.0005 ...
    python -m deepnet_setups.config CONFIG [key=value ...] --dump    # resolved YAML
"""

import argparse
import dataclasses
import shlex
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

import deepnet_methods

from . import lang_tags


# the keys that take one of a few values, and those values
CHOICES = {
    "data.kind": ("bilingual", "multilingual"),
    "data.layout": ("plain", "iwslt_archive", "wmt_archives", "opus100"),
    "prep.tokenizer": ("moses", "none"),
    "prep.segmenter": ("bpe", "sentencepiece"),
    "eval.metric": ("tok_bleu", "compound_split_bleu", "sacrebleu"),
    "train.precision": ("fp16", "bf16", "fp32"),
    "data.lang_tags": tuple(lang_tags.STRATEGIES),
}


# the criterion that takes train.crossconst_alpha (deepnet_fairseq/criterions/)
CROSSCONST_CRITERION = "diagnostic_label_smoothed_cross_entropy"


@dataclass
class DataConfig:
    kind: str = "bilingual"
    layout: str = "plain"
    source_lang: Optional[str] = None  # bilingual
    target_lang: Optional[str] = None
    langs: List[str] = field(default_factory=list)  # multilingual: every language (order fixes language-token ids)
    lang_pairs: List[str] = field(default_factory=list)  # multilingual training directions, "src-tgt"
    zero_shot_pairs: List[str] = field(default_factory=list)  # evaluated, never trained
    lang_tags: str = "s-enc-t-dec"  # multilingual: where the language tags go (deepnet_setups/lang_tags.py)
    downloads: List[Any] = field(default_factory=list)  # [{url: ..., sha256: ... or null}]
    train: List[str] = field(default_factory=list)  # raw file prefixes (plain layout: <prefix>.<lang>)
    valid: List[str] = field(default_factory=list)  # empty: every valid_every-th training pair is held out
    test: List[str] = field(default_factory=list)
    valid_every: int = 23


@dataclass
class PrepConfig:
    tokenizer: str = "moses"
    moses_escape: bool = True
    aggressive_dash_splits: bool = False
    lowercase: bool = False
    clean_ratio: float = 1.5
    clean_min_len: int = 1
    clean_max_len: int = 175
    segmenter: str = "bpe"  # subword-nmt's BPE or sentencepiece
    bpe_merges: int = 10000
    spm_vocab_size: int = 32000
    spm_model_type: str = "unigram"
    spm_character_coverage: float = 1.0
    spm_sample_temperature: float = 5.0
    spm_sample_sentences: int = 1000000
    max_train_lines: Optional[int] = None  # per corpus; null = all


@dataclass
class BinarizeConfig:
    workers: int = 8


@dataclass
class ModelConfig:
    size: str = ""  # a size variant of deepnet_fairseq.models.sizes
    encoder_layers: int = 6
    decoder_layers: int = 6
    embed_dim: Optional[int] = None  # null: the size variant's value
    ffn_dim: Optional[int] = None
    heads: Optional[int] = None
    share_all_embeddings: bool = True
    share_decoder_input_output_embed: bool = False
    checkpoint_activations: bool = False
    # --arch deepnet: a name of deepnet_fairseq.models.deepnorm.DEEPNORM_INITS (checked when the config loads); a
    # run folder is named deepnet_<init> where it is not the paper's
    deepnorm_init: str = "paper"


@dataclass
class TrainConfig:
    # by fairseq's option names: deepnet_setups.launch passes each key on as a fairseq-train option,
    # except its own (launch.LAUNCHER_KEYS)
    optimizer: str = "adam"
    adam_betas: str = "(0.9, 0.98)"
    clip_norm: float = 0.0
    lr: float = 5e-4
    lr_scheduler: str = "inverse_sqrt"
    warmup_updates: int = 4000
    warmup_init_lr: float = 1e-7
    dropout: float = 0.3
    attention_dropout: float = 0.0
    weight_decay: float = 0.0001
    criterion: str = "label_smoothed_cross_entropy"
    label_smoothing: float = 0.1
    max_tokens: int = 4096  # per GPU (per process) and step
    batch_tokens: int = 4096  # effective tokens per update: max_tokens x world x update_freq
    # GPU memory (GiB) max_tokens was sized for; the launcher then scales max_tokens to the GPU's
    # memory, keeping batch_tokens (update-freq follows). null: max_tokens as given
    max_tokens_gpu_gib: Optional[float] = None
    max_update: int = 8000
    max_epoch: Optional[int] = None
    save_interval_updates: int = 1000
    keep_interval_updates: int = 10
    no_epoch_checkpoints: bool = True
    validate_interval_updates: int = 1000
    log_interval: int = 100
    seed: int = 1
    precision: str = "fp16"  # on GPU (on CPU always fp32; docs/setups.md)
    fp16: Optional[bool] = None  # old spelling: true = precision fp16, false = precision fp32
    # fp16's dynamic loss scaler (fairseq's options and defaults; docs/setups.md, "Precision")
    fp16_init_scale: int = 128
    fp16_scale_window: Optional[int] = None  # null: fairseq's 2**14 / (world size x update-freq)
    fp16_scale_tolerance: float = 0.0
    min_loss_scale: float = 1e-4  # fairseq stops with "Minimum loss scale reached" below this
    threshold_loss_scale: Optional[float] = None
    ddp_backend: str = "c10d"
    sampling_temperature: float = 5.0  # multilingual: language sampling
    # CrossConST's weight (--crossconst-alpha of the plugin's criterion; null: not passed, off). Set, it needs
    # criterion diagnostic_label_smoothed_cross_entropy (fairseq's own criterion refuses the option)
    crossconst_alpha: Optional[float] = None
    # --flush-denormal of the plugin's task (and diagnostic criterion): float32 denormals flushed to zero, for a deep
    # Post-LN on CPU, whose vanishing gradients otherwise make an update several times slower
    flush_denormal: bool = False
    # a checkpoint to fine-tune from (fairseq's --finetune-from-model: its weights, a new optimizer, schedule and
    # data order), taken only while the run folder has no checkpoint_last.pt, so that a stopped fine-tune resumes
    finetune_from_model: Optional[str] = None
    extra_args: List[str] = field(default_factory=list)  # any further fairseq-train options, verbatim


@dataclass
class EvalConfig:
    subset: str = "test"
    average_last: int = 5
    beam: int = 5
    lenpen: float = 1.0
    max_tokens: int = 8000
    max_len_a: float = 0.0  # output length limit a*source+b (fairseq's defaults)
    max_len_b: int = 200
    metric: str = "tok_bleu"
    sacrebleu_tokenize: str = "13a"
    groups: Dict[str, Any] = field(default_factory=dict)  # multilingual: group name -> directions or "x-en"/"en-x"


@dataclass
class PathsConfig:
    work: str = "work/{setup}"  # prepared text and binarised data ({setup}: the setup's name)
    runs: str = "runs"  # run folders: <runs>/<setup>/<arch>/<N>L-<M>L
    results: str = "runs/results.jsonl"


@dataclass
class SetupConfig:
    setup: Optional[str] = None  # required
    description: str = ""
    assumed: List[str] = field(default_factory=list)
    data: DataConfig = field(default_factory=DataConfig)
    prep: PrepConfig = field(default_factory=PrepConfig)
    binarize: BinarizeConfig = field(default_factory=BinarizeConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)


class ConfigError(ValueError):
    """A config problem; the message is one line naming the file and key."""


def _declared(dotted):
    """A dotted key's declared type in words: "int", "float or null", "list", ... (KeyError: none)."""
    hint = SetupConfig
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(hint):
            raise KeyError(dotted)
        hint = typing.get_type_hints(hint)[part]
    optional = type(None) in typing.get_args(hint)  # Optional[X]
    if optional:
        hint = typing.get_args(hint)[0]
    name = "mapping" if dataclasses.is_dataclass(hint) else (typing.get_origin(hint) or hint).__name__
    return f"{name} or null" if optional else name


def get(cfg, dotted):
    """The value of a dotted key (``train.lr``) of a loaded config."""
    node = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ConfigError(f"unknown key '{dotted}'")
        node = node[part]
    return node


def _merge(cfg, key, value, where):
    """``cfg`` with top-level ``key: value`` merged in; OmegaConf's refusals as one-line ConfigErrors."""
    try:
        return OmegaConf.merge(cfg, {key: value})
    except OmegaConfBaseException as err:
        dotted = err.full_key or str(key)
        if isinstance(err, ConfigKeyError):
            raise ConfigError(f"{where}: unknown key '{dotted}'") from None
        problem = ": " + str(err).splitlines()[0]  # OmegaConf's words, unless a declared key has the wrong type
        if isinstance(err, ValidationError):
            try:
                problem = f" must be {_declared(dotted)}, got {get({key: value}, dotted)!r}"
            except (KeyError, ConfigError):
                pass
        raise ConfigError(f"{where}: key '{dotted}'{problem}") from None


def parse_override(text, where="command line"):
    """``section.key=value`` as a nested dict (the value parsed as YAML, by OmegaConf's dotlist)."""
    if "=" not in text:
        raise ConfigError(f"{where}: override '{text}' is not of the form section.key=value")
    try:
        return OmegaConf.to_container(OmegaConf.from_dotlist([text]))
    except yaml.YAMLError as err:  # ReaderError (control characters), ScannerError, ParserError, ...
        reason = " ".join(str(err).split())
        raise ConfigError(f"{where}: override '{text}' has a value that is not valid YAML ({reason})") from None
    except OmegaConfBaseException as err:  # e.g. an unfinished ${interpolation}
        raise ConfigError(f"{where}: override '{text}': {str(err).splitlines()[0]}") from None


def expand_pairs(patterns, langs):
    """``*-en``, ``en-*`` and ``*-*`` expand over ``langs``; other entries are kept as given."""
    pairs = []
    for pattern in patterns:
        src, _, tgt = str(pattern).partition("-")
        srcs = langs if src == "*" else [src]
        tgts = langs if tgt == "*" else [tgt]
        for s in srcs:
            for t in tgts:
                if s != t and f"{s}-{t}" not in pairs:
                    pairs.append(f"{s}-{t}")
    return pairs


def resolve_precision(train, where):
    """``train.fp16`` (the old key) sets ``train.precision``: true -> fp16, false -> fp32."""
    if train["fp16"] is not None:
        if train["fp16"] and train["precision"] == "bf16":
            raise ConfigError(f"{where}: keys 'train.fp16' (true) and 'train.precision' (bf16) disagree; "
                              "set train.precision only")
        train["precision"] = "fp16" if train["fp16"] else "fp32"
        train["fp16"] = None


def choices():
    """CHOICES, and DeepNet's inits as the method registry names them (tests/test_method_registry.py: the plugin's
    deepnorm.DEEPNORM_INITS), read without importing fairseq: a config loads in every script, prepare's too."""
    return {**CHOICES, "model.deepnorm_init": deepnet_methods.METHODS["deepnet"].inits}


def validate(cfg, where):
    for dotted, allowed in choices().items():
        if get(cfg, dotted) not in allowed:
            raise ConfigError(f"{where}: key '{dotted}' must be one of {', '.join(allowed)}, got {get(cfg, dotted)!r}")
    if not cfg["setup"]:
        raise ConfigError(f"{where}: key 'setup' is required")
    for dotted in cfg["assumed"]:
        try:
            get(cfg, dotted)
        except ConfigError:
            raise ConfigError(f"{where}: 'assumed' names unknown key '{dotted}'") from None
    data = cfg["data"]
    if data["kind"] == "bilingual":
        if not data["source_lang"] or not data["target_lang"]:
            raise ConfigError(f"{where}: a bilingual setup needs data.source_lang and data.target_lang")
    else:
        if not data["langs"] or not data["lang_pairs"]:
            raise ConfigError(f"{where}: a multilingual setup needs data.langs and data.lang_pairs")
        langs = set(data["langs"])
        for pair in data["lang_pairs"] + data["zero_shot_pairs"]:
            parts = str(pair).split("-")
            if len(parts) != 2:
                raise ConfigError(f"{where}: language pair '{pair}' must look like src-tgt")
            for lang in parts:
                if lang not in langs:
                    raise ConfigError(f"{where}: language pair '{pair}' uses unknown language '{lang}' (not in data.langs)")
    train = cfg["train"]
    if train["precision"] == "bf16" and train["ddp_backend"] == "fully_sharded":
        raise ConfigError(f"{where}: train.precision bf16 does not work with train.ddp_backend fully_sharded "
                          "(fairseq 0.12's FSDP has no bf16); use fp16")
    alpha = train["crossconst_alpha"]
    if alpha is not None:
        if not 0 <= alpha < float("inf"):
            raise ConfigError(f"{where}: key 'train.crossconst_alpha' must be a number >= 0 (or null), got {alpha!r}")
        if train["criterion"] != CROSSCONST_CRITERION:
            raise ConfigError(f"{where}: key 'train.crossconst_alpha' needs train.criterion {CROSSCONST_CRITERION} "
                              f"(the plugin's criterion takes --crossconst-alpha), got {train['criterion']!r}; "
                              "or set train.crossconst_alpha=null")
    if train["max_tokens_gpu_gib"] is not None and train["max_tokens_gpu_gib"] <= 0:
        raise ConfigError(f"{where}: key 'train.max_tokens_gpu_gib' must be > 0 (or null)")
    if train["fp16_init_scale"] <= 0 or train["min_loss_scale"] <= 0 or not 0 <= train["fp16_scale_tolerance"] < 1:
        raise ConfigError(f"{where}: train.fp16_init_scale and train.min_loss_scale must be > 0, "
                          "train.fp16_scale_tolerance in [0, 1)")
    for dotted in ("train.max_tokens", "train.batch_tokens", "model.encoder_layers", "model.decoder_layers",
                   "eval.average_last", "eval.beam"):
        if get(cfg, dotted) < 1:
            raise ConfigError(f"{where}: key '{dotted}' must be >= 1")


def load(path, overrides=()):
    """The resolved config as plain dicts: the dataclasses' defaults < the file < the overrides.
    Raises ConfigError."""
    path = Path(path)
    where = str(path)
    if not path.is_file():
        raise ConfigError(f"{where}: config file not found")
    try:  # YAML 1.1 reads "5e-4" as a string; OmegaConf's float keys take it as the number
        given = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ConfigError(f"{where}: not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(given, dict):
        raise ConfigError(f"{where}: 'top level' must be a mapping")
    cfg = OmegaConf.structured(SetupConfig)  # struct mode: a key not declared is refused
    for key, value in given.items():
        cfg = _merge(cfg, key, value, where)
    for text in overrides:
        for key, value in parse_override(text).items():
            cfg = _merge(cfg, key, value, f"{where} (override '{text}')")
    try:
        cfg = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as err:  # an ${interpolation} that does not resolve
        raise ConfigError(f"{where}: key '{err.full_key}': {str(err).splitlines()[0]}") from None
    data = cfg["data"]
    data["lang_pairs"] = expand_pairs(data["lang_pairs"], data["langs"])
    resolve_precision(cfg["train"], where)
    validate(cfg, where)
    for key, value in cfg["paths"].items():
        cfg["paths"][key] = value.replace("{setup}", cfg["setup"])
    return cfg


def _shell_value(value):
    if isinstance(value, bool):
        return "1" if value else "0"
    if value is None:
        return "''"
    if isinstance(value, list):
        return "(" + " ".join(shlex.quote(str(v)) for v in value) + ")"
    if isinstance(value, dict):
        return shlex.quote(yaml.safe_dump(value, default_flow_style=True).strip())
    return shlex.quote(str(value))


def shell_assignments(cfg, prefix="cfg", node=None):
    """``cfg_<section>_<key>=value`` lines (lists as bash arrays, booleans as 1/0)."""
    node = cfg if node is None else node
    lines = []
    for key, value in node.items():
        name = f"{prefix}_{key}"
        if node is cfg and isinstance(value, dict):  # a section
            lines += shell_assignments(cfg, name, value)
        else:
            lines.append(f"{name}={_shell_value(value)}")
    return lines


def format_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, (list, dict)):
        return yaml.safe_dump(value, default_flow_style=True).strip()
    return str(value)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m deepnet_setups.config", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--get", metavar="KEY", help="print one value (dotted key)")
    group.add_argument("--shell", action="store_true", help="print bash assignments cfg_<section>_<key>=...")
    group.add_argument("--dump", action="store_true", help="print the resolved config as YAML")
    group.add_argument("--assumed", action="store_true", help="print the assumed keys with their values")
    args = parser.parse_intermixed_args(argv)
    try:
        cfg = load(args.config, args.overrides)
        if args.get:
            print(format_value(get(cfg, args.get)))
        elif args.shell:
            print("\n".join(shell_assignments(cfg)))
        elif args.assumed:
            for dotted in cfg["assumed"]:
                print(f"{dotted}={format_value(get(cfg, dotted))}")
        else:
            print(yaml.safe_dump(cfg, sort_keys=False).rstrip())
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
