"""CrossConST (Gao et al., Findings of ACL 2023, "Improving Zero-shot Multilingual Neural Machine Translation
by Leveraging Cross-lingual Consistency Regularization"): the pieces ``diagnostic_label_smoothed_cross_entropy``
uses for ``--crossconst-alpha A`` (0 = off).

The term. For a pair (x, y), teacher-forced on the same decoder input (y's prefixes, ``prev_output_tokens``),
f(x) is the model's output distribution at each target position given the source x, and f(y) the one given the
target sentence y itself as the source. The training loss becomes

    label-smoothed CE(x, y)  +  A * sum over the non-pad target positions t of  KL( f(x)_t || f(y)_t ),

and ``crossconst`` logs the sum of KL (without A) per ``sample_size`` in bits, as fairseq logs ``loss``: the
logged loss is the logged label-smoothed CE plus A times the logged crossconst.

Choices, as the paper's Eq. and the authors' fairseq 0.12 criterion (gpengzhi/CrossConST-MT,
user_src/label_smoothed_cross_entropy_with_crossconst.py) make them:

- Direction: KL(f(x) || f(y)), the original source's distribution first. The authors call
  ``kl_div(input=log_softmax(logits given y), target=softmax(logits given x))``, which is
  sum p_x (log p_x - log p_y). Here the same call takes both sides as log-probabilities (``log_target``): the
  log-probabilities the cross-entropy already computed for x (fairseq's ``get_normalized_probs``, fp32 also
  under fp16/bf16) and the same for y, the same value without the log of a softmax.
- Gradient: through both sides. The authors do not detach the softmax of the original forward, so the term
  also pulls f(x) towards f(y); nothing here is detached either.
- Masking: positions where the target is padding contribute 0 (the authors mask by ``target != pad``), and
  ``--ignore-prefix-size N`` drops the first N positions, as it does for the cross-entropy.
- Normalisation: the KL is summed over positions and sentences and added to the summed cross-entropy, so
  fairseq's division by ``sample_size`` (target tokens, or sentences with ``--sentence-avg``) makes it a
  per-token mean, as the authors do.
- Training only: the term is added when the model is in training mode (the authors' ``if model.training``).
  Validation losses stay the cross-entropy, comparable with runs without it.
- Dropout: each of the two forwards draws its own dropout masks (fairseq seeds them per update, so a resumed
  run draws the same ones), as in the authors' code: with dropout on, the term also measures the difference
  between two dropout masks (as R-Drop does), not only between the two sources.

The target-as-source input (``target_as_source``): the target sentence as the encoder would see it in the
direction target -> target, laid out as the task lays out sources.

- Tokens: each target row's non-pad tokens, in order (target ends with EOS, as a source does), padded on the
  side the task pads sources (``left_pad_source``; fairseq's default left), whichever side the target is padded.
  The target's token ids are fed to the encoder, so source and target must share one dictionary (the setups'
  joined dictionary): refused otherwise.
- Language tag (fairseq's ``translation_multi_simple_epoch``; deepnet_setups/lang_tags.py's strategies): the tag
  the strategy puts on the encoder for a sentence in the target language, translated into that language. Under
  every strategy of lang_tags.py that is the target language's tag __tgt__, so the target-as-source is
  ``__tgt__ y </s>``:
    * t-enc (``--encoder-langtok tgt``, no decoder tag; the authors' own layout, which prepends the
      target-language tag to the source text): the target carries no tag; the source's tag (first non-pad
      token) is the target language's, and is put before y.
    * t-enc-t-dec (``--encoder-langtok tgt --decoder-langtok``): the target starts with the decoder's tag
      __tgt__, which is dropped from y; the source's tag (__tgt__ too) is put before it: the same tokens.
    * s-enc-t-dec (``--encoder-langtok src --decoder-langtok``): the source's tag is the source language's, the
      wrong one for y; the encoder tag of a sentence in the target language is that language's, __tgt__, which
      is the target's first token (the decoder's tag): the target as it is.
  With no encoder tag only the decoder tag, if any, is dropped. ``--encoder-langtok src`` without
  ``--decoder-langtok`` is refused: the target language of each row (batches mix directions) is then nowhere in
  the batch. ``--lang-tok-replacing-bos-eos`` is refused too (its tags replace EOS/BOS; not handled). With
  ``--enable-lang-ids``, the encoder's ``src_lang_id`` becomes the batch's ``tgt_lang_id``.
- Bilingual tasks (``translation``, the plugin's ``translation_exact_resume``): no tags, ``y </s>``.

The second forward is the whole model's (``model(**net_input)``, the same call fairseq's criterion makes), so
any wrapper, hook and architecture sees it as a forward of its own. A target-as-source one token longer than the
longest source (the T-ENC tag) can exceed a learned positional embedding's ``--max-source-positions`` only for a
target at ``--max-target-positions`` with equal limits; sinusoidal positions (the default) have no limit.
"""

