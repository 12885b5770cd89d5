"""Export a trained checkpoint to plain fairseq (no plugin needed to load it) or to CTranslate2.

    python -m deepnet_fairseq.export CHECKPOINT --to transformer OUT.pt
    python -m deepnet_fairseq.export CHECKPOINT --to ctranslate2 OUTDIR [--quantization int8] [--work DIR]
    python -m deepnet_fairseq.export CHECKPOINT --to ctranslate2 OUTDIR [--data DIR] [--tokenizer moses]
        [--bpe subword_nmt --bpe-codes FILE | --bpe sentencepiece --sentencepiece-model FILE]   (no setup)
    python -m deepnet_fairseq.export RUN/checkpoints --average-last 5 --to ...   (average first)

What is exported, and why it is exact:

- ``deepnet_transformer`` -> fairseq's ``transformer``. LayerNorm is scale-invariant up to its eps:
  ``LN_eps(alpha*x + G(x)) = LN_{eps/alpha^2}(x + G(x)/alpha)``. Dividing each residual branch's
  output projection (self-attention ``out_proj``, cross-attention ``out_proj``, ``fc2``; weight and
  bias) by its layer's alpha (the ``deepnorm_alpha`` buffer the checkpoint holds) leaves a Post-LN
  Transformer whose only difference is LayerNorm's eps: fairseq's 1e-5 where 1e-5/alpha^2 is exact.
- ``deepnet_transformer_lm`` -> ``transformer_lm`` by the same fold.
- ``lns_transformer`` -> ``transformer`` with ``--*-normalize-before``: ``s * LN(x)`` is a LayerNorm whose weight
  and bias are times s, so each scaled LayerNorm's weight and bias are multiplied by its ``lns_scale`` buffer.
- ``preln_transformer`` / ``postln_transformer`` -> ``transformer`` (their weights are fairseq's, with
  ``--{encoder,decoder}-normalize-before`` on / off); fairseq's own ``transformer`` passes through.
- Every other architecture is refused: none has an exact equivalent in plain fairseq (the method registry,
  deepnet_methods, says which export each method takes, and why where none).

The file written holds only plain dicts, lists, numbers, strings and tensors (``cfg`` as dicts with
``cfg.model._name`` set): it loads with torch's default weights-only unpickling, without the plugin,
in ``fairseq-generate`` (no ``--user-dir``) and ``TransformerModel.from_pretrained``. The optimizer
state, the plugin's options, buffers and ``user_dir`` are dropped.

CTranslate2 has one LayerNorm eps for the whole model. Set to the decoder's exact eps,
``eps_dec = 1e-5/alpha_dec^2``, the decoder is exact; the encoder, which needs ``1e-5/alpha_enc^2``,
is made exact by carrying its residual stream scaled by ``c = alpha_enc/alpha_dec``
(``LN_{eps_dec}(c*z) = LN_{eps_dec/c^2}(z)``): embedding scale and positions times c, every encoder
LayerNorm's gain and bias times c (so each layer outputs c times the original), the inputs
projections that read the stream (``q/k/v_proj``, ``fc1``, and the decoder's cross-attention
``k/v_proj`` reading the encoder output) divided by c, and the branch outputs (``out_proj``, ``fc2``)
times c. docs/deploy.md has the derivation. The directory also gets the dictionaries, the text
processing and the languages in ``deploy.json`` (a setup's Moses/BPE or SentencePiece, else
fairseq-interactive's ``--tokenizer``/``--bpe`` options, else tokens in and out; a multilingual
model's language tokens as its task adds them), so ``python -m deepnet_fairseq.translate OUTDIR``
translates raw text.
"""

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

import deepnet_fairseq  # noqa: F401  (architectures; weights-only allow-list; checked checkpoint loading)
import deepnet_methods
from deepnet_fairseq.training import CorruptCheckpointError
from deepnet_fairseq.translate import DEPLOY_FILE

PLAIN_TYPES = (dict, list, tuple, str, int, float, bool, type(None), torch.Tensor)
BRANCH_OUTPUTS = ("self_attn.out_proj", "encoder_attn.out_proj", "fc2")


class ExportError(ValueError):
    """A checkpoint that cannot be exported; the message is one line naming the file."""


# -- reading ------------------------------------------------------------------------------------

