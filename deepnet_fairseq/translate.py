"""Translate raw text with a CTranslate2 directory written by ``python -m deepnet_fairseq.export``.

    python -m deepnet_fairseq.translate MODEL_DIR < raw.de > out.en
    python -m deepnet_fairseq.translate MODEL_DIR --source-lang de --target-lang fr < raw.de > out.fr   (multilingual)

Raw text in, text out, with the pre- and post-processing recorded in MODEL_DIR/deploy.json: a setup's
(Moses normalisation and tokenisation, lowercased where the setup lowercased, BPE with its codes; or
its SentencePiece model), or fairseq-interactive's options given to the export (--tokenizer moses,
--bpe subword_nmt / sentencepiece), or none (the dictionary's tokens in and out). A multilingual
model gets the language tokens its task used: the source's tag before the source, the target's tag
as the first output token. Then beam search in CTranslate2, subword removal, detokenisation.
Decoding defaults (beam, length penalty, maximum length ``a * source length + b``) are the run's
``eval`` settings, else fairseq-generate's.

Every input line gives exactly one output line: an empty line stays empty; invalid UTF-8 is
replaced by U+FFFD (or, with --invalid-utf8 error, stops the run with one line naming the line
before anything is translated); a line longer than the model's positions is cut to fit; a line the
model cannot translate gives an empty line. Each of these is one warning on stderr naming the line.
Progress goes to stderr.
"""

import argparse
import json
import sys
import time
from pathlib import Path

from deepnet_text import textprep as tp

DEPLOY_FILE = "deploy.json"  # written by deepnet_fairseq.export


