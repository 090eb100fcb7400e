"""Latency statistics after warm-up, and the machine's measured dense matmul peak.

Every timed call is bracketed by ``torch.cuda.synchronize()`` when the device is CUDA, so the
timer measures finished kernels and not their launch.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from compress.core.config import check_range


def _sync(device: str | torch.device | None) -> None:
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default) of ``values`` for q in [0, 100]."""
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def latency_stats(times_s: list[float]) -> dict[str, Any]:
    """mean/median/p90/min/max in milliseconds of per-call times given in seconds."""
    ms = [t * 1000.0 for t in times_s]
    return {"mean_ms": statistics.fmean(ms), "median_ms": statistics.median(ms),
            "p90_ms": percentile(ms, 90), "min_ms": min(ms), "max_ms": max(ms), "iterations": len(ms)}


def measure_latency(fn: Callable[[], Any], warmup: int = 3, iterations: int = 10,
                    device: str | torch.device | None = None,
                    clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """Call ``fn`` ``warmup`` times untimed, then ``iterations`` times timed; returns stats (ms)."""
    return measure_interleaved({"fn": fn}, warmup, iterations, devices={"fn": device}, clock=clock)["fn"]


def matmul_peak_gflops(n: int = 1024, repeats: int = 5, device: str = "cpu",
                       dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """Measured dense ``n x n @ n x n`` throughput: 2 n^3 FLOPs / best time, in GFLOP/s.

    The best of ``repeats`` timed runs (after one warm-up) approximates what the BLAS reaches on
    this machine with torch's current thread count; achieved model GFLOP/s are compared to it.
    """
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    stats = measure_latency(lambda: torch.mm(a, b), warmup=1, iterations=repeats, device=device)
    best_s = stats["min_ms"] / 1000.0
    return {"n": n, "dtype": str(dtype).replace("torch.", ""), "device": str(device),
            "threads": torch.get_num_threads(), "gflops": 2 * n**3 / best_s / 1e9}


def measure_interleaved(fns: dict[str, Callable[[], Any]], warmup: int = 3, iterations: int = 10,
                        rounds: int = 1, devices: dict[str, str | torch.device | None] | None = None,
                        clock: Callable[[], float] = time.perf_counter, settle_s: float = 0.1
                        ) -> dict[str, dict[str, Any]]:
    """Time several callables in turn: each round calls every one ``iterations`` times.

    On a shared machine the speed drifts over minutes (other tenants, frequency); timing model A
    fully and then model B puts that drift into the A/B ratio. Round-robin rounds spread it over
    every callable alike. Before each callable's turn the machine is left idle for ``settle_s``
    (untimed): onnxruntime's worker threads keep spinning for tens of milliseconds after a run,
    and without the pause they took the cores from the next model timed (PyTorch MiniLM at
    batch 32 x 128: 584 ms per batch right after an onnxruntime session against 438 ms alone;
    with 0.1 s of pause it times as alone). Each callable gets ``warmup`` untimed calls once,
    before the first round; with several callables, each turn also starts with one untimed call
    after the pause, so caches and thread pools left cold by the other models are not charged to
    the first timed call. The order is reversed every other round (a b c, c b a, ...), so no
    callable always follows the same one. Returns, per name, the stats of all
    ``rounds x iterations`` calls pooled, plus ``round_mean_ms`` (one mean per round) from which
    per-round ratios are taken.
    """
    check_range("warmup", warmup, 0)
    check_range("iterations", iterations, 1)
    check_range("rounds", rounds, 1)
    check_range("settle_s", settle_s, 0.0)
    devices = devices or {}
    for name, fn in fns.items():
        for _ in range(warmup):
            fn()
        _sync(devices.get(name))
    times: dict[str, list[float]] = {name: [] for name in fns}
    round_means: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            fn, device = fns[name], devices.get(name)
            if len(fns) > 1:  # the turn follows another callable: settle, then one untimed call
                if settle_s > 0:
                    time.sleep(settle_s)
                fn()
                _sync(device)
            these = []
            for _ in range(iterations):
                _sync(device)
                t0 = clock()
                fn()
                _sync(device)
                these.append(clock() - t0)
            times[name].extend(these)
            round_means[name].append(1000.0 * statistics.fmean(these))
    out = {}
    for name in fns:
        stats = latency_stats(times[name])
        stats.update(warmup=warmup, rounds=rounds, round_mean_ms=round_means[name])
        out[name] = stats
    return out
