"""FLOPs per example: fvcore's tracing engine + an explicit op-handle table + a report.

Unit: one multiply-add is one MAC and counts as 2 FLOPs. Handles return MACs (fvcore's own
convention), and the report gives both ``*_macs`` and ``*_flops`` (= 2 x MACs).

Two totals are reported under different names:

* ``dense_*``: every MAC of the traced graph, whatever the weight values;
* ``effective_*``: sparsity-aware; MACs whose weight is exactly zero are not counted. Each
  element of a Linear / Conv / RNN weight takes part in the same number of MACs (once per token,
  per output position or per time step), so a module's effective count is its dense count times the
  density (non-zeros / elements) of its weight matrices. Activation-by-activation products
  (attention scores, attention-weighted values) have no weights and are counted in full.

Embedding look-ups are gathers, not arithmetic: they count zero MACs (stated in the report).
Element-wise ops (add, GELU, softmax, tanh, masking) are not counted and are listed with their
number of occurrences under ``not_counted``, so a reader sees what the total leaves out. LayerNorm
is the one exception: it keeps fvcore's estimate (5 units per element with the affine part), counted
as MACs like the rest; under 0.5% of MiniLM's total.

Attention is counted as executed, whichever implementation runs (``attention_implementation`` in
the result names it; ``compress measure`` loads transformers' default: SDPA where the architecture
has it, eager otherwise). Eager attention is two ``matmul``/``bmm`` calls (Q K^T, then P V),
SDPA is one ``scaled_dot_product_attention`` call; both count heads x L x L x head_dim MACs each
for Q K^T and P V, so a BERT gives the same total under either. Per architecture:

* DeBERTa-v2/v3 (eager only; it has no SDPA path): its disentangled attention adds, per layer, the
  content-to-position and position-to-content products, ``bmm``s of the [heads, L, head_dim]
  queries (keys) with the projected relative-position embeddings [heads, 2 x span, head_dim], i.e.
  2 x heads x L x 2·span x head_dim MACs, plus the Linear projections of the 2·span relative
  embeddings (``share_att_key``: by the layer's own query/key Linears, else by
  ``pos_query_proj``/``pos_key_proj``). span = ``position_buckets`` (or the maximum relative
  distance): those products are computed over all 2·span positions and then gathered, so they do
  not shrink with L.
* ModernBERT: the fused Wqkv Linear, the GLU FFN's Wi ([2 x ffn, hidden]: input and gate halves)
  and the head's dense + norm on the pooled token are Linears/norms like any other. Its "local"
  layers (sliding window of ``local_attention`` tokens) run under eager and SDPA as full L x L
  attention with the out-of-window scores masked, so a local layer costs what a global one costs
  (only flash-attention's windowed kernels skip the masked blocks, and they do not run here).
  The rotary embedding (cos/sin products) is element-wise and listed as not counted.
* ALBERT runs its shared layers ``num_hidden_layers`` times: each execution is traced and counted,
  as is the embedding projection (embedding_size -> hidden). ELECTRA's ``embeddings_project``
  likewise.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
from fvcore.nn import FlopCountAnalysis
from fvcore.nn.jit_handles import (
    addmm_flop_jit,
    bmm_flop_jit,
    conv_flop_jit,
    einsum_flop_jit,
    get_shape,
    linear_flop_jit,
    matmul_flop_jit,
    norm_flop_counter,
)

Handle = Callable[[list, list], Any]

UNIT = "1 MAC (one multiply-add) = 2 FLOPs; counts are per example (batch 1)"


def _prod(xs: Sequence[int]) -> int:
    out = 1
    for x in xs:
        out *= int(x)
    return out


def sdpa_flop_jit(inputs: list, outputs: list) -> int:
    """``aten::scaled_dot_product_attention(q [.., L, E], k [.., S, E], v [.., S, Ev])``.

    MACs = prod(batch dims) x L x S x (E + Ev): Q K^T plus the probability-weighted sum of V.
    Scaling, masking and softmax are element-wise and not counted.
    """
    q, k, v = (get_shape(x) for x in inputs[:3])
    assert q is not None and k is not None and v is not None, "sdpa inputs must have known shapes"
    batch = _prod(q[:-2])
    length, e = q[-2], q[-1]
    s, ev = k[-2], v[-1]
    return batch * length * s * (e + ev)


def _rnn_flop_jit(inputs: list, outputs: list) -> int:
    """``aten::lstm`` / ``aten::gru`` / ``aten::rnn_*``: every weight matrix element is used once per
    token and time step, so MACs = tokens x (sum of elements of all 2-D weight matrices).

    Works for any number of layers, both directions and every gate layout (LSTM 4H, GRU 3H rows):
    the gate count is already in the matrix shapes. ``tokens`` = T x B for a padded input
    ([T, B, I] or [B, T, I]) and the number of rows for a packed one ([sum of lengths, I]).
    Gate non-linearities and the cell-state products are element-wise and not counted.
    """
    x = get_shape(inputs[0])
    assert x is not None, "RNN input must have a known shape"
    tokens = _prod(x[:-1])
    weight_elems = 0
    for val in inputs[1:]:
        node = val.node()
        if node.kind() != "prim::ListConstruct":
            continue
        for item in node.inputs():
            shape = get_shape(item)
            if shape is not None and len(shape) == 2:
                weight_elems += _prod(shape)
    return tokens * weight_elems


def zero_flop_jit(inputs: list, outputs: list) -> int:
    """Table look-ups (embedding gathers) do no multiply-adds."""
    return 0


# The op-handle table: what is counted and how. Any op missing here is reported as not counted.
FLOP_HANDLES: dict[str, Handle | None] = {
    "aten::linear": linear_flop_jit,
    "aten::addmm": addmm_flop_jit,
    "aten::matmul": matmul_flop_jit,
    "aten::mm": matmul_flop_jit,
    "aten::bmm": bmm_flop_jit,
    "aten::einsum": einsum_flop_jit,
    "aten::_convolution": conv_flop_jit,
    "aten::scaled_dot_product_attention": sdpa_flop_jit,
    "aten::lstm": _rnn_flop_jit,
    "aten::gru": _rnn_flop_jit,
    "aten::rnn_tanh": _rnn_flop_jit,
    "aten::rnn_relu": _rnn_flop_jit,
    "aten::layer_norm": norm_flop_counter(2),
    "aten::embedding": zero_flop_jit,
    "aten::embedding_bag": zero_flop_jit,
}

# Ops whose MACs all multiply a weight of the module that calls them (scaled by weight density).
WEIGHT_OPS = frozenset({"linear", "addmm", "conv", "_convolution", "lstm", "gru", "rnn_tanh", "rnn_relu"})
ZERO_BY_DEFINITION = {"embedding": "table look-up (gather), 0 MACs",
                      "embedding_bag": "table look-up + sum (gather), 0 MACs"}


def _recording_zero(op: str, seen: Counter[str]) -> Handle:
    """A zero-MAC handle that also records that ``op`` occurred (fvcore drops zero counts)."""

    def handle(inputs: list, outputs: list) -> int:
        seen[op] += 1
        return 0

    return handle


class _FirstTensor(torch.nn.Module):
    """Calls ``model(**inputs)`` and returns one tensor, so tracing sees no ModelOutput dicts."""

    def __init__(self, model: torch.nn.Module, names: tuple[str, ...]):
        super().__init__()
        self.model = model
        self.names = names

    def forward(self, *args):
        out = self.model(**dict(zip(self.names, args)))
        if isinstance(out, torch.Tensor):
            return out
        if isinstance(out, dict):
            return next(v for v in out.values() if isinstance(v, torch.Tensor))
        return out[0]


def _weight_density(module: torch.nn.Module) -> tuple[int, int]:
    """(non-zeros, elements) of the module's own weight matrices (dim >= 2, not its children's)."""
    nnz = total = 0
    for p in module.parameters(recurse=False):
        if p.dim() >= 2:
            nnz += int(torch.count_nonzero(p.detach()))
            total += p.numel()
    return nnz, total


def count_flops(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> dict[str, Any]:
    """FLOPs of ``model(**inputs)``; see the module docstring for the definitions.

    ``inputs`` should have batch 1 so the numbers are per example. Returns a dict with
    ``dense_macs``, ``dense_flops``, ``effective_macs``, ``effective_flops``, per-operator
    dense/effective MACs, ``not_counted`` (op -> occurrences), ``unit`` and
    ``attention_implementation`` (a Hugging Face model's "eager"/"sdpa", else None).
    """
    names = tuple(inputs)
    wrapped = _FirstTensor(model, names).eval()
    analysis = FlopCountAnalysis(wrapped, tuple(inputs[n] for n in names))
    analysis.set_op_handle(**FLOP_HANDLES)
    seen_zero: Counter[str] = Counter()
    analysis.set_op_handle(**{f"aten::{op}": _recording_zero(op, seen_zero) for op in ZERO_BY_DEFINITION})
    analysis.unsupported_ops_warnings(False)
    analysis.uncalled_modules_warnings(False)
    analysis.tracer_warnings("none")
    with torch.no_grad():
        by_module = analysis.by_module_and_operator()
        dense_by_op = Counter(analysis.by_operator())
        not_counted = dict(sorted(analysis.unsupported_ops().items()))

    effective_by_op = Counter(dense_by_op)
    for name, module in wrapped.named_modules():
        nnz, total = _weight_density(module)
        if total == 0 or nnz == total:
            continue
        own = Counter(by_module.get(name, {}))
        for child_name, _ in module.named_children():
            own.subtract(by_module.get(f"{name}.{child_name}" if name else child_name, {}))
        for op, macs in own.items():
            if op in WEIGHT_OPS and macs > 0:
                # integer arithmetic: macs is a multiple of the weight's element count
                effective_by_op[op] -= macs - (macs * nnz) // total

    dense = int(sum(dense_by_op.values()))
    effective = int(sum(effective_by_op.values()))
    zero_ops = {op: f"{why} ({seen_zero[op]} calls)" for op, why in ZERO_BY_DEFINITION.items()
                if seen_zero[op]}
    return {
        "unit": UNIT,
        "attention_implementation": getattr(getattr(model, "config", None), "_attn_implementation", None),
        "dense_macs": dense,
        "dense_flops": 2 * dense,
        "effective_macs": effective,
        "effective_flops": 2 * effective,
        "dense_macs_by_operator": {k: int(v) for k, v in sorted(dense_by_op.items())},
        "effective_macs_by_operator": {k: int(v) for k, v in sorted(effective_by_op.items())},
        "zero_by_definition": zero_ops,
        "not_counted": not_counted,
    }
