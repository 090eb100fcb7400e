"""The benchmark suite: the runner lists every registered benchmark, each has its --help, the result
file says when, where and on what it ran, the CLI-chaining benchmarks keep their flags (dry run),
every command docs/results.md names exists and parses, and no benchmark parses its own arguments."""

from __future__ import annotations

import ast
import json
import re
import shlex
import subprocess
import sys

import pytest

from benchmarks.__main__ import main
from benchmarks.registry import BENCHMARKS
from benchmarks.suite import Benchmark, BenchmarkError, Started, build_parser, parse, write_result
from tests.conftest import ROOT

BENCH_DIR = ROOT / "benchmarks"
SHARED = {"__init__.py", "__main__.py", "registry.py", "suite.py"}
RESULTS = ROOT / "docs" / "results.md"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


@pytest.mark.parametrize("args", [(), ("--help",), ("list",)])
def test_the_runner_lists_every_registered_benchmark_with_one_line(args):
    proc = _run(*args)
    assert proc.returncode == 0, proc.stderr
    listed = re.findall(r"^  (\S+)\s+(\S.*)$", proc.stdout, flags=re.M)
    assert [name for name, _ in listed] == list(BENCHMARKS)
    assert all(summary == BENCHMARKS[name].summary for name, summary in listed)


