"""DeepNorm's constants (Wang et al. 2022, "DeepNet: Scaling Transformers to 1,000 Layers", Fig. 2).

This is the one home of the alpha/beta formulas. A stack with 0 layers is absent, so the same
function serves encoder-decoder, encoder-only (BERT-like) and decoder-only (GPT-like) models:

    architecture      encoder alpha           encoder beta             decoder alpha  decoder beta
    encoder-only      (2N)^(1/4)              (8N)^(-1/4)              -              -
    decoder-only      -                       -                        (2M)^(1/4)     (8M)^(-1/4)
    encoder-decoder   0.81 (N^4 M)^(1/16)     0.87 (N^4 M)^(-1/16)     (3M)^(1/4)     (12M)^(-1/4)

alpha up-weights the residual in every sublayer, ``x <- LN(alpha * x + G(x))``; beta is the gain of
``xavier_normal_`` for the FFN weights and the attention value/output projections.

Which weights get beta: the value/output projections and FFN ``fc1``/``fc2`` of the sublayer groups in
``SUBLAYER_GROUPS``, in every layer, except where the init (a record of ``DEEPNORM_INITS``, the one list of
``--deepnorm-init`` names) or the ablation option ``--deepnorm-gains`` gives a group, or one layer of it,
another Xavier gain (``sublayer_gain``).
"""

from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class DeepNormConstants:
    encoder_alpha: Optional[float] = None
    encoder_beta: Optional[float] = None
    decoder_alpha: Optional[float] = None
    decoder_beta: Optional[float] = None

    def describe(self) -> str:
        parts = []
        if self.encoder_alpha is not None:
            parts.append(f"encoder alpha={self.encoder_alpha:.4f} beta={self.encoder_beta:.4f}")
        if self.decoder_alpha is not None:
            parts.append(f"decoder alpha={self.decoder_alpha:.4f} beta={self.decoder_beta:.4f}")
        return "DeepNorm: " + ", ".join(parts)


