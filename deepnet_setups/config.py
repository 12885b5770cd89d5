"""One loader for the setup configs (``configs/<setup>.yaml``).

A config has fixed sections and keys (``SCHEMA``); an unknown or mistyped key is an error naming the
key and the file. ``assumed:`` lists the dotted keys whose values the papers do not state (taken
from fairseq's recipes), so "what is assumed" is machine-readable. Any value can be overridden with
``section.key=value`` (the value is parsed as YAML: ``train.lr=1e-3``, ``data.test=[test2016]``).

Command line (the shell scripts use this)::

    python -m deepnet_setups.config CONFIG [key=value ...] --get train.lr
    python -m deepnet_setups.config CONFIG [key=value ...] --shell   # cfg_train_lr=0.0005 ...
    python -m deepnet_setups.config CONFIG [key=value ...] --dump    # resolved YAML
"""

import argparse
import shlex
import sys
from pathlib import Path

import yaml

NUM = (int, float)
OPT_STR = (str, type(None))
OPT_INT = (int, type(None))
OPT_NUM = (int, float, type(None))

# section -> key -> (accepted types, default)
SCHEMA = {
    "setup": ((str,), None),
    "description": ((str,), ""),
    "assumed": ((list,), []),
    "data": {
        "kind": ((str,), "bilingual"),  # bilingual | multilingual
        "layout": ((str,), "plain"),  # plain | iwslt_archive | wmt_archives | opus100
        "source_lang": (OPT_STR, None),  # bilingual
        "target_lang": (OPT_STR, None),
        "langs": ((list,), []),  # multilingual: every language (order fixes language-token ids)
        "lang_pairs": ((list,), []),  # multilingual training directions, "src-tgt"
        "zero_shot_pairs": ((list,), []),  # evaluated, never trained
        "downloads": ((list,), []),  # [{url: ..., sha256: ... or null}]
        "train": ((list,), []),  # raw file prefixes (plain layout: <prefix>.<lang>)
        "valid": ((list,), []),  # empty: every valid_every-th training pair is held out
        "test": ((list,), []),
        "valid_every": ((int,), 23),
    },
    "prep": {
        "tokenizer": ((str,), "moses"),  # moses | none
        "moses_escape": ((bool,), True),
        "aggressive_dash_splits": ((bool,), False),
        "lowercase": ((bool,), False),
        "clean_ratio": (NUM, 1.5),
        "clean_min_len": ((int,), 1),
        "clean_max_len": ((int,), 175),
        "segmenter": ((str,), "bpe"),  # bpe (subword-nmt) | sentencepiece
        "bpe_merges": ((int,), 10000),
        "spm_vocab_size": ((int,), 32000),
        "spm_model_type": ((str,), "unigram"),
        "spm_character_coverage": (NUM, 1.0),
        "spm_sample_temperature": (NUM, 5.0),
        "spm_sample_sentences": ((int,), 1000000),
        "max_train_lines": (OPT_INT, None),  # per corpus; null = all
    },
    "binarize": {
        "workers": ((int,), 8),
    },
    "model": {
        "size": ((str,), ""),  # a size variant of deepnet_fairseq.models.sizes
        "encoder_layers": ((int,), 6),
        "decoder_layers": ((int,), 6),
        "embed_dim": (OPT_INT, None),  # null: the size variant's value
        "ffn_dim": (OPT_INT, None),
        "heads": (OPT_INT, None),
        "share_all_embeddings": ((bool,), True),
        "share_decoder_input_output_embed": ((bool,), False),
        "checkpoint_activations": ((bool,), False),
    },
    "train": {
        "optimizer": ((str,), "adam"),
        "adam_betas": ((str,), "(0.9, 0.98)"),
        "clip_norm": (NUM, 0.0),
        "lr": (NUM, 5e-4),
        "lr_scheduler": ((str,), "inverse_sqrt"),
        "warmup_updates": ((int,), 4000),
        "warmup_init_lr": (NUM, 1e-7),
        "dropout": (NUM, 0.3),
        "attention_dropout": (NUM, 0.0),
        "weight_decay": (NUM, 0.0001),
        "criterion": ((str,), "label_smoothed_cross_entropy"),
        "label_smoothing": (NUM, 0.1),
        "max_tokens": ((int,), 4096),  # per GPU (per process) and step
        "batch_tokens": ((int,), 4096),  # effective tokens per update: max_tokens x world x update_freq
        # GPU memory (GiB) max_tokens was sized for; the launcher then scales max_tokens to the GPU's
        # memory, keeping batch_tokens (update-freq follows). null: max_tokens as given
        "max_tokens_gpu_gib": (OPT_NUM, None),
        "max_update": ((int,), 8000),
        "max_epoch": (OPT_INT, None),
        "save_interval_updates": ((int,), 1000),
        "keep_interval_updates": ((int,), 10),
        "no_epoch_checkpoints": ((bool,), True),
        "validate_interval_updates": ((int,), 1000),
        "log_interval": ((int,), 100),
        "seed": ((int,), 1),
        "precision": ((str,), "fp16"),  # fp16 | bf16 | fp32, on GPU (on CPU always fp32; docs/setups.md)
        "fp16": ((bool, type(None)), None),  # old spelling: true = precision fp16, false = precision fp32
        # fp16's dynamic loss scaler (fairseq's options and defaults; docs/setups.md, "Precision")
        "fp16_init_scale": ((int,), 128),
        "fp16_scale_window": (OPT_INT, None),  # null: fairseq's 2**14 / (world size x update-freq)
        "fp16_scale_tolerance": (NUM, 0.0),
        "min_loss_scale": (NUM, 1e-4),  # fairseq stops with "Minimum loss scale reached" below this
        "threshold_loss_scale": (OPT_NUM, None),
        "ddp_backend": ((str,), "c10d"),
        "sampling_temperature": (NUM, 5.0),  # multilingual: language sampling
        "extra_args": ((list,), []),  # any further fairseq-train options, verbatim
    },
    "eval": {
        "subset": ((str,), "test"),
        "average_last": ((int,), 5),
        "beam": ((int,), 5),
        "lenpen": (NUM, 1.0),
        "max_tokens": ((int,), 8000),
        "max_len_a": (NUM, 0),  # output length limit a*source+b (fairseq's defaults)
        "max_len_b": ((int,), 200),
        "metric": ((str,), "tok_bleu"),  # tok_bleu | compound_split_bleu | sacrebleu
        "sacrebleu_tokenize": ((str,), "13a"),
        "groups": ((dict,), {}),  # multilingual: group name -> list of directions or "x-en"/"en-x" patterns
    },
    "paths": {
        "work": ((str,), "work/{setup}"),  # prepared text and binarised data
        "runs": ((str,), "runs"),  # run folders: <runs>/<setup>/<arch>/<N>L-<M>L
        "results": ((str,), "runs/results.jsonl"),
    },
}

