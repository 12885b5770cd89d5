"""Stages 1-2 of every setup: raw text -> tokenised/segmented text -> fairseq binary data.

    python -m deepnet_setups.prepare CONFIG [key=value ...] --stage text [--raw-dir DIR]
    python -m deepnet_setups.prepare CONFIG [key=value ...] --stage binarize

Work folder (``paths.work``)::

    download/            archives from data.downloads (when no --raw-dir), extracted under download/raw
    extracted/           plain text pulled out of IWSLT XML / WMT SGML
    tok/                 bilingual: Moses-tokenised (lowercased) train/valid/test; the tokenised references
    bpe/                 bilingual: codes + BPE-segmented train/valid/test
    ref/                 raw test text (detokenised references for sacreBLEU)
    spm/, spm_text/      multilingual: the joint SentencePiece model and segmented text per corpus
    bin/                 fairseq-preprocess output (joined dictionary)

Each step writes under temp names and leaves a ``.done`` marker only after success; a rerun skips
finished steps. ``prep.json`` records the data/prep settings (not the tag strategy): a rerun with other settings stops.
"""

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

from deepnet_text import textprep as tp
from .config import ConfigError, load
from .runner import program


def log(message):
    print(f"[prepare] {message}", flush=True)


class Step:
    """A step whose outputs live in ``folder``; ``.done`` appears only after success."""

    def __init__(self, folder, name):
        self.folder, self.name = Path(folder), name
        self.marker = self.folder / ".done"

    def done(self):
        """True (and says so) if finished earlier; otherwise starts the clock."""
        if self.marker.exists():
            log(f"{self.name}: already done ({self.folder}), skipping")
            return True
        log(f"{self.name} ...")
        self.start = time.time()
        return False

    def finish(self):
        self.marker.parent.mkdir(parents=True, exist_ok=True)
        self.marker.write_text(time.strftime("%Y-%m-%dT%H:%M:%S\n"))
        log(f"{self.name}: done in {time.time() - self.start:.1f}s")


# fairseq adds the language tags while training and decoding: one prepared folder serves every strategy
NOT_PREPARED = ("lang_tags",)


def check_fingerprint(cfg, work, raw_dir):
    data = {key: value for key, value in cfg["data"].items() if key not in NOT_PREPARED}
    settings = {"data": data, "prep": cfg["prep"], "raw_dir": str(raw_dir)}
    path = work / "prep.json"
    if path.exists():
        old = json.loads(path.read_text())
        for key in NOT_PREPARED:  # written by earlier versions
            old.get("data", {}).pop(key, None)
        for key in ("raw_dir", "data", "prep"):
            if old.get(key) != settings[key]:
                changed = key if key == "raw_dir" else next(
                    (f"{key}.{k}" for k in settings[key] if old.get(key, {}).get(k) != settings[key][k]), key)
                raise tp.DataError(f"{work}: prepared earlier with a different '{changed}'; "
                                   f"use another paths.work or remove {work}")
        return
    with tp.atomic_write(path) as handle:
        json.dump(settings, handle, indent=1)


# -- downloads ---------------------------------------------------------------------------------

def download(cfg, work):
    """Fetch and extract data.downloads into ``work/download/raw``; returns that folder."""
    downloads = cfg["data"]["downloads"]
    if not downloads:
        raise tp.DataError(f"{cfg['setup']}: no public download for this corpus; give --raw-dir DIR (see docs/setups.md)")
    folder = work / "download"
    raw = folder / "raw"
    step = Step(raw, "download and extract")
    if step.done():
        return raw
    for item in downloads:
        url, sha = item["url"], item.get("sha256")
        target = folder / url.rsplit("/", 1)[-1]
        if not target.exists():
            log(f"downloading {url}")
            tmp = target.with_name(target.name + ".part")
            folder.mkdir(parents=True, exist_ok=True)
            try:
                with urllib.request.urlopen(url, timeout=60) as response, open(tmp, "wb") as out:
                    shutil.copyfileobj(response, out, length=1 << 20)
            except OSError as err:
                raise tp.DataError(f"{url}: download failed ({err}); download it yourself and use --raw-dir") from None
            tmp.rename(target)
        if sha:
            digest = hashlib.sha256(target.read_bytes()).hexdigest()
            if digest != sha:
                raise tp.DataError(f"{target}: sha256 {digest} does not match the config's {sha}")
        log(f"extracting {target.name}")
        with tarfile.open(target) as archive:
            archive.extractall(raw, filter="data")
    step.finish()
    return raw


