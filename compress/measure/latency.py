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

from compress.config import check_range


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
    check_range("warmup", warmup, 0)
    check_range("iterations", iterations, 1)
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(iterations):
        _sync(device)
        t0 = clock()
        fn()
        _sync(device)
        times.append(clock() - t0)
    stats = latency_stats(times)
    stats["warmup"] = warmup
    return stats


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
