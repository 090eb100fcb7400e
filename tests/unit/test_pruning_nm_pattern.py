"""N:M semi-structured masks on hand-made matrices: exact masks, gradual group fractions, nesting,
ties, bad input; the pattern's detection in the sparsity report and its speed verdict per device."""

from __future__ import annotations

import pytest
import torch

from compress.core.errors import UsageError
from compress.pruning.masks import NMPattern, broken_groups, nm_mask
from compress.pruning.pruner import ScheduledPruner
from compress.pruning.schedules import GradualSchedule, OneShotSchedule

# two rows, two groups of 4 each; |w| group sums of the 2 lowest: 0.3, 1.3 | 2.0, 0.06
W = torch.tensor([[0.5, -0.1, 0.3, 0.2, 0.9, 0.8, 0.7, 0.6],
                  [1.0, 1.0, 1.0, 1.0, 0.05, 0.4, -0.01, 0.3]])


def _zeros_per_group(w: torch.Tensor, m: int = 4) -> list[int]:
    return (w.reshape(-1, m) == 0).sum(dim=1).tolist()


def test_two_four_mask_hand_made():
    keep = nm_mask(W.abs(), 2, 4)
    assert keep.int().tolist() == [[1, 0, 1, 0, 1, 1, 0, 0],
                                   [0, 0, 1, 1, 0, 1, 0, 1]]  # all-equal group: lower index first


def test_other_patterns_hand_made():
    assert nm_mask(W.abs(), 1, 4).int().tolist() == [[1, 0, 1, 1, 1, 1, 1, 0],
                                                     [0, 1, 1, 1, 1, 1, 0, 1]]
    assert nm_mask(W.abs(), 1, 2).int().tolist() == [[1, 0, 1, 0, 1, 0, 1, 0],
                                                     [0, 1, 0, 1, 0, 1, 0, 1]]
    assert nm_mask(W.abs(), 3, 8).int().tolist() == [[1, 0, 0, 0, 1, 1, 1, 1],
                                                     [1, 1, 1, 1, 0, 1, 0, 0]]


def test_group_fraction_prunes_the_groups_with_the_smallest_lowest_first():
    # groups by the sum of their 2 lowest: (row 1, group 1) 0.06 < (0, 0) 0.3 < (0, 1) 1.3 < (1, 0) 2.0
    assert nm_mask(W.abs(), 2, 4, 0.25).int().tolist() == [[1, 1, 1, 1, 1, 1, 1, 1],
                                                           [1, 1, 1, 1, 0, 1, 0, 1]]
    assert nm_mask(W.abs(), 2, 4, 0.5).int().tolist() == [[1, 0, 1, 0, 1, 1, 1, 1],
                                                          [1, 1, 1, 1, 0, 1, 0, 1]]
    assert nm_mask(W.abs(), 2, 4, 0.75).int().tolist() == [[1, 0, 1, 0, 1, 1, 0, 0],
                                                           [1, 1, 1, 1, 0, 1, 0, 1]]
    assert nm_mask(W.abs(), 2, 4, 0.0).all()


def test_group_ties_break_by_lower_group_index():
    keep = nm_mask(torch.ones(2, 8), 2, 4, 0.5)  # 4 equal groups, 2 pruned: the first two
    assert keep.int().tolist() == [[0, 0, 1, 1, 0, 0, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1]]


def test_already_pruned_entries_go_first_so_masks_nest():
    scores = W.abs().clone()
    scores[1, 1] = float("-inf")  # pruned before: its group (row 1, group 0) is chosen first
    keep = nm_mask(scores, 2, 4, 0.25)
    assert keep.int().tolist() == [[1, 1, 1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1, 1, 1]]