# -- bilingual ---------------------------------------------------------------------------------

def _find(prefix, lang, folders):
    for folder in folders:
        path = Path(folder) / f"{prefix}.{lang}"
        if path.exists():
            return path
    return Path(folders[-1]) / f"{prefix}.{lang}"


def _read_sets(prefixes, src, tgt, folders, max_lines=None):
    all_src, all_tgt = [], []
    for prefix in prefixes:
        s, t = tp.read_parallel(_find(prefix, src, folders), _find(prefix, tgt, folders))
        if max_lines:
            s, t = s[:max_lines], t[:max_lines]
        all_src += s
        all_tgt += t
    return all_src, all_tgt


def prepare_bilingual(cfg, raw_dir, work, workers):
    data, prep = cfg["data"], cfg["prep"]
    src, tgt = data["source_lang"], data["target_lang"]
    folders = [raw_dir]
    if data["layout"] in ("iwslt_archive", "wmt_archives"):
        extracted = work / "extracted"
        step = Step(extracted, f"extract text from the {data['layout']} layout")
        if not step.done():
            if data["layout"] == "iwslt_archive":
                names = tp.extract_iwslt_archive(raw_dir, extracted, src, tgt)
            else:
                names = tp.extract_sgm_sets(raw_dir, extracted)
            log(f"extracted sets: {', '.join(names) or '(none)'}")
            step.finish()
        folders = [extracted, raw_dir]
    if not data["test"]:
        raise tp.DataError(f"{cfg['setup']}: data.test is empty")

    def tokenize(lines, lang):
        return tp.pretokenize(lines, lang, prep, workers)

    tok, ref = work / "tok", work / "ref"
    step = Step(tok, "tokenise and clean")
    if not step.done():
        splits = {}
        train = _read_sets(data["train"], src, tgt, folders, prep["max_train_lines"])
        log(f"train: {len(train[0])} pairs read")
        train_tok = tp.clean_pairs(tokenize(train[0], src), tokenize(train[1], tgt), prep["clean_ratio"],
                                   prep["clean_min_len"], prep["clean_max_len"])
        log(f"train: {len(train_tok[0])} pairs after cleaning (ratio {prep['clean_ratio']}, "
            f"length {prep['clean_min_len']}-{prep['clean_max_len']})")
        if data["valid"]:
            valid = _read_sets(data["valid"], src, tgt, folders)
            splits["valid"] = (tokenize(valid[0], src), tokenize(valid[1], tgt))
            splits["train"] = train_tok
        else:  # fairseq: every n-th cleaned training pair is held out
            n = data["valid_every"]
            splits["valid"] = tuple([x for i, x in enumerate(side, 1) if i % n == 0] for side in train_tok)
            splits["train"] = tuple([x for i, x in enumerate(side, 1) if i % n != 0] for side in train_tok)
        test = _read_sets(data["test"], src, tgt, folders)
        splits["test"] = (tokenize(test[0], src), tokenize(test[1], tgt))
        for lang, lines in zip((src, tgt), test):
            tp.write_lines(ref / f"test.{lang}", lines)
        for split, (s, t) in splits.items():
            tp.write_lines(tok / f"{split}.{src}", s)
            tp.write_lines(tok / f"{split}.{tgt}", t)
            log(f"{split}: {len(s)} pairs")
        step.finish()

    bpe = work / "bpe"
    step = Step(bpe, f"joint BPE ({prep['bpe_merges']} merges, subword-nmt)")
    if not step.done():
        train = [tp.read_lines(tok / f"train.{lang}") for lang in (src, tgt)]
        tp.learn_bpe(train[0] + train[1], bpe / "codes", prep["bpe_merges"])
        for split in ("train", "valid", "test"):
            for lang in (src, tgt):
                lines = tp.read_lines(tok / f"{split}.{lang}")
                tp.write_lines(bpe / f"{split}.{lang}", tp.apply_bpe(lines, bpe / "codes", workers))
        step.finish()


