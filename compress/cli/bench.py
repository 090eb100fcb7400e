import dataclasses

from compress.cli.common import add_config_args, config_from_args
from compress.core.errors import UsageError
from compress.measure.bench import BenchConfig, BenchOptions, format_bench
from compress.recipes.bench import run_bench
from compress.recipes.embedding_bench import EmbeddingBenchConfig, format_embedding_bench, run_embedding_bench

HELP = ("benchmark models in PyTorch (eager, fp16/bf16, compiled, int8) and onnxruntime: latency, "
        "throughput, ratios, GFLOP/s vs peak")
EXAMPLES = """examples:
  compress bench minilm --batch-sizes 1,32 --seq-lens 128
  compress bench base=minilm int8=sst2-int8.onnx bilstm=bilstm.onnx --runtimes ort
  compress bench artifacts/finetune/RUN --provider cuda --iterations 50
  compress bench base=artifacts/finetune/RUN fp16=sst2-fp16.onnx --provider cuda \\
      --runtimes torch,torch-fp16,torch-compile        # the export against what PyTorch does
  compress bench minilm --runtimes torch,torch-compile,torch-int8,ort   # CPU peers
  compress bench --task embedding dense=minilm int8=dense-int8.onnx static=artifacts/distill/RUN \\
      --data-dir ../shared/data --split-by-article 38/10   # sentences/s on real sentences + scores
"""


def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


EMBEDDING_ONLY = sorted(_fields(EmbeddingBenchConfig) - _fields(BenchConfig))


def add_arguments(parser):
    parser.add_argument("models", nargs="+", metavar="MODEL",
                        help="model/run/student folders, 'minilm' or .onnx files; LABEL=PATH names a row; "
                             "the first is the baseline")
    add_config_args(parser, BenchOptions)
    group = parser.add_argument_group("--task embedding (sentences per second on real sentences)")
    add_config_args(group, EmbeddingBenchConfig, only=EMBEDDING_ONLY)


def run(args):
    typed = {k for k in vars(args) if k not in ("config", "command", "func", "verbose")}
    if getattr(args, "task", None) is not None:
        wrong = sorted(typed - _fields(EmbeddingBenchConfig))
        if wrong:
            raise UsageError(f"{', '.join('--' + w.replace('_', '-') for w in wrong)} not used with --task "
                             "embedding; remove it")
        result = run_embedding_bench(config_from_args(EmbeddingBenchConfig, args))
        print(format_embedding_bench(result))
        print(f"-> {result['run_dir']}/bench.json")
        return 0
    wrong = sorted(typed & set(EMBEDDING_ONLY))
    if wrong:
        flags = ", ".join("--" + w.replace("_", "-") for w in wrong)
        raise UsageError(f"{flags} apply with --task embedding; add it or remove them")
    result = run_bench(config_from_args(BenchConfig, args))
    print(format_bench(result))
    print(f"-> {result['run_dir']}/bench.json")
    return 0