def test_gradual_pruner_ramps_the_group_count_nested_to_every_group():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(8, 16))
    sched = GradualSchedule(final_sparsity=0.5, span_steps=4, every=1, power=1.0)
    pruner = ScheduledPruner({"w": w}, sched, pattern=NMPattern(2, 4))
    pruner.initialize()
    previous = pruner.masks["w"].clone()
    for step in range(1, 5):
        pruner.step(step)
        keep = pruner.masks["w"]
        assert not (keep & ~previous).any()  # nested: a pruned weight never comes back
        groups_pruned = sum(z == 2 for z in _zeros_per_group(keep.int()))
        frac = sched.sparsity_at(step) / 0.5
        assert groups_pruned == round(frac * 32), step  # 32 groups: 8 rows x 4
        assert set(_zeros_per_group(keep.int())) <= {0, 2}
        assert torch.equal(w.detach() == 0, ~keep)
        previous = keep.clone()
    assert _zeros_per_group(w.detach()) == [2] * 32
    assert pruner.history[-1]["sparsity"] == 0.5
    assert torch.equal(pruner.finalize()["w"], w.detach() != 0)


def test_oneshot_pattern_keeps_earlier_zeros_and_its_own():
    torch.manual_seed(1)
    w = torch.nn.Parameter(torch.randn(4, 8))
    initial = torch.ones(4, 8, dtype=torch.bool)
    initial[0, 5] = False  # an earlier unstructured zero survives and counts in its group
    pruner = ScheduledPruner({"w": w}, OneShotSchedule(0.5), pattern=NMPattern(2, 4),
                             initial_masks={"w": initial})
    pruner.initialize()
    masks = pruner.finalize()
    assert not masks["w"][0, 5] and w[0, 5] == 0
    assert _zeros_per_group(w.detach()) == [2] * 8


@pytest.mark.parametrize("text", ["4:2", "2:2", "0:4", "a:b", "2-4", "2:4:8", ""])
def test_bad_patterns_refused_in_one_line(text):
    with pytest.raises(UsageError, match="0 < N < M") as e:
        NMPattern.parse(text)
    assert "\n" not in str(e.value)


def test_pattern_parse_and_sparsity():
    p = NMPattern.parse(" 2 : 4 ")
    assert (p.n, p.m, str(p), p.sparsity) == (2, 4, "2:4", 0.5)
    assert p.group_fraction(0.25) == 0.5 and p.group_fraction(0.5) == 1.0


def test_pruner_refuses_what_the_pattern_cannot_do():
    params = {"a.weight": torch.nn.Parameter(torch.randn(4, 8)),
              "b.weight": torch.nn.Parameter(torch.randn(4, 6))}
    with pytest.raises(UsageError, match=r"b.weight is \[4, 6\]; leave it out with --exclude"):
        ScheduledPruner(params, OneShotSchedule(0.5), pattern=NMPattern(2, 4))
    ok = {"a.weight": params["a.weight"]}
    with pytest.raises(UsageError, match="drop --criterion 'random'"):
        ScheduledPruner(ok, OneShotSchedule(0.5), criterion="random", pattern=NMPattern(2, 4))
    with pytest.raises(UsageError, match="drop --scope 'global'"):
        ScheduledPruner(ok, OneShotSchedule(0.5), scope="global", pattern=NMPattern(2, 4))
    with pytest.raises(UsageError, match="sparsity 0.5 by definition, not 0.6"):
        ScheduledPruner(ok, OneShotSchedule(0.6), pattern=NMPattern(2, 4))


def test_nm_mask_refuses_a_matrix_that_does_not_split_into_groups():
    with pytest.raises(UsageError, match=r"shape \(2, 6\)"):
        nm_mask(torch.rand(2, 6), 2, 4)


def test_broken_groups_names_the_first():
    w = torch.tensor([[0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0],
                      [0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0]])
    assert broken_groups(w, 2, 4) == (1, (1, 1, 1))  # row 1, group 1 (columns 4-7): one zero
    assert broken_groups(w[:1], 2, 4) == (0, None)


def test_prune_config_sets_sparsity_and_refuses_conflicts():
    from compress.api.prune_stages import PruneConfig

    cfg = PruneConfig(pattern="2 : 4")
    assert (cfg.pattern, cfg.sparsity) == ("2:4", 0.5)
    assert PruneConfig(pattern="1:4", initial_sparsity=0.1).sparsity == 0.25
    assert PruneConfig(pattern="2:4", sparsity=0.5).sparsity == 0.5
    with pytest.raises(UsageError, match="not 0.6; drop --sparsity"):
        PruneConfig(pattern="2:4", sparsity=0.6)
    with pytest.raises(UsageError, match="drop --scope 'global'"):
        PruneConfig(pattern="2:4", scope="global")
    with pytest.raises(UsageError, match="drop --criterion 'random'"):
        PruneConfig(pattern="2:4", criterion="random")
    with pytest.raises(UsageError, match="--structured removes whole heads"):
        PruneConfig(pattern="2:4", structured=("heads",))


