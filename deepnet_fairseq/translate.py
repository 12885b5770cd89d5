"""Translate raw text with a CTranslate2 directory written by ``python -m deepnet_fairseq.export``.

    python -m deepnet_fairseq.translate MODEL_DIR < raw.de > out.en

Raw text in, detokenised text out, with the pre- and post-processing of the setup that trained the
model (``deploy.json`` in MODEL_DIR): Moses normalisation and tokenisation (lowercased where the
setup lowercased) and BPE with the setup's codes; then beam search in CTranslate2; then BPE
removal and Moses detokenisation. Decoding defaults (beam, length penalty,
maximum length ``a * source length + b``) are the setup's ``eval`` settings. Progress goes to stderr.
"""

import argparse
import json
import sys
import time
from pathlib import Path

from .setups import textprep as tp

DEPLOY_FILE = "deploy.json"  # written by deepnet_fairseq.export


class DeployedTranslator:
    """A CTranslate2 translator with its setup's tokenisation (MODEL_DIR/deploy.json)."""

    def __init__(self, model_dir, device="cpu", threads=1, compute_type="default"):
        import ctranslate2

        self.model_dir = Path(model_dir)
        settings_path = self.model_dir / DEPLOY_FILE
        if not settings_path.exists():
            raise tp.DataError(f"{self.model_dir}: not a translator directory (no {DEPLOY_FILE}; "
                               "write one with python -m deepnet_fairseq.export CHECKPOINT --to ctranslate2 DIR)")
        self.settings = json.loads(settings_path.read_text(encoding="utf-8"))
        if self.settings.get("segmentation") != "bpe":
            raise tp.DataError(f"{settings_path}: segmentation {self.settings.get('segmentation')!r} is not supported")
        self.decoding = self.settings["decoding"]
        self.translator = ctranslate2.Translator(str(self.model_dir), device=device, compute_type=compute_type,
                                                 inter_threads=1, intra_threads=threads)

    # pre- and post-processing: the setup's own (deepnet_fairseq.setups.textprep, fairseq's BPE removal)

    def segment(self, lines):
        """Raw sentences -> the subword tokens the model reads."""
        s = self.settings
        lines = tp.setup_tokenize(lines, s["source_lang"], s)  # deploy.json holds the prep settings it reads
        return [line.split() for line in tp.apply_bpe(lines, self.model_dir / s["bpe_codes"])]

    def desegment(self, tokens):
        """Output subword tokens -> tokenised text (what the setup's tokenised BLEU scores), as
        fairseq-generate's ``--remove-bpe`` does."""
        from fairseq.data.data_utils import post_process

        return post_process(" ".join(tokens), "subword_nmt")

    def detokenize(self, lines):
        if self.settings["tokenizer"] == "moses":
            return tp.moses_detokenize(lines, self.settings["target_lang"])
        return lines

    # decoding

    def translate_segmented(self, sources, beam=None, lenpen=None, max_len_a=None, max_len_b=None,
                            batch_size=32, batches=None, progress=None):
        """Subword token lists -> output subword token lists, in input order, as fairseq-generate decodes.

        As in fairseq-generate, the sentences of a batch may produce at most ``max_len_a * (the batch's
        longest source + </s>) + max_len_b`` tokens. ``batches`` (lists of indices) sets those batches
        (give fairseq-generate's to get its hypotheses exactly); by default they are ``batch_size``
        sentences, longest first. Each batch is decoded ``batch_size`` sentences at a time."""
        d = self.decoding
        beam, lenpen = beam or d["beam"], d["lenpen"] if lenpen is None else lenpen
        a = d["max_len_a"] if max_len_a is None else max_len_a
        b = d["max_len_b"] if max_len_b is None else max_len_b
        if batches is None:
            order = sorted(range(len(sources)), key=lambda i: -len(sources[i]))
            batches = [order[start:start + batch_size] for start in range(0, len(order), batch_size)]
        outputs, done = [None] * len(sources), 0
        for batch in batches:
            limit = max(1, int(a * (max(len(sources[i]) for i in batch) + 1) + b))
            batch = sorted(batch, key=lambda i: -len(sources[i]))
            for chunk in (batch[start:start + batch_size] for start in range(0, len(batch), batch_size)):
                chunk_sources = [sources[i] for i in chunk]
                results = self.translator.translate_batch(
                    chunk_sources, beam_size=beam, num_hypotheses=beam, length_penalty=lenpen,
                    max_decoding_length=limit, max_input_length=0)
                best = self.best_hypotheses(chunk_sources, [r.hypotheses for r in results], limit, lenpen)
                for i, hypothesis in zip(chunk, best):
                    outputs[i] = hypothesis
                done += len(chunk)
                if progress:
                    progress(done, len(sources))
        return outputs

    def best_hypotheses(self, sources, nbest, limit, lenpen):
        """CTranslate2's best, except where the length limit was reached: there fairseq ends each hypothesis
        with a forced </s> and ranks by (log-prob including that </s>) / (length + 1)^lenpen, while
        CTranslate2 stops without it; those n-best lists are rescored as fairseq scores them."""
        best = [hypotheses[0] for hypotheses in nbest]
        limited = [j for j, hypotheses in enumerate(nbest) if any(len(h) >= limit for h in hypotheses)]
        pairs = [(j, h) for j in limited for h in nbest[j]]
        if not pairs:
            return best
        scored = self.translator.score_batch([sources[j] for j, _ in pairs], [h for _, h in pairs], max_input_length=0)
        best_score = {}
        for (j, hypothesis), result in zip(pairs, scored):
            score = sum(result.log_probs) / len(result.log_probs) ** lenpen  # log_probs include </s>
            if score > best_score.get(j, -float("inf")):
                best_score[j], best[j] = score, hypothesis
        return best

    def translate(self, lines, batch_size=32, progress=None, **decoding):
        """Raw sentences -> detokenised translations."""
        outputs = self.translate_segmented(self.segment(lines), batch_size=batch_size, progress=progress, **decoding)
        return self.detokenize([self.desegment(tokens) for tokens in outputs])