def test_an_unknown_name_fails_with_the_known_names(capsys):
    assert main(["no-such-benchmark"]) == 2
    err = capsys.readouterr().err
    assert "no-such-benchmark" in err and all(name in err for name in BENCHMARKS)


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_every_benchmark_has_its_help_and_interface(name, capsys):
    with pytest.raises(SystemExit) as exc:
        main([name, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert f"python -m benchmarks {name}" in out and "--out" in out and "--dry-run" in out
    module = BENCHMARKS[name].load()
    assert all(callable(getattr(module, f, None)) for f in ("add_arguments", "budget", "run"))
    assert module.__doc__ and module.__doc__.strip()


def test_help_and_the_list_import_no_torch():
    code = ("import sys\nfrom benchmarks.registry import BENCHMARKS\n"
            "from benchmarks.suite import build_parser\n"
            "for b in BENCHMARKS.values(): build_parser(b, b.load()).format_help()\n"
            "print(sorted(m for m in ('torch', 'transformers', 'onnxruntime') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_a_common_flag_that_does_not_exist_is_refused():
    class Module:
        COMMON = ("data_dir", "gpu_count")

        @staticmethod
        def add_arguments(p):
            pass

    with pytest.raises(TypeError, match="gpu_count"):
        build_parser(Benchmark("x", "x", "x"), Module)


def test_the_result_file_records_date_commit_machine_load_and_budget(tmp_path):
    path = write_result(tmp_path / "r.json", "demo", ["--seeds", "1,2"], "2 seeds x 10 steps", {"score": 1.0},
                        Started.now(), steps=[{"name": "a", "seconds": 1.0}])
    record = json.loads(path.read_text())
    assert record["benchmark"] == "demo" and record["command"] == "python -m benchmarks demo --seeds 1,2"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", record["date"])
    assert record["commit"] != "unknown" and re.match(r"[0-9a-f]{7,}", record["commit"])
    machine = record["machine"]
    assert machine["cpu"] and machine["cores"] >= 1 and machine["torch"]
    assert len(record["load_average"]["start"]) == 3 and len(record["load_average"]["end"]) == 3
    assert record["budget"] == "2 seeds x 10 steps" and record["results"] == {"score": 1.0}
    assert record["finished"] is True and record["steps"] == [{"name": "a", "seconds": 1.0}]
    assert not list(tmp_path.glob(".*tmp"))


def _family(folder, seed: int, score: float) -> None:
    folder.mkdir(parents=True)
    rows = [{"label": "2x", "score_fp32": score, "score_int8": score - 0.01,
             "vs_dense_int8_32x128": 2.0 + seed / 100}]
    (folder / "family.json").write_text(json.dumps({"dense_score": 0.86, "rows": rows}))


def test_a_benchmark_run_writes_its_result_beside_mean_and_spread(tmp_path, capsys):
    _family(tmp_path / "runs" / "obs-s42", 42, 0.85)
    _family(tmp_path / "runs" / "obs-s1", 1, 0.83)
    out = tmp_path / "seeds.json"
    assert main(["family-seeds", str(tmp_path / "runs"), "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["benchmark"] == "family-seeds" and record["budget"].startswith("none")
    (row,) = record["results"]["rows"]
    assert row["method"] == "obs" and sorted(row["seeds"]) == ["1", "42"]
    assert row["fp32"]["mean"] == pytest.approx(0.84) and row["fp32"]["spread"] == pytest.approx(0.01)
    assert "84.00 ± 1.00" in capsys.readouterr().out


def test_the_default_result_path_is_named_by_benchmark_and_date(tmp_path, monkeypatch):
    monkeypatch.setenv("COMPRESS_ARTIFACTS", str(tmp_path))
    _family(tmp_path / "runs" / "fisher-s1", 1, 0.8)
    assert main(["family-seeds", str(tmp_path / "runs")]) == 0
    (path,) = (tmp_path / "benchmarks").glob("family-seeds-*.json")
    assert re.fullmatch(r"family-seeds-\d{4}-\d\d-\d\d\.json", path.name)


def _dry(capsys, *argv: str) -> list[list[str]]:
    assert main([*argv, "--dry-run"]) == 0
    return [shlex.split(line) for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]


def test_dry_run_of_structured_reconstruction_keeps_the_script_flags(tmp_path, capsys):
    obs, agnews = _dry(capsys, "structured-reconstruction", "TEACHER", "obs-gradual-s1",
                       "agnews-fisher-oneshot-s42", "--work", str(tmp_path))
    assert obs[1:4] == ["-m", "compress", "prune"]
    assert " ".join(obs[4:]) == (
        "--stage post-training --model TEACHER --task sst2 --data-dir ../shared/data --train-limit 20000 "
        "--max-length 64 --structured heads,ffn --criterion obs --calibration-samples 512 --latency-shape "
        f"32x128 --seed 1 --speedup 2,3,4 --family-mode gradual --recovery-steps 500 --teacher self "
        f"--out {tmp_path}/obs-gradual-s1")
    assert " ".join(agnews[4:]) == (
        f"--stage post-training --model {tmp_path}/agnews-teacher --task ag_news --data-dir ../shared/data "
        "--train-limit 10000 --max-length 64 --structured heads,ffn --criterion fisher "
        "--calibration-samples 512 --latency-shape 32x128 --seed 42 --speedup 2,3 --family-mode independent "
        f"--out {tmp_path}/agnews-fisher-oneshot-s42")
    assert not (tmp_path / "logs").exists()  # nothing ran


def test_dry_run_of_speed_at_kept_accuracy_exports_then_benches(tmp_path, capsys):
    *exports, bench = _dry(capsys, "speed-at-kept-accuracy", "DENSE", "f40=RUN40", "--work", str(tmp_path))
    assert [e[3:5] for e in exports] == [["export", "DENSE"], ["export", "RUN40"]]
    assert all(e[-8:] == ["--quantize", "int8", "--task", "sst2", "--data-dir", "../shared/data",
                          "--max-length", "64"] for e in exports)
    assert bench[3:] == ["bench", "dense=DENSE", f"dense-int8={tmp_path}/dense-int8.onnx",
                         f"f40-int8={tmp_path}/f40-int8.onnx", "--runtimes", "torch,ort", "--batch-sizes",
                         "1,32", "--seq-lens", "128", "--iterations", "5", "--rounds", "5",
                         "--out", f"{tmp_path}/bench"]


def test_dry_run_lists_a_finished_step_as_done(tmp_path, capsys):
    (tmp_path / "obs-oneshot-s42").mkdir()
    argv = ["structured-reconstruction", "T", "obs-oneshot-s42", "--work", str(tmp_path), "--dry-run"]
    assert main(argv) == 0
    assert "# done already: " in capsys.readouterr().out


def test_squad_oneshot_is_the_grid_with_squad_defaults(tmp_path, capsys):
    finetune, *prunes = _dry(capsys, "squad-oneshot", "--finetune-from", "MINILM", "--work", str(tmp_path))
    assert finetune[3:] == ["finetune", "--model", "MINILM", "--task", "squad", "--data-dir",
                            "../shared/data", "--split-by-article", "38/10", "--max-length", "256", "--seed",
                            "42", "--epochs", "2", "--lr", "1e-4", "--batch-size", "16",
                            "--out", f"{tmp_path}/dense"]
    assert [p[-1].rsplit("/", 1)[1] for p in prunes] == [
        "sparsegpt-50", "wanda-50", "magnitude-50", "sparsegpt-60", "sparsegpt-2of4", "sparsegpt-70"]
    assert all("--exclude role:word_embeddings --out" in shlex.join(p) for p in prunes)


def test_a_usage_error_before_any_step_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["oneshot-post-training", "--dense", "D", "--cells", "oneshot,nope", "--dry-run"])
    assert exc.value.code == 2 and "--cells takes" in capsys.readouterr().err


def _doc_commands() -> list[str]:
    return re.findall(r"`python -m benchmarks ([^`]+)`", RESULTS.read_text())


def test_every_benchmark_command_in_results_md_exists_and_parses():
    commands = _doc_commands()
    assert len(commands) >= 20
    for command in commands:
        name, *argv = shlex.split(command)
        assert name in BENCHMARKS, f"docs/results.md names `python -m benchmarks {name}`, not registered"
        try:
            parse(BENCHMARKS[name], argv)
        except SystemExit:
            pytest.fail(f"docs/results.md: `python -m benchmarks {command}` does not parse")


def test_every_table_of_results_md_says_how_to_regenerate_it():
    sections = re.split(r"^#{2,4} ", RESULTS.read_text(), flags=re.M)[1:]
    missing = [s.splitlines()[0] for s in sections if "|---" in s and "Regenerate:" not in s]
    assert not missing, f"sections with a table and no 'Regenerate:' line: {missing}"


def test_results_md_names_no_benchmark_script_that_is_gone():
    text = RESULTS.read_text()
    for path in re.findall(r"(?<![0-9a-f]:)benchmarks/([\w.]+\.(?:py|sh))", text):
        assert (BENCH_DIR / path).is_file(), f"docs/results.md names benchmarks/{path}, which does not exist"


def _own_parsing(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name == "argparse" for a in node.names):
            found.append("import argparse")
        elif isinstance(node, ast.ImportFrom) and node.module in ("argparse", "optparse", "getopt", "click"):
            found.append(f"from {node.module} import")
        elif isinstance(node, ast.Attribute) and node.attr in ("ArgumentParser", "argv"):
            found.append(node.attr)
    return found


def test_no_benchmark_parses_its_own_arguments():
    for path in sorted(BENCH_DIR.glob("*.py")):
        if path.name == "suite.py":
            continue
        own = _own_parsing(ast.parse(path.read_text()))
        if path.name == "__main__.py":  # the runner reads sys.argv once, to pick the benchmark
            own = [o for o in own if o != "argv"]
        assert not own, f"benchmarks/{path.name} parses its own arguments ({own}); use benchmarks/suite.py"


def test_the_parsing_rule_catches_a_parser():
    assert _own_parsing(ast.parse("import argparse\np = argparse.ArgumentParser()")) == [
        "import argparse", "ArgumentParser"]


def test_every_benchmark_file_is_registered_and_no_script_is_left_beside_them():
    modules = {b.module for b in BENCHMARKS.values()}
    files = {p.stem for p in BENCH_DIR.glob("*.py") if p.name not in SHARED}
    assert files == modules, f"unregistered: {sorted(files - modules)}; missing: {sorted(modules - files)}"
    assert not [p.name for p in BENCH_DIR.iterdir() if p.suffix in (".sh", ".bash")]


def test_member_recovery_variants_name_their_overrides_and_refuse_unknown_keys():
    from benchmarks.member_recovery import _variants, variant_name

    parsed = _variants("1000:0, 3000:20000:layers=1:lr=2e-4")
    assert parsed == [(1000, 0, {}), (3000, 20000, {"kd_layers": 1.0, "lr": 2e-4})]
    assert [variant_name(*v) for v in parsed] == ["1000-0", "3000-20000-layers1-lr0.0002"]
    for bad in ("1000", "1000:0:temperature=2", "1000:0:layers=-1", "0:0", "1000:x"):
        with pytest.raises(BenchmarkError, match="STEPS:UNLABELED"):
            _variants(bad)
