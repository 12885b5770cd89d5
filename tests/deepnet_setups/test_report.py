"""scripts/report's multilingual cell from a record alone (make test; the OPUS-100 pipeline that writes such
records end to end is in test_setup_opus.py, make test-slow): BLEU, the on-target shares of the supervised
and zero-shot directions, and zero-shot BLEU against the pivot through English, one row per DeepNorm init."""

import json

from deepnet_setups import report


def direction(name, zero_shot, bleu, on_target, pivot=None):
    return {"direction": name, "zero_shot": zero_shot, "bleu": bleu, "target_lang_acc": on_target, "pivot_bleu": pivot}


def test_multilingual_cell_with_on_target_and_pivot(tmp_path):
    directions = [direction("de-en", False, 16.0, 99.0), direction("en-de", False, 10.0, 97.0),
                  direction("de-fr", True, 1.0, 80.0, pivot=8.0), direction("fr-de", True, 0.8, 70.0, pivot=4.0)]
    records = [{"kind": "eval", "setup": "opus100", "arch": "deepnet", "deepnorm_init": init, "encoder_layers": 6,
                "decoder_layers": 6, "bleu": 6.88, "directions": directions, "signature": "nrefs:1|case:mixed"}
               for init in ("paper", "source")]
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert report.main([str(path), "--out-dir", str(tmp_path / "report")]) == 0
    cell = "6.88 (on target 98% / zero-shot 75%; zero-shot BLEU 15% of pivot 6.00)"
    text = (tmp_path / "report/results.md").read_text()
    assert f"| DeepNet | {cell} |" in text and f"| DeepNet, source init | {cell} |" in text


def test_no_pivot_no_ratio_and_a_bilingual_cell_is_bleu_alone():
    assert report.on_target([direction("de-en", False, 16.0, 99.0)]) == " (on target 99%)"
    assert report.on_target([direction("de-fr", True, 0.0, 5.0, pivot=0.0)]) == \
        " (on target zero-shot 5%; zero-shot BLEU pivot 0.00)"
    assert report.on_target([]) == ""


def test_runs_at_several_rates_are_a_row_each():
    """A width study's records: two rates of one method and width are two rows, each with its own run's BLEU (one
    cell no longer shows whichever rate was recorded last); a method run at one rate keeps its plain row."""
    def record(arch, lr, bleu):
        return {"kind": "eval", "setup": "iwslt14_de_en", "arch": arch, "encoder_layers": 18, "decoder_layers": 18,
                "bleu": bleu, "run": {"device": "cpu", "width": 128, "precision": "fp32", "lr": lr}}
    _, rows, _ = report.tables([record("preln", 2e-3, 31.74), record("preln", 4e-3, 30.60),
                                record("deepnet", 5e-4, 22.99)])["iwslt14_de_en"]
    assert rows == [["Pre-LN [lr 0.002]", "31.74"], ["Pre-LN [lr 0.004]", "30.60"], ["DeepNet", "22.99"]]