def test_sparsity_report_detects_two_four_and_the_verdict_per_device():
    from transformers import BertConfig, BertModel

    from compress.api.functions import prune_model
    from compress.measure.sparsity import format_sparsity_table, sparsity_report
    from compress.measure.verdict import semi_structured_verdict

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=32)
    model = BertModel(cfg)
    assert sparsity_report(model)["pattern"] is None  # dense
    prune_model(model, 0.5)  # unstructured 50%: not a 2:4 pattern
    assert sparsity_report(model)["pattern"] is None
    model = BertModel(cfg)
    prune_model(model, 0.5, pattern="2:4")
    report = sparsity_report(model)
    assert report["pattern"]["pattern"] == "2:4" and report["pattern"]["encoder"]
    assert report["pattern"]["other"] == [] and len(report["pattern"]["matrices"]) == 7
    assert "2:4 pattern: every group of 4 weights along the input dimension holds >= 2 zeros in all 7" \
        in format_sparsity_table(report)

    assert semi_structured_verdict("2:4", True, (8, 0), "A100")["here"] == {
        "device": "A100, capability 8.0", "faster": "yes"}
    assert semi_structured_verdict("2:4", True, (7, 5), "T4")["here"]["faster"] == "storage only"
    cpu = semi_structured_verdict("2:4", True, None, "CPU, no CUDA device")
    assert cpu["here"]["faster"] == "storage only"
    assert cpu["per_device"] == {"CUDA capability >= 8.0": "yes",
                                 "CPU, CUDA below 8.0, other runtimes": "storage only"}
    assert semi_structured_verdict("1:4")["per_device"] == {"any device": "storage only"}


def test_measure_reports_the_pattern_and_storage_only_on_this_cpu():
    from transformers import BertConfig, BertModel

    from compress.api.functions import measure_model, prune_model
    from compress.recipes.measure import format_measure

    if torch.cuda.is_available():
        pytest.skip("checks the verdict of a machine without CUDA")
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1,
                                 num_attention_heads=2, intermediate_size=32, max_position_embeddings=32))
    prune_model(model, 0.5, pattern="2:4")
    r = measure_model(model, seq_len=8)
    ss = r["verdict"]["semi_structured"]
    assert ss["pattern"] == "2:4"
    assert ss["here"] == {"device": "CPU, no CUDA device", "faster": "storage only"}
    assert r["verdict"]["faster"] == "storage only"
    text = format_measure({**r, "disk": None})
    assert "will the 2:4 pattern be faster? here (CPU, no CUDA device): storage only; " \
           "CUDA capability >= 8.0: yes" in text


def test_two_four_masks_have_the_layout_of_pytorchs_semi_structured_format():
    """PyTorch's own (CPU-runnable) conversion to the CUTLASS semi-structured format round-trips a
    matrix exactly only when it is 2:4 along its rows: ours does, an unstructured 50% mask or the
    pattern along the other dimension does not."""
    conv = pytest.importorskip("torch.sparse._semi_structured_conversions")

    def round_trips(dense: torch.Tensor) -> bool:
        sparse, meta = conv.sparse_semi_structured_from_dense_cutlass(dense)
        return torch.equal(conv.sparse_semi_structured_to_dense_cutlass(sparse, meta), dense)

    from compress.pruning.masks import mask_from_scores

    torch.manual_seed(0)
    w = torch.randn(64, 128).half()  # [out, in], the kernels' minimum fp16 tile is 32 x 64
    assert round_trips(w * nm_mask(w.abs(), 2, 4))
    assert not round_trips(w * mask_from_scores(w.abs(), 0.5))
    assert not round_trips((w.t() * nm_mask(w.t().abs(), 2, 4)).t().contiguous())
