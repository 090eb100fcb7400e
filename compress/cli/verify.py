HELP = ("check that every weight of a saved model is finite (NaN or inf fails), that a "
        "structured-pruned model's weights have the sizes its config gives, that every pruned weight "
        "is still exactly zero, and its N:M pattern when it has one (reloads from disk); a dense model "
        "or a distilled student passes on its weights being finite")
EXAMPLES = """examples:
  compress verify artifacts/prune/20261122-101500-sample-finetune-magnitude-40
  compress verify artifacts/finetune/20261122-111500-sst2     # fine-tuned from a pruned run
"""


def add_arguments(parser):
    parser.add_argument("run", help="run folder (or model folder) holding model/masks.safetensors")


def run(args):
    from compress.pruning.integrity import verify_run

    r = verify_run(args.run)
    print(result_line(r))
    return 0


def result_line(r: dict) -> str:
    """One line: what was checked and found, for every kind of folder ``verify_run`` reads."""
    if r["kind"] == "student":
        return f"ok: every weight of the distilled student is finite in {r['model_dir']}"
    structure = r.get("structure")
    heads = structure and structure["layer_heads"]
    shapes = (f"; the weights have the sizes of its config (heads per layer "
              f"{'all kept' if heads is None else heads}, "
              f"FFN width per layer {structure['layer_intermediate']})" if structure else "")
    if r.get("stock_copy"):
        shapes += ("; its stock copy for sentence-transformers (0_Transformer) is complete and computes "
                   "the same")
    if r["kind"] == "dense":
        what = "structured-pruned model" if structure else "dense model"
        return f"ok: every weight finite, no masks ({what}){shapes} in {r['model_dir']}"
    pattern = (f"; every group of {r['pattern'].split(':')[1]} along their input dimension holds the "
               f"{r['pattern']} pattern" if r.get("pattern") else "")
    return (f"ok: {r['pruned']:,} of {r['total']:,} weights in {r['tensors']} masked tensors are zero "
            f"({100 * r['sparsity']:.2f}%){pattern}{shapes}, every weight finite, in {r['model_dir']}")
