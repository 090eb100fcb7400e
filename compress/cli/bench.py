from compress.cli.common import add_config_args, config_from_args
from compress.recipes.bench import BenchConfig, BenchOptions, format_bench, run_bench

HELP = ("benchmark models in PyTorch (eager, fp16/bf16, compiled, int8) and onnxruntime: latency, "
        "throughput, ratios, GFLOP/s vs peak")
EXAMPLES = """examples:
  compress bench minilm --batch-sizes 1,32 --seq-lens 128
  compress bench base=minilm int8=sst2-int8.onnx bilstm=bilstm.onnx --runtimes ort
  compress bench artifacts/finetune/RUN --provider cuda --iterations 50
  compress bench base=artifacts/finetune/RUN fp16=sst2-fp16.onnx --provider cuda \\
      --runtimes torch,torch-fp16,torch-compile        # the export against what PyTorch does
  compress bench minilm --runtimes torch,torch-compile,torch-int8,ort   # CPU peers
"""


def add_arguments(parser):
    parser.add_argument("models", nargs="+", metavar="MODEL",
                        help="model/run/student folders, 'minilm' or .onnx files; LABEL=PATH names a row; "
                             "the first is the baseline")
    add_config_args(parser, BenchOptions)


def run(args):
    result = run_bench(config_from_args(BenchConfig, args))
    print(format_bench(result))
    print(f"-> {result['run_dir']}/bench.json")
    return 0
