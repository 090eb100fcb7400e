"""How well a latency table predicts real structured-pruned encoders on this machine.

Builds (or reads from the cache) the table of ``compress.measure.latency_table`` for a model's
architecture, then builds whole random-weight pruned classifiers of a few per-layer layouts (the
dense one, every layer at half its heads and width, and random ones), times them end to end in
the same runtime, in round-robin rounds, and writes predicted against measured milliseconds:

    python -m benchmarks latency-table --model minilm --runtime ort-int8 --rebuild

Writes one JSON object: the table (with its build seconds and phases), and per layout its
per-layer heads and FFN widths, predicted and measured ms (median, p90), the error in percent and
the predicted and measured speedups over the dense layout. The 1-minute load average is recorded
before and after: on a shared machine the error includes the other tenants.
"""

from __future__ import annotations

import os
import random
import time


def random_layouts(layers: int, heads: int, ffn: int, count: int, empty_blocks: bool, seed: int
                   ) -> dict[str, tuple[list[int], list[int]]]:
    """dense, half (every layer at half its heads and width) and ``count`` random layouts; random
    sizes start at 0 where the family can remove a whole block."""
    rng = random.Random(seed)
    low = 0 if empty_blocks else 1
    out = {"dense": ([heads] * layers, [ffn] * layers),
           "half": ([max(1, heads // 2)] * layers, [max(1, ffn // 2)] * layers)}
    for i in range(count):
        out[f"random{i}"] = ([rng.randint(low, heads) for _ in range(layers)],
                             [rng.randint(low, ffn) for _ in range(layers)])
    return out


def compare(table, measured: dict, layouts: dict) -> list[dict]:
    """Per layout: predicted vs measured ms, the error and both speedups over the dense layout."""
    dense_ms = measured["dense"]["median_ms"]
    rows = []
    for name, (heads, ffn) in layouts.items():
        predicted = table.predict_ms(heads, ffn)
        got = measured[name]["median_ms"]
        rows.append({"layout": name, "layer_heads": heads, "layer_ffn": ffn, "predicted_ms": predicted,
                     "measured_ms": got, "measured_p90_ms": measured[name]["p90_ms"],
                     "error_pct": 100.0 * (predicted - got) / got,
                     "predicted_speedup": table.predicted_speedup(heads, ffn),
                     "measured_speedup": dense_ms / got, "fused_ops": measured[name]["fused_ops"]})
    return rows


def add_arguments(p) -> None:
    p.add_argument("--model", default="minilm", help="'minilm' or a model folder")
    p.add_argument("--runtime", default="ort-int8")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--repeats", type=int, default=None,
                   help="timed calls per model of the table (unset: latency_table's default)")
    p.add_argument("--layout-repeats", type=int, default=6, help="timed calls per checked layout")
    p.add_argument("--random-layouts", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--rebuild", action="store_true", help="measure the table even when cached")


def budget(args) -> str:
    return (f"one latency table ({args.repeats or 'default'} timed calls per block model), then "
            f"{args.random_layouts + 2} layouts x {args.layout_repeats} timed calls at "
            f"{args.batch} x {args.seq_len}")


def run(args, ctx) -> dict | None:
    if ctx.dry_run:
        print(f"# builds the {args.runtime} latency table of {args.model} and times "
              f"{args.random_layouts + 2} layouts")
        return None
    import torch

    from compress.measure import latency_table as lt

    load_before = os.getloadavg()[0]
    config = lt.encoder_config(args.model)
    t0 = time.perf_counter()
    repeats = {} if args.repeats is None else {"repeats": args.repeats}
    table = lt.latency_table(config, args.runtime, args.batch, args.seq_len, args.cache_dir,
                             rebuild=args.rebuild, **repeats)
    table_s = time.perf_counter() - t0
    how = "cached" if table_s < table.build_seconds / 2 else "built"
    print(f"table: {table_s:.1f} s ({how}; build {table.build_seconds:.1f} s: "
          + ", ".join(f"{k} {v:.1f}" for k, v in table.phase_seconds.items()) + ")")
    layouts = random_layouts(table.num_layers, table.num_heads, table.ffn_width, args.random_layouts,
                             table.reference == "empty", args.seed)
    threads = torch.get_num_threads()
    measured, phases = lt.time_layouts(
        config, {n: (tuple(h), tuple(f), table.key["shape"]["vocab"]) for n, (h, f) in layouts.items()},
        lt.check_runtime(args.runtime), args.batch, args.seq_len, threads, args.layout_repeats)
    rows = compare(table, measured, layouts)
    for r in rows:
        print(f"{r['layout']:>8}: predicted {r['predicted_ms']:8.1f} ms, measured {r['measured_ms']:8.1f} ms "
              f"({r['error_pct']:+.1f}%), speedup predicted {r['predicted_speedup']:.2f}x "
              f"measured {r['measured_speedup']:.2f}x")
    return {"model": args.model, "runtime": args.runtime, "batch": args.batch, "seq_len": args.seq_len,
            "threads": threads, "table_seconds": table_s, "build_seconds": table.build_seconds,
            "layout_phases": phases, "load_average_1min": [load_before, os.getloadavg()[0]],
            "layouts": rows, "table": table.to_dict()}
