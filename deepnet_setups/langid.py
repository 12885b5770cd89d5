"""Target-language accuracy: which language a multilingual model's hypotheses are in (off-target output).

    python -m deepnet_setups.langid --flores ../shared/data/flores200_devtest [--compare lingua]

The identifier is py3langid (a maintained fork of langid.py: a naive Bayes model over byte n-grams,
140 language labels, whose model ships inside its PyPI package; nothing is downloaded at run time). In an
evaluation it is restricted to the setup's languages (``data.langs``) that it knows: a multilingual
model writes one of its own languages, and the restriction removes confusions with languages the model
never saw (measured on FLORES by the command above; docs/setups.md "Target-language accuracy").

For one direction, :func:`target_language_accuracy` gives, as percentages of all its hypotheses:
``target_lang_acc`` (identified as the target language), ``top_wrong_lang`` / ``top_wrong_share`` (the
most frequent other language and its share; "" and 0.0 when there is none) and ``empty_share``
(hypotheses without a single letter: blank lines, digits, punctuation; not identified, never on
target). Short hypotheses with letters are identified as they are (FLORES: the first three words of a
sentence are identified less reliably than the sentence; see the docs). A target language the
identifier does not know (e.g. yi, li) gives ``target_lang_acc`` None; its hypotheses are still
identified.

Language codes: a setup's code (OPUS-100 / M2M-100, ISO 639-1 mostly) is the identifier's label, a
region or script suffix after "_" is dropped (pt_br -> pt), and ALIASES lists the codes it names
otherwise. The wrong language is reported as the identifier's label.
"""

import argparse
import copy
import functools
import sys
import time
from collections import Counter
from importlib import metadata
from pathlib import Path

EMPTY = "empty"
# setup code -> the identifier's labels that count as it (OPUS-100: nb, sh; M2M-100: ns, ff)
ALIASES = {"nb": ("no",), "sh": ("sr", "hr", "bs"), "ns": ("nso",), "ff": ("fuv",)}
# FLORES-200 file suffixes (ISO 639-3) of ../shared/data/flores200_devtest -> setup codes
FLORES_CODES = {"eng": "en", "deu": "de", "fra": "fr", "spa": "es", "ron": "ro", "ces": "cs"}


def identifier_name():
    return f"py3langid {metadata.version('py3langid')}"


@functools.lru_cache(maxsize=None)
def _identifier(labels):
    """py3langid's identifier over ``labels`` (a sorted tuple of its labels; () for all of them)."""
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    if not labels:
        return LanguageIdentifier.from_model_file(MODEL_FILE)
    identifier = copy.copy(_identifier(()))  # shares the full model's arrays; set_languages replaces its own
    identifier.set_languages(list(labels))
    return identifier


def known_labels():
    return set(_identifier(()).labels)


def labels_of(code):
    """The identifier's labels that count as the setup's language ``code`` (empty: it does not know it)."""
    base = code.lower().split("_")[0]
    return tuple(label for label in ALIASES.get(base, (base,)) if label in known_labels())


def candidates(langs):
    """The labels to restrict identification to for a setup's languages (() = all, when fewer than two)."""
    labels = sorted({label for code in langs or () for label in labels_of(code)})
    return tuple(labels) if len(labels) >= 2 else ()


def has_letters(text):
    return any(char.isalpha() for char in text)


def identify(texts, langs=None):
    """The identifier's label for each text (EMPTY for a text without letters), restricted to ``langs``
    (setup codes; None: all the identifier's languages)."""
    identifier = _identifier(candidates(langs))
    return [identifier.classify(text)[0] if has_letters(text) else EMPTY for text in texts]


def accuracy_of(labels, target):
    """The per-direction figures (see the module's doc) from identified labels and the target code."""
    n = len(labels)
    accepted = set(labels_of(target))
    counts = Counter(labels)
    on_target = sum(counts[label] for label in accepted)
    wrong = sorted(((c, label) for label, c in counts.items() if label not in accepted and label != EMPTY),
                   key=lambda x: (-x[0], x[1]))

    def share(count):
        return round(100.0 * count / n, 1) if n else 0.0

    return {"target_lang_acc": share(on_target) if accepted and n else None,
            "top_wrong_lang": wrong[0][1] if wrong else "", "top_wrong_share": share(wrong[0][0]) if wrong else 0.0,
            "empty_share": share(counts[EMPTY])}


def target_language_accuracy(hypotheses, target, langs=None):
    """Share of ``hypotheses`` identified as language ``target``, the top wrong language and its share,
    and the share without letters (percentages; see the module's doc). ``langs``: the setup's languages
    to restrict identification to (None: all the identifier's)."""
    return accuracy_of(identify(hypotheses, langs), target)


def mean_accuracy(rows):
    """Average ``target_lang_acc`` of direction rows (None where no row has one)."""
    values = [r["target_lang_acc"] for r in rows if r.get("target_lang_acc") is not None]
    return round(sum(values) / len(values), 1) if values else None


