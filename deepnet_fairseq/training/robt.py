"""``translation_multi_robt``: fairseq's ``translation_multi_simple_epoch`` with random online back-translation
(ROBT; Zhang et al. 2020, "Improving Massively Multilingual Neural Machine Translation and Zero-Shot
Translation", ACL), a training-side remedy for zero-shot directions. Opt-in: ``--robt-share 0`` (the default)
trains exactly as the parent task.

In a share of the updates (``--robt-share P``, drawn from ``(seed, update)``, so a resumed run draws the same),
from update ``--robt-from-update U`` on, every target sentence y of the batch (language t) is translated by the
model being trained, greedily and without gradient, into a language t' drawn uniformly from the task's other
languages, and the update also trains on the pairs (that translation -> y): translating into t from a language
the data never pairs with t. Cost per such update: one greedy decode of the batch's targets and a second
forward and backward pass.
"""

import numpy as np
import torch
from fairseq.data import data_utils
from fairseq.sequence_generator import SequenceGenerator
from fairseq.tasks import register_task
from fairseq.tasks.translation_multi_simple_epoch import TranslationMultiSimpleEpochTask

MAX_LEN_A, MAX_LEN_B = 1.2, 10  # the back-translation's length limit, as the setups' evaluation's


@register_task("translation_multi_robt")
class RobtTranslationTask(TranslationMultiSimpleEpochTask):
    """fairseq's multilingual task; ``--robt-share`` adds random online back-translation (module docstring)."""

    @staticmethod
    def add_args(parser):
        TranslationMultiSimpleEpochTask.add_args(parser)
        parser.add_argument("--robt-share", type=float, default=0.0, metavar="P",
                            help="share of updates that also train on the batch's targets back-translated by the "
                                 "model into a random other language (random online back-translation; 0: off)")
        parser.add_argument("--robt-from-update", type=int, default=0, metavar="U",
                            help="back-translate only from update U on (Zhang et al. fine-tune a trained model "
                                 "with it: an untrained model's translations are noise)")

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        loss, sample_size, logging_output = super().train_step(sample, model, criterion, optimizer, update_num,
                                                               ignore_grad)
        if self.args.robt_share <= 0 or update_num < self.args.robt_from_update or ignore_grad or not sample:
            return loss, sample_size, logging_output
        rng = np.random.default_rng([self.args.seed, update_num])
        if rng.random() >= self.args.robt_share:
            return loss, sample_size, logging_output
        synthetic, _ = self.back_translated(sample, model, rng)
        extra_loss, extra_size, extra_output = super().train_step(synthetic, model, criterion, optimizer, update_num)
        for key, value in extra_output.items():  # one update over both batches: losses and counts add up
            if isinstance(value, (int, float, torch.Tensor)) and key in logging_output:
                logging_output[key] = logging_output[key] + value
        return loss + extra_loss, sample_size + extra_size, logging_output

    def back_translated(self, sample, model, rng):
        """(the batch with each target's back-translation as its source, the languages translated into)."""
        src_spec, tgt_spec = self.args.langtoks["main"]
        manager, pad = self.data_manager, self.source_dictionary.pad()
        langs = sorted(set(self.source_langs) | set(self.target_langs))
        target = sample["target"]
        if tgt_spec:  # the target's language: its decoder tag, else the encoder's target tag (t-enc)
            tags, tag_at = {manager.get_decoder_langtok(lang, tgt_spec): lang for lang in langs}, target[:, 0]
        else:
            src = sample["net_input"]["src_tokens"]
            tags = {manager.get_encoder_langtok(None, lang, src_spec): lang for lang in langs}
            tag_at = src.gather(1, src.ne(pad).int().argmax(1, keepdim=True)).squeeze(1)
        target_langs = [tags[int(tag)] for tag in tag_at]
        into = [str(rng.choice([lang for lang in langs if lang != lang_y])) for lang_y in target_langs]
        skip = 1 if tgt_spec else 0  # the decoder tag is not part of the sentence
        sentences = [row[row.ne(pad)][skip:] for row in target]

        def source(tokens, src_lang, tgt_lang):
            tag = manager.get_encoder_langtok(src_lang, tgt_lang, src_spec) if src_spec else None
            return tokens if tag is None else torch.cat([tokens.new_tensor([tag]), tokens])

        rows = [source(s, lang_y, lang) for s, lang_y, lang in zip(sentences, target_langs, into)]
        prefix = (torch.tensor([[manager.get_decoder_langtok(lang, tgt_spec)] for lang in into]).to(target)
                  if tgt_spec else None)
        net = getattr(model, "module", model)  # a DDP wrapper holds the model
        query = {"net_input": {"src_tokens": data_utils.collate_tokens(rows, pad, left_pad=True),
                               "src_lengths": torch.tensor([len(r) for r in rows]).to(target)}}
        was_training = net.training
        generator = SequenceGenerator([net], self.target_dictionary, beam_size=1, max_len_a=MAX_LEN_A,
                                      max_len_b=MAX_LEN_B)  # (puts the model in eval mode)
        with torch.no_grad():
            hypotheses = generator.generate([net], query, prefix_tokens=prefix)
        net.train(was_training)
        rows = [source(h[0]["tokens"][skip:], lang, lang_y) for h, lang, lang_y in zip(hypotheses, into, target_langs)]
        synthetic = dict(sample, net_input=dict(sample["net_input"],
                                                src_tokens=data_utils.collate_tokens(rows, pad, left_pad=True),
                                                src_lengths=torch.tensor([len(r) for r in rows]).to(target)))
        return synthetic, into