import torch
from fairseq import utils


class CrossConSTError(ValueError):
    """A task whose batches CrossConST cannot build the target-as-source input for; one line."""


class TargetAsSource:
    """How to build the target-as-source encoder input for ``task``'s batches (checked once, at build time)."""

    def __init__(self, task):
        settings = task.cfg if getattr(task, "cfg", None) is not None else getattr(task, "args", None)
        left_pad = getattr(settings, "left_pad_source", True)
        self.left_pad = utils.eval_bool(left_pad) if isinstance(left_pad, str) else bool(left_pad)
        source, target = task.source_dictionary, task.target_dictionary
        if source is None or target is None or source.symbols != target.symbols:
            raise CrossConSTError("--crossconst-alpha feeds the target sentence to the encoder, so source and target "
                                  "need one dictionary (fairseq-preprocess --joined-dictionary)")
        self.pad = target.pad()
        # the multilingual task's tags for its main data, as its data manager resolves them (langtoks["main"])
        encoder_tag, decoder_tag = getattr(settings, "encoder_langtok", None), getattr(settings, "decoder_langtok", False)
        encoder_tag, decoder_tag = (getattr(settings, "langtoks", None) or {}).get("main", (encoder_tag, decoder_tag))
        decoder_tag = bool(decoder_tag)
        if (encoder_tag or decoder_tag) and getattr(settings, "lang_tok_replacing_bos_eos", False):
            raise CrossConSTError("--crossconst-alpha does not handle --lang-tok-replacing-bos-eos")
        if encoder_tag and encoder_tag.startswith("src") and not decoder_tag:
            raise CrossConSTError("--crossconst-alpha with --encoder-langtok src needs --decoder-langtok: the target "
                                  "language's tag for the target-as-source input is then the target's first token")
        # where the tag of the target-as-source comes from: None, "source" (the source's first token: the encoder
        # tag, __tgt__) or "target" (the target's first token: the decoder tag, __tgt__)
        self.tag_from = None if not encoder_tag else "target" if encoder_tag.startswith("src") else "source"
        self.drop_decoder_tag = decoder_tag

    def __call__(self, sample):
        """The ``net_input`` of the target-as-source forward: ``sample["net_input"]`` with the target as source."""
        net_input = sample["net_input"]
        tags = None
        if self.tag_from == "source":
            tags = first_token(net_input["src_tokens"], self.pad)
        elif self.tag_from == "target":
            tags = first_token(sample["target"], self.pad)
        src_tokens = target_as_source(sample["target"], self.pad, self.left_pad, tags, self.drop_decoder_tag)
        new_input = dict(net_input, src_tokens=src_tokens, src_lengths=src_tokens.ne(self.pad).sum(dim=1))
        if "src_lang_id" in net_input and sample.get("tgt_lang_id") is not None:
            new_input["src_lang_id"] = sample["tgt_lang_id"]
        return new_input


def first_token(tokens, pad):
    """Each row's first non-pad token (rows padded on either side)."""
    index = tokens.ne(pad).int().argmax(dim=1, keepdim=True)  # the first maximum: the first non-pad position
    return tokens.gather(1, index).squeeze(1)


def target_as_source(target, pad, left_pad, tags=None, drop_first=False):
    """Each row of ``target`` (padded on either side) as an encoder input: its non-pad tokens in order, without
    the first one if ``drop_first``, after ``tags[row]`` if given, padded on the left if ``left_pad``."""
    keep = target.ne(pad)
    if drop_first:
        keep = keep & keep.int().cumsum(dim=1).gt(1)
    lengths = keep.sum(dim=1) + (0 if tags is None else 1)
    width = int(lengths.max())
    start = (width - lengths) if left_pad else torch.zeros_like(lengths)  # each row's first column
    column = keep.long().cumsum(dim=1) - 1 + start[:, None] + (0 if tags is None else 1)
    rows = torch.arange(target.size(0), device=target.device)[:, None].expand_as(target)
    out = target.new_full((target.size(0), width), pad)
    out[rows[keep], column[keep]] = target[keep]
    if tags is not None:
        out[torch.arange(target.size(0), device=target.device), start] = tags
    return out


def divergence(lprobs_x, lprobs_y, target, pad, reduce=True):
    """sum over the non-pad target positions of KL(f(x) || f(y)), from the log-probabilities given the source
    (``lprobs_x``) and given the target as source (``lprobs_y``), both N x V and ``target`` N as fairseq's
    ``get_lprobs_and_target`` flattens them (per position if not ``reduce``). torch's ``kl_div(input, target)`` is
    KL(target || input); with ``log_target`` it takes log-probabilities and passes gradient to both."""
    kl = torch.nn.functional.kl_div(lprobs_y, lprobs_x, reduction="none", log_target=True).sum(dim=-1)
    kl = kl.masked_fill(target.eq(pad), 0.0)
    return kl.sum() if reduce else kl