CHOICES = {
    "data.kind": ("bilingual", "multilingual"),
    "data.layout": ("plain", "iwslt_archive", "wmt_archives", "opus100"),
    "prep.tokenizer": ("moses", "none"),
    "prep.segmenter": ("bpe", "sentencepiece"),
    "eval.metric": ("tok_bleu", "compound_split_bleu", "sacrebleu"),
    "train.precision": ("fp16", "bf16", "fp32"),
}


class ConfigError(ValueError):
    """A config problem; the message is one line naming the file and key."""


def _type_ok(value, types):
    if bool in types:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    return isinstance(value, types)


def _defaults(schema):
    out = {}
    for key, spec in schema.items():
        out[key] = _defaults(spec) if isinstance(spec, dict) else _copy(spec[1])
    return out


def _copy(value):
    return yaml.safe_load(yaml.safe_dump(value))


def _merge(base, given, schema, where, path=""):
    if not isinstance(given, dict):
        raise ConfigError(f"{where}: '{path or 'top level'}' must be a mapping")
    for key, value in given.items():
        dotted = f"{path}.{key}" if path else str(key)
        if key not in schema:
            raise ConfigError(f"{where}: unknown key '{dotted}'")
        spec = schema[key]
        if isinstance(spec, dict):
            _merge(base[key], value, spec, where, dotted)
            continue
        types = spec[0]
        if float in types and isinstance(value, int) and not isinstance(value, bool):
            value = value if int in types else float(value)
        if isinstance(value, str) and float in types and not _type_ok(value, types):
            try:
                value = float(value)  # YAML 1.1 reads "5e-4" as a string
            except ValueError:
                pass
        if not _type_ok(value, types):
            names = "/".join(t.__name__ for t in types)
            raise ConfigError(f"{where}: key '{dotted}' must be {names}, got {value!r}")
        base[key] = value


