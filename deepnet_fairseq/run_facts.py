"""What a checkpoint says of the run that wrote it, for the run records: the model's shape, its DeepNorm init and
constants, the schedule, the seed, the precision and the update count, read from the checkpoint's own config (the
options fairseq-train resolved), never from a line the run printed.

    checkpoint_facts("RUN/checkpoints/checkpoint_last.pt")
    -> {"arch": "deepnet_transformer_iwslt_de_en", "width": 64, "ffn": 256, "heads": 4, "encoder_layers": 18, ...}
"""

from dataclasses import asdict

import torch

from .models.deepnet_transformer import DeepNetConfig


def precision(common):
    """fairseq's common options as the precision a run computed in (fp16 and bf16 need a GPU here)."""
    if common.get("bf16"):
        return "bf16"
    return "fp16" if common.get("fp16") or common.get("memory_efficient_fp16") else "fp32"


def checkpoint_facts(path):
    """The facts of ``path`` (a fairseq checkpoint, averaged ones included): see the module's docstring. ``init``
    and ``deepnorm`` (the constants, at full precision) only for DeepNet, the one family with a named init."""
    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # the plugin's allow-list applies
    cfg, model = state["cfg"], vars(state["cfg"]["model"])
    history = state.get("optimizer_history") or [{}]
    facts = {"arch": model.get("arch"), "width": model.get("encoder_embed_dim"),
             "ffn": model.get("encoder_ffn_embed_dim"), "heads": model.get("encoder_attention_heads"),
             "encoder_layers": model.get("encoder_layers"), "decoder_layers": model.get("decoder_layers"),
             "lr": cfg["optimization"]["lr"][0], "warmup_updates": cfg["lr_scheduler"].get("warmup_updates"),
             "seed": cfg["common"]["seed"], "precision": precision(cfg["common"]),
             "updates": history[-1].get("num_updates"),
             "valid_loss": (state.get("extra_state") or {}).get("val_loss")}  # of the validation before the save
    if str(model.get("arch", "")).startswith("deepnet_transformer"):
        config = DeepNetConfig.from_namespace(state["cfg"]["model"])
        facts["init"] = str(config.deepnorm_init)
        facts["deepnorm"] = asdict(config.deepnorm())
    return facts