def read_checkpoint(path, average_last=None):
    """The checkpoint at ``path`` (a file, or with ``average_last`` a checkpoints folder: the mean of
    its last K update checkpoints, as ``scripts/evaluate.sh`` averages), read by fairseq's loader as
    the plugin checks it: weights-only with the plugin's allow-list, a damaged or foreign file is a
    ``CorruptCheckpointError`` naming it."""
    from fairseq import checkpoint_utils
    from omegaconf import OmegaConf

    from deepnet_fairseq.average import average_checkpoints, last_checkpoints

    path = Path(path)
    if not path.exists():
        raise ExportError(f"{path}: no such file or folder")
    if average_last:
        folder = path if path.is_dir() else path.parent
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            averaged = average_checkpoints(last_checkpoints(folder, average_last), Path(tmp) / "averaged.pt")
            state = checkpoint_utils.load_checkpoint_to_cpu(str(averaged))
    elif path.is_dir():
        raise ExportError(f"{path}: a folder; give a checkpoint file, or --average-last K to average its last K")
    else:
        state = checkpoint_utils.load_checkpoint_to_cpu(str(path))
    cfg = state.get("cfg")
    if cfg is None or "model" not in cfg:
        raise ExportError(f"{path}: fairseq checkpoint without a model configuration (cfg.model)")
    state["cfg"] = OmegaConf.to_container(cfg, resolve=True)  # the model's Namespace stays a Namespace
    return state


def plain_options(section):
    """A cfg section as a plain dict (training checkpoints of legacy models and tasks, such as
    ``translation_multi_simple_epoch``, hold an argparse.Namespace)."""
    return dict(vars(section)) if isinstance(section, argparse.Namespace) else dict(section or {})


def model_options(cfg):
    """cfg.model as a plain dict."""
    return plain_options(cfg["model"])


def model_name(options):
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    arch = options.get("arch") or options.get("_name")
    return ARCH_MODEL_NAME_REGISTRY.get(arch, arch), arch


# -- the fold -----------------------------------------------------------------------------------

def layer_prefixes(state_dict, stack):
    """``encoder.layers.0.``, ``encoder.layers.1.``, ... present in ``state_dict``, in order."""
    indices = {int(k.split(".")[2]) for k in state_dict if k.startswith(f"{stack}.layers.")}
    return [f"{stack}.layers.{i}." for i in sorted(indices)]


def fold_deepnorm_alpha(state_dict):
    """Divide each residual branch's output projection by its layer's alpha and drop the alpha buffers.

    Returns the folded state dict and each stack's alpha (None for an absent stack)."""
    folded = dict(state_dict)
    alphas = {}
    for stack in ("encoder", "decoder"):
        values = []
        for prefix in layer_prefixes(state_dict, stack):
            alpha = folded.pop(prefix + "deepnorm_alpha")
            values.append(float(alpha))
            for branch in BRANCH_OUTPUTS:
                for param in ("weight", "bias"):
                    key = f"{prefix}{branch}.{param}"
                    if key in folded:  # divided in float64, stored in the checkpoint's dtype (fp16 too)
                        folded[key] = (folded[key].double() / alpha.double()).to(folded[key].dtype)
        if values and max(values) != min(values):  # one eps per stack in the docs and in CTranslate2
            raise ExportError(f"{stack} layers have different DeepNorm alphas ({min(values)}..{max(values)})")
        alphas[stack] = values[0] if values else None
    return folded, alphas


def fold_lns_scale(state_dict):
    """Multiply each LayerNorm Scaling LayerNorm's weight and bias by its ``lns_scale`` and drop the buffers."""
    folded = dict(state_dict)
    for key in [k for k in state_dict if k.endswith(".lns_scale")]:
        prefix, scale = key.removesuffix("lns_scale"), folded.pop(key).double()
        for param in ("weight", "bias"):
            folded[prefix + param] = (folded[prefix + param].double() * scale).to(folded[prefix + param].dtype)
    return folded


# -- plain fairseq cfg --------------------------------------------------------------------------

def transformer_option_names():
    """The options fairseq's legacy ``transformer`` reads (its ``add_args``, plus one its defaults set)."""
    from fairseq.models.transformer import TransformerModel

    parser = argparse.ArgumentParser()
    TransformerModel.add_args(parser)
    return {action.dest for action in parser._actions if action.dest != "help"} | {"decoder_input_dim"}


