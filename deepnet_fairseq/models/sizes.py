"""Named size variants shared by every architecture family of the plugin.

Each variant takes fairseq's own defaults for that shape; depth is always set with
``--encoder-layers`` / ``--decoder-layers``.

    variant          embed  ffn   heads  fairseq defaults taken from
    (none)           512    2048  8      transformer
    iwslt_de_en      512    1024  4      transformer_iwslt_de_en
    wmt_en_de        512    2048  8      transformer_wmt_en_de
    wmt_en_de_big    1024   4096  16     transformer_vaswani_wmt_en_de_big (dropout 0.3)
    opus100          512    2048  8      transformer (DeepNet's OPUS-100 models)
    m2m_102          1024   4096  16     transformer_vaswani_wmt_en_de_big (DeepNet's 102-language model)
"""

from fairseq.models import register_model_architecture
from fairseq.models.transformer.transformer_legacy import (
    base_architecture,
    transformer_iwslt_de_en,
    transformer_vaswani_wmt_en_de_big,
    transformer_wmt_en_de,
)

SIZE_VARIANTS = {
    "": base_architecture,
    "iwslt_de_en": transformer_iwslt_de_en,
    "wmt_en_de": transformer_wmt_en_de,
    "wmt_en_de_big": transformer_vaswani_wmt_en_de_big,
    "opus100": base_architecture,
    "m2m_102": transformer_vaswani_wmt_en_de_big,
}


def register_size_variants(model_name, family_defaults):
    """Register ``model_name`` and ``model_name_<variant>`` for every size variant.

    ``family_defaults(args)`` sets the family's own defaults (with ``getattr`` so the command line
    wins) before fairseq's size defaults are applied.
    """
    for variant, size_defaults in SIZE_VARIANTS.items():
        arch_name = f"{model_name}_{variant}" if variant else model_name

        def arch(args, size_defaults=size_defaults):
            family_defaults(args)
            size_defaults(args)

        register_model_architecture(model_name, arch_name)(arch)