def stderr_progress(every=10):
    """A progress callback printing ``translated N/M sentences (S sent/s)`` every ``every`` batches."""
    start, calls = time.time(), [0]

    def progress(done, total):
        calls[0] += 1
        if calls[0] % every == 0 or done == total:
            rate = done / max(time.time() - start, 1e-9)
            print(f"[translate] {done}/{total} sentences ({rate:.1f} sentences/s)", file=sys.stderr, flush=True)

    return progress


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m deepnet_fairseq.translate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir")
    parser.add_argument("--beam", type=int, help="beam size (default: the setup's eval.beam)")
    parser.add_argument("--lenpen", type=float, help="length penalty (default: the setup's eval.lenpen)")
    parser.add_argument("--max-len-a", type=float, help="maximum output length a * source length + b")
    parser.add_argument("--max-len-b", type=int)
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per batch (default 32)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (default 1)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--compute-type", default="default",
                        help="CTranslate2 compute type (default: the model's; e.g. int8, float16)")
    parser.add_argument("--input", help="read this file instead of stdin")
    parser.add_argument("--output", help="write this file instead of stdout")
    args = parser.parse_args(argv)
    try:
        translator = DeployedTranslator(args.model_dir, device=args.device, threads=args.threads,
                                        compute_type=args.compute_type)
        lines = tp.read_lines(args.input) if args.input else sys.stdin.read().splitlines()
        start = time.time()
        translations = translator.translate(lines, batch_size=args.batch_size, progress=stderr_progress(),
                                            beam=args.beam, lenpen=args.lenpen, max_len_a=args.max_len_a,
                                            max_len_b=args.max_len_b)
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
