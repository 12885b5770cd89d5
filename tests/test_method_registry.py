"""deepnet_methods, the one registry of training methods: a method added there reaches every driver's choices and
the report's labels, and no driver, setup, benchmark or script keeps a list of method names of its own."""

import ast
import re
from contextlib import redirect_stdout
from io import StringIO

import pytest
from conftest import ROOT, run

import deepnet_methods
from deepnet_methods import Method

FAKE = Method("fake", "fake_transformer", "Fake-LN", zoo=True)  # a new scheme, as one is added


@pytest.fixture
def fake_method(monkeypatch):
    monkeypatch.setitem(deepnet_methods.METHODS, FAKE.name, FAKE)
    return FAKE


def help_text(main, *argv):
    out = StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return out.getvalue()


def test_an_added_method_is_in_every_drivers_choices(fake_method):
    from deepnet_experiments import init_ablation, paper_protocol, plateau, stability_map, sweep, zero_shot_study
    from deepnet_setups import evaluate, launch

    for main in (launch.main, evaluate.main, stability_map.parse_args, plateau.parse_args, zero_shot_study.main,
                 init_ablation.parse_args, sweep.parse_args, paper_protocol.parse_args):
        assert "fake" in help_text(main), main.__module__
    assert launch.fairseq_arch("fake", "iwslt_de_en") == "fake_transformer_iwslt_de_en"
    # the defaults stay the paper's three
    assert stability_map.parse_args(["--out", "x"]).methods == ["postln", "preln", "deepnet"]


def test_the_shell_scripts_take_their_methods_from_the_registry():
    usage = run(["bash", ROOT / "scripts" / "train_setup.sh", "--help"]).stdout
    assert f"--arch A            the method, one of {', '.join(deepnet_methods.names())}\n" in usage


def test_an_added_method_has_its_label_and_place_in_the_report(fake_method):
    from deepnet_setups import report

    records = [{"kind": "eval", "setup": "s", "arch": arch, "encoder_layers": 6, "decoder_layers": 6, "bleu": bleu}
               for arch, bleu in (("deepnet", 3.0), ("fake", 2.0), ("postln", 1.0))]
    _, rows, _ = report.tables(records)["s"]
    assert [row[0] for row in rows] == ["Post-LN", "DeepNet", "Fake-LN"]  # in table order: the new one where added


def test_names_labels_aliases_and_archs():
    assert deepnet_methods.names(zoo=False) == ["postln", "preln", "deepnet"]
    assert deepnet_methods.label("deepnet_source_init") == deepnet_methods.label("deepnet_source") == \
        "DeepNet, source init"
    assert deepnet_methods.label("deepnet", init_named=True) == "DeepNet, paper init"
    assert deepnet_methods.canonical("deepnet_torchscale_init") == "deepnet_torchscale"
    assert deepnet_methods.order("deepnet_source_init") == deepnet_methods.order("deepnet_source") < \
        deepnet_methods.order("unknown")
    assert deepnet_methods.row_name("deepnet", "paper") == "deepnet" and deepnet_methods.row_name("postln", "source") \
        == "postln" and deepnet_methods.row_name("deepnet", "source") == "deepnet_source"
    postln = deepnet_methods.METHODS["postln"]
    assert postln.arch("wmt_en_de_big") == "transformer_vaswani_wmt_en_de_big" and postln.models() == \
        ("postln_transformer", "transformer")
    assert deepnet_methods.of_arch("transformer_iwslt_de_en") is postln
    assert deepnet_methods.of_arch("dsinit_transformer_iwslt_de_en").label == "DS-Init"
    assert deepnet_methods.exports()["deepnet_transformer"] == deepnet_methods.FOLD
    with pytest.raises(ValueError, match="size variant 'huge'"):
        postln.arch("huge")


def test_the_registry_agrees_with_the_plugin():
    """The families are the plugin's registered models, the sizes its size variants, Pre-LN what their defaults set,
    DeepNet's inits its DEEPNORM_INITS, and each variant's init one its method takes."""
    from argparse import Namespace

    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    from deepnet_fairseq.models.deepnorm import DEEPNORM_INITS  # the plugin's import registers its models
    from deepnet_fairseq.models.sizes import SIZE_VARIANTS

    assert deepnet_methods.SIZES == tuple(SIZE_VARIANTS)
    for method in deepnet_methods.METHODS.values():
        for size in deepnet_methods.SIZES:
            assert method.arch(size) in ARCH_MODEL_REGISTRY, (method.name, size)
        defaults = Namespace()
        ARCH_CONFIG_REGISTRY[method.arch()](defaults)
        assert defaults.encoder_normalize_before == defaults.decoder_normalize_before == method.pre_ln, method.name
    assert deepnet_methods.METHODS["deepnet"].inits == tuple(DEEPNORM_INITS)
    for variant in deepnet_methods.VARIANTS.values():
        assert variant.init in deepnet_methods.METHODS[variant.method].inits


