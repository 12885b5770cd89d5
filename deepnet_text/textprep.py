"""The text pipeline, for the setups' preparation and for the deployed translator (export, translate):
reading and checking raw parallel text, archive extraction, Moses tokenisation and detokenisation,
cleaning, BPE, SentencePiece with temperature-sampled training text, subword removal as fairseq does
it, fairseq's language tokens, compound splitting.

Every writer goes through ``atomic_write`` (temp name, then rename), so an interrupted step never
leaves a file that looks finished.
"""

import os
import random
import re
from contextlib import contextmanager
from multiprocessing import Pool
from pathlib import Path


class DataError(ValueError):
    """Bad input data; the message is one line naming the file."""


@contextmanager
def atomic_write(path):
    """Open ``path`` for writing under a temp name; rename only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            yield handle
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_lines(path, lines):
    with atomic_write(path) as handle:
        for line in lines:
            handle.write(line + "\n")


def read_lines(path):
    """All lines of a UTF-8 text file (no newline); one-line errors for missing/empty/non-UTF-8 files.

    The count is exact: one line per ``\\n``, plus a final line without one (trailing blank lines kept)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    data = path.read_bytes()
    if not data.strip():
        raise DataError(f"{path}: file is empty")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise DataError(f"{path}: not UTF-8 (invalid byte at line {line})") from None
    if text.endswith("\n"):  # the newline that ends the last line; blank lines before it are lines
        text = text[:-1]
    return text.split("\n")


def read_parallel(src_path, tgt_path):
    """Both sides of a parallel corpus, checked: present, non-empty, UTF-8, same number of lines."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise DataError(f"{src_path}: {len(src)} lines but {tgt_path} has {len(tgt)} (misaligned parallel text)")
    return src, tgt


# -- archive layouts ---------------------------------------------------------------------------

_SEG = re.compile(r'^\s*<seg id="?[^">]*"?>\s*(.*?)\s*</seg>\s*$')
# fairseq's prepare-iwslt14.sh drops these tag lines and keeps <title>/<description> text
_IWSLT_DROP = re.compile(r"^\s*<(url|talkid|keywords|speaker|reviewer|translator)>")
_IWSLT_TAGS = re.compile(r"</?(title|description)>")


def extract_iwslt_train(path):
    """Text lines of an IWSLT ``train.tags.<pair>.<lang>`` file, as fairseq's prepare-iwslt14.sh keeps them."""
    return [_IWSLT_TAGS.sub("", line).strip() for line in read_lines(path) if not _IWSLT_DROP.match(line)]


def extract_segments(path):
    """The ``<seg>`` texts of an IWSLT XML or WMT SGML file (right quote normalised as fairseq does)."""
    segments = [m.group(1).replace("\u2019", "'") for m in map(_SEG.match, read_lines(path)) if m]
    if not segments:
        raise DataError(f"{path}: no <seg id=...> lines found")
    return segments


def extract_iwslt_archive(raw_dir, out_dir, src, tgt):
    """IWSLT layout (``[<src>-<tgt>/]train.tags.<pair>.<lang>``, ``IWSLT14.*.<pair>.<lang>.xml``) -> plain text.

    Writes ``train.<lang>`` and ``<set>.<lang>`` (e.g. ``IWSLT14.TED.dev2010.de``) into ``out_dir``.
    """
    raw_dir = Path(raw_dir)
    pair = f"{src}-{tgt}"
    base = raw_dir / pair if (raw_dir / pair).is_dir() else raw_dir
    train_tags = {lang: base / f"train.tags.{pair}.{lang}" for lang in (src, tgt)}
    if not train_tags[src].exists():
        raise DataError(f"{train_tags[src]}: file not found (expected IWSLT's archive layout under {raw_dir})")
    sides = {lang: extract_iwslt_train(path) for lang, path in train_tags.items()}
    if len(sides[src]) != len(sides[tgt]):
        raise DataError(f"{train_tags[src]}: {len(sides[src])} text lines but {train_tags[tgt]} has {len(sides[tgt])}")
    for lang, lines in sides.items():
        write_lines(Path(out_dir) / f"train.{lang}", lines)
    xml_sets = sorted(base.glob(f"IWSLT*.{pair}.{src}.xml"))
    for xml in xml_sets:
        name = xml.name[: -len(f".{pair}.{src}.xml")]
        texts = {lang: extract_segments(base / f"{name}.{pair}.{lang}.xml") for lang in (src, tgt)}
        if len(texts[src]) != len(texts[tgt]):
            raise DataError(f"{xml}: {len(texts[src])} segments but the {tgt} side has {len(texts[tgt])}")
        for lang, lines in texts.items():
            write_lines(Path(out_dir) / f"{name}.{lang}", lines)
    return [xml.name[: -len(f".{pair}.{src}.xml")] for xml in xml_sets]