class DeployedTranslator:
    """A CTranslate2 translator with its text processing and languages (MODEL_DIR/deploy.json)."""

    def __init__(self, model_dir, device="cpu", threads=1, compute_type="default"):
        import ctranslate2

        self.model_dir = Path(model_dir)
        settings_path = self.model_dir / DEPLOY_FILE
        if not settings_path.exists():
            raise tp.DataError(f"{self.model_dir}: not a translator directory (no {DEPLOY_FILE}; "
                               "write one with python -m deepnet_fairseq.export CHECKPOINT --to ctranslate2 DIR)")
        self.settings = json.loads(settings_path.read_text(encoding="utf-8"))
        if self.settings.get("segmentation") not in ("bpe", "sentencepiece", "none"):
            raise tp.DataError(f"{settings_path}: segmentation {self.settings.get('segmentation')!r} is not supported")
        self.decoding = self.settings["decoding"]
        self.translator = ctranslate2.Translator(str(self.model_dir), device=device, compute_type=compute_type,
                                                 inter_threads=1, intra_threads=threads)

    @property
    def multilingual(self):
        return bool(self.settings.get("langs"))

    def languages(self, source_lang=None, target_lang=None):
        """(source, target) checked against the model's: a multilingual model needs both, from its languages."""
        s = self.settings
        if not self.multilingual:
            for given, name in ((source_lang, "source"), (target_lang, "target")):
                if given not in (None, s[f"{name}_lang"]):
                    raise tp.DataError(f"--{name}-lang {given}: this model translates {s['source_lang']}-{s['target_lang']}")
            return s["source_lang"], s["target_lang"]
        for given, name in ((source_lang, "source"), (target_lang, "target")):
            if given not in s["langs"]:
                raise tp.DataError(f"--{name}-lang {given}: a multilingual model needs --source-lang and --target-lang "
                                   f"from its languages: {' '.join(s['langs'])}")
        return source_lang, target_lang

    # pre- and post-processing (deepnet_text.textprep, the setups' own)

    def segment(self, lines, source_lang=None):
        """Raw sentences -> the subword tokens the model reads (without language tokens)."""
        s = self.settings
        lines = tp.pretokenize(lines, source_lang or s["source_lang"], s)
        if s["segmentation"] == "bpe":
            lines = tp.apply_bpe(lines, self.model_dir / s["bpe_codes"])
        elif s["segmentation"] == "sentencepiece":
            lines = tp.sentencepiece_encode(lines, self.model_dir / s["sentencepiece_model"])
        return [line.split() for line in lines]

    def desegment(self, tokens):
        """Output subword tokens -> tokenised text (what a setup's tokenised BLEU scores), as
        fairseq-generate's ``--remove-bpe`` (subword_nmt or sentencepiece) does."""
        return tp.remove_subwords(" ".join(tokens), self.settings["segmentation"])

    def detokenize(self, lines, target_lang=None):
        if self.settings["tokenizer"] == "moses":
            return tp.moses_detokenize(lines, target_lang or self.settings["target_lang"])
        return lines

    def language_tokens(self, source_lang, target_lang):
        """(source prefix, target prefix): the language tokens as the model's task adds them."""
        s = self.settings
        if not self.multilingual:
            return [], []
        tag = {"src": source_lang, "tgt": target_lang}.get(s["encoder_langtok"])
        source = [tp.language_token(tag, s["lang_tok_style"])] if tag else []
        target = [tp.language_token(target_lang, s["lang_tok_style"])] if s["decoder_langtok"] else []
        return source, target

    # decoding

    def translate_segmented(self, sources, source_lang=None, target_lang=None, beam=None, lenpen=None,
                            max_len_a=None, max_len_b=None, batch_size=32, batches=None, progress=None, warn=None):
        """Subword token lists -> output subword token lists, in input order, as fairseq-generate decodes;
        language tokens added (and removed from the output) as the model's task does.

        As in fairseq-generate, the sentences of a batch may produce at most ``max_len_a * (the batch's
        longest source + </s>) + max_len_b`` tokens, and no more than the model's positions allow.
        ``batches`` (lists of indices) sets those batches (give fairseq-generate's to get its hypotheses
        exactly); by default they are ``batch_size`` sentences, longest first. Each batch is decoded
        ``batch_size`` sentences at a time. A source longer than the model's positions is cut to fit and
        an empty one gives an empty output; ``warn(index, message)`` hears of both, and of a sentence
        that fails to decode (its output is empty)."""
        d = self.decoding
        beam, lenpen = beam or d["beam"], d["lenpen"] if lenpen is None else lenpen
        a = d["max_len_a"] if max_len_a is None else max_len_a
        b = d["max_len_b"] if max_len_b is None else max_len_b
        warn = warn or (lambda index, message: None)
        source_prefix, target_prefix = self.language_tokens(*self.languages(source_lang, target_lang))
        longest = self.settings.get("max_source_positions", 1024) - 1 - len(source_prefix)  # </s> and the tag too
        outputs, todo = [[] for _ in sources], []
        tagged = [None] * len(sources)
        for i, tokens in enumerate(sources):
            if not tokens:
                continue  # an empty line translates to an empty line
            if len(tokens) > longest:
                warn(i, f"{len(tokens)} tokens, cut to the first {longest} (the model's source positions)")
                tokens = tokens[:longest]
            tagged[i] = source_prefix + tokens
            todo.append(i)
        if batches is None:
            order = sorted(todo, key=lambda i: -len(tagged[i]))
            batches = [order[start:start + batch_size] for start in range(0, len(order), batch_size)]
        positions_left = self.settings.get("max_target_positions", 1024) - 1
        done = 0
        for batch in batches:
            batch = sorted((i for i in batch if tagged[i]), key=lambda i: -len(tagged[i]))
            if not batch:
                continue
            limit = max(1, min(int(a * (len(tagged[batch[0]]) + 1) + b), positions_left))
            for chunk in (batch[start:start + batch_size] for start in range(0, len(batch), batch_size)):
                for i, hypothesis in zip(chunk, self.decode_chunk([tagged[i] for i in chunk], target_prefix, beam,
                                                                  lenpen, limit, chunk, warn)):
                    outputs[i] = [token for token in hypothesis if token not in target_prefix]
                done += len(chunk)
                if progress:
                    progress(done, len(todo))
        return outputs

    def decode_chunk(self, sources, target_prefix, beam, lenpen, limit, indices, warn):
        """Beam search on one chunk; if it fails, sentence by sentence, so that one bad sentence (an
        empty output, warned about) never loses the others."""
        try:
            return self.fairseq_best(sources, target_prefix, beam, lenpen, limit)
        except (RuntimeError, ValueError) as error:
            if len(sources) == 1:
                warn(indices[0], f"not translated ({type(error).__name__}: {error}); output left empty")
                return [[]]
            return [self.decode_chunk([source], target_prefix, beam, lenpen, limit, [i], warn)[0]
                    for source, i in zip(sources, indices)]

    def fairseq_best(self, sources, target_prefix, beam, lenpen, limit):
        """fairseq-generate's best hypothesis (prefix included, </s> not) for each source, from CTranslate2's
        beam search, which differs from fairseq's (fairseq/sequence_generator.py) in three places:

        - **The forced prefix's score.** fairseq ranks a finished hypothesis by its log-probability, the
          forced target prefix (the language tag) and </s> included, divided by its length (those tokens
          counted)^lenpen. CTranslate2 divides by the same length but scores the prefix 0. The prefix's
          log-probability is the same for all of a sentence's hypotheses (beam search itself is unchanged)
          but changes the ranking between lengths (the less likely the tag, the more fairseq prefers the
          longer ones): it is added back.
        - **</s> right after the prefix.** fairseq ends a hypothesis there when </s> is among the ``beam``
          best next tokens; CTranslate2 ends it only from the first beam and leaves the beam it would take
          dead, so that its beam differs from the next step on. Where </s> is 2nd to ``beam``-th after the
          prefix, </s> is disabled at that one step (``min_decoding_length``: the other tokens, as fairseq
          takes them) and ``prefix </s>`` is added as fairseq scores it; CTranslate2 then collects up to
          ``2 beam`` hypotheses (``patience``), of which fairseq's are those that ended first (fairseq
          stops when ``beam`` have ended, ``prefix </s>`` the first).
        - **The length limit.** fairseq's hypotheses have at most ``limit`` tokens before </s>: at step
          ``limit`` it allows only </s>, so each live hypothesis of ``limit`` tokens ends with its real </s>
          log-probability, unless the sentence's ``beam`` hypotheses ended earlier. CTranslate2 stops at its
          maximum length without </s> and keeps only ``beam`` hypotheses of its last step. Decoded to
          ``limit + 1`` tokens, CTranslate2 ends the same sentences at the same steps with the same
          hypotheses. A sentence that gets to ``limit`` tokens is ranked among its hypotheses that ended
          and the live ones with </s> forced, all scored by ``score_batch`` (every token's log-probability,
          </s> included): the live ones are the first ``limit`` tokens of those that went on, and those
          that CTranslate2 stops at the limit when decoding to ``limit`` tokens. Either decode shows only
          ``beam`` live ones, so a live one that neither shows is missed (docs/deploy.md)."""
        n = len(sources)
        prefix_score, ends_after_prefix, ended = [0.0] * n, [False] * n, [None] * n
        if target_prefix:
            scored = self.translator.score_batch(sources, [target_prefix] * n, max_input_length=0)
            prefix_score = [sum(r.log_probs[:len(target_prefix)]) for r in scored]
            ended = [sum(r.log_probs) / len(r.log_probs) ** lenpen for r in scored]  # fairseq's score of prefix </s>
            if beam > 1:
                ends_after_prefix = [0 < rank < beam for rank in self.end_rank_after(sources, target_prefix)]
        best = [None] * n
        for early in (False, True):
            group = [j for j in range(n) if ends_after_prefix[j] == early]
            if not group:
                continue
            options = {"beam_size": beam, "num_hypotheses": beam, "length_penalty": lenpen, "max_input_length": 0,
                       "target_prefix": [target_prefix] * len(group) if target_prefix else None}
            if early:
                options.update(num_hypotheses=2 * beam, patience=2, min_decoding_length=len(target_prefix) + 1)
            results = self.translator.translate_batch([sources[j] for j in group], max_decoding_length=limit + 1,
                                                      return_scores=True, **options)
            reached = []
            for j, result in zip(group, results):
                hypotheses = [(list(h), score + prefix_score[j] / (len(h) + 1) ** lenpen)  # + 1: the </s>
                              for h, score in zip(result.hypotheses, result.scores)]
                if early:
                    hypotheses.append((list(target_prefix), ended[j]))
                # fairseq's: the first beam to end before the limit (at a step, the likeliest first)
                ended_first = sorted(hypotheses, key=lambda h: (len(h[0]), -h[1]))
                ended_first = [h for h in ended_first if len(h[0]) < limit][:beam]
                if len(ended_first) == beam:
                    best[j] = max(ended_first, key=lambda h: h[1])[0]
                else:  # fairseq got to the limit
                    reached.append((j, [h for h, _ in ended_first + hypotheses]))
            if reached:
                if early:
                    options["min_decoding_length"] = min(len(target_prefix) + 1, limit)
                options["target_prefix"] = [target_prefix] * len(reached) if target_prefix else None
                again = self.translator.translate_batch([sources[j] for j, _ in reached], max_decoding_length=limit,
                                                        **options)
                self.rank_at_limit(sources, [(j, seen + r.hypotheses) for (j, seen), r in zip(reached, again)],
                                   limit, lenpen, best)
        return best

    def rank_at_limit(self, sources, seen, limit, lenpen, best):
        """``best[j]``: the best of the hypotheses seen for sentence j, each cut to ``limit`` tokens and ended
        with </s>, scored as fairseq scores them (``score_batch``: log-probabilities, </s> included)."""
        pairs = [(j, list(h)) for j, hypotheses in seen for h in dict.fromkeys(tuple(h[:limit]) for h in hypotheses)]
        scored = self.translator.score_batch([sources[j] for j, _ in pairs], [h for _, h in pairs], max_input_length=0)
        best_score = {}
        for (j, hypothesis), result in zip(pairs, scored):
            score = sum(result.log_probs) / len(result.log_probs) ** lenpen
            if score > best_score.get(j, -float("inf")):
                best_score[j], best[j] = score, hypothesis

    def end_rank_after(self, sources, target_prefix):
        """For each source, how many tokens are likelier than </s> right after the target prefix."""
        import numpy as np

        if not hasattr(self, "_end_id"):
            names = [name for name in ("target_vocabulary.json", "shared_vocabulary.json")
                     if (self.model_dir / name).exists()]
            vocabulary = json.loads((self.model_dir / names[0]).read_text(encoding="utf-8"))
            self._end_id = vocabulary.index("</s>")
        results = self.translator.translate_batch(sources, [target_prefix] * len(sources), beam_size=1,
                                                  max_decoding_length=len(target_prefix) + 1, max_input_length=0,
                                                  return_logits_vocab=True)
        ranks = []
        for result in results:
            logits = np.asarray(result.logits[0][len(target_prefix)])
            ranks.append(int((logits > logits[self._end_id]).sum()))
        return ranks

    def translate(self, lines, source_lang=None, target_lang=None, batch_size=32, progress=None, warn=None,
                  **decoding):
        """Raw sentences -> translations (detokenised), one per sentence."""
        outputs = self.translate_segmented(self.segment(lines, source_lang), source_lang, target_lang,
                                           batch_size=batch_size, progress=progress, warn=warn, **decoding)
        return self.detokenize([self.desegment(tokens) for tokens in outputs], target_lang)