def binarize_bilingual(cfg, work, workers, dry_run=False):
    src, tgt = cfg["data"]["source_lang"], cfg["data"]["target_lang"]
    bpe, out = work / "bpe", work / "bin"
    tmp = work / "bin.tmp"
    cmd = [program("fairseq-preprocess"), "--source-lang", src, "--target-lang", tgt,
           "--trainpref", bpe / "train", "--validpref", bpe / "valid", "--testpref", bpe / "test",
           "--destdir", tmp, "--joined-dictionary", "--workers", workers]
    return _run_binarize([cmd], out, tmp, dry_run)


def _run_binarize(cmds, out, tmp, dry_run):
    if (out / ".done").exists():
        log(f"binarise: already done ({out}), skipping")
        return out
    if dry_run:
        for cmd in cmds:
            print(" ".join(map(str, cmd)))
        return out
    start = time.time()
    shutil.rmtree(tmp, ignore_errors=True)
    for cmd in cmds:
        log("running: " + " ".join(map(str, cmd)))
        proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
            raise tp.DataError(f"fairseq-preprocess failed writing {tmp} ({tail[0]})")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    (out / ".done").write_text(time.strftime("%Y-%m-%dT%H:%M:%S\n"))
    log(f"binarise: done in {time.time() - start:.1f}s -> {out}")
    return out


# -- multilingual ------------------------------------------------------------------------------

def corpus_name(a, b):
    """OPUS-100 names a corpus by its two languages in alphabetical order (``de-en``, ``en-fr``)."""
    return "-".join(sorted((a, b)))


def multilingual_corpora(cfg):
    """corpus -> the splits it is used for (training pairs: all splits; zero-shot: test only)."""
    data = cfg["data"]
    corpora = {}
    for pair in data["lang_pairs"]:
        corpora[corpus_name(*pair.split("-"))] = ("train", "valid", "test")
    for pair in data["zero_shot_pairs"]:
        corpora.setdefault(corpus_name(*pair.split("-")), ("test",))
    return corpora


def _opus_files(raw_dir, corpus, split_name):
    a, b = corpus.split("-")
    for group in ("supervised", "zeroshot", ""):
        folder = Path(raw_dir) / group / corpus if group else Path(raw_dir) / corpus
        if folder.is_dir():
            return [folder / f"opus.{corpus}-{split_name}.{lang}" for lang in (a, b)]
    raise tp.DataError(f"{Path(raw_dir) / 'supervised' / corpus}: corpus folder not found (OPUS-100 layout)")