def transformer_lm_option_names():
    from fairseq.models.transformer_lm import TransformerLanguageModelConfig

    return {f.name for f in dataclasses.fields(TransformerLanguageModelConfig)} - {"_name"}


def plain_model_cfg(options, name, normalize_before):
    """cfg.model for fairseq's ``transformer`` / ``transformer_lm``: only the options it knows."""
    names = transformer_option_names() if name == "transformer" else transformer_lm_option_names()
    model = {k: v for k, v in options.items() if k in names}
    if name == "transformer":
        model["encoder_normalize_before"] = normalize_before
    model["decoder_normalize_before"] = normalize_before
    model["_name"] = model["arch"] = name
    return model


def is_plugin(registry, name):
    cls = registry.get(name)
    return cls is not None and cls.__module__.startswith("deepnet_fairseq")


def plain_cfg(cfg, model_cfg):
    """The checkpoint's cfg with the plugin taken out: no user_dir; the plugin's exact-resume task as
    fairseq's ``translation`` (whose configuration it uses), its back-translating one as fairseq's
    ``translation_multi_simple_epoch``; a plugin criterion or optimizer dropped (decoding needs neither)."""
    from fairseq.criterions import CRITERION_REGISTRY
    from fairseq.optim import OPTIMIZER_REGISTRY
    from fairseq.tasks import TASK_REGISTRY
    from fairseq.tasks.translation import TranslationConfig

    from deepnet_fairseq.training.exact_resume import ExactResumeTranslationTask
    from deepnet_fairseq.training.robt import RobtTranslationTask

    plain = {k: v for k, v in cfg.items() if k != "model"}
    plain["model"] = model_cfg
    if isinstance(plain.get("common"), dict):
        plain["common"] = dict(plain["common"], user_dir=None)
    task = plain["task"] = plain_options(plain.get("task"))
    if TASK_REGISTRY.get(task.get("_name")) is ExactResumeTranslationTask:  # only the options fairseq's task has
        fields = {f.name for f in dataclasses.fields(TranslationConfig)}
        plain["task"] = dict({k: v for k, v in task.items() if k in fields}, _name="translation")
    elif TASK_REGISTRY.get(task.get("_name")) is RobtTranslationTask:  # decoding is its parent's
        parent = {"_name": "translation_multi_simple_epoch", **({"task": "translation_multi_simple_epoch"}
                                                                if "task" in task else {})}
        plain["task"] = dict({k: v for k, v in task.items() if not k.startswith("robt_")}, **parent)
    elif is_plugin(TASK_REGISTRY, task.get("_name")):
        raise ExportError(f"task '{task['_name']}' has no fairseq equivalent")
    for section, registry in (("criterion", CRITERION_REGISTRY), ("optimizer", OPTIMIZER_REGISTRY)):
        entry = plain.get(section)
        if isinstance(entry, dict) and is_plugin(registry, entry.get("_name")):
            plain[section] = None
    return plain


