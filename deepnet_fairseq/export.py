"""Export a trained checkpoint to plain fairseq (no plugin needed to load it) or to CTranslate2.

    python -m deepnet_fairseq.export CHECKPOINT --to transformer OUT.pt
    python -m deepnet_fairseq.export CHECKPOINT --to ctranslate2 OUTDIR [--quantization int8] [--work DIR]
    python -m deepnet_fairseq.export RUN/checkpoints --average-last 5 --to ...   (average first)

What is exported, and why it is exact:

- ``deepnet_transformer`` -> fairseq's ``transformer``. LayerNorm is scale-invariant up to its eps:
  ``LN_eps(alpha*x + G(x)) = LN_{eps/alpha^2}(x + G(x)/alpha)``. Dividing each residual branch's
  output projection (self-attention ``out_proj``, cross-attention ``out_proj``, ``fc2``; weight and
  bias) by its layer's alpha (the ``deepnorm_alpha`` buffer the checkpoint holds) leaves a Post-LN
  Transformer whose only difference is LayerNorm's eps: fairseq's 1e-5 where 1e-5/alpha^2 is exact.
- ``deepnet_transformer_lm`` -> ``transformer_lm`` by the same fold.
- ``preln_transformer`` / ``postln_transformer`` -> ``transformer`` (their weights are fairseq's, with
  ``--{encoder,decoder}-normalize-before`` on / off); fairseq's own ``transformer`` passes through.
- Every other architecture is refused: none has an exact equivalent in plain fairseq.

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
times c. docs/deploy.md has the derivation. The directory also gets the dictionaries and the
setup's tokenisation (Moses settings and BPE codes; bilingual setups) in ``deploy.json``, so
``python -m deepnet_fairseq.translate OUTDIR`` translates raw text.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

import deepnet_fairseq  # noqa: F401  (architectures; weights-only allow-list; checked checkpoint loading)
from deepnet_fairseq.training.checkpoint_integrity import CorruptCheckpointError
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

    from deepnet_fairseq.setups.average import average_checkpoints, last_checkpoints

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


def model_options(cfg):
    """cfg.model as a plain dict (training checkpoints of legacy models hold an argparse.Namespace)."""
    model = cfg["model"]
    return dict(vars(model)) if isinstance(model, argparse.Namespace) else dict(model)


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


# -- plain fairseq cfg --------------------------------------------------------------------------

def transformer_option_names():
    """The options fairseq's legacy ``transformer`` reads (its ``add_args``, plus one its defaults set)."""
    from fairseq.models.transformer import TransformerModel

    parser = argparse.ArgumentParser()
    TransformerModel.add_args(parser)
    return {action.dest for action in parser._actions if action.dest != "help"} | {"decoder_input_dim"}


def transformer_lm_option_names():
    import dataclasses

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
    fairseq's ``translation`` (whose configuration it uses); a plugin criterion or optimizer dropped
    (decoding needs neither)."""
    from fairseq.criterions import CRITERION_REGISTRY
    from fairseq.optim import OPTIMIZER_REGISTRY
    from fairseq.tasks import TASK_REGISTRY

    from deepnet_fairseq.training.exact_resume import ExactResumeTranslationTask

    plain = {k: v for k, v in cfg.items() if k != "model"}
    plain["model"] = model_cfg
    if isinstance(plain.get("common"), dict):
        plain["common"] = dict(plain["common"], user_dir=None)
    task = plain.get("task") or {}
    if TASK_REGISTRY.get(task.get("_name")) is ExactResumeTranslationTask:
        plain["task"] = dict(task, _name="translation")
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

SUPPORTED = ("deepnet_transformer", "deepnet_transformer_lm", "preln_transformer", "postln_transformer",
             "transformer", "transformer_lm")


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
    if name not in SUPPORTED:
        raise ExportError(f"architecture '{arch}' ({name}) has no exact equivalent in plain fairseq; "
                          f"export supports {', '.join(SUPPORTED)}")
    lm = name in ("deepnet_transformer_lm", "transformer_lm")
    if name.startswith("deepnet_"):
        weights, alphas = fold_deepnorm_alpha(state["model"])
    else:
        weights, alphas = dict(state["model"]), {"encoder": None, "decoder": None}
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
    return spec, task


def find_work_dir(cfg, work=None):
    """The setup's work folder (``prep.json``, ``bin/``, ``bpe/codes``)."""
    if work is not None:
        folder = Path(work)
    else:
        data = str(cfg["task"].get("data") or "").split(os.pathsep)[0]
        folder = Path(data).parent
    if not (folder / "prep.json").exists():
        raise ExportError(f"{folder}: not a prepared setup's work folder (no prep.json); give --work DIR "
                          "(the paths.work the data was prepared in)")
    return folder