def table(rows, groups=None):
    """The per-direction table an evaluation prints: BLEU, chrF++, target-language accuracy, top wrong
    language, and for zero-shot directions (marked *) the same model through English: pivot BLEU, its
    on-target share and zero-shot BLEU / pivot BLEU."""
    lines = ["[evaluate] direction    BLEU  chrF++  on-target  top wrong (share)  empty   pivot  on-target  "
             f"zero/pivot   (* zero-shot; language identified by {identifier_name()})"]
    share = lambda value: "n/a" if value is None else f"{value:.1f}%"  # noqa: E731
    for r in rows:
        wrong = f"{r['top_wrong_lang']} ({r['top_wrong_share']:.1f}%)" if r["top_wrong_lang"] else "-"
        name = r["direction"] + ("*" if r["zero_shot"] else "")
        line = (f"[evaluate] {name:<10} {r['bleu']:6.2f} {r['chrf']:7.2f} {share(r['target_lang_acc']):>10}  "
                f"{wrong:<17} {r['empty_share']:5.1f}%")
        if r.get("pivot_bleu") is not None:
            ratio = "n/a" if r["zero_shot_over_pivot"] is None else f"{r['zero_shot_over_pivot']:.2f}"
            line += f" {r['pivot_bleu']:6.2f} {share(r['pivot_target_lang_acc']):>10}  {ratio:>10}"
        lines.append(line)
    for name, group in (groups or {}).items():
        acc = group.get("target_lang_acc")
        lines.append(f"[evaluate] {name}: on-target {'n/a' if acc is None else f'{acc:.1f}%'} "
                     f"over {group['directions']} directions")
    return "\n".join(lines)


def read_flores(folder):
    """{setup code: sentences} of a FLORES folder's ``devtest.<iso639-3>`` files that FLORES_CODES maps."""
    found = {}
    for path in sorted(Path(folder).glob("devtest.*")):
        code = FLORES_CODES.get(path.suffix[1:])
        if code:
            found[code] = path.read_text(encoding="utf-8").splitlines()
    if not found:
        raise FileNotFoundError(f"{folder}: no devtest.<{'|'.join(FLORES_CODES)}> files")
    return found


def first_words(text, n=3):
    return " ".join(text.split()[:n])


def lingua_identifier(langs):
    """lingua-language-detector as a function from texts to labels (ISO 639-1), over ``langs`` (None: all
    its languages), models preloaded; for the comparison only (not a dependency: pip install
    lingua-language-detector==2.1.1)."""
    from lingua import IsoCode639_1, Language, LanguageDetectorBuilder

    if langs:
        builder = LanguageDetectorBuilder.from_iso_codes_639_1(*[getattr(IsoCode639_1, c.upper()) for c in langs])
    else:
        builder = LanguageDetectorBuilder.from_all_languages()
    detector = builder.with_preloaded_language_models().build()

    def run(texts):
        found = [detector.detect_language_of(text) if has_letters(text) else None for text in texts]
        return [x.iso_code_639_1.name.lower() if isinstance(x, Language) else EMPTY for x in found]

    return run


def compare(flores, identifiers=("py3langid",)):
    """Rows of the comparison: for each identifier, over all its languages or the FLORES ones, on whole
    sentences and on their first three words: accuracy per language, mean, sentences per second in this
    one thread, and the time to load the model (once per language set)."""
    data = read_flores(flores)
    langs = sorted(data)
    rows = []
    for name in identifiers:
        for restricted in (False, True):
            over = langs if restricted else None
            start = time.perf_counter()
            if name == "py3langid":
                _identifier.cache_clear()
                _identifier(candidates(over))
                run = functools.partial(identify, langs=over)
                version = identifier_name()
            else:
                run = lingua_identifier(over)
                version = f"lingua-language-detector {metadata.version('lingua-language-detector')}"
            load = time.perf_counter() - start
            for snippet in (False, True):
                per_lang, n, elapsed = {}, 0, 0.0
                for code in langs:
                    texts = [first_words(t) if snippet else t for t in data[code]]
                    start = time.perf_counter()
                    labels = run(texts)
                    elapsed += time.perf_counter() - start
                    per_lang[code] = accuracy_of(labels, code)["target_lang_acc"]
                    n += len(texts)
                rows.append({"identifier": version,
                             "languages": f"the {len(langs)} FLORES ones" if restricted else "all it knows",
                             "text": "first 3 words" if snippet else "sentence", **per_lang,
                             "mean": round(sum(per_lang.values()) / len(per_lang), 1),
                             "sentences_per_s": round(n / elapsed), "load_s": round(load, 2)})
    return rows, langs


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m deepnet_setups.langid", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flores", required=True, help="folder with FLORES-200 devtest.<eng|deu|fra|...> files")
    parser.add_argument("--compare", action="append", default=[], choices=["lingua"],
                        help="also measure lingua-language-detector (install it first; not a dependency)")
    opts = parser.parse_args(argv)
    try:
        rows, langs = compare(opts.flores, ["py3langid"] + opts.compare)
    except (FileNotFoundError, ImportError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    fields = ["identifier", "languages", "text"] + langs + ["mean", "sentences_per_s", "load_s"]
    print("| " + " | ".join(fields) + " |\n|" + "---|" * len(fields))
    for row in rows:
        print("| " + " | ".join(str(row[f]) for f in fields) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
