import json

HELP = ("print versions, device, the onnxruntime providers that can run here (and those built in "
        "that cannot, with why) and the default model path")
EXAMPLES = "examples:\n  compress info\n  compress info --json\n"


def add_arguments(parser):
    parser.add_argument("--json", action="store_true", help="print JSON")


def run(args):
    from compress.recipes.info import collect_info

    info = collect_info()
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        for k, v in info.items():
            if isinstance(v, dict):  # {provider: why it cannot run here}
                v = "; ".join(f"{name}: {why}" for name, why in v.items()) or "none"
            print(f"{k:>22}: {v}")
    return 0
