"""Where 2:4 semi-structured linears lose time on a GPU: one BERT-base-shaped ``nn.Linear`` (fp16),
dense against ``torch.sparse.to_sparse_semi_structured`` with each backend PyTorch offers
(cuSPARSELt, CUTLASS), with 2-D and 3-D inputs, and the profiler's top CUDA kernels of each.

    python benchmarks/sparse_linear_probe.py --out /tmp/probe.json     # on a CUDA machine
"""

from __future__ import annotations

import argparse
import json
import sys


def timed(fn, iters: int = 50) -> float:
    import torch

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def top_kernels(fn, n: int = 5) -> list[str]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    rows = prof.key_averages().table(sort_by="cuda_time_total", row_limit=n)
    return rows.splitlines()


def main(argv=None) -> int:
    import torch
    from torch.sparse import SparseSemiStructuredTensor, to_sparse_semi_structured

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 1
    result: dict = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "cases": []}
    torch.manual_seed(0)
    for out_f, in_f in ((3072, 768), (768, 3072), (768, 768)):
        lin = torch.nn.Linear(in_f, out_f).half().cuda().eval()
        w = lin.weight.detach()
        groups = w.reshape(-1, 4)
        groups.scatter_(1, groups.abs().argsort(dim=1)[:, :2], 0.0)
        x3 = torch.randn(32, 512, in_f, dtype=torch.float16, device="cuda")
        x2 = x3.reshape(-1, in_f)
        case = {"shape": [out_f, in_f], "tokens": x2.shape[0]}
        with torch.no_grad():
            case["dense_2d_ms"] = timed(lambda lin=lin, x2=x2: lin(x2))
            case["dense_3d_ms"] = timed(lambda lin=lin, x3=x3: lin(x3))
            for backend, force in (("cusparselt", False), ("cutlass", True)):
                SparseSemiStructuredTensor._FORCE_CUTLASS = force
                try:
                    sp = torch.nn.Linear(in_f, out_f).half().cuda().eval()
                    sp.weight = torch.nn.Parameter(to_sparse_semi_structured(w.clone()), requires_grad=False)
                    sp.bias = lin.bias
                    case[f"{backend}_class"] = type(sp.weight).__name__
                    case[f"{backend}_2d_ms"] = timed(lambda sp=sp, x2=x2: sp(x2))
                    case[f"{backend}_3d_ms"] = timed(lambda sp=sp, x3=x3: sp(x3))
                    err = (sp(x2) - lin(x2)).abs().max().item()
                    case[f"{backend}_max_abs_diff"] = err
                    case[f"{backend}_kernels_3d"] = top_kernels(lambda sp=sp, x3=x3: sp(x3))
                except Exception as exc:  # recorded: a backend missing here is an answer too
                    case[f"{backend}_error"] = f"{type(exc).__name__}: {exc}"[:500]
            case["dense_kernels_3d"] = top_kernels(lambda lin=lin, x3=x3: lin(x3))
        result["cases"].append(case)
        print(json.dumps({k: v for k, v in case.items() if "kernels" not in k}))
    SparseSemiStructuredTensor._FORCE_CUTLASS = False
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