def test_the_cli_lists_what_table1_trains():
    families = run([ROOT / ".venv" / "bin" / "python", "-m", "deepnet_methods", "list", "--field", "family",
                    "--zoo"]).stdout.strip()
    assert families == ",".join(m.family for m in deepnet_methods.METHODS.values())
    assert families.split(",")[0] == "postln_transformer" and families.endswith(",deepnet_transformer")
    labels = run([ROOT / ".venv" / "bin" / "python", "-m", "deepnet_methods", "list", "--field", "label",
                  "--variants", "--sep", "|"]).stdout.strip()
    assert labels == "Post-LN|Pre-LN|DeepNet|DeepNet, paper init|DeepNet, torchscale's init|DeepNet, source init"


def test_each_method_has_the_year_its_baselines_row_cites_and_the_schemes_study_takes_the_newest():
    rows = {}
    for line in (ROOT / "docs/baselines.md").read_text().splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) > 2 and (arch := re.search(r"--arch (\w+)", cells[2])):
            rows[arch[1]] = cells[1]
    for method in deepnet_methods.METHODS.values():
        cited = rows[method.family]
        assert re.search(rf"\b{method.year}\b", cited), f"{method.name}: {method.year}, baselines.md cites {cited}"
    newest = run([ROOT / ".venv" / "bin" / "python", "-m", "deepnet_methods", "list", "--zoo", "--since", "2024"])
    assert newest.stdout.strip() == "periln,mixln,lns,dyt"
    study = (ROOT / "docs/results/schemes/commands.sh").read_text()
    assert '$("$py" -m deepnet_methods list --zoo --since 2024)' in study


# --- no list of method names outside the registry ------------------------------------------------------------------

SCANNED = ("deepnet_setups", "deepnet_experiments", "benchmarks")
# marks a study's own pick of methods (DeepNet's Fig. 5: Post-LN and DeepNet), which no registry field could give
CHOSEN = "# method-list: chosen"


def registry_names():
    """Every name the registry gives: methods, variants, aliases, families and their archs at every size."""
    found = set(deepnet_methods.names(variants=True, aliases=True))
    for method in deepnet_methods.METHODS.values():
        found |= {method.family, *(method.arch(size) for size in deepnet_methods.SIZES)}
    return found


def items(text):
    """A string's items, were it a list: comma- or bar-separated words."""
    return [part.strip() for part in re.split(r"[,|]", text)]


def lists_in_python(source):
    """(line, names) of each tuple, list, set or dict literal, and each string, that holds 2+ registry names;
    docstrings are prose and left out, and so is a line marked CHOSEN."""
    known = registry_names()
    lines = source.splitlines()
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
            elements = node.keys if isinstance(node, ast.Dict) else node.elts
            strings = [e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            strings = items(node.value)
        else:
            continue
        names = [s for s in strings if s in known]
        if len(names) >= 2 and CHOSEN not in lines[node.lineno - 1]:
            yield node.lineno, names


def lists_in_shell(source):
    known = registry_names()
    for number, line in enumerate(source.splitlines(), 1):
        for match in re.finditer(r"[\w-]+(?:\s*[,|]\s*[\w-]+)+", line):
            names = [part for part in items(match.group()) if part in known]
            if len(names) >= 2:
                yield number, names


def test_no_driver_setup_benchmark_or_script_lists_method_names():
    found = []
    for package in SCANNED:
        for path in sorted((ROOT / package).rglob("*.py")):
            found += [f"{path.relative_to(ROOT)}:{line}: {names}" for line, names in lists_in_python(path.read_text())]
    for path in sorted((ROOT / "scripts").glob("*.sh")):
        found += [f"{path.relative_to(ROOT)}:{line}: {names}" for line, names in lists_in_shell(path.read_text())]
    assert not found, "method names listed outside deepnet_methods (take them from it):\n" + "\n".join(found)


def test_the_scan_finds_a_list():
    assert list(lists_in_python('ARCHS = ("postln", "deepnet")\nDEFAULT = "preln,deepnet_source"\n')) == [
        (1, ["postln", "deepnet"]), (2, ["preln", "deepnet_source"])]
    assert list(lists_in_python('"""postln,preln: prose"""\nx = {"transformer": 1, "deepnet_transformer": 2}\n')) == [
        (2, ["transformer", "deepnet_transformer"])]
    assert not list(lists_in_python(f'FIG5 = ("postln", "deepnet")  {CHOSEN} (the figure pair)\n'))
    assert list(lists_in_shell('METHODS="postln_transformer,dsinit_transformer"\n  --arch deepnet|preln\n')) == [
        (1, ["postln_transformer", "dsinit_transformer"]), (2, ["deepnet", "preln"])]
