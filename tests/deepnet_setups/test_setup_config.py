"""Setups: config loading, launch commands (--dry-run), text helpers, IWSLT archive extraction.

Fast tests (no training). The end-to-end pipelines are in test_setup_{pipelines,opus,wmt}.py.
"""

import json
import pkgutil
import re
import shlex
import sys

import pytest
from conftest import ROOT, SHARED_DATA, run

from deepnet_setups import config as cfgmod
from deepnet_setups import launch
from deepnet_text import textprep as tp

CONFIGS = {name: ROOT / "configs" / f"{name}.yaml" for name in ("iwslt14_de_en", "wmt17_en_de", "opus100", "m2m_102")}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_config_loads_and_marks_assumed_values(name):
    cfg = cfgmod.load(CONFIGS[name])
    assert cfg["setup"] == name
    assert cfg["assumed"], "each setup lists the values the papers do not state"
    for dotted in cfg["assumed"]:
        cfgmod.get(cfg, dotted)  # every assumed key exists
    assert "train.lr" in cfg["assumed"]


def test_iwslt_defaults_are_fairseqs_recipe():
    cfg = cfgmod.load(CONFIGS["iwslt14_de_en"])
    assert (cfg["prep"]["bpe_merges"], cfg["prep"]["clean_ratio"], cfg["prep"]["clean_max_len"]) == (10000, 1.5, 175)
    assert cfg["prep"]["lowercase"] is True and cfg["data"]["valid_every"] == 23
    assert (cfg["train"]["lr"], cfg["train"]["warmup_updates"], cfg["train"]["max_update"]) == (5e-4, 4000, 8000)
    assert cfg["train"]["adam_betas"] == "(0.9, 0.98)" and cfg["train"]["max_tokens"] == 4096
    wmt = cfgmod.load(CONFIGS["wmt17_en_de"])
    assert wmt["prep"]["bpe_merges"] == 40000 and wmt["eval"]["metric"] == "compound_split_bleu"
    opus = cfgmod.load(CONFIGS["opus100"])
    assert len(opus["data"]["langs"]) == 100 and len(opus["data"]["lang_pairs"]) == 198  # 99 x 2 English-centric
    assert "de-fr" in opus["data"]["zero_shot_pairs"] and "de-fr" not in opus["data"]["lang_pairs"]
    m2m = cfgmod.load(CONFIGS["m2m_102"])
    assert (m2m["model"]["size"], m2m["model"]["encoder_layers"], m2m["train"]["ddp_backend"]) == ("m2m_102", 100, "fully_sharded")


