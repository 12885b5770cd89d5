"""Target-language accuracy (deepnet_setups/langid.py) on real FLORES-200 devtest sentences."""

import pytest
from conftest import SHARED_DATA

from deepnet_setups import langid

FLORES = SHARED_DATA / "flores200_devtest"
SIX = ["cs", "de", "en", "es", "fr", "ro"]


@pytest.fixture(scope="module")
def flores():
    return langid.read_flores(FLORES)


def test_reads_the_six_flores_languages_line_aligned(flores):
    assert sorted(flores) == SIX
    assert {len(lines) for lines in flores.values()} == {1012}


@pytest.mark.parametrize("langs", [SIX, None], ids=["restricted", "all-languages"])
def test_whole_sentences_are_on_target(flores, langs):
    for code in SIX:
        result = langid.target_language_accuracy(flores[code][:8], code, langs)
        assert result == {"target_lang_acc": 100.0, "top_wrong_lang": "", "top_wrong_share": 0.0,
                          "empty_share": 0.0}, code


def test_off_target_share_and_top_wrong_language(flores):
    # line i is the same sentence in every language: a German "translation" of which 3 lines came out
    # in English and 1 in French
    hyps = flores["de"][:6] + flores["en"][6:9] + flores["fr"][9:10]
    result = langid.target_language_accuracy(hyps, "de", ["de", "en", "fr"])
    assert result == {"target_lang_acc": 60.0, "top_wrong_lang": "en", "top_wrong_share": 30.0, "empty_share": 0.0}
    assert langid.identify(hyps, ["de", "en", "fr"]) == ["de"] * 6 + ["en"] * 3 + ["fr"]


def test_lines_without_letters_are_empty_never_on_target(flores):
    hyps = ["", "   ", "12 345 .", "\u2014 !", flores["fr"][0], flores["en"][1]]
    assert langid.identify(hyps, SIX) == [langid.EMPTY] * 4 + ["fr", "en"]
    result = langid.target_language_accuracy(hyps, "fr", SIX)
    assert result == {"target_lang_acc": 16.7, "top_wrong_lang": "en", "top_wrong_share": 16.7, "empty_share": 66.7}
    assert langid.target_language_accuracy([""] * 3, "fr", SIX) == {
        "target_lang_acc": 0.0, "top_wrong_lang": "", "top_wrong_share": 0.0, "empty_share": 100.0}
    assert langid.target_language_accuracy([], "fr", SIX) == {
        "target_lang_acc": None, "top_wrong_lang": "", "top_wrong_share": 0.0, "empty_share": 0.0}


def test_short_hypotheses_restricted_to_the_setups_languages(flores):
    """Three-word snippets: some Spanish ones are taken for a language close to Spanish that the setup does
    not have (Extremaduran, Galician, Occitan, ...); restricted to the setup's languages they are Spanish."""
    snippets = [langid.first_words(line) for line in flores["es"][:200]]
    everywhere, restricted = langid.identify(snippets), langid.identify(snippets, SIX)
    outside = [i for i, label in enumerate(everywhere) if label not in SIX]
    assert outside, "no snippet identified outside the six languages"
    assert set(restricted) <= set(SIX)
    assert sum(restricted[i] == "es" for i in outside) > len(outside) / 2
    assert langid.identify(["Hund"], ["de", "en"]) in (["de"], ["en"])  # one word: still a language, well defined


def test_language_codes():
    assert langid.labels_of("de") == ("de",) and langid.labels_of("pt_br") == ("pt",)
    assert langid.labels_of("nb") == ("no",) and langid.labels_of("sh") == ("sr", "hr", "bs")
    assert langid.labels_of("yi") == ()  # not a language py3langid knows
    assert langid.candidates(["fr", "de", "en"]) == ("de", "en", "fr")
    assert langid.candidates(["de"]) == () and langid.candidates(["de", "yi"]) == ()  # fewer than two: all


def test_a_target_the_identifier_does_not_know(flores):
    result = langid.target_language_accuracy(flores["de"][:4], "yi", ["de", "en", "yi"])
    assert result == {"target_lang_acc": None, "top_wrong_lang": "de", "top_wrong_share": 100.0, "empty_share": 0.0}


def test_table_marks_zero_shot_and_unknown_targets():
    rows = [{"direction": "de-en", "zero_shot": False, "bleu": 12.3, "chrf": 40.5, "target_lang_acc": 98.0,
             "top_wrong_lang": "de", "top_wrong_share": 2.0, "empty_share": 0.0, "pivot_bleu": None},
            {"direction": "de-yi", "zero_shot": True, "bleu": 0.1, "chrf": 9.25, "target_lang_acc": None,
             "top_wrong_lang": "", "top_wrong_share": 0.0, "empty_share": 0.0, "pivot_bleu": 2.5,
             "pivot_target_lang_acc": 80.0, "zero_shot_over_pivot": 0.04}]
    groups = {"zero-shot": {"bleu": 0.1, "directions": 1, "target_lang_acc": langid.mean_accuracy(rows[1:])}}
    lines = langid.table(rows, groups).splitlines()
    assert "py3langid" in lines[0] and "chrF++" in lines[0] and "zero/pivot" in lines[0]
    assert lines[1].split()[1:6] == ["de-en", "12.30", "40.50", "98.0%", "de"]
    assert lines[2].split()[1:5] == ["de-yi*", "0.10", "9.25", "n/a"]
    assert lines[2].split()[-3:] == ["2.50", "80.0%", "0.04"]  # the pivot through English
    assert lines[3] == "[evaluate] zero-shot: on-target n/a over 1 directions"
    assert langid.mean_accuracy(rows) == 98.0


def test_flores_comparison_entry_point(tmp_path, capsys, flores):
    for code, suffix in (("de", "deu"), ("fr", "fra")):
        (tmp_path / f"devtest.{suffix}").write_text("\n".join(flores[code][:5]) + "\n", encoding="utf-8")
    assert langid.main(["--flores", str(tmp_path)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("| identifier | languages | text | de | fr | mean |")
    assert len(table) == 2 + 4  # py3langid: all languages / the FLORES ones x sentence / first 3 words
    assert table[2].split(" | ")[1:6] == ["all it knows", "sentence", "100.0", "100.0", "100.0"]
    assert langid.main(["--flores", str(tmp_path / "missing")]) == 2