def _check_layers(value, option: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{option} must be a non-negative integer, got {value!r}")
    return value


def _check_override(value, option: str) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
        raise ValueError(f"{option} must be a finite number > 0, got {value!r}")
    return float(value)


# The sublayer groups whose value/output (attention) or fc1/fc2 (FFN) weights the init scales by beta.
SUBLAYER_GROUPS = ("encoder_self_attn", "encoder_ffn", "decoder_self_attn", "decoder_cross_attn", "decoder_ffn")
# and the query/key projections of each attention group, which the init leaves at gain 1
SUBLAYER_GROUPS += tuple(f"{group}_qk" for group in SUBLAYER_GROUPS if group.endswith("_attn"))


@dataclass(frozen=True)
class DeepNormInit:
    """A ``--deepnorm-init``: the c of an encoder-decoder model's encoder beta c (N^4 M)^(-1/16) (every other
    beta is the paper's) and the Xavier gains it sets apart from beta, as ``parse_gains`` gives them."""

    name: str
    encoder_beta_coefficient: float
    description: str  # the option's help
    gains: dict = field(default_factory=dict)
    pytorch_default_linear: bool = False  # beta multiplies PyTorch's default Linear init, not a Xavier gain


DEEPNORM_INITS = {init.name: init for init in (
    DeepNormInit("paper", 0.87, "Xavier-normal gains and beta of the paper"),
    # torchscale/architecture/encoder.py divides weights and biases by (N^4 M)^(1/16) / 1.15
    DeepNormInit("torchscale", 1.15, "torchscale 0.3.0's released init; docs/torchscale.md",
                 pytorch_default_linear=True),
    # the decoder hears its source within a few hundred updates, and the early update stays bounded
    DeepNormInit("source", 0.87 / 4, "the paper's with a quarter of its encoder beta and the last decoder layer's "
                 "cross-attention at gain 1: no source-ignoring plateau; docs/diagnostics.md",
                 gains={("decoder_cross_attn", -1): 1.0}),
)}


def parse_gains(spec: Optional[str]) -> dict:
    """``--deepnorm-gains``: "GROUP=GAIN,GROUP[i]=GAIN,..." -> {(group, layer index or None): gain}.

    ``decoder_ffn=1`` sets the group's gain in every layer; ``decoder_cross_attn[0]=1`` in its first layer
    only and ``[-1]`` in its last (Python indices; a layer's own entry wins over its group's).
    """
    gains = {}
    for item in filter(None, (part.strip() for part in (spec or "").split(","))):
        target, _, value = item.partition("=")
        group, bracket, index = target.partition("[")
        index_ok = not bracket or (index.endswith("]") and index[:-1].lstrip("-").isdigit())
        try:
            gain = float(value)
        except ValueError:
            gain = None
        if group not in SUBLAYER_GROUPS or not index_ok or gain is None or not 0 < gain < float("inf"):
            raise ValueError(f"--deepnorm-gains: {item!r} is not GROUP=GAIN or GROUP[i]=GAIN with a gain > 0 and "
                             f"GROUP one of {', '.join(SUBLAYER_GROUPS)}")
        gains[group, int(index[:-1]) if bracket else None] = gain
    return gains


def sublayer_gain(gains: dict, group: str, layer: int, num_layers: int, beta: float) -> float:
    """The Xavier gain of ``group``'s scaled weights in layer ``layer`` (0-based, of ``num_layers``)."""
    own = [g for (name, index), g in gains.items()
           if name == group and index is not None and index % num_layers == layer]
    return own[-1] if own else gains.get((group, None), beta)


def deepnorm_constants(
    encoder_layers: int = 0,
    decoder_layers: int = 0,
    *,
    init: str = "paper",
    encoder_alpha: Optional[float] = None,
    encoder_beta: Optional[float] = None,
    decoder_alpha: Optional[float] = None,
    decoder_beta: Optional[float] = None,
) -> DeepNormConstants:
    """The paper's alpha and beta for an N-layer encoder and M-layer decoder (0 = no such stack).

    ``init`` (a name in ``DEEPNORM_INITS``) chooses the beta formula of the initialisation it goes with.
    Keyword overrides (for ablations) replace a formula's value; each must be > 0. Errors name the
    command-line option they come from.
    """
    if init not in DEEPNORM_INITS:
        raise ValueError(f"--deepnorm-init must be one of {sorted(DEEPNORM_INITS)}, got {init!r}")
    n = _check_layers(encoder_layers, "--encoder-layers")
    m = _check_layers(decoder_layers, "--decoder-layers")
    if n == 0 and m == 0:
        raise ValueError("--encoder-layers and --decoder-layers: at least one stack needs >= 1 layer")
    overrides = {
        "encoder_alpha": _check_override(encoder_alpha, "--deepnorm-encoder-alpha"),
        "encoder_beta": _check_override(encoder_beta, "--deepnorm-encoder-beta"),
        "decoder_alpha": _check_override(decoder_alpha, "--deepnorm-decoder-alpha"),
        "decoder_beta": _check_override(decoder_beta, "--deepnorm-decoder-beta"),
    }
    if n and m:  # encoder-decoder
        paper = dict(
            encoder_alpha=0.81 * (n**4 * m) ** (1 / 16),
            encoder_beta=DEEPNORM_INITS[init].encoder_beta_coefficient * (n**4 * m) ** (-1 / 16),
            decoder_alpha=(3 * m) ** (1 / 4),
            decoder_beta=(12 * m) ** (-1 / 4),
        )
    elif n:  # encoder-only
        paper = dict(encoder_alpha=(2 * n) ** (1 / 4), encoder_beta=(8 * n) ** (-1 / 4))
    else:  # decoder-only
        paper = dict(decoder_alpha=(2 * m) ** (1 / 4), decoder_beta=(8 * m) ** (-1 / 4))
    for name, value in overrides.items():
        if value is not None:
            if name not in paper:
                stack = name.split("_")[0]
                raise ValueError(f"--deepnorm-{name.replace('_', '-')} given, but the model has no {stack}")
            paper[name] = value
    return DeepNormConstants(**paper)
