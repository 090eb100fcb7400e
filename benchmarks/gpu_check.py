"""One prepared check for a lent GPU machine (under 8 minutes, no hub, no ../shared): half-precision
exports and PyTorch peers on a CUDA machine.

1. builds random-weight BERT classifiers from config: MiniLM's shapes (6 layers, hidden 384,
   12 heads, FFN 1536) and BERT-base's (12 layers, 768, 12 heads, 3072), vocabulary 30522;
2. exports each with the real CLI: fp32 optimized and fp16, each with its parity check on CUDA;
3. ``compress bench`` of each: PyTorch eager fp32 (the baseline), torch-fp16, torch-bf16,
   torch-compile, and the onnxruntime CUDA fp32/fp16 files, at batch 32 x 128 and 1 x 128; then
   BERT-base's shape pruned one-shot to 2:4 by SparseGPT (``compress.prune_model``, random-token
   calibration, on the GPU): torch-fp16 against torch-sparse (PyTorch's semi-structured sparse
   linears) at batch 32 x 512; without onnxruntime's CUDA provider the exports are recorded as not
   run and the benches time the PyTorch runtimes only;
4. the speed family of the MiniLM shape on the CUDA runtime (fp16): the random-weight model is
   fine-tuned one epoch on the bundled sample (``--task sample``, a tokenizer over the sample's
   words saved beside it), then ``compress prune --stage post-training --structured heads,ffn
   --speedup 2,3,4 --latency-runtime ort-cuda-fp16 --latency-shape 32x128`` measures its latency
   table on the GPU, builds the members, exports them in fp16 and benches them against the dense
   fp16 export and PyTorch eager fp32 (accuracy on 64 sample sentences means nothing here: the
   question is speed); ``family.md``, ``family.json`` and ``latency_table.json`` are kept in
   ``--work``;
5. runs the tests marked ``gpu`` (after the MiniLM shape's family, before BERT-base's); they include
   a bf16 export checked on CUDA (does onnxruntime's CUDA provider run the bfloat16 graph?), and a
   bf16 export of the MiniLM shape comes last if time is left;
6. rewrites the result JSON (``--out``) after every step (a killed run keeps what it finished):
   every step's command, exit code, seconds and output tail, the export reports, each bench table;
   the bench run folders, the tests' JUnit XML and nvidia-smi's answer go to ``--work``. The models
   and .onnx files (about 1.5 GB with BERT-base's) go to ``--models-dir`` (default: a temporary
   folder removed at the end), so ``--work`` stays small enough to copy back from the GPU machine.

Steps run in order of what the GPU question needs most and stop when ``--budget-s`` is spent (the
rest are recorded as not run). ``--tiny`` is the CPU rehearsal a test runs: one 2-layer hidden-32
model, fp16 only, CPU runtimes (torch, torch-int8; torch-fp16 reported as skipped), batch 2 x 16,
a family of 1.5x and 2x aimed at ``ort-fp32`` at 2 x 16, no tests step.

    python -m benchmarks gpu-check --work /tmp/gpu-check --out /tmp/gpu-check/gpu_check.json   # on a GPU
    python -m benchmarks gpu-check --tiny --work /tmp/gpu-check    # the CPU rehearsal (what a test runs)
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# name -> (layers, hidden, heads, FFN)
GPU_SHAPES = {"minilm-shape": (6, 384, 12, 1536), "bert-base-shape": (12, 768, 12, 3072)}
TINY_SHAPES = {"tiny": (2, 32, 4, 64)}
VOCAB = 30522
GPU_BENCH = ["--batch-sizes", "32,1", "--seq-lens", "128", "--warmup", "3", "--iterations", "20",
             "--rounds", "3", "--provider", "cuda", "--runtimes", "torch,torch-fp16,torch-bf16,torch-compile"]
TINY_BENCH = ["--batch-sizes", "2", "--seq-lens", "16", "--warmup", "1", "--iterations", "1",
              "--rounds", "1", "--settle-s", "0", "--matmul-n", "64", "--provider", "cpu",
              "--runtimes", "torch,torch-fp16,torch-int8"]
# the speed family: targets, latency runtime and shape (the GPU's, then the CPU rehearsal's)
GPU_FAMILY = ("2,3,4", "ort-cuda-fp16", 32, 128)
TINY_FAMILY = ("1.5,2", "ort-fp32", 2, 16)
GPU_TESTS = ["tests/unit/test_export_half.py", "tests/unit/test_bench_peers.py",
             "tests/unit/test_export_parity.py"]


COMMON = ("work", "python")


def add_arguments(p) -> None:
    p.add_argument("--tiny", action="store_true", help="CPU rehearsal: one tiny model, CPU runtimes")
    p.add_argument("--budget-s", type=float, default=420.0, help="start no step after this many seconds")
    p.add_argument("--models-dir", type=Path, help="folder for the models and .onnx files (kept); default: "
                                                   "a temporary folder, removed at the end")


def budget(args) -> str:
    shapes = "one tiny 2-layer model" if args.tiny else "MiniLM and BERT-base shapes"
    return f"{shapes}; steps started within {args.budget_s:g} s; bench rounds as GPU_BENCH / TINY_BENCH say"


class Check:
    """The run's record: steps in order, saved (``save``: the result file) after each one."""

    def __init__(self, save, budget_s: float, python: str):
        self._save = save
        self.python = python
        self.start = time.monotonic()
        self.budget_s = budget_s
        self.record: dict = {"budget_s": budget_s, "environment": environment(), "steps": [],
                             "exports": {}, "bench": {}, "tests": None}
        self.save()

    def left_s(self) -> float:
        return self.budget_s - (time.monotonic() - self.start)

    def save(self) -> None:
        self.record["elapsed_s"] = round(time.monotonic() - self.start, 1)
        self._save(self.record)

    def run(self, name: str, cmd: list[str], min_s: float = 20.0, env: dict[str, str] | None = None) -> dict:
        """Run ``cmd`` (in the repository root, with ``env`` added) within what is left of the budget;
        record it."""
        step: dict = {"name": name, "cmd": cmd}
        left = self.left_s()
        if left < min_s:
            step.update(rc=None, not_run=f"out of time ({left:.0f} s of the budget left)")
        else:
            t0 = time.monotonic()
            try:
                proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=left,
                                      env={**os.environ, "HF_HUB_OFFLINE": "1", "COMPRESS_NO_PROGRESS": "1",
                                           "TOKENIZERS_PARALLELISM": "false", **(env or {})})
                step.update(rc=proc.returncode, tail=(proc.stdout[-3000:] + proc.stderr[-3000:]))
            except subprocess.TimeoutExpired as exc:
                said = exc.stdout or ""
                said = said.decode(errors="replace") if isinstance(said, bytes) else said
                step.update(rc=None, timed_out=True, tail=said[-3000:])
            step["seconds"] = round(time.monotonic() - t0, 1)
        self.record["steps"].append(step)
        self.save()
        return step