def decode_lines(data, invalid_utf8="replace", warn=None):
    """Bytes -> text lines, one per ``\\n`` (a ``\\r`` before it dropped), plus a last line without one.
    Invalid UTF-8 is replaced by U+FFFD and warned about (``warn(index, message)``), or with
    ``invalid_utf8="error"`` a ``DataError`` naming the first such line."""
    raw = data.split(b"\n")
    if raw[-1] == b"":
        raw.pop()  # the newline that ends the last line
    lines = []
    for i, line in enumerate(raw):
        line = line[:-1] if line.endswith(b"\r") else line
        try:
            lines.append(line.decode("utf-8"))
        except UnicodeDecodeError as err:
            message = f"invalid UTF-8 (byte 0x{line[err.start]:02x} at byte {err.start + 1})"
            if invalid_utf8 == "error":
                raise tp.DataError(f"line {i + 1}: {message}") from None
            if warn:
                warn(i, message + ", replaced by U+FFFD")
            lines.append(line.decode("utf-8", errors="replace"))
    return lines


def stderr_warning(index, message):
    print(f"[translate] warning: line {index + 1}: {message}", file=sys.stderr, flush=True)


def stderr_progress(every=10):
    """A progress callback printing ``translated N/M sentences (S sent/s)`` every ``every`` batches."""
    start, calls = time.time(), [0]

    def progress(done, total):
        calls[0] += 1
        if calls[0] % every == 0 or done == total:
            rate = done / max(time.time() - start, 1e-9)
            print(f"[translate] {done}/{total} sentences ({rate:.1f} sentences/s)", file=sys.stderr, flush=True)

    return progress


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m deepnet_fairseq.translate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir")
    parser.add_argument("--source-lang", help="source language (required for a multilingual model)")
    parser.add_argument("--target-lang", help="target language (required for a multilingual model)")
    parser.add_argument("--beam", type=positive_int, help="beam size (default: the run's eval.beam, else 5)")
    parser.add_argument("--lenpen", type=float, help="length penalty (default: the run's eval.lenpen, else 1)")
    parser.add_argument("--max-len-a", type=float, help="maximum output length a * source length + b")
    parser.add_argument("--max-len-b", type=int)
    parser.add_argument("--batch-size", type=positive_int, default=32, help="sentences per batch (default 32)")
    parser.add_argument("--threads", type=positive_int, default=1, help="CPU threads (default 1)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--compute-type", default="default",
                        help="CTranslate2 compute type (default: the model's; e.g. int8, float16)")
    parser.add_argument("--invalid-utf8", choices=("replace", "error"), default="replace",
                        help="a line that is not UTF-8: replace its bad bytes by U+FFFD and warn (default), or "
                             "stop with an error naming the line before translating anything")
    parser.add_argument("--input", help="read this file instead of stdin")
    parser.add_argument("--output", help="write this file instead of stdout")
    args = parser.parse_args(argv)
    try:
        translator = DeployedTranslator(args.model_dir, device=args.device, threads=args.threads,
                                        compute_type=args.compute_type)
        translator.languages(args.source_lang, args.target_lang)
        if args.input and not Path(args.input).is_file():
            raise tp.DataError(f"{args.input}: file not found")
        data = Path(args.input).read_bytes() if args.input else sys.stdin.buffer.read()
        lines = decode_lines(data, args.invalid_utf8, stderr_warning)
        start = time.time()
        translations = translator.translate(lines, args.source_lang, args.target_lang, batch_size=args.batch_size,
                                            progress=stderr_progress(), warn=stderr_warning, beam=args.beam,
                                            lenpen=args.lenpen, max_len_a=args.max_len_a, max_len_b=args.max_len_b)
    except tp.DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.output:
        tp.write_lines(args.output, translations)
    else:
        sys.stdout.write("".join(line + "\n" for line in translations))
    print(f"[translate] {len(lines)} sentences in {time.time() - start:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
