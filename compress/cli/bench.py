from compress.cli.common import add_config_args, config_from_args
from compress.recipes.bench import RUNTIMES, BenchConfig, BenchOptions, format_bench, run_bench

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
HELPS = {"batch_sizes": "batch sizes to time (integers)", "seq_lens": "sequence lengths to time",
         "warmup": "untimed calls per model before the first round",
         "iterations": "timed calls per grid point and round",
         "rounds": "rounds in which every model is timed in turn (spreads machine drift evenly)",
         "settle_s": "idle seconds before each model's turn, which then starts with one untimed call",
         "runtimes": "for model folders: torch (eager fp32), ort (exported on the fly) and the PyTorch "
                     "peers torch-fp16, torch-bf16 (GPU only), torch-sparse (2:4-pruned linears in "
                     "PyTorch semi-structured form; GPU of capability >= 8.0), torch-compile "
                     "(compile time reported apart), torch-int8 (dynamic int8 nn.Linear, CPU only); "
                     ".onnx files always use ort; choices: " + ", ".join(RUNTIMES),
         "provider": "onnxruntime provider: auto, cpu, cuda or a full provider name",
         "threads": "intra-op threads for torch and onnxruntime (default: torch's)",
         "matmul_n": "matrix size of the dense matmul peak measurement",
         "out": "run folder to create", "name": "run name"}


def add_arguments(parser):
    parser.add_argument("models", nargs="+", metavar="MODEL",
                        help="model/run/student folders, 'minilm' or .onnx files; LABEL=PATH names a row; "
                             "the first is the baseline")
    add_config_args(parser, BenchOptions, HELPS)


def run(args):
    result = run_bench(config_from_args(BenchConfig, args))
    print(format_bench(result))
    print(f"-> {result['run_dir']}/bench.json")
    return 0