def environment() -> dict:
    """What ran: Python, torch and its CUDA device, onnxruntime and its providers."""
    env: dict = {"python": platform.python_version(), "machine": platform.machine()}
    try:
        import torch

        env["torch"] = torch.__version__
        env["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            env["cuda_device"] = torch.cuda.get_device_name(0)
            env["cuda_capability"] = list(torch.cuda.get_device_capability(0))
            env["cuda_runtime"] = torch.version.cuda
    except ImportError as exc:
        env["torch"] = f"not importable: {exc}"
    try:
        import onnxruntime

        env["onnxruntime"] = onnxruntime.__version__
        env["onnxruntime_providers"] = onnxruntime.get_available_providers()
    except ImportError as exc:
        env["onnxruntime"] = f"not importable: {exc}"
    return env


def build_model(folder: Path, layers: int, hidden: int, heads: int, ffn: int) -> Path:
    """A randomly initialised 2-label BERT classifier of the given shape, saved as safetensors."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers,
                     num_attention_heads=heads, intermediate_size=ffn, max_position_embeddings=512,
                     num_labels=2)
    BertForSequenceClassification(cfg).save_pretrained(folder, safe_serialization=True)
    return folder


def save_sample_tokenizer(folder: Path) -> None:
    """A WordPiece tokenizer beside the model in ``folder``: the special tokens, every lower-cased word
    of the bundled sample, and ``[unusedN]`` rows up to ``VOCAB``, so that a random-weight model reads
    a task's text with no hub and no packaged model."""
    from importlib import resources

    from transformers import BertTokenizerFast

    lines = (resources.files("compress") / "data" / "sample.tsv").read_text(encoding="utf-8").splitlines()[1:]
    words = sorted({w for line in lines for w in line.split("\t")[0].lower().split()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    vocab += [f"[unused{i}]" for i in range(VOCAB - len(vocab))]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    BertTokenizerFast(vocab_file=str(folder / "vocab.txt")).save_pretrained(folder)


def two_four_copy(src: Path, dst: Path, calibration_batches: int = 8, seq_len: int = 128) -> dict:
    """``src`` with every encoder matrix pruned one-shot to 2:4 by SparseGPT (two zeros in each group
    of 4 along the input dimension, the kept weights reconstructed layer by layer) through
    ``compress.prune_model``, saved to ``dst``. The calibration inputs are random token ids (the
    weights are random too: the 2:4 kernels' speed depends on the pattern, not on the values).
    Runs on the GPU when there is one. Returns what it did and how long it took."""
    import torch
    from transformers import BertForSequenceClassification

    import compress

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = BertForSequenceClassification.from_pretrained(src, use_safetensors=True).to(device)
    g = torch.Generator().manual_seed(0)
    batches = [{"input_ids": torch.randint(1000, VOCAB, (8, seq_len), generator=g),
                "attention_mask": torch.ones(8, seq_len, dtype=torch.long)}
               for _ in range(calibration_batches)]
    t0 = time.monotonic()
    masks = compress.prune_model(model, 0.5, criterion="sparsegpt", pattern="2:4", calibration=batches,
                                 exclude=("embeddings.word_embeddings.weight",))
    seconds = time.monotonic() - t0
    model.cpu().save_pretrained(dst, safe_serialization=True)
    return {"criterion": "sparsegpt", "pattern": "2:4", "device": device, "matrices": len(masks),
            "calibration": f"{calibration_batches} x 8 sequences of {seq_len} random tokens",
            "prune_seconds": round(seconds, 1)}


SPARSE_BENCH = ["--batch-sizes", "32", "--seq-lens", "512", "--warmup", "3", "--iterations", "20",
                "--rounds", "3", "--provider", "cuda", "--runtimes", "torch-fp16,torch-sparse"]
TINY_SPARSE_BENCH = ["--batch-sizes", "2", "--seq-lens", "16", "--warmup", "1", "--iterations", "1",
                     "--rounds", "1", "--settle-s", "0", "--matmul-n", "64", "--provider", "cpu",
                     "--runtimes", "torch,torch-sparse"]


def run(args, ctx) -> dict | None:
    if ctx.dry_run:
        tiny = " (tiny)" if args.tiny else ""
        print(f"# gpu check{tiny}: exports, benches and tests within {args.budget_s:g} s")
        return None
    out = Path(args.work).resolve()
    out.mkdir(parents=True, exist_ok=True)
    try:
        smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        smi = "nvidia-smi: not available"
    (out / "nvidia-smi.txt").write_text(smi)
    work = Path(args.models_dir).resolve() if args.models_dir else Path(tempfile.mkdtemp(prefix="gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        return run_check(args, ctx, out, work)
    finally:
        if not args.models_dir:
            shutil.rmtree(work, ignore_errors=True)


def run_check(args, ctx, out: Path, work: Path) -> dict:
    check = Check(ctx.save, args.budget_s, args.python)
    check.record["mode"] = "tiny" if args.tiny else "gpu"
    python = [args.python]
    cli = [*python, "-m", "compress"]
    shapes = TINY_SHAPES if args.tiny else GPU_SHAPES
    provider = "cpu" if args.tiny else "cuda"

    models = {}
    for name, (layers, hidden, heads, ffn) in shapes.items():
        models[name] = build_model(work / "models" / name, layers, hidden, heads, ffn)
    check.record["models"] = {n: dict(zip(("layers", "hidden", "heads", "ffn"), shape))
                              for n, shape in shapes.items()}
    check.save()

    ort_cuda = args.tiny or "CUDAExecutionProvider" in check.record["environment"].get(
        "onnxruntime_providers", [])

    def export(name: str, precision: str) -> Path | None:
        if not ort_cuda:  # onnxruntime without CUDA (e.g. the CPU wheel): no CUDA parity, no ort rows
            check.record["steps"].append({"name": f"export {name} {precision}", "rc": None,
                                          "not_run": "onnxruntime has no CUDAExecutionProvider here"})
            check.save()
            return None
        dst = work / "onnx" / f"{name}-{precision}.onnx"
        dst.parent.mkdir(parents=True, exist_ok=True)
        flags = ["--optimize"] if precision == "fp32" else ["--precision", precision]
        step = check.run(f"export {name} {precision}", [*cli, "export", str(models[name]), "--to", str(dst),
                                                        "--provider", provider, *flags])
        report = dst.with_suffix(".json")
        if step.get("rc") == 0 and report.is_file():
            check.record["exports"].setdefault(name, {})[precision] = json.loads(report.read_text())
            check.save()
            return dst
        return None

    def bench(name: str, files: dict[str, Path | None]) -> None:
        entries = [f"{name}={models[name]}"]
        for precision, path in files.items():
            parity = check.record["exports"].get(name, {}).get(precision, {}).get(f"parity_{precision}", {})
            if path is not None and "skipped" not in parity:  # a graph the provider cannot run is left out
                entries.append(f"ort-{precision}={path}")
        run_dir = out / "bench" / name
        step = check.run(f"bench {name}", [*cli, "bench", *entries, *(TINY_BENCH if args.tiny else GPU_BENCH),
                                           "--out", str(run_dir)], min_s=30.0)
        result = run_dir / "bench.json"
        if step.get("rc") == 0 and result.is_file():
            data = json.loads(result.read_text())
            check.record["bench"][name] = {
                "table": [{k: r.get(k) for k in ("model", "runtime", "batch", "seq_len", "mean_ms", "p90_ms",
                                                  "throughput", "vs_baseline", "compile_s")}
                          for r in data["rows"]],
                "skipped": data.get("skipped", []), "peer_parity": data["models"][0].get("peer_parity"),
                "text": (run_dir / "bench.txt").read_text() if (run_dir / "bench.txt").is_file() else None}
            check.save()

    def family(name: str) -> None:
        targets, runtime, batch, tokens = TINY_FAMILY if args.tiny else GPU_FAMILY
        if runtime == "ort-cuda-fp16" and not ort_cuda:
            check.record["steps"].append({"name": f"family {name}", "rc": None,
                                          "not_run": "onnxruntime has no CUDAExecutionProvider here"})
            check.save()
            return
        save_sample_tokenizer(models[name])
        tuned, fam = work / "family" / f"{name}-sample", work / "family" / f"{name}-family"
        finetune = [*cli, "finetune", "--model", str(models[name]), "--task", "sample", "--epochs", "1",
                    "--max-length", str(tokens), "--out", str(tuned)]
        if check.run(f"finetune {name} on the sample", finetune).get("rc") != 0:
            return
        prune = [*cli, "prune", "--stage", "post-training", "--model", str(tuned), "--task", "sample",
                 "--structured", "heads,ffn", "--speedup", targets, "--latency-runtime", runtime,
                 "--latency-shape", f"{batch}x{tokens}", "--max-length", str(tokens), "--calibration-samples",
                 "32", "--out", str(fam)]
        # the table is measured now, on this machine, into the temporary folder
        step = check.run(f"family {name}", prune, min_s=60.0, env={"COMPRESS_CACHE_DIR": str(work / "cache")})
        if step.get("rc") == 0 and (fam / "family.json").is_file():
            kept = out / "family" / name
            kept.mkdir(parents=True, exist_ok=True)
            for f in ("family.md", "family.json", "latency_table.json"):
                shutil.copy2(fam / f, kept / f)
            check.record.setdefault("family", {})[name] = json.loads((fam / "family.json").read_text())
            check.save()

    names = list(shapes)
    first = names[0]
    bench(first, {"fp32": export(first, "fp32"), "fp16": export(first, "fp16")})
    family(first)
    if not args.tiny:
        junit = out / "gpu-tests.xml"
        # addopts emptied: one process (no xdist workers competing for the one GPU)
        step = check.run("tests marked gpu", [*python, "-m", "pytest", "-o", "addopts=", "-q", "-m", "gpu",
                                              "-p", "no:cacheprovider", "-rA", f"--junitxml={junit}",
                                              *GPU_TESTS])
        check.record["tests"] = {"rc": step.get("rc"), "junit": str(junit) if junit.is_file() else None}
        check.save()
    for name in names[1:]:
        bench(name, {"fp32": export(name, "fp32"), "fp16": export(name, "fp16")})
    # 2:4 semi-structured linears against dense fp16, at the largest shape (BERT-base's), 32 x 512
    last = names[-1]
    sparse_name = f"{last}-2of4"
    models[sparse_name] = work / "models" / sparse_name
    t0 = time.monotonic()
    try:
        check.record["two_four"] = two_four_copy(models[last], models[sparse_name],
                                                 2 if args.tiny else 8, 16 if args.tiny else 128)
    except Exception as exc:  # recorded, and the 2:4 bench is left out
        check.record["two_four"] = {"error": f"{type(exc).__name__}: {exc}",
                                    "seconds": round(time.monotonic() - t0, 1)}
    check.save()
    run_dir = out / "bench" / sparse_name
    step = (check.run(f"bench {sparse_name}", [*cli, "bench", f"{sparse_name}={models[sparse_name]}",
                                               *(TINY_SPARSE_BENCH if args.tiny else SPARSE_BENCH),
                                               "--out", str(run_dir)], min_s=30.0)
            if "error" not in check.record["two_four"] else {})
    if step.get("rc") == 0 and (run_dir / "bench.json").is_file():
        data = json.loads((run_dir / "bench.json").read_text())
        check.record["bench"][sparse_name] = {
            "table": [{k: r.get(k) for k in ("model", "runtime", "batch", "seq_len", "mean_ms", "throughput",
                                              "vs_baseline")} for r in data["rows"]],
            "skipped": data.get("skipped", []), "peer_parity": data["models"][0].get("peer_parity")}
        check.save()
    if not args.tiny:  # last, if time is left: the gpu tests already export a tiny bf16 graph on CUDA
        export(first, "bf16")
    failed = [s["name"] for s in check.record["steps"] if s.get("rc") not in (0, None) or s.get("timed_out")]
    check.record["failed_steps"] = failed
    check.record["not_run"] = [s["name"] for s in check.record["steps"] if "not_run" in s]
    check.save()
    print(f"gpu check: {len(check.record['steps'])} steps, failed: {failed or 'none'}, "
          f"not run: {check.record['not_run'] or 'none'}")
    # the run's exit code: 1 when a step failed or timed out (steps not run for time are not failures)
    ctx.steps.extend({k: s[k] for k in ("name", "rc", "seconds", "timed_out") if k in s}
                     for s in check.record["steps"] if "not_run" not in s)
    return check.record