def check_plain(value, where="exported"):
    """Raise unless ``value`` holds only what torch's weights-only unpickler loads without help."""
    if not isinstance(value, PLAIN_TYPES):
        raise ExportError(f"{where}: {type(value).__name__} is not a plain value")
    if isinstance(value, dict):
        for key, item in value.items():
            check_plain(key, where)
            check_plain(item, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_plain(item, f"{where}[{i}]")


# -- export to fairseq --------------------------------------------------------------------------

# fairseq model name -> how it becomes plain fairseq: the registry's methods, and the language models
EXPORTS = {**deepnet_methods.exports(), "deepnet_transformer_lm": deepnet_methods.FOLD,
           "transformer_lm": deepnet_methods.AS_IS}


def refusal(name, arch):
    """Why architecture ``arch`` (model ``name``) cannot be exported, in one line."""
    method = deepnet_methods.of_arch(arch)
    why = f" ({method.no_export})" if method and method.no_export else ""
    return (f"architecture '{arch}' ({name}) has no exact equivalent in plain fairseq{why}; "
            f"export supports {', '.join(EXPORTS)}")


def to_plain_fairseq(state, source="checkpoint"):
    """A plain fairseq checkpoint (dict) equivalent to ``state``; refuses what has no equivalent with an
    ``ExportError`` naming ``source``.

    ``exported_from`` records the source architecture and each stack's DeepNorm alpha: the folded
    model is exact with LayerNorm eps 1e-5/alpha^2 (CTranslate2's export uses it)."""
    try:
        return plain_fairseq_state(state)
    except ExportError as err:
        raise ExportError(f"{source}: {err}") from None


def plain_fairseq_state(state):
    options = model_options(state["cfg"])
    name, arch = model_name(options)
    if name not in EXPORTS:
        raise ExportError(refusal(name, arch))
    if options.get("encoder_drop_residual_layer") is not None:
        raise ExportError(f"--encoder-drop-residual-layer {options['encoder_drop_residual_layer']}: plain fairseq's "
                          "layers always keep their residual connections; no exact equivalent")
    lm = name in ("deepnet_transformer_lm", "transformer_lm")
    weights, alphas = dict(state["model"]), {"encoder": None, "decoder": None}
    if EXPORTS[name] == deepnet_methods.FOLD:
        weights, alphas = fold_deepnorm_alpha(weights)
    elif EXPORTS[name] == deepnet_methods.SCALE:
        weights = fold_lns_scale(weights)
    # 1.0 where there is no DeepNorm: that stack's LayerNorm eps is exact as it is
    alphas = {stack: alphas[stack] or 1.0 for stack in (("decoder",) if lm else ("encoder", "decoder"))}
    normalize_before = bool(options.get("decoder_normalize_before", False))
    if not lm and normalize_before != bool(options.get("encoder_normalize_before", False)):
        raise ExportError("encoder and decoder differ in --*-normalize-before; no plain equivalent")
    plain_name = "transformer_lm" if lm else "transformer"
    cfg = plain_cfg(state["cfg"], plain_model_cfg(options, plain_name, normalize_before))
    history = (state.get("optimizer_history") or [{}])[-1]
    exported = {
        "args": None,
        "cfg": cfg,
        "model": weights,
        "optimizer_history": [{"criterion_name": history.get("criterion_name", "CrossEntropyCriterion"),
                               "optimizer_name": history.get("optimizer_name", "none"),
                               "lr_scheduler_state": {}, "num_updates": int(history.get("num_updates", 0))}],
        "extra_state": {"train_iterator": {"epoch": 1}},
        "task_state": {},
        "exported_from": {"arch": arch, "deepnorm_alpha": alphas},
    }
    check_plain(exported)
    return exported


def build_plain_model(exported, dict_dir):
    """The exported checkpoint as a fairseq model, loaded strictly (dictionaries from ``dict_dir``)."""
    from fairseq import models, tasks
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(exported["cfg"])
    cfg.task.data = str(dict_dir)
    task = tasks.setup_task(cfg.task)
    model = models.build_model(cfg.model, task)
    model.load_state_dict(exported["model"], strict=True)
    return model.eval().requires_grad_(False), task, cfg


def save_atomic(obj, path):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)
    return path


# -- export to CTranslate2 ----------------------------------------------------------------------

def equalise_layer_norm_eps(model, scale):
    """Carry the encoder's residual stream multiplied by ``scale`` (in place; see the module docstring),
    so that every encoder LayerNorm computes with eps*scale^2 what it computed with eps before."""
    encoder = model.encoder
    if getattr(encoder, "layernorm_embedding", None) is not None:
        raise ExportError("--layernorm-embedding: the embedding LayerNorm's eps cannot be kept exact")
    with torch.no_grad():
        encoder.embed_scale = encoder.embed_scale * scale
        positions = encoder.embed_positions
        if positions is not None:
            (positions.weight if isinstance(positions, torch.nn.Embedding) else positions.weights).mul_(scale)
        for layer in encoder.layers:
            for linear in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.fc1):
                linear.weight.div_(scale)
            for module in (layer.self_attn.out_proj, layer.fc2, layer.self_attn_layer_norm, layer.final_layer_norm):
                module.weight.mul_(scale)
                module.bias.mul_(scale)
        for layer in model.decoder.layers:
            for linear in (layer.encoder_attn.k_proj, layer.encoder_attn.v_proj):
                linear.weight.div_(scale)