_SGM_NAME = re.compile(r"^(?P<name>.+?)-[a-z]{4}-(src|ref)\.(?P<lang>[a-z]+)\.sgm$")


def extract_sgm_sets(raw_dir, out_dir):
    """Every WMT ``<name>-<pair>-{src,ref}.<lang>.sgm`` under ``raw_dir`` -> ``out_dir/<name>.<lang>``."""
    names = []
    for sgm in sorted(Path(raw_dir).rglob("*.sgm")):
        match = _SGM_NAME.match(sgm.name)
        if match:
            write_lines(Path(out_dir) / f"{match['name']}.{match['lang']}", extract_segments(sgm))
            names.append(match["name"])
    return sorted(set(names))


# -- tokenisation and cleaning ----------------------------------------------------------------

_TOKENIZERS = {}


def _moses_line(args):
    line, lang, escape, aggressive, lowercase, normalize = args
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    if lang not in _TOKENIZERS:
        _TOKENIZERS[lang] = (MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang))
    normalizer, tokenizer = _TOKENIZERS[lang]
    out = tokenizer.tokenize(normalizer.normalize(line) if normalize else line, return_str=True, escape=escape,
                             aggressive_dash_splits=aggressive)
    return out.lower() if lowercase else out


def moses_tokenize(lines, lang, escape=True, aggressive_dash_splits=False, lowercase=False, workers=1, normalize=True):
    """Moses punctuation normalisation (unless ``normalize`` is False, as fairseq's own ``--tokenizer
    moses``) + tokenisation (sacremoses), optionally lowercased."""
    jobs = ((line, lang, escape, aggressive_dash_splits, lowercase, normalize) for line in lines)
    if workers > 1 and len(lines) > 5000:
        with Pool(workers) as pool:
            return list(pool.imap(_moses_line, jobs, chunksize=2000))
    return [_moses_line(job) for job in jobs]


def pretokenize(lines, lang, settings, workers=1):
    """Tokenisation as ``settings`` (a bilingual config's ``prep`` section, or a translator's deploy.json)
    sets it: Moses (normalised unless ``moses_normalize`` is False) or none, lowercased where configured.
    Preparation and ``deepnet_fairseq.translate`` both use it."""
    if settings["tokenizer"] == "none":
        return [line.lower() for line in lines] if settings["lowercase"] else lines
    return moses_tokenize(lines, lang, settings["moses_escape"], settings["aggressive_dash_splits"],
                          settings["lowercase"], workers, settings.get("moses_normalize", True))


def moses_detokenize(lines, lang):
    from sacremoses import MosesDetokenizer

    detok = MosesDetokenizer(lang=lang)
    return [detok.detokenize(line.split()) for line in lines]


def clean_pairs(src, tgt, ratio, min_len, max_len):
    """Moses clean-corpus-n: keep pairs with min_len..max_len tokens per side and length ratio <= ratio."""
    keep_src, keep_tgt = [], []
    for s, t in zip(src, tgt):
        ns, nt = len(s.split()), len(t.split())
        if min_len <= ns <= max_len and min_len <= nt <= max_len and max(ns, nt) <= ratio * min(ns, nt):
            keep_src.append(s)
            keep_tgt.append(t)
    return keep_src, keep_tgt


def compound_split(line):
    """fairseq's compound_split_bleu.sh: ``a-b`` -> ``a ##AT##-##AT## b``."""
    return re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", line)


# -- subword segmentation ----------------------------------------------------------------------

def learn_bpe(lines, codes_path, merges):
    """Joint BPE codes (subword-nmt learn_bpe, as fairseq's prepare scripts call it)."""
    import io

    from subword_nmt import learn_bpe as module

    module.tqdm = lambda iterator, *args, **kwargs: iterator  # no progress bar line per merge
    with atomic_write(codes_path) as out:
        module.learn_bpe(io.StringIO("\n".join(lines) + "\n"), out, merges)


