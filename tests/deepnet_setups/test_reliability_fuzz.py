"""Fuzz the text-processing entry points of the data pipeline (deepnet_setups) with hypothesis.

Arbitrary Unicode (surrogates excluded: they cannot be UTF-8 encoded), control characters, and
long lines: nothing crashes, and source and target never drift apart in line count, neither in
Python nor for fairseq-preprocess, which reads text with universal newlines (``\\r`` ends a line).
"""

import string

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest import ROOT

from deepnet_text import textprep
from deepnet_setups import config

FAIRSEQ_LINE_BREAKS = "\n\r"  # what Python's text mode (fairseq's readers) splits lines on

CONTROL = "".join(chr(c) for c in range(32) if chr(c) != "\n") + "\x7f\x85\u2028\u2029\ufeff\u200b"
line_text = st.text(
    alphabet=st.one_of(
        st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"),
        st.sampled_from(CONTROL),
        st.sampled_from(string.ascii_letters + " -.,'&<>|[]"),
    ),
    max_size=80,
)
long_line = st.builds(lambda word, n: " ".join([word] * n), st.text(string.ascii_letters + "äß-", min_size=1, max_size=12),
                      st.integers(500, 3000))
lines = st.lists(st.one_of(line_text, long_line), min_size=1, max_size=6)

FUZZ = settings(max_examples=40, deadline=None, report_multiple_bugs=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def subword_models(tmp_path_factory, multi30k):
    """BPE codes and a SentencePiece model learned from 2000 real Multi30k lines per side."""
    work = tmp_path_factory.mktemp("subword")
    text = [line for lang in ("de", "en")
            for line in (multi30k / f"train.{lang}").read_text(encoding="utf-8").splitlines()[:2000]]
    textprep.learn_bpe(text, work / "codes", 200)
    textprep.train_sentencepiece(text, work / "spm", 300, "unigram", 1.0)
    return work / "codes", work / "spm.model"


def assert_aligned(inputs, outputs):
    assert len(outputs) == len(inputs)
    for line in outputs:
        assert not any(ch in line for ch in FAIRSEQ_LINE_BREAKS), f"line break inside an output line: {line!r}"


@FUZZ
@given(src=lines, tgt_extra=st.data())
def test_moses_bpe_and_cleaning_keep_sides_aligned(subword_models, src, tgt_extra):
    tgt = tgt_extra.draw(st.lists(st.one_of(line_text, long_line), min_size=len(src), max_size=len(src)))
    codes, _ = subword_models
    src_tok, tgt_tok = textprep.moses_tokenize(src, "de", lowercase=True), textprep.moses_tokenize(tgt, "en")
    assert_aligned(src, src_tok)
    assert_aligned(tgt, tgt_tok)
    src_bpe, tgt_bpe = textprep.apply_bpe(src_tok, codes), textprep.apply_bpe(tgt_tok, codes)
    assert_aligned(src, src_bpe)
    assert_aligned(tgt, tgt_bpe)
    kept_src, kept_tgt = textprep.clean_pairs(src_bpe, tgt_bpe, 1.5, 1, 175)
    assert len(kept_src) == len(kept_tgt) and set(zip(kept_src, kept_tgt)) <= set(zip(src_bpe, tgt_bpe))


@FUZZ
@given(text=lines)
def test_sentencepiece_keeps_line_count(subword_models, text):
    _, spm_model = subword_models
    assert_aligned(text, textprep.sentencepiece_encode(text, spm_model))


@FUZZ
@given(text=lines)
@example(text=["0", ""])
def test_written_lines_read_back_unchanged(tmp_path, text):
    path = tmp_path / "side.txt"
    textprep.write_lines(path, text)
    try:
        back = textprep.read_lines(path)
    except textprep.DataError as err:  # only a file that is blank throughout may be refused
        assert "file is empty" in str(err) and not "".join(text).strip()
        return
    assert back == text


@FUZZ
@given(text=st.text(max_size=60))
@example(text="prep.bpe_merges=\x1f")
def test_any_override_is_accepted_or_a_config_error(text):
    try:
        cfg = config.load(ROOT / "configs" / "iwslt14_de_en.yaml", [text])
    except config.ConfigError as err:
        assert "override" in str(err) or "iwslt14_de_en.yaml" in str(err)
        return
    assert cfg["setup"] == "iwslt14_de_en"


@FUZZ
@given(doc=st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                        max_leaves=8))
def test_any_yaml_config_is_accepted_or_a_config_error(tmp_path, doc):
    path = tmp_path / "fuzzed.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    try:
        config.load(path)
    except config.ConfigError as err:
        assert str(path) in str(err)
