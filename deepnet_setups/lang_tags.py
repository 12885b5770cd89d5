"""Where a multilingual model's language tags go: named strategies (Wu et al. 2021, "Language Tags Matter
for Zero-Shot Neural Machine Translation"), each as fairseq's ``translation_multi_simple_epoch`` options.

The setups choose one with ``data.lang_tags``; training and evaluation pass its options to fairseq. A model
carries its strategy in its checkpoint's task config (``encoder_langtok``, ``decoder_langtok``), which the
CTranslate2 export and ``python -m deepnet_fairseq.translate`` follow; ``strategy_of`` names it back, so an
evaluation configured with another strategy is refused instead of decoding with the wrong tags.
"""

STRATEGIES = {
    # the source's tag on the encoder, the target's as the decoder's first token (fairseq's multilingual recipe)
    "s-enc-t-dec": {"encoder_langtok": "src", "decoder_langtok": True},
    # the target's tag on the encoder, none on the decoder: Wu et al.'s T-ENC; OPUS-100 (Zhang et al. 2020)
    # prepends the target-language token to the source
    "t-enc": {"encoder_langtok": "tgt", "decoder_langtok": False},
    # the target's tag on both sides
    "t-enc-t-dec": {"encoder_langtok": "tgt", "decoder_langtok": True},
}


def task_options(strategy):
    """fairseq's options for ``strategy`` (for ``runner.fairseq_options``)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"data.lang_tags '{strategy}': one of {', '.join(STRATEGIES)}")
    return dict(STRATEGIES[strategy])


def strategy_of(task_cfg):
    """The strategy a checkpoint's task config trained with (None: tags placed otherwise, or none)."""
    tags = {"encoder_langtok": task_cfg.get("encoder_langtok"), "decoder_langtok": bool(task_cfg.get("decoder_langtok"))}
    return next((name for name, options in STRATEGIES.items() if options == tags), None)


def check_model_strategy(strategy, task_cfg, checkpoint):
    """One line if the model at ``checkpoint`` was trained with tags other than ``strategy``'s."""
    trained = strategy_of(task_cfg)
    if trained != strategy:
        raise ValueError(f"{checkpoint}: trained with language tags {trained or 'of no named strategy'}, "
                         f"but data.lang_tags is {strategy}; evaluate with data.lang_tags={trained} "
                         "(a model decodes only with the tags it was trained with)")
