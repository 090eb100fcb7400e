import json

from compress.cli.common import add_config_args, config_from_args
from compress.recipes.measure import MeasureConfig, format_measure, run_measure

HELP = "parameters, FLOPs (dense and effective), sparsity, disk size and 'will it be faster?' of a model"
EXAMPLES = """examples:
  compress measure minilm                          # packaged MiniLM at length 128
  compress measure artifacts/prune/RUN --seq-len 256
  compress measure model.onnx --json               # initializers' size and sparsity of an ONNX file
  compress measure artifacts/distill/RUN           # a student
"""


def add_arguments(parser):
    add_config_args(parser, MeasureConfig, positional=("model",))


def run(args):
    cfg = config_from_args(MeasureConfig, args)
    result = run_measure(cfg)
    if cfg.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print(format_measure(result))
    return 0
