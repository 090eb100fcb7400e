HELP = ("check that every weight of a saved model is finite (NaN or inf fails, a dense model too), "
        "that every pruned weight is still exactly zero, and its N:M pattern when it has one "
        "(reloads from disk)")
EXAMPLES = """examples:
  compress verify artifacts/prune/20261122-101500-sample-finetune-magnitude-40
  compress verify artifacts/finetune/20261122-111500-sst2     # fine-tuned from a pruned run
"""


def add_arguments(parser):
    parser.add_argument("run", help="run folder (or model folder) holding model/masks.safetensors")


def run(args):
    from compress.pruning.integrity import verify_run

    r = verify_run(args.run)
    pattern = (f"; every group of {r['pattern'].split(':')[1]} along their input dimension holds the "
               f"{r['pattern']} pattern" if r.get("pattern") else "")
    print(f"ok: {r['pruned']:,} of {r['total']:,} weights in {r['tensors']} masked tensors are zero "
          f"({100 * r['sparsity']:.2f}%){pattern} in {r['model_dir']}")
    return 0