_BPE = {}


def _bpe_line(args):
    line, codes_path = args
    if codes_path not in _BPE:
        from subword_nmt.apply_bpe import BPE

        with open(codes_path, encoding="utf-8") as codes:
            _BPE[codes_path] = BPE(codes)
    return _BPE[codes_path].process_line(line)


def apply_bpe(lines, codes_path, workers=1):
    jobs = ((line, str(codes_path)) for line in lines)
    if workers > 1 and len(lines) > 5000:
        with Pool(workers) as pool:
            return list(pool.imap(_bpe_line, jobs, chunksize=2000))
    return [_bpe_line(job) for job in jobs]


def temperature_sample(corpora, total, temperature, seed=1):
    """Lines for SentencePiece training: language l gets a share ~ (n_l / N)^(1/T) of ``total``.

    ``corpora`` maps language -> list of lines. Small languages are up-sampled (repeated) when their
    share exceeds their size; large ones are sub-sampled without replacement.
    """
    rng = random.Random(seed)
    sizes = {lang: len(lines) for lang, lines in corpora.items() if lines}
    n_all = sum(sizes.values())
    weights = {lang: (n / n_all) ** (1.0 / temperature) for lang, n in sizes.items()}
    norm = sum(weights.values())
    sample = []
    for lang, lines in corpora.items():
        if not lines:
            continue
        want = max(1, round(total * weights[lang] / norm))
        if want <= len(lines):
            sample += rng.sample(lines, want)
        else:
            sample += lines * (want // len(lines)) + rng.sample(lines, want % len(lines))
    rng.shuffle(sample)
    return sample, {lang: weights[lang] / norm for lang in weights}


def train_sentencepiece(lines, model_prefix, vocab_size, model_type, character_coverage):
    """One joint SentencePiece model over ``lines``; writes ``<model_prefix>.model/.vocab`` atomically."""
    import sentencepiece as spm

    model_prefix = Path(model_prefix)
    tmp_prefix = model_prefix.with_name(f".{model_prefix.name}.tmp{os.getpid()}")
    text = tmp_prefix.with_suffix(".txt")
    write_lines(text, lines)
    try:
        spm.SentencePieceTrainer.train(
            input=str(text), model_prefix=str(tmp_prefix), vocab_size=vocab_size, model_type=model_type,
            character_coverage=character_coverage, hard_vocab_limit=False,
            input_sentence_size=len(lines), shuffle_input_sentence=True, minloglevel=2,
        )
        for suffix in (".vocab", ".model"):  # .model last: its presence means finished
            os.replace(f"{tmp_prefix}{suffix}", f"{model_prefix}{suffix}")
    finally:
        for leftover in (text, Path(f"{tmp_prefix}.model"), Path(f"{tmp_prefix}.vocab")):
            if leftover.exists():
                leftover.unlink()


def sentencepiece_encode(lines, model_path):
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=str(model_path))
    return [" ".join(pieces) for pieces in processor.encode(lines, out_type=str)]


def remove_subwords(line, segmentation):
    """Subword tokens -> words, as fairseq-generate's ``--remove-bpe subword_nmt`` / ``sentencepiece``
    (fairseq.data.data_utils.post_process); ``none``: unchanged."""
    if segmentation == "bpe":
        return (line + " ").replace("@@ ", "").rstrip()
    if segmentation == "sentencepiece":
        return line.replace(" ", "").replace("\u2581", " ").strip()
    return line


def language_token(lang, style="multilingual"):
    """fairseq's language tag for ``lang`` (multilingual_utils.get_lang_tok): ``__de__``, or ``[de]`` (mBART)."""
    return {"multilingual": "__{}__", "mbart": "[{}]"}[style].format(lang)


def sentencepiece_fairseq_dict(model_path, dict_path):
    """A fairseq dictionary holding every SentencePiece piece (specials are fairseq's own)."""
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=str(model_path))
    specials = {"<unk>", "<s>", "</s>", "<pad>"}
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    write_lines(dict_path, [f"{p} 1" for p in pieces if p not in specials])