def _lookup(cfg, dotted):
    node = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def parse_override(text, where="command line"):
    """``a.b=value`` -> nested dict ``{a: {b: value}}`` (value parsed as YAML)."""
    if "=" not in text:
        raise ConfigError(f"{where}: override '{text}' is not of the form section.key=value")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as err:  # ReaderError (control characters), ScannerError, ParserError, ...
        reason = " ".join(str(err).split())
        raise ConfigError(f"{where}: override '{text}' has a value that is not valid YAML ({reason})") from None
    nested = value
    for part in reversed(key.strip().split(".")):
        nested = {part: nested}
    return nested


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


def validate(cfg, where):
    for dotted, choices in CHOICES.items():
        if _lookup(cfg, dotted) not in choices:
            raise ConfigError(f"{where}: key '{dotted}' must be one of {', '.join(choices)}, got {_lookup(cfg, dotted)!r}")
    if not cfg["setup"]:
        raise ConfigError(f"{where}: key 'setup' is required")
    for dotted in cfg["assumed"]:
        try:
            _lookup(SCHEMA, dotted)
        except KeyError:
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
    if train["max_tokens_gpu_gib"] is not None and train["max_tokens_gpu_gib"] <= 0:
        raise ConfigError(f"{where}: key 'train.max_tokens_gpu_gib' must be > 0 (or null)")
    if train["fp16_init_scale"] <= 0 or train["min_loss_scale"] <= 0 or not 0 <= train["fp16_scale_tolerance"] < 1:
        raise ConfigError(f"{where}: train.fp16_init_scale and train.min_loss_scale must be > 0, "
                          "train.fp16_scale_tolerance in [0, 1)")
    for dotted in ("train.max_tokens", "train.batch_tokens", "model.encoder_layers", "model.decoder_layers",
                   "eval.average_last", "eval.beam"):
        if _lookup(cfg, dotted) < 1:
            raise ConfigError(f"{where}: key '{dotted}' must be >= 1")
    return cfg


def load(path, overrides=()):
    """The resolved config: schema defaults < the file < the overrides. Raises ConfigError."""
    path = Path(path)
    where = str(path)
    if not path.is_file():
        raise ConfigError(f"{where}: config file not found")
    try:
        given = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ConfigError(f"{where}: not valid YAML ({str(err).splitlines()[0]})") from None
    cfg = _defaults(SCHEMA)
    _merge(cfg, given, SCHEMA, where)
    for text in overrides:
        _merge(cfg, parse_override(text), SCHEMA, f"{where} (override '{text}')")
    data = cfg["data"]
    data["langs"] = [str(lang) for lang in data["langs"]]
    data["lang_pairs"] = expand_pairs(data["lang_pairs"], data["langs"])
    resolve_precision(cfg["train"], where)
    validate(cfg, where)
    for key in ("work", "runs", "results"):
        cfg["paths"][key] = cfg["paths"][key].format(setup=cfg["setup"])
    return cfg


def get(cfg, dotted):
    try:
        return _lookup(cfg, dotted)
    except KeyError:
        raise ConfigError(f"unknown key '{dotted}'") from None


def is_assumed(cfg, dotted):
    return dotted in cfg["assumed"]


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
        if node is cfg and isinstance(SCHEMA.get(key), dict):
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