def test_typo_key_is_rejected_with_key_and_file(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(CONFIGS["iwslt14_de_en"].read_text().replace("  warmup_updates: 4000", "  warmup_update: 4000"))
    with pytest.raises(cfgmod.ConfigError, match=r"bad\.yaml: unknown key 'train\.warmup_update'"):
        cfgmod.load(bad)
    assert cfgmod.main([str(bad), "--get", "train.lr"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {bad}: unknown key 'train.warmup_update'"]


def test_overrides_are_typed_and_checked():
    cfg = cfgmod.load(CONFIGS["iwslt14_de_en"], ["train.lr=1e-3", "data.test=[test2016]", "model.embed_dim=64"])
    assert cfg["train"]["lr"] == 1e-3 and cfg["data"]["test"] == ["test2016"] and cfg["model"]["embed_dim"] == 64
    with pytest.raises(cfgmod.ConfigError, match="key 'train.max_update' must be int"):
        cfgmod.load(CONFIGS["iwslt14_de_en"], ["train.max_update=many"])
    with pytest.raises(cfgmod.ConfigError, match="unknown key 'trian'"):
        cfgmod.load(CONFIGS["iwslt14_de_en"], ["trian.lr=1"])
    with pytest.raises(cfgmod.ConfigError, match="unknown language 'xx'"):
        cfgmod.load(CONFIGS["opus100"], ["data.zero_shot_pairs=[de-xx]"])


def test_yaml_floats_types_and_path_interpolation(tmp_path):
    """YAML 1.1 reads ``5e-4`` as a string: the float keys take it as the number; a wrong type names
    the key's declared type; ``{setup}`` and ``${setup}`` in paths are the setup's name."""
    given = tmp_path / "floats.yaml"
    given.write_text(CONFIGS["iwslt14_de_en"].read_text().replace("lr: 5.0e-4", "lr: 5e-4"), encoding="utf-8")
    assert "lr: 5e-4" in given.read_text() and cfgmod.load(given)["train"]["lr"] == 5e-4
    cfg = cfgmod.load(given, ["paths.work=/scratch/{setup}", "paths.runs=${paths.work}/runs"])
    assert cfg["paths"]["work"] == "/scratch/iwslt14_de_en" and cfg["paths"]["runs"] == "/scratch/iwslt14_de_en/runs"
    for override, message in (("model.embed_dim=wide", "key 'model.embed_dim' must be int or null, got 'wide'"),
                              ("train=5", "key 'train' must be mapping, got 5"),
                              ("train.extra_args=--seed", "key 'train.extra_args' must be list, got '--seed'")):
        with pytest.raises(cfgmod.ConfigError, match=re.escape(f"{given} (override '{override}'): {message}")):
            cfgmod.load(given, [override])


def test_shell_assignments_round_trip():
    lines = cfgmod.shell_assignments(cfgmod.load(CONFIGS["iwslt14_de_en"]))
    assert "cfg_train_lr=0.0005" in lines and "cfg_prep_lowercase=1" in lines
    assert any(line.startswith("cfg_data_test=(IWSLT14.TED.dev2010 ") for line in lines)


def test_update_freq_matches_the_effective_batch():
    cfg = cfgmod.load(CONFIGS["wmt17_en_de"])  # 131072 tokens per update, 4096 per GPU step
    assert [launch.update_freq(cfg, world) for world in (1, 8, 16, 32)] == [32, 4, 2, 1]
    with pytest.raises(launch.LaunchError, match="3 processes x train.max_tokens 4096 = 12288 tokens per step "
                                                 "does not divide train.batch_tokens 131072"):
        launch.update_freq(cfg, 3)


def _dry_run(*args):
    proc = run(["bash", ROOT / "scripts/train_wmt17.sh", "--dry-run", *args])
    return [line for line in proc.stdout.splitlines() if not line.startswith("#")], proc.stdout


def _dry_run_in_process(capsys, *args):
    assert launch.main([str(CONFIGS["wmt17_en_de"]), "--dry-run", *args]) == 0
    text = capsys.readouterr().out
    return [line for line in text.splitlines() if not line.startswith("#")], text


def test_dry_run_prints_multi_node_fp16_commands():
    """Through the user's script: one torchrun command per node with fp16 and the derived update-freq."""
    commands, text = _dry_run("--arch", "deepnet", "--layers", "100,100", "--gpus", "8", "--nodes", "2",
                              "--master-addr", "node0")
    assert "world size 16, update-freq 2" in text and "runs/wmt17_en_de/deepnet_source/100L-100L" in text
    assert len(commands) == 2  # one torchrun per node
    for rank, command in enumerate(commands):
        argv = shlex.split(command)
        assert argv[0].endswith("torchrun") and argv[6].endswith("fairseq-train")
        assert argv[1:6] == ["--nproc_per_node=8", "--nnodes=2", f"--node_rank={rank}", "--master_addr=node0",
                             "--master_port=29500"]
        opts = dict(zip(argv[7:], argv[8:]))
        assert opts["--arch"] == "deepnet_transformer_wmt_en_de" and opts["--encoder-layers"] == "100"
        assert opts["--task"] == "translation_exact_resume"  # resumes bit-exactly (docs/reliability.md)
        assert opts["--update-freq"] == "2" and opts["--distributed-world-size"] == "16"
        assert opts["--lr"] == "0.0005" and opts["--max-tokens"] == "4096" and opts["--ddp-backend"] == "c10d"
        assert "--fp16" in argv and "--cpu" not in argv and "--share-all-embeddings" in argv


def test_dry_run_single_gpu_postln_and_cpu_gloo(capsys):
    commands, _ = _dry_run_in_process(capsys, "--arch", "postln", "--layers", "6", "--gpus", "1", "train.fp16=false")
    argv = shlex.split(commands[0])
    assert argv[0].endswith("fairseq-train") and "--fp16" not in argv
    assert argv[argv.index("--arch") + 1] == "transformer_wmt_en_de" and argv[argv.index("--update-freq") + 1] == "32"
    assert argv[argv.index("--task") + 1] == "translation_exact_resume"
    commands, _ = _dry_run_in_process(capsys, "--arch", "preln", "--layers", "2,2", "--cpu", "--procs", "2")
    argv = shlex.split(commands[0])
    assert argv[0].endswith("torchrun") and "--nproc_per_node=2" in argv and "--cpu" in argv and "--fp16" not in argv
    assert argv[6:8] == ["-m", "deepnet_setups.cpu_worker"]  # passes each process's rank (env://)
    tail = " ".join(argv)
    assert "--distributed-backend gloo --ddp-backend legacy_ddp" in tail and "--distributed-world-size 2" in tail


def test_bad_arch_and_bad_gpu_count_fail_with_one_line(capsys):
    for args, message in ((["--arch", "rezero_transformer"], "error: --arch 'rezero_transformer': unknown (choose "
                                                             "postln, dsinit, admin, rezero, tfixup, preln, dlcl, "),
                          (["--arch", "deepnet", "--gpus", "3"], "does not divide train.batch_tokens 131072"),
                          (["--arch", "deepnet", "--layers", "0,6"], "error: --layers '0,6': expected N or N,M")):
        assert launch.main([str(CONFIGS["wmt17_en_de"]), "--dry-run", *args]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and message in err


def test_text_checks_name_the_file(tmp_path):
    good, short, empty, latin1 = (tmp_path / n for n in ("a.de", "b.en", "c.en", "d.en"))
    good.write_text("eins\nzwei\n", encoding="utf-8")
    short.write_text("one\n", encoding="utf-8")
    empty.write_text("", encoding="utf-8")
    latin1.write_bytes("one\ntwo \xe4\n".encode("latin-1"))
    with pytest.raises(tp.DataError, match=re.escape(f"{good}: 2 lines but {short} has 1 (misaligned")):
        tp.read_parallel(good, short)
    with pytest.raises(tp.DataError, match=re.escape(f"{empty}: file is empty")):
        tp.read_parallel(good, empty)
    with pytest.raises(tp.DataError, match=re.escape(f"{latin1}: not UTF-8 (invalid byte at line 2)")):
        tp.read_parallel(good, latin1)
    with pytest.raises(tp.DataError, match="file not found"):
        tp.read_parallel(good, tmp_path / "missing.en")


def test_cleaning_compound_splitting_and_temperature_sampling():
    src = ["a b c", "a", "a b c d e f g", ""]
    tgt = ["x y z", "x y", "x", "x"]
    assert tp.clean_pairs(src, tgt, ratio=1.5, min_len=1, max_len=175) == (["a b c"], ["x y z"])
    assert tp.compound_split("Ein Rot-Weiß-Foto") == "Ein Rot ##AT##-##AT## Weiß ##AT##-##AT## Foto"
    assert tp.compound_split("a-b-c") == "a ##AT##-##AT## b-c"  # matches do not overlap, as with perl s///g
    assert tp.compound_split("Ein Rot @-@ Foto") == "Ein Rot @ ##AT##-##AT## @ Foto"
    sample, shares = tp.temperature_sample({"big": ["b"] * 900, "small": ["s"] * 100}, total=1000, temperature=5)
    # (0.9^0.2, 0.1^0.2) normalised: the small language gets ~39% instead of 10%
    assert shares["small"] == pytest.approx(0.1**0.2 / (0.1**0.2 + 0.9**0.2))
    assert sample.count("s") == round(1000 * shares["small"]) and len(sample) == 1000


def test_iwslt_archive_extraction(tmp_path):
    """IWSLT's layout (train.tags + XML dev/test) built from the real IWSLT'14 dev/test text."""
    data = SHARED_DATA / "iwslt14_de_en"
    raw = tmp_path / "raw" / "de-en"
    raw.mkdir(parents=True)
    texts = {lang: (data / f"tst2010.{lang}").read_text(encoding="utf-8").splitlines()[:40] for lang in ("de", "en")}
    for lang, lines in texts.items():
        tags = ["<url>http://www.ted.com/talks/x.html</url>", "<keywords>talks, music</keywords>",
                "<speaker>Someone</speaker>", "<talkid>1</talkid>", f"<title>Title {lang}</title>",
                f"<description>About {lang}</description>"]
        (raw / f"train.tags.de-en.{lang}").write_text("\n".join(tags + lines) + "\n", encoding="utf-8")
        dev = (data / f"dev2010.{lang}").read_text(encoding="utf-8").splitlines()[:30]
        segs = [f'<seg id="{i}"> {line} </seg>' for i, line in enumerate(dev, 1)]
        xml = ['<?xml version="1.0" encoding="UTF-8"?>', "<mteval>", f'<srcset setid="iwslt2010" srclang="{lang}">',
               '<doc docid="1" genre="lectures">', "<talkid>1</talkid>"] + segs + ["</doc>", "</srcset>", "</mteval>"]
        (raw / f"IWSLT14.TED.dev2010.de-en.{lang}.xml").write_text("\n".join(xml) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    assert tp.extract_iwslt_archive(tmp_path / "raw", out, "de", "en") == ["IWSLT14.TED.dev2010"]
    for lang in ("de", "en"):
        train = (out / f"train.{lang}").read_text(encoding="utf-8").splitlines()
        assert train == [f"Title {lang}", f"About {lang}"] + texts[lang]
        dev = (out / f"IWSLT14.TED.dev2010.{lang}").read_text(encoding="utf-8").splitlines()
        expected = [line.strip().replace("\u2019", "'") for line in
                    (data / f"dev2010.{lang}").read_text(encoding="utf-8").splitlines()[:30]]
        assert dev == expected
    # tokenised and lowercased as fairseq's prepare-iwslt14.sh does (Moses escaping, no dash splitting)
    assert tp.moses_tokenize(["It's a Test-Case, isn't it?"], "en", lowercase=True) == ["it &apos;s a test-case , isn &apos;t it ?"]


def test_prepare_rejects_missing_raw_dir_and_misaligned_text(tmp_path):
    prepare = ROOT / "scripts/prepare_iwslt14.sh"
    proc = run(["bash", prepare, "--raw-dir", tmp_path / "nowhere", f"paths.work={tmp_path / 'w'}"], check=False)
    assert proc.returncode == 2 and proc.stderr.strip() == f"error: --raw-dir {tmp_path / 'nowhere'}: folder not found"
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "train.de").write_text("a\nb\nc\n", encoding="utf-8")
    (raw / "train.en").write_text("a\nb\n", encoding="utf-8")
    proc = run(["bash", prepare, "--raw-dir", raw, "data.layout=plain", f"paths.work={tmp_path / 'w'}"], check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: {raw / 'train.de'}: 3 lines but {raw / 'train.en'} has 2 (misaligned parallel text)"
    assert not (tmp_path / "w" / "tok" / ".done").exists()


def test_generate_keeps_every_test_sentence(monkeypatch, tmp_path):
    """fairseq 0.12 drops a last batch whose size is not a multiple of 8 unless told otherwise."""
    import subprocess

    from deepnet_setups import evaluate

    seen = []

    def fake_run(cmd, **kwargs):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout="H-1\t-0.5\tb\nH-0\t-0.1\ta\n", stderr="")

    monkeypatch.setattr(evaluate.subprocess, "run", fake_run)
    cfg = cfgmod.load(CONFIGS["iwslt14_de_en"])
    assert evaluate.generate(cfg, tmp_path / "model.pt", [], True, tmp_path / "generate.log") == ["a", "b"]
    argv = seen[0]
    assert argv[argv.index("--required-batch-size-multiple") + 1] == "1" and "--cpu" in argv


def _argv_of(capsys, config, *args):
    assert launch.main([str(CONFIGS[config]), "--dry-run", *args]) == 0
    return shlex.split(capsys.readouterr().out.splitlines()[-1])


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_configs_carry_precision_and_loss_scale_keys(name):
    text = CONFIGS[name].read_text()
    for key in ("precision", "fp16_init_scale", "fp16_scale_window", "fp16_scale_tolerance", "min_loss_scale",
                "threshold_loss_scale"):
        assert re.search(rf"^  {key}:", text, re.M), f"{name} lacks train.{key}"
    train = cfgmod.load(CONFIGS[name])["train"]
    assert train["precision"] == "fp16" and train["min_loss_scale"] == 1e-4 and train["fp16_init_scale"] == 128


def test_precision_options_on_gpu(capsys):
    argv = _argv_of(capsys, "wmt17_en_de", "--arch", "deepnet", "--gpus", "8", "train.fp16_scale_tolerance=0.25",
                    "train.threshold_loss_scale=1024", "train.min_loss_scale=1e-6")
    opts = dict(zip(argv, argv[1:]))
    assert "--fp16" in argv and "--bf16" not in argv
    assert (opts["--fp16-init-scale"], opts["--fp16-scale-tolerance"], opts["--min-loss-scale"],
            opts["--threshold-loss-scale"]) == ("128", "0.25", "1e-06", "1024.0")  # a float key
    assert "--fp16-scale-window" not in argv  # null: fairseq derives it from the world size and update-freq
    argv = _argv_of(capsys, "wmt17_en_de", "--arch", "deepnet", "--gpus", "8", "train.precision=bf16")
    assert "--bf16" in argv and "--fp16" not in argv and "--min-loss-scale" not in argv  # bf16 needs no scaler
    argv = _argv_of(capsys, "wmt17_en_de", "--arch", "deepnet", "--gpus", "8", "train.precision=fp32")
    assert not {"--fp16", "--bf16", "--fp16-init-scale"} & set(argv)
    argv = _argv_of(capsys, "wmt17_en_de", "--arch", "deepnet", "--cpu", "train.precision=bf16")
    assert not {"--fp16", "--bf16"} & set(argv) and "--cpu" in argv  # CPU always trains fp32


def test_old_fp16_key_and_bad_precision_values():
    assert cfgmod.load(CONFIGS["iwslt14_de_en"], ["train.fp16=false"])["train"]["precision"] == "fp32"
    assert cfgmod.load(CONFIGS["iwslt14_de_en"], ["train.precision=bf16", "train.fp16=false"])["train"]["precision"] == "fp32"
    for overrides, message in ((["train.precision=fp8"], "key 'train.precision' must be one of fp16, bf16, fp32"),
                               (["train.precision=bf16", "train.fp16=true"], "disagree"),
                               (["train.fp16_scale_tolerance=1.5"], "train.fp16_scale_tolerance in [0, 1)"),
                               (["train.precision=bf16"], "bf16 does not work with train.ddp_backend fully_sharded")):
        config = CONFIGS["m2m_102" if "bf16 does not" in message else "iwslt14_de_en"]
        with pytest.raises(cfgmod.ConfigError, match=re.escape(message)):
            cfgmod.load(config, overrides)


def test_every_train_key_is_a_fairseq_option_or_a_launcher_key(capsys):
    """One loop passes the train keys on by fairseq's names; the launcher's own keys are named in one place."""
    cfg = cfgmod.load(CONFIGS["wmt17_en_de"], ["train.max_epoch=3"])
    argv = _argv_of(capsys, "wmt17_en_de", "--arch", "deepnet", "--gpus", "8", "train.max_epoch=3")
    opts = dict(zip(argv, argv[1:]))
    passed_on = set(cfg["train"]) - launch.LAUNCHER_KEYS
    assert passed_on and launch.LAUNCHER_KEYS <= set(cfg["train"])
    for key in passed_on:
        option, value = "--" + key.replace("_", "-"), cfg["train"][key]
        left_out = value is None or value is False  # runner.fairseq_options: a flag set false is not given
        assert (option in argv) if value is True else (option not in argv) if left_out else opts[option] == str(value), key
    assert "--batch-tokens" not in argv and opts["--update-freq"] == "4"


def test_fully_sharded_without_fairscale_is_one_line_before_launch(capsys, monkeypatch, tmp_path):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "fairscale" else real_find_spec(name, *a))
    missing = "error: --ddp-backend fully_sharded needs fairscale, which is not installed in"
    # --dry-run, the config's backend
    assert launch.main([str(CONFIGS["m2m_102"]), "--dry-run", "--arch", "deepnet", "--gpus", "8", "--nodes", "16"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and missing in err and "make install EXTRAS=fsdp" in err
    # a real launch (stops before looking for data or starting anything), backend given in extra_args
    assert launch.main([str(CONFIGS["wmt17_en_de"]), "--arch", "deepnet", "--gpus", "8",
                        "train.extra_args=[--ddp-backend, fully_sharded]", f"paths.runs={tmp_path}"]) == 2
    captured = capsys.readouterr()
    assert len(captured.err.strip().splitlines()) == 1 and missing in captured.err and not list(tmp_path.iterdir())
    # with fairscale importable the command goes through
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "fairscale" else real_find_spec(name, *a))
    argv = _argv_of(capsys, "m2m_102", "--arch", "deepnet", "--gpus", "8", "--nodes", "16")
    assert argv[argv.index("--ddp-backend") + 1] == "fully_sharded"


def test_install_rejects_an_unknown_extra_in_one_line(tmp_path):
    proc = run(["bash", ROOT / "scripts/install.sh", "--venv", tmp_path / "venv", "--extras", "fsdp,nope"], check=False)
    assert proc.returncode == 2 and proc.stderr.strip() == "install.sh: unknown extra 'nope' (known: fsdp)"
    assert not (tmp_path / "venv").exists()
    assert "fairscale==" in (ROOT / "requirements-fsdp.txt").read_text()
    assert 'EXTRAS="$(EXTRAS)"' in (ROOT / "Makefile").read_text()


@pytest.mark.parametrize("gib, world, expected", [(32, 8, 4096), (80, 8, 8192), (16, 8, 2048), (24, 8, 2048),
                                                  (141, 8, 16384), (141, 6, 4369), (80, 3, None)])  # 21845 = 5 x 17 x 257
def test_max_tokens_sized_to_gpu_memory_keeps_the_batch(gib, world, expected):
    cfg = cfgmod.load(CONFIGS["wmt17_en_de"], ["train.max_tokens_gpu_gib=32"])  # 4096 tokens on 32 GiB, 131072 per update
    cfg["train"]["batch_tokens"] = 131070 if world == 6 else cfg["train"]["batch_tokens"]
    if expected is None:  # 131072 tokens do not split over 3 processes
        with pytest.raises(launch.LaunchError, match="cannot be split over 3 processes"):
            launch.fit_max_tokens(cfg, world, gib)
        return
    tokens = launch.fit_max_tokens(cfg, world, gib)
    assert tokens == expected and tokens <= 4096 * gib / 32
    cfg["train"]["max_tokens"] = tokens
    assert tokens * world * launch.update_freq(cfg, world) == cfg["train"]["batch_tokens"]


def test_launch_sizes_max_tokens_from_the_visible_gpus(capsys, monkeypatch):
    monkeypatch.setattr(launch, "gpu_memory_gib", lambda: 79.6)  # a faked 80 GB card as torch.cuda reports it
    argv = _argv_of(capsys, "wmt17_en_de", "--arch", "deepnet", "--gpus", "8", "train.max_tokens_gpu_gib=32")
    assert argv[argv.index("--max-tokens") + 1] == "8192" and argv[argv.index("--update-freq") + 1] == "2"
    argv = _argv_of(capsys, "wmt17_en_de", "--arch", "deepnet", "--gpus", "8", "train.max_tokens_gpu_gib=32",
                    "--gpu-memory-gib", "16")
    assert argv[argv.index("--max-tokens") + 1] == "2048" and argv[argv.index("--update-freq") + 1] == "8"
    argv = _argv_of(capsys, "wmt17_en_de", "--arch", "deepnet", "--gpus", "8")  # not set: the config's value
    assert argv[argv.index("--max-tokens") + 1] == "4096"
    monkeypatch.setattr(launch, "gpu_memory_gib", lambda: None)
    assert launch.main([str(CONFIGS["wmt17_en_de"]), "--dry-run", "--arch", "deepnet", "--gpus", "8",
                        "train.max_tokens_gpu_gib=32"]) == 2
    assert "no GPU is visible; give --gpu-memory-gib" in capsys.readouterr().err


DRIVERS = sorted(f"deepnet_experiments.{m.name}" for m in pkgutil.iter_modules([str(ROOT / "deepnet_experiments")]))


@pytest.mark.parametrize("module", ["deepnet_setups.launch", "deepnet_setups.report", "deepnet_setups.prepare",
                                    "deepnet_setups.evaluate", "deepnet_text.textprep", *DRIVERS])
def test_drivers_and_the_launcher_import_no_fairseq(module):
    """The drivers, the launcher, preparation and evaluation import neither fairseq nor the plugin at start-up
    (seconds for every prepare step and --help): they start fairseq in subprocesses or import it where it runs;
    fairseq's own entry points (fairseq-train --user-dir) register the plugin."""
    proc = run([sys.executable, "-X", "importtime", "-c", f"import {module}"])
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert module in imported and not {"fairseq", "deepnet_fairseq"} & imported


def test_every_config_loads_and_a_dry_run_prints_without_fairseq():
    """Loading a config (every script does, prepare's early errors too) checks DeepNet's inits against the method
    registry, not the plugin: a script that refuses its input answers in well under a second, not fairseq's ~5 s."""
    code = ("import sys; from deepnet_setups import config, launch; "
            f"[config.load(p, ['model.deepnorm_init=source']) for p in {sorted(map(str, CONFIGS.values()))!r}]; "
            f"launch.main([{str(CONFIGS['iwslt14_de_en'])!r}, '--arch', 'deepnet', '--layers', '2,2', '--cpu', "
            "'--dry-run']); assert not {'fairseq', 'deepnet_fairseq'} & set(sys.modules), 'fairseq imported'")
    assert "fairseq-train" in run([sys.executable, "-c", code]).stdout


def test_report_tables_and_plots_bleu_by_updates_for_staged_runs(tmp_path):
    """Runs evaluated at several update counts (paper_protocol_multi30k.sh) get a by-updates table and plot."""
    import csv
    import json

    from deepnet_setups import report

    records = []
    for arch, bleus in (("deepnet", (10.53, 20.1)), ("preln", (10.61, 19.5))):
        for updates, score in zip((2000, 4000), bleus):
            common = {"setup": "iwslt14_de_en", "arch": arch, "encoder_layers": 18, "decoder_layers": 18, "updates": updates}
            records += [dict(common, kind="train", valid_loss=6.5 - updates / 1000, diverged=False),
                        dict(common, kind="eval", bleu=score, signature="tok:none", max_update=updates,
                             updates=updates - 100 * (arch == "deepnet"))]  # last update checkpoint before the end
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert report.main([str(results), "--out-dir", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out/results.md").read_text()
    assert "| Pre-LN | 19.50 |" in text and "| DeepNet | 20.10 |" in text  # the depth table: latest evaluation
    assert "| model | 2000 | 4000 |" in text and "| DeepNet | 10.53 (4.500) | 20.10 (2.500) |" in text
    rows = list(csv.reader((tmp_path / "out/iwslt14_de_en_18L-18L_by_updates.csv").open()))
    assert rows[0] == ["model", "updates", "bleu", "valid_loss"] and ["Pre-LN", "4000", "19.5", "2.5"] in rows
    assert (tmp_path / "out/iwslt14_de_en_18L-18L_by_updates.png").read_bytes()[:4] == b"\x89PNG"


def test_deepnorm_init_is_a_setup_option_that_names_the_run_folder(capsys):
    """model.deepnorm_init reaches fairseq-train, and two inits of one arch and depth never share a folder."""
    def folder_and_init(*args):
        argv = _argv_of(capsys, "iwslt14_de_en", "--cpu", "--layers", "6,6", *args)
        init = argv[argv.index("--deepnorm-init") + 1] if "--deepnorm-init" in argv else None
        return argv[argv.index("--save-dir") + 1].split("/")[-3], init

    assert folder_and_init("--arch", "deepnet") == ("deepnet_source", "source")  # the bilingual setups' default
    assert folder_and_init("--arch", "deepnet", "model.deepnorm_init=paper") == ("deepnet", "paper")
    assert folder_and_init("--arch", "deepnet", "model.deepnorm_init=torchscale") == ("deepnet_torchscale", "torchscale")
    assert folder_and_init("--arch", "preln", "model.deepnorm_init=source") == ("preln", None)  # DeepNet's only
    cfg = cfgmod.load(CONFIGS["iwslt14_de_en"], ["model.deepnorm_init=source"])
    assert launch.config_block(cfg, "deepnet", "cuda")["model"]["deepnorm_init"] == "source"
    assert "deepnorm_init" not in launch.config_block(cfg, "preln", "cuda")["model"]  # a Pre-LN record names no init
    assert launch.config_block(cfg, "preln", "cuda")["train"]["precision"] == "fp16"
    assert "precision" not in launch.config_block(cfg, "preln", "cpu")["train"]  # a CPU run computes in fp32
    with pytest.raises(cfgmod.ConfigError, match="key 'model.deepnorm_init' must be one of paper, torchscale, source, "
                                                 "got 'sorce'"):
        cfgmod.load(CONFIGS["iwslt14_de_en"], ["model.deepnorm_init=sorce"])  # a typo fails when the config loads


@pytest.mark.parametrize("strategy, encoder, decoder", [("s-enc-t-dec", "src", True), ("t-enc", "tgt", False),
                                                        ("t-enc-t-dec", "tgt", True)])
def test_lang_tags_strategy_reaches_the_multilingual_task(capsys, strategy, encoder, decoder):
    argv = _argv_of(capsys, "opus100", "--cpu", "--arch", "deepnet", f"data.lang_tags={strategy}")
    assert argv[argv.index("--encoder-langtok") + 1] == encoder and ("--decoder-langtok" in argv) == decoder
    from deepnet_setups import lang_tags

    assert lang_tags.strategy_of({"encoder_langtok": encoder, "decoder_langtok": decoder}) == strategy
    with pytest.raises(ValueError, match="trained with language tags t-enc, but data.lang_tags is s-enc-t-dec"):
        lang_tags.check_model_strategy("s-enc-t-dec", {"encoder_langtok": "tgt", "decoder_langtok": False}, "ckpt.pt")


def test_a_bad_lang_tags_strategy_is_refused_in_one_line(capsys):
    assert launch.main([str(CONFIGS["opus100"]), "--dry-run", "--cpu", "--arch", "deepnet", "data.lang_tags=s-enc"]) == 2
    assert "key 'data.lang_tags' must be one of s-enc-t-dec, t-enc, t-enc-t-dec, got 's-enc'" in capsys.readouterr().err


def test_one_prepared_folder_serves_every_lang_tags_strategy(tmp_path):
    from deepnet_setups.prepare import check_fingerprint

    cfg = cfgmod.load(CONFIGS["opus100"], ["data.lang_tags=s-enc-t-dec", f"paths.work={tmp_path}"])
    check_fingerprint(cfg, tmp_path, "raw")
    check_fingerprint(cfgmod.load(CONFIGS["opus100"], ["data.lang_tags=t-enc", f"paths.work={tmp_path}"]), tmp_path, "raw")
    # a folder whose prep.json (written by earlier versions) names a strategy is still accepted
    record = json.loads((tmp_path / "prep.json").read_text())
    record["data"]["lang_tags"] = "s-enc-t-dec"
    (tmp_path / "prep.json").write_text(json.dumps(record))
    check_fingerprint(cfg, tmp_path, "raw")
    # what the data depends on still stops a rerun
    with pytest.raises(tp.DataError, match="prepared earlier with a different 'prep.spm_vocab_size'"):
        check_fingerprint(cfgmod.load(CONFIGS["opus100"], ["prep.spm_vocab_size=1000"]), tmp_path, "raw")
