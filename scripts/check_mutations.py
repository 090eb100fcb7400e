"""Mutations of the speed / structured-pruning code that the test suite must catch.

Each mutation is one exact text replacement in one file of ``compress/`` and the pytest node ids that
should fail under it. For each, ``compress/`` and ``tests/`` (and ``pyproject.toml``) are copied into a
temporary folder, the replacement is made there, and the named tests run there with that folder as the
working directory: the working tree is never modified. A mutation is

- ``caught``: the tests fail (pytest exit code 1; 2 when the mutated code no longer imports);
- ``survived``: they pass;
- ``stale``: its old text is no longer in the file exactly once (the code moved: update the list);
- ``error``: pytest could not run the tests (a node id that does not exist, a timeout).

First the union of the named tests runs on the unmutated copy (a test failing there would make every
mutation look caught). Writes ``artifacts/mutations.json`` and exits 1 when fewer than ``--min-caught``
(default 90%) of the mutations are caught (2 when the unmutated tests fail).

    python scripts/check_mutations.py                # every mutation
    python scripts/check_mutations.py --only 9 --only stock   # 9a-9d and the names holding "stock"
    python scripts/check_mutations.py --list
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "artifacts" / "mutations.json"
TIMEOUT_S = 900


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str  # relative to the repository root
    old: str  # exact text, present once in the file
    new: str
    tests: tuple[str, ...]  # pytest node ids, relative to the repository root


EMPTY = "tests/unit/test_empty_blocks.py::test_removed_blocks_compute_the_zeroed_original"
STOCK = "tests/unit/test_stock_copy.py::test_a_copy_whose_weights_land_in_the_wrong_places_is_refused"
EMB = ("tests/unit/test_embedding.py::"
       "test_recovery_loss_with_layers_equals_a_hand_computation_over_real_tokens_and_kept_layers")
KD = ("tests/unit/test_teacher_kd.py::"
      "test_layerwise_term_is_added_with_its_weight_over_the_kept_layers_and_real_tokens")
PER_CHANNEL = "tests/unit/test_export_parity.py::test_int8_per_channel_scales"
EXPORT_INT8 = ("tests/unit/test_export_parity.py::"
               "test_the_int8_export_and_conversion_write_per_channel_scales_unless_per_tensor_is_asked")
FASTEST = ("tests/unit/test_family_report.py::"
           "test_the_fastest_within_the_budget_is_judged_on_the_shipped_score_in_points")
FAMILY_REPORT = ("tests/unit/test_family_report.py::"
                 "test_the_family_report_names_the_fastest_by_its_shipped_score_within_max_drop_points")
FAMILY_BENCH = ("tests/unit/test_family_report.py::"
                "test_the_family_benches_at_the_latency_tables_shape_not_max_length")
KEY = "tests/unit/test_latency_table.py::test_the_cache_key_names_machine_runtime_shape_and_input_size"
CACHED_APART = ("tests/unit/test_latency_table.py::"
                "test_tables_of_another_length_or_thread_count_are_measured_and_cached_apart")
PREDICT = "tests/unit/test_latency_table.py::test_predict_is_base_plus_the_sum_by_hand"
RESIDUAL = ("tests/unit/test_latency_table.py::"
            "test_a_built_table_charges_the_dense_time_its_blocks_do_not_explain")
OPTION_LOSS = ("tests/unit/test_latency_search.py::"
               "test_each_options_loss_is_the_loss_of_removing_exactly_the_units_it_does_not_keep")
BRUTE = ("tests/unit/test_latency_search.py::"
         "test_the_plan_is_the_least_loss_layout_within_the_target_by_brute_force")
BOUND = "tests/unit/test_latency_search.py::test_the_speedup_path_holds_the_tuned_scales_within_the_bound"
RECIPE_BOUND = ("tests/unit/test_latency_search.py::"
                "test_the_prune_recipe_passes_its_scale_bound_on_the_speedup_path")
OBS_BRUTE = "tests/unit/test_obs_structured.py::test_the_plan_meets_the_target_at_the_least_database_error"
OBS_FIXED = ("tests/unit/test_obs_structured.py::"
             "test_the_plan_is_the_least_error_layout_when_layers_have_a_fixed_cost")

MUTATIONS: tuple[Mutation, ...] = (
    Mutation("1 empty attention block drops its LayerNorm", "compress/models/modeling_pruned.py",
             "return out.LayerNorm(out.dropout(bias.expand_as(hidden_states)) + hidden_states), None",
             "return out.dropout(bias.expand_as(hidden_states)) + hidden_states, None",
             (EMPTY,)),
    Mutation("2 empty FFN block returns its input", "compress/models/modeling_pruned.py",
             "return self.LayerNorm(self.dropout(bias.expand_as(input_tensor)) + input_tensor)",
             "return input_tensor",
             (EMPTY,)),
    Mutation("3 stock-copy output check skipped", "compress/pruning/stock_copy.py",
             "    _check_same_outputs(model, stock)\n    return stock",
             "    return stock",
             (STOCK,)),
    Mutation("4a embedding recovery: layer-wise MSE over padding tokens", "compress/embedding/losses.py",
             "layers = layerwise_mse(s_hidden, t_hidden, mask, kept_layers(student.encoder))",
             "layers = layerwise_mse(s_hidden, t_hidden, None, kept_layers(student.encoder))",
             (EMB,)),
    Mutation("4b embedding recovery: pooling over padding tokens", "compress/embedding/losses.py",
             "cos = (1 - F.cosine_similarity(student.embedding_of(s_last, mask), "
             "teacher.embedding_of(t_last, mask),",
             "cos = (1 - F.cosine_similarity(student.embedding_of(s_last, mask.clamp_min(1)), "
             "teacher.embedding_of(t_last, mask.clamp_min(1)),",
             (EMB,)),
    Mutation("4c embedding recovery: removed layers matched", "compress/embedding/losses.py",
             "layers = layerwise_mse(s_hidden, t_hidden, mask, kept_layers(student.encoder))",
             "layers = layerwise_mse(s_hidden, t_hidden, mask, None)",
             (EMB,)),
    Mutation("4d teacher KD: removed layers matched", "compress/distill/teacher_kd.py",
             "layers = self.layers if self.layers is not None else kept_layers(model)",
             "layers = self.layers",
             (KD,)),
    Mutation("5a quantize_int8 forces per-tensor scales", "compress/export/quantize.py",
             "per_channel=per_channel,", "per_channel=False,",
             (PER_CHANNEL, EXPORT_INT8)),
    Mutation("5b int8 precision converts per tensor", "compress/export/precision.py",
             "quantize_int8(src, dst, per_channel=per_channel)", "quantize_int8(src, dst, per_channel=False)",
             (EXPORT_INT8,)),
    Mutation("5c export recipe forces per-tensor int8", "compress/export/model_export.py",
             "per_channel=not cfg.per_tensor", "per_channel=False",
             (EXPORT_INT8,)),
    Mutation("6a family judges its fastest model by the fp32 score", "compress/recipes/speed_family.py",
             '"macro_f1_int8" if by_macro else "score_int8")',
             '"macro_f1_int8" if by_macro else "score_fp32")',
             (FAMILY_REPORT,)),
    Mutation("6b fastest_within reads the fp32 score by default", "compress/report/speed_family.py",
             'speed_key: str, score_key: str = "score_int8")',
             'speed_key: str, score_key: str = "score_fp32")',
             (FASTEST, FAMILY_REPORT)),
    Mutation("6c --max-drop read as a fraction", "compress/report/speed_family.py",
             "and 100 * (dense_score - r[score_key]) <= max_drop + 1e-9]",
             "and (dense_score - r[score_key]) <= max_drop + 1e-9]",
             (FASTEST, FAMILY_REPORT)),
    Mutation("6d family passes --max-drop as a fraction", "compress/recipes/speed_family.py",
             "best = fastest_within(rows, dense_judged, cfg.max_drop, speed_key,",
             "best = fastest_within(rows, dense_judged, cfg.max_drop / 100, speed_key,",
             (FAMILY_REPORT,)),
    Mutation("7a threads left out of the latency cache key", "compress/measure/latency_table.py",
             '"seq_len": seq_len, "threads": threads, ', '"seq_len": seq_len, ',
             (KEY, CACHED_APART)),
    Mutation("7b sequence length left out of the latency cache key", "compress/measure/latency_table.py",
             '"seq_len": seq_len, "threads": threads, ', '"threads": threads, ',
             (KEY, CACHED_APART)),
    Mutation("7c threads left out of the key latency_table looks up", "compress/measure/latency_table.py",
             "key = cache_key(shape, rt, batch, seq_len, threads, heads,",
             "key = cache_key(shape, rt, batch, seq_len, 0, heads,",
             (KEY, CACHED_APART)),
    Mutation("7d sequence length left out of the key latency_table looks up",
             "compress/measure/latency_table.py",
             "key = cache_key(shape, rt, batch, seq_len, threads, heads,",
             "key = cache_key(shape, rt, batch, 0, threads, heads,",
             (KEY, CACHED_APART)),
    Mutation("8a layer fixed cost charged twice in predict_ms", "compress/measure/latency_table.py",
             "total += self.layer_fixed_ms + self.attention_ms(h) + self.ffn_ms(w)",
             "total += 2 * self.layer_fixed_ms + self.attention_ms(h) + self.ffn_ms(w)",
             (PREDICT, RESIDUAL)),
    Mutation("8b layer fixed cost charged twice in the speedup budget (Fisher and OBS searches)",
             "compress/pruning/latency_search.py",
             '+ n_layers * table.layer_fixed_ms', '+ 2 * n_layers * table.layer_fixed_ms',
             (BRUTE, OBS_FIXED)),
    Mutation("9a option loss of k read at k+1 (Fisher)", "compress/pruning/latency_search.py",
             "tuple(float(losses[n - k]) for k in counts)",
             "tuple(float(losses[max(n - k - 1, 0)]) for k in counts)",
             (OPTION_LOSS, BRUTE)),
    Mutation("9b option loss of k read at k-1 (Fisher)", "compress/pruning/latency_search.py",
             "tuple(float(losses[n - k]) for k in counts)",
             "tuple(float(losses[min(n - k + 1, n)]) for k in counts)",
             (OPTION_LOSS, BRUTE)),
    Mutation("9c option loss of k read at k+1 (OBS)", "compress/pruning/obs_structured.py",
             "tuple(float(losses[n - k]) if n - k < len(losses)",
             "tuple(float(losses[max(n - k - 1, 0)]) if n - k < len(losses)",
             (OBS_BRUTE, OBS_FIXED)),
    Mutation("9d option loss of k read at k-1 (OBS)", "compress/pruning/obs_structured.py",
             "tuple(float(losses[n - k]) if n - k < len(losses)",
             "tuple(float(losses[n - k + 1]) if n - k + 1 < len(losses)",
             (OBS_BRUTE, OBS_FIXED)),
    Mutation("10a full head count never offered (Fisher)", "compress/pruning/latency_structured.py",
             "heads_full[layer] + 1)) if", "heads_full[layer])) if",
             (BRUTE,)),
    Mutation("10b full head count never offered (OBS)", "compress/pruning/obs_structured.py",
             "min(1, nh), nh + 1))", "min(1, nh), nh))",
             (OBS_FIXED,)),
    Mutation("11a scale bound dropped in prune_to_speedup", "compress/pruning/latency_structured.py",
             "rearrange, tune, max_swaps, scale_bound)", "rearrange, tune, max_swaps, None)",
             (BOUND,)),
    Mutation("11b scale bound dropped on the --speedup path of the prune recipe",
             "compress/api/prune_stages.py",
             "scale_bound=cfg.scale_bound or None, dense_sizes=dense_sizes)",
             "scale_bound=None, dense_sizes=dense_sizes)",
             (RECIPE_BOUND,)),
    Mutation("12a family benches at --max-length", "compress/recipes/speed_family.py",
             "bench = _bench(cfg, run.path, dense, members, batch, tokens)",
             "bench = _bench(cfg, run.path, dense, members, batch, cfg.max_length)",
             (FAMILY_BENCH,)),
    Mutation("12b family bench shapes use --max-length", "compress/recipes/speed_family.py",
             "seq_lens=tuple(sorted({tokens, 128}))", "seq_lens=tuple(sorted({cfg.max_length, 128}))",
             (FAMILY_BENCH,)),
    Mutation("13 latency table charges nothing the blocks do not explain",
             "compress/measure/latency_table.py",
             "        return total * self.dense_scale\n", "        return total\n",
             (RESIDUAL,)),
    Mutation("13b speed search ignores the table's scale", "compress/pruning/latency_search.py",
             'return dense_ms / speedup / getattr(table, "dense_scale", 1.0) - fixed_ms',
             "return dense_ms / speedup - fixed_ms",
             ("tests/unit/test_latency_search.py::test_the_target_holds_when_the_table_charges_unexplained_time",)),
    Mutation("14 latency table trusts blocks that ran slow", "compress/measure/latency_table.py",
             "    if predicted_ms - dense_ms > max(DENSE_TOLERANCE * dense_ms, DENSE_FLOOR_MS):\n"
             "        return -1\n",
             "",
             ("tests/unit/test_latency_table.py::"
              "test_a_table_built_while_its_blocks_ran_slow_keeps_the_calm_retiming",
              "tests/unit/test_latency_table.py::"
              "test_blocks_whose_sum_is_far_above_the_dense_timing_are_timed_again_then_refused")),
)


def copy_tree(dest: Path) -> Path:
    """``compress/``, ``tests/`` and ``pyproject.toml`` copied to ``dest/repo``; ``dest/shared`` links to
    the real ``../shared`` (the tests' data folder) where there is one. Returns ``dest/repo``."""
    repo = dest / "repo"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("compress", "tests"):
        shutil.copytree(ROOT / name, repo / name, ignore=ignore)
    shutil.copy2(ROOT / "pyproject.toml", repo / "pyproject.toml")
    shared = ROOT.parent / "shared"
    if shared.is_dir():
        (dest / "shared").symlink_to(shared, target_is_directory=True)
    return repo


def run_tests(repo: Path, tests: tuple[str, ...]) -> tuple[int, str, float]:
    """pytest on ``tests`` in ``repo`` (stop at the first failure): (exit code, output, seconds)."""
    env = {**os.environ, "PYTHONPATH": str(repo), "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-o", "addopts=",
           "-q", "-x", "--no-header", "-W", "ignore", *tests]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        return -1, f"timed out after {TIMEOUT_S} s\n{exc.stdout or ''}", time.perf_counter() - t0
    return done.returncode, done.stdout + done.stderr, time.perf_counter() - t0


def failed_tests(output: str) -> list[str]:
    return re.findall(r"^(?:FAILED|ERROR) (\S+)", output, flags=re.MULTILINE)


def check(mutation: Mutation) -> dict:
    with tempfile.TemporaryDirectory(prefix="compress-mutation-") as tmp:
        repo = copy_tree(Path(tmp))
        target = repo / mutation.file
        text = target.read_text(encoding="utf-8")
        found = text.count(mutation.old)
        if found != 1:
            return {"status": "stale", "why": f"old text found {found} times in {mutation.file}"}
        target.write_text(text.replace(mutation.old, mutation.new), encoding="utf-8")
        code, output, seconds = run_tests(repo, mutation.tests)
    status = {0: "survived", 1: "caught", 2: "caught"}.get(code, "error")
    out = {"status": status, "pytest_exit_code": code, "seconds": round(seconds, 1),
           "failed": failed_tests(output)}
    out["output_tail"] = output[-(1500 if status == "caught" else 3000):]
    return out


def baseline(mutations: list[Mutation]) -> tuple[bool, str]:
    """Whether every named test passes on the unmutated code (and the output when not)."""
    tests = tuple(dict.fromkeys(t for m in mutations for t in m.tests))
    with tempfile.TemporaryDirectory(prefix="compress-mutation-") as tmp:
        code, output, seconds = run_tests(copy_tree(Path(tmp)), tests)
    print(f"baseline: {len(tests)} test ids on the unmutated code: exit {code} ({seconds:.0f} s)", flush=True)
    return code == 0, output


def _selects(only: str, name: str) -> bool:
    """``--only 9`` picks 9a-9d, ``--only 9a`` 9a alone; a longer text picks the names holding it."""
    number = name.split()[0]
    return only in (number, number.rstrip("abcdefgh")) or (len(only) > 3 and only in name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[],
                        help="run the mutations whose name contains this text (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--no-baseline", action="store_true", help="skip the run on the unmutated code")
    parser.add_argument("--min-caught", type=float, default=0.9, help="fraction that must be caught")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.only or any(_selects(o, m.name) for o in args.only)]
    if args.list:
        for m in chosen:
            print(f"{m.name}\n    {m.file}: {' '.join(m.tests)}")
        return 0
    if not args.no_baseline:
        ok, output = baseline(chosen)
        if not ok:
            print(output[-5000:])
            print("the named tests fail on the unmutated code: fix them first")
            return 2
    results = []
    for m in chosen:
        r = check(m)
        results.append({"name": m.name, "file": m.file, "tests": list(m.tests), **r})
        where = f" by {r['failed'][0]}" if r.get("failed") else ""
        print(f"{r['status']:>8}  {m.name}{where}" + (f" ({r['why']})" if "why" in r else ""), flush=True)
    caught = sum(r["status"] == "caught" for r in results)
    share = caught / len(results) if results else 1.0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"caught": caught, "total": len(results), "share_caught": share,
                                    "min_caught": args.min_caught, "mutations": results}, indent=2) + "\n",
                        encoding="utf-8")
    counts = {s: sum(r["status"] == s for r in results) for s in ("caught", "survived", "stale", "error")}
    print(f"{caught}/{len(results)} caught ({100 * share:.0f}%); "
          + ", ".join(f"{k} {v}" for k, v in counts.items()) + f"; written to {args.out}")
    return 0 if share >= args.min_caught else 1


if __name__ == "__main__":
    sys.exit(main())