def ctranslate2_spec(exported, dict_dir):
    """CTranslate2's model spec for an exported encoder-decoder checkpoint, exact for DeepNet."""
    from ctranslate2.converters import fairseq as ct2_fairseq

    if exported["cfg"]["model"]["_name"] != "transformer":
        raise ExportError("CTranslate2 export: translation models (encoder-decoder) only")
    model, task, cfg = build_plain_model(exported, dict_dir)
    alphas = exported["exported_from"]["deepnorm_alpha"]
    eps = model.decoder.layers[0].final_layer_norm.eps  # fairseq's LayerNorm eps
    if alphas["encoder"] != alphas["decoder"]:
        equalise_layer_norm_eps(model, alphas["encoder"] / alphas["decoder"])
    spec = ct2_fairseq._get_model_spec(cfg.model)
    ct2_fairseq.set_transformer_encoder(spec.encoder, model.encoder)
    ct2_fairseq.set_transformer_decoder(spec.decoder, model.decoder)
    spec.register_source_vocabulary(ct2_fairseq._get_vocab(task.source_dictionary))
    spec.register_target_vocabulary(ct2_fairseq._get_vocab(task.target_dictionary))
    spec.config.decoder_start_token = spec.config.eos_token  # fairseq starts decoding with </s>
    spec.config.add_source_eos = True
    spec.config.layer_norm_epsilon = eps / alphas["decoder"] ** 2
    return spec


# -- the translator's languages and text processing (deploy.json) -------------------------------

MULTILINGUAL_TASK = "translation_multi_simple_epoch"


def language_settings(task_cfg, dict_dir):
    """The languages, and the language tokens as the checkpoint's task uses them: fairseq's multilingual
    task prefixes the source with ``__src__`` (``--encoder-langtok src``; ``tgt``: the target's tag) and
    forces the target's tag as the first output token (``--decoder-langtok``)."""
    if task_cfg.get("_name") == MULTILINGUAL_TASK:
        if task_cfg.get("lang_tok_replacing_bos_eos") or list(task_cfg.get("langtoks_specs") or ["main"]) != ["main"]:
            raise ExportError("CTranslate2 export: language tokens as a prefix only (not --lang-tok-replacing-bos-eos "
                              "or other --langtoks-specs)")
        pairs = task_cfg["lang_pairs"]
        pairs = pairs.split(",") if isinstance(pairs, str) else list(pairs)
        langs = task_cfg.get("langs") or sorted({lang for pair in pairs for lang in pair.split("-")})
        return {"source_lang": None, "target_lang": None, "langs": list(langs), "lang_pairs": pairs,
                "encoder_langtok": task_cfg.get("encoder_langtok"), "decoder_langtok": bool(task_cfg.get("decoder_langtok")),
                "lang_tok_style": task_cfg.get("lang_tok_style") or "multilingual"}
    src, tgt = task_cfg.get("source_lang"), task_cfg.get("target_lang")
    if not (src and tgt):  # fairseq-train infers them from the data folder's train.<src>-<tgt>.* files
        from fairseq.data.data_utils import infer_language_pair

        src, tgt = infer_language_pair(str(dict_dir))
        if not (src and tgt):
            raise ExportError(f"{dict_dir}: no train.<src>-<tgt>.* files, and the checkpoint names no language "
                              "pair (-s/-t); give --data the fairseq-preprocess folder the model was trained on")
    return {"source_lang": src, "target_lang": tgt, "langs": None, "lang_pairs": None, "encoder_langtok": None,
            "decoder_langtok": False, "lang_tok_style": None}


def setup_text_settings(work):
    """A setup's pre- and post-processing (its ``prep.json``), and the files it needs {name in OUTDIR: path}."""
    prep_record = json.loads((work / "prep.json").read_text())
    data, prep = prep_record["data"], prep_record["prep"]
    if data.get("kind", "bilingual") == "multilingual":  # one SentencePiece model on raw text
        settings = {"tokenizer": "none", "lowercase": False, "segmentation": "sentencepiece",
                    "sentencepiece_model": "spm.model"}
        files = {"spm.model": work / "spm" / "spm.model"}
    else:  # Moses (normalised, as preparation does) and subword-nmt BPE
        settings = {"tokenizer": prep["tokenizer"], "moses_normalize": True, "moses_escape": prep["moses_escape"],
                    "aggressive_dash_splits": prep["aggressive_dash_splits"], "lowercase": prep["lowercase"],
                    "segmentation": "bpe", "bpe_codes": "bpe.codes"}
        files = {"bpe.codes": work / "bpe" / "codes"}
    return settings, files