def tokenisation_settings(work, run_config=None):
    """deploy.json's content: languages, the setup's pre/post-processing and its decoding defaults."""
    prep_record = json.loads((work / "prep.json").read_text())
    data, prep = prep_record["data"], prep_record["prep"]
    if data.get("kind", "bilingual") != "bilingual":
        raise ExportError(f"{work}: multilingual setups (SentencePiece, language tokens) are not supported by "
                          "the CTranslate2 export yet; export them with --to transformer")
    settings = {"source_lang": data["source_lang"], "target_lang": data["target_lang"],
                "tokenizer": prep["tokenizer"], "lowercase": prep["lowercase"],
                "moses_escape": prep["moses_escape"], "aggressive_dash_splits": prep["aggressive_dash_splits"]}
    if not (work / "bpe" / "codes").exists():  # bilingual setups segment with subword-nmt BPE
        raise ExportError(f"{work / 'bpe' / 'codes'}: missing (the setup's BPE codes)")
    settings["segmentation"], settings["bpe_codes"] = "bpe", "bpe.codes"
    ev = (run_config or {}).get("eval", {})
    settings["decoding"] = {"beam": ev.get("beam", 5), "lenpen": ev.get("lenpen", 1.0),
                            "max_len_a": ev.get("max_len_a", 0), "max_len_b": ev.get("max_len_b", 200)}
    return settings


def to_ctranslate2(exported, out_dir, work, quantization=None, run_config=None):
    """Write a CTranslate2 translator directory: model, dictionaries, tokenisation (``deploy.json``)."""
    from ctranslate2.converters.converter import Converter

    settings = tokenisation_settings(work, run_config)
    dict_dir = work / "bin"
    spec, task = ctranslate2_spec(exported, dict_dir)

    class SpecConverter(Converter):
        def _load(self):
            return spec

    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    SpecConverter().convert(str(tmp), quantization=quantization, force=True)
    for lang in (settings["source_lang"], settings["target_lang"]):
        shutil.copy(dict_dir / f"dict.{lang}.txt", tmp / f"dict.{lang}.txt")
    shutil.copy(work / "bpe" / "codes", tmp / settings["bpe_codes"])
    settings.update(quantization=quantization or "none", layer_norm_epsilon=spec.config.layer_norm_epsilon,
                    exported_from=exported["exported_from"])
    (tmp / DEPLOY_FILE).write_text(json.dumps(settings, indent=1) + "\n", encoding="utf-8")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    return out_dir


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
    parser.add_argument("--work", help="ctranslate2: the setup's work folder (default: the training data's parent)")
    args = parser.parse_args(argv)
    target, out = args.to
    if target not in ("transformer", "ctranslate2"):
        parser.error(f"--to {target}: choose transformer or ctranslate2")
    if args.quantization and target != "ctranslate2":
        parser.error("--quantization applies to --to ctranslate2")
    try:
        state = read_checkpoint(args.checkpoint, args.average_last)
        exported = to_plain_fairseq(state, source=args.checkpoint)
        if target == "transformer":
            save_atomic(exported, out)
        else:
            work = find_work_dir(exported["cfg"], args.work)
            to_ctranslate2(exported, out, work, args.quantization, run_config_for(args.checkpoint))
    except (ExportError, CorruptCheckpointError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    origin = exported["exported_from"]
    print(f"exported {origin['arch']} (DeepNorm alpha {origin['deepnorm_alpha']}) -> {target}: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
