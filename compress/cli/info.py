import json

HELP = "print versions, device, onnxruntime providers and the default model path"
EXAMPLES = "examples:\n  compress info\n  compress info --json\n"


def add_arguments(parser):
    parser.add_argument("--json", action="store_true", help="print JSON")


def run(args):
    from compress.info import collect_info

    info = collect_info()
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        for k, v in info.items():
            print(f"{k:>22}: {v}")
    return 0