def flag_text_settings(tokenizer=None, bpe=None, bpe_codes=None, sentencepiece_model=None):
    """fairseq-interactive's pre- and post-processing for these options (fairseq/data/encoders: Moses
    with its defaults, without punctuation normalisation; subword-nmt BPE; SentencePiece), and the files
    it needs. Neither: the translator reads and writes the dictionary's tokens."""
    settings = {"tokenizer": tokenizer or "none", "moses_normalize": False, "moses_escape": True,
                "aggressive_dash_splits": True, "lowercase": False}
    files = {}
    if bpe == "subword_nmt":
        if not bpe_codes:
            raise ExportError("--bpe subword_nmt needs --bpe-codes FILE")
        settings.update(segmentation="bpe", bpe_codes="bpe.codes")
        files["bpe.codes"] = Path(bpe_codes)
    elif bpe == "sentencepiece":
        if not sentencepiece_model:
            raise ExportError("--bpe sentencepiece needs --sentencepiece-model FILE")
        settings.update(segmentation="sentencepiece", sentencepiece_model="spm.model")
        files["spm.model"] = Path(sentencepiece_model)
    else:
        settings["segmentation"] = "none"
    return settings, files


def decoding_settings(run_config=None):
    """The run's eval settings when it has them, else fairseq-generate's defaults."""
    ev = (run_config or {}).get("eval", {})
    return {"beam": ev.get("beam", 5), "lenpen": ev.get("lenpen", 1.0),
            "max_len_a": ev.get("max_len_a", 0), "max_len_b": ev.get("max_len_b", 200)}


def to_ctranslate2(exported, out_dir, work=None, quantization=None, run_config=None, data=None, text=None):
    """Write a CTranslate2 translator directory: the model, its dictionaries, the files of its text
    processing and ``deploy.json`` (languages, language tokens, tokenisation, decoding defaults).

    With ``work`` (a setup's work folder) the dictionaries are its ``bin/`` and the text processing is
    the setup's; else the dictionaries are in ``data`` (default: the checkpoint's training data folder)
    and the text processing is ``flag_text_settings(**text)``."""
    from ctranslate2.converters.converter import Converter

    if work is not None:
        work = Path(work)
        if not (work / "prep.json").exists():
            raise ExportError(f"{work}: not a prepared setup's work folder (no prep.json)")
        dict_dir = work / "bin"
        settings, files = setup_text_settings(work)
    else:
        dict_dir = Path(data or str(exported["cfg"]["task"].get("data") or "").split(os.pathsep)[0])
        settings, files = flag_text_settings(**(text or {}))
    dictionaries = sorted(dict_dir.glob("dict.*.txt"))
    if not dictionaries:
        raise ExportError(f"{dict_dir}: no fairseq dictionaries (dict.<lang>.txt); give --data the "
                          "fairseq-preprocess folder the model was trained on")
    languages = language_settings(exported["cfg"]["task"], dict_dir)
    for name, path in files.items():
        if not path.is_file():
            raise ExportError(f"{path}: missing (the {name} the model's text was segmented with)")
    spec = ctranslate2_spec(exported, dict_dir)

    class SpecConverter(Converter):
        def _load(self):
            return spec

    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    SpecConverter().convert(str(tmp), quantization=quantization, force=True)
    langs = languages["langs"] or (languages["source_lang"], languages["target_lang"])
    dictionaries = [path for path in dictionaries if path.name[len("dict."):-len(".txt")] in langs]
    if len({path.read_bytes() for path in dictionaries}) == 1 and languages["langs"]:
        shutil.copy(dictionaries[0], tmp / "dict.txt")  # a multilingual model's one dictionary, once
    else:
        for path in dictionaries:
            shutil.copy(path, tmp / path.name)
    for name, path in files.items():
        shutil.copy(path, tmp / name)
    model = exported["cfg"]["model"]
    settings = {**languages, **settings, "decoding": decoding_settings(run_config),
                "max_source_positions": model.get("max_source_positions", 1024),
                "max_target_positions": model.get("max_target_positions", 1024),
                "quantization": quantization or "none", "layer_norm_epsilon": spec.config.layer_norm_epsilon,
                "exported_from": exported["exported_from"]}
    (tmp / DEPLOY_FILE).write_text(json.dumps(settings, indent=1) + "\n", encoding="utf-8")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    return out_dir