def prepare_multilingual(cfg, raw_dir, work, workers):
    data, prep = cfg["data"], cfg["prep"]
    corpora = multilingual_corpora(cfg)
    split_names = {"train": data["train"][0] if data["train"] else "train",
                   "valid": data["valid"][0] if data["valid"] else "dev",
                   "test": data["test"][0] if data["test"] else "test"}
    ref, text = work / "ref", work / "spm_text"
    spm_dir = work / "spm"
    raw = {}  # (split, corpus) -> (lines_a, lines_b)
    for corpus, splits in corpora.items():
        for split in splits:
            files = _opus_files(raw_dir, corpus, split_names[split])
            if split != "train" and not files[0].exists():
                log(f"{corpus}: no {split} set, skipped")
                continue
            a, b = tp.read_parallel(*files)
            if split == "train" and prep["max_train_lines"]:
                a, b = a[: prep["max_train_lines"]], b[: prep["max_train_lines"]]
            raw[(split, corpus)] = (a, b)
    step = Step(spm_dir, f"joint SentencePiece ({prep['spm_vocab_size']} pieces, temperature {prep['spm_sample_temperature']})")
    if not step.done():
        per_lang = {}
        for (split, corpus), sides in raw.items():
            if split == "train":
                for lang, lines in zip(corpus.split("-"), sides):
                    per_lang.setdefault(lang, []).extend(lines)
        sample, shares = tp.temperature_sample(per_lang, prep["spm_sample_sentences"],
                                               prep["spm_sample_temperature"], seed=cfg["train"]["seed"])
        log("SentencePiece training text shares: " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(shares.items())))
        tp.train_sentencepiece(sample, spm_dir / "spm", prep["spm_vocab_size"], prep["spm_model_type"],
                               prep["spm_character_coverage"])
        tp.sentencepiece_fairseq_dict(spm_dir / "spm.model", spm_dir / "dict.txt")
        step.finish()
    step = Step(text, "SentencePiece-encode every corpus")
    if not step.done():
        model = spm_dir / "spm.model"
        for (split, corpus), (a, b) in raw.items():
            la, lb = corpus.split("-")
            enc_a, enc_b = tp.sentencepiece_encode(a, model), tp.sentencepiece_encode(b, model)
            if split == "train":
                before = len(enc_a)
                enc_a, enc_b = tp.clean_pairs(enc_a, enc_b, prep["clean_ratio"], prep["clean_min_len"],
                                              prep["clean_max_len"])
                log(f"{corpus} train: {len(enc_a)} of {before} pairs kept after cleaning")
            if split == "test":
                tp.write_lines(ref / f"test.{corpus}.{la}", a)
                tp.write_lines(ref / f"test.{corpus}.{lb}", b)
            tp.write_lines(text / f"{split}.{corpus}.{la}", enc_a)
            tp.write_lines(text / f"{split}.{corpus}.{lb}", enc_b)
        step.finish()


def binarize_multilingual(cfg, work, workers, dry_run=False):
    text, out, tmp = work / "spm_text", work / "bin", work / "bin.tmp"
    dict_txt = work / "spm" / "dict.txt"
    cmds = []
    for corpus in multilingual_corpora(cfg):
        a, b = corpus.split("-")
        cmd = [program("fairseq-preprocess"), "--source-lang", a, "--target-lang", b,
               "--destdir", tmp, "--srcdict", dict_txt, "--tgtdict", dict_txt, "--workers", workers]  # one joint dictionary
        for split in ("train", "valid", "test"):
            if dry_run or (text / f"{split}.{corpus}.{a}").exists():
                cmd += [f"--{split}pref", text / f"{split}.{corpus}"]
        cmds.append(cmd)
    return _run_binarize(cmds, out, tmp, dry_run)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m deepnet_setups.prepare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    parser.add_argument("--stage", choices=("text", "binarize"), required=True)
    parser.add_argument("--raw-dir", help="local raw data (the downloads' layout); default: download")
    parser.add_argument("--workers", type=int, help="parallel workers (default: binarize.workers)")
    parser.add_argument("--dry-run", action="store_true", help="binarize: print the commands only")
    args = parser.parse_intermixed_args(argv)
    try:
        cfg = load(args.config, args.overrides)
        work = Path(cfg["paths"]["work"])
        workers = args.workers or cfg["binarize"]["workers"]
        multilingual = cfg["data"]["kind"] == "multilingual"
        if args.stage == "text":
            if args.raw_dir:
                raw_dir = Path(args.raw_dir)
                if not raw_dir.is_dir():
                    raise tp.DataError(f"--raw-dir {raw_dir}: folder not found")
            else:
                raw_dir = None
            work.mkdir(parents=True, exist_ok=True)
            check_fingerprint(cfg, work, raw_dir.resolve() if raw_dir else "download")
            raw_dir = raw_dir or download(cfg, work)
            (prepare_multilingual if multilingual else prepare_bilingual)(cfg, raw_dir, work, workers)
            log(f"text ready under {work}")
        else:
            ready = work / ("spm_text" if multilingual else "bpe") / ".done"
            if not ready.exists() and not args.dry_run:
                raise tp.DataError(f"{ready.parent}: text stage not finished; run the prepare script first")
            (binarize_multilingual if multilingual else binarize_bilingual)(cfg, work, workers, args.dry_run)
    except (ConfigError, tp.DataError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
