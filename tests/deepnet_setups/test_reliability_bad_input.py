"""Bad input gets a one-line error naming the file/option, a non-zero exit, and no finished-looking output.

The data pipeline is driven through its real entry point (``deepnet_setups.prepare``, which
scripts/prepare_*.sh and scripts/binarize.sh exec) on a small plain-layout copy of real Multi30k
text; fairseq-train's own option checks run through the real CLI.
"""

import os
import sys

import pytest

from conftest import BIN, ROOT, TINY_MODEL, USER_DIR, run

from deepnet_setups import prepare

IWSLT = ROOT / "configs" / "iwslt14_de_en.yaml"
OPUS = ROOT / "configs" / "opus100.yaml"
PLAIN = ["data.layout=plain", "data.train=[train]", "data.valid=[valid]", "data.test=[test]", "prep.bpe_merges=50"]


@pytest.fixture
def raw(tmp_path, multi30k):
    folder = tmp_path / "raw"
    folder.mkdir()
    for split, src, n in (("train", "train", 200), ("valid", "valid", 20), ("test", "test2016", 20)):
        for lang in ("de", "en"):
            lines = (multi30k / f"{src}.{lang}").read_text(encoding="utf-8").splitlines()[:n]
            (folder / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def prepare_text(capsys, work, raw_dir, *overrides, config=IWSLT):
    code = prepare.main([str(config), "--stage", "text", "--raw-dir", str(raw_dir), "--workers", "1",
                         f"paths.work={work}", *PLAIN, *overrides])
    return code, capsys.readouterr().err


def finished_markers(work):
    return sorted(str(p.relative_to(work)) for p in work.rglob(".done")) if work.exists() else []


def assert_one_line_error(code, err, *names):
    lines = [line for line in err.splitlines() if not line.startswith("[prepare]")]
    assert code != 0
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for name in names:
        assert str(name) in lines[0], f"{name!s} not named in: {lines[0]}"


def corrupt_empty(raw):
    (raw / "valid.de").write_text("")
    return raw / "valid.de"


def corrupt_misaligned(raw):
    lines = (raw / "train.en").read_text(encoding="utf-8").splitlines()
    (raw / "train.en").write_text("\n".join(lines[:-3]) + "\n", encoding="utf-8")
    return raw / "train.de"


def corrupt_not_utf8(raw):
    data = (raw / "train.de").read_bytes()
    (raw / "train.de").write_bytes(data[:500] + b"\xff\xfe caf\xe9 " + data[500:])
    return raw / "train.de"


def corrupt_missing_file(raw):
    (raw / "test.en").unlink()
    return raw / "test.en"


@pytest.mark.parametrize("corrupt", [corrupt_empty, corrupt_misaligned, corrupt_not_utf8, corrupt_missing_file])
def test_bad_raw_text_is_named_and_nothing_looks_finished(capsys, tmp_path, raw, corrupt):
    bad_file = corrupt(raw)
    code, err = prepare_text(capsys, tmp_path / "work", raw)
    assert_one_line_error(code, err, bad_file)
    assert finished_markers(tmp_path / "work") == []


def test_missing_raw_folder(capsys, tmp_path):
    code, err = prepare_text(capsys, tmp_path / "work", tmp_path / "no_such_folder")
    assert_one_line_error(code, err, "--raw-dir", tmp_path / "no_such_folder")
    assert finished_markers(tmp_path / "work") == []


@pytest.mark.parametrize("override,named", [
    ("prep.bpe_mergez=5", "bpe_mergez"),                      # typo'd key
    ("prep.bpe_merges=many", "prep.bpe_merges"),              # wrong type
])
def test_config_mistakes_are_named(capsys, tmp_path, raw, override, named):
    code, err = prepare_text(capsys, tmp_path / "work", raw, override)
    assert_one_line_error(code, err, named)
    assert not (tmp_path / "work").exists() or finished_markers(tmp_path / "work") == []


def test_unknown_language_in_a_multilingual_config(capsys, tmp_path, raw):
    code = prepare.main([str(OPUS), "--stage", "text", "--raw-dir", str(raw), f"paths.work={tmp_path / 'work'}",
                         "data.langs=[en,de,fr]", "data.lang_pairs=[en-de,de-xx]", "data.zero_shot_pairs=[]"])
    assert_one_line_error(code, capsys.readouterr().err, "de-xx", "'xx'")
    assert not (tmp_path / "work").exists()


@pytest.mark.slow  # ~30 s of preparing and binarising; make test keeps the bad-text and config tests
def test_disk_full_during_binarisation_leaves_nothing_finished(capsys, tmp_path, raw):
    work = tmp_path / "work"
    code, err = prepare_text(capsys, work, raw)
    assert code == 0, err
    # a 4 KiB file-size limit (the train .bin needs ~6 KiB): fairseq-preprocess's binary writes fail with EFBIG (SIGXFSZ ignored,
    # as on a full disk where write() fails with ENOSPC)
    script = ("import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
              "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096)); "
              "from deepnet_setups import prepare; sys.exit(prepare.main(sys.argv[1:]))")
    args = [sys.executable, "-c", script, IWSLT, "--stage", "binarize", "--workers", "1",
            f"paths.work={work}", *PLAIN]
    proc = run(args, check=False, env={"PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"})
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("[prepare]")]
    assert proc.returncode != 0
    assert len(lines) == 1 and lines[0].startswith("error: fairseq-preprocess failed"), proc.stderr
    assert not (work / "bin").exists() and not (work / "bin" / ".done").exists()
    # and with room again, the same command finishes the job
    code = prepare.main([str(IWSLT), "--stage", "binarize", "--workers", "1", f"paths.work={work}", *PLAIN])
    assert code == 0 and (work / "bin" / ".done").exists() and (work / "bin" / "train.de-en.de.bin").stat().st_size > 0
    assert str(work / "bin.tmp") in lines[0]  # names the folder being written


# each a fairseq-train process (~7 s): make test keeps the plugin's own check, make test-slow (CI) all three
@pytest.mark.parametrize("options,named", [
    pytest.param(["--encoder-layers", "0"], "--encoder-layers must be a positive integer, got 0", marks=pytest.mark.slow),
    (["--deepnorm-encoder-alpha", "-1"], "--deepnorm-encoder-alpha must be a finite number > 0, got -1.0"),
    pytest.param(["--arch", "deepnet_transformr"], "argument --arch/-a: invalid choice: 'deepnet_transformr'",
                 marks=pytest.mark.slow),
])
def test_fairseq_train_rejects_bad_model_options(multi30k_small_bin, tmp_path, options, named):
    cmd = [BIN / "fairseq-train", multi30k_small_bin, "--user-dir", USER_DIR, "--arch", "deepnet_transformer", *TINY_MODEL,
           "--encoder-layers", "2", "--decoder-layers", "2", "--optimizer", "adam", "--lr", "1e-3",
           "--max-tokens", "500", "--max-update", "1", "--cpu", "--save-dir", tmp_path / "save", *options]
    proc = run(cmd, check=False)
    assert proc.returncode != 0
    last = (proc.stderr.strip().splitlines() or [""])[-1]
    assert named in last, proc.stderr[-2000:]
    assert not (tmp_path / "save" / "checkpoint_last.pt").exists()