def setup_work_dir(exported, data=None):
    """The setup's work folder when the training data (or ``data``) is a prepared setup's ``bin/``, else None."""
    folder = Path(data or str(exported["cfg"]["task"].get("data") or "").split(os.pathsep)[0]).parent
    return folder if (folder / "prep.json").exists() else None


def run_config_for(checkpoint):
    """The training run's resolved config (``<run>/config.resolved.json``) when the checkpoint is in a run folder."""
    checkpoint = Path(checkpoint).resolve()
    for folder in (checkpoint, *checkpoint.parents[:3]):
        if (folder / "config.resolved.json").exists():
            return json.loads((folder / "config.resolved.json").read_text())
    return None


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m deepnet_fairseq.export", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a checkpoint file, or a checkpoints folder with --average-last")
    parser.add_argument("--to", required=True, nargs=2, metavar=("FORMAT", "OUT"),
                        help="transformer OUT.pt | ctranslate2 OUTDIR")
    parser.add_argument("--average-last", type=int, metavar="K",
                        help="average the last K update checkpoints of the folder first")
    parser.add_argument("--quantization", choices=("int8", "int8_float16", "float16"),
                        help="ctranslate2: weight type (default: float32, as trained)")
    group = parser.add_argument_group(
        "ctranslate2: dictionaries and text processing",
        "A model trained by a setup gets the setup's (found from the training data folder, or --work).\n"
        "Any other translation checkpoint: dictionaries from --data (default: the training data folder\n"
        "the checkpoint names), text processing as fairseq-interactive's options; none: tokens in and out.")
    group.add_argument("--work", metavar="DIR",
                       help="the setup's work folder (default: the training data folder's parent)")
    group.add_argument("--data", metavar="DIR",
                       help="the fairseq-preprocess folder with the dictionaries (dict.<lang>.txt)")
    group.add_argument("--tokenizer", choices=("moses",), help="Moses tokenisation (sacremoses, fairseq's defaults)")
    group.add_argument("--bpe", choices=("subword_nmt", "sentencepiece"), help="subword segmentation")
    group.add_argument("--bpe-codes", metavar="FILE", help="--bpe subword_nmt: the BPE codes")
    group.add_argument("--sentencepiece-model", metavar="FILE", help="--bpe sentencepiece: the SentencePiece model")
    args = parser.parse_args(argv)
    target, out = args.to
    text = {k: getattr(args, k) for k in ("tokenizer", "bpe", "bpe_codes", "sentencepiece_model") if getattr(args, k)}
    if target not in ("transformer", "ctranslate2"):
        parser.error(f"--to {target}: choose transformer or ctranslate2")
    if target != "ctranslate2" and (args.quantization or args.work or args.data or text):
        parser.error("--quantization, --work, --data, --tokenizer and --bpe* apply to --to ctranslate2")
    if args.work and (args.data or text):
        parser.error("--work takes the setup's dictionaries and text processing; --data, --tokenizer and --bpe* "
                     "are for checkpoints trained outside a setup")
    try:
        state = read_checkpoint(args.checkpoint, args.average_last)
        exported = to_plain_fairseq(state, source=args.checkpoint)
        if target == "transformer":
            save_atomic(exported, out)
        else:
            work = args.work or (None if text else setup_work_dir(exported, args.data))
            if work is None and not text:
                print("note: no --tokenizer/--bpe: the translator reads and writes the dictionary's tokens, "
                      "space-separated", file=sys.stderr)
            to_ctranslate2(exported, out, work, args.quantization, run_config_for(args.checkpoint), args.data, text)
    except (ExportError, CorruptCheckpointError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    origin = exported["exported_from"]
    print(f"exported {origin['arch']} (DeepNorm alpha {origin['deepnorm_alpha']}) -> {target}: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
