"""Distillation-aware pruning's loss and plumbing: the combined loss against a hand computation, the
teacher stays frozen, bad options are refused."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from compress.core.errors import UsageError
from compress.distill.teacher_kd import (
    TEACHER_LOGITS,
    TeacherKDOptions,
    TeacherLogitsLoss,
    agreement,
    attach_teacher_logits,
    teacher_logits_collate,
)


class _Out:
    def __init__(self, logits, hidden=None):
        self.logits, self.hidden_states = logits, hidden


class _Fixed(torch.nn.Module):
    """A 'model' whose logits are a parameter, so the loss can be checked by hand."""

    def __init__(self, logits, hidden=None):
        super().__init__()
        self.logits = torch.nn.Parameter(torch.tensor(logits))
        self.hidden = None if hidden is None else torch.nn.Parameter(torch.tensor(hidden))

    def forward(self, input_ids, attention_mask=None, output_hidden_states=False):
        return _Out(self.logits, (self.hidden,) if output_hidden_states else None)


def _log_softmax(row):
    z = math.log(sum(math.exp(x) for x in row))
    return [x - z for x in row]


def test_combined_loss_equals_a_hand_computation():
    s, t, y = [[1.0, -1.0, 0.5], [0.0, 2.0, -1.0]], [[2.0, 0.0, 0.0], [-1.0, 1.0, 3.0]], [0, 2]
    temp, lam = 2.0, 3.0
    ce = -sum(_log_softmax(s[i])[y[i]] for i in range(2)) / 2
    kl = 0.0
    for i in range(2):
        ls, lt = _log_softmax([x / temp for x in s[i]]), _log_softmax([x / temp for x in t[i]])
        kl += sum(math.exp(lt[j]) * (lt[j] - ls[j]) for j in range(3))
    expected = ce + lam * temp * temp * kl / 2
    batch = {"input_ids": torch.zeros(2, 4, dtype=torch.long), "labels": torch.tensor(y),
             TEACHER_LOGITS: torch.tensor(t)}
    loss, extra = TeacherLogitsLoss(False, lam, temp)(_Fixed(s), batch)
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-6)
    assert extra["task_loss"] == pytest.approx(ce, rel=1e-6)
    assert extra["kd_loss"] == pytest.approx(temp * temp * kl / 2, rel=1e-6)


def test_multilabel_uses_bernoulli_kl_and_lambda_zero_is_the_task_loss():
    s, t, y = [[0.5, -2.0]], [[1.0, 1.0]], [[1.0, 0.0]]
    batch = {"input_ids": torch.zeros(1, 3, dtype=torch.long), "labels": torch.tensor(y),
             TEACHER_LOGITS: torch.tensor(t)}

    def sig(x):
        return 1 / (1 + math.exp(-x))

    bce = -(math.log(sig(0.5)) + math.log(1 - sig(-2.0))) / 2
    bern = sum(sig(b) * math.log(sig(b) / sig(a)) + (1 - sig(b)) * math.log((1 - sig(b)) / (1 - sig(a)))
               for a, b in zip(s[0], t[0])) / 2
    loss, _ = TeacherLogitsLoss(True, 1.0, 1.0)(_Fixed(s), batch)
    assert float(loss.detach()) == pytest.approx(bce + bern, rel=1e-6)
    loss0, _ = TeacherLogitsLoss(True, 0.0, 1.0)(_Fixed(s), batch)
    plain = torch.nn.functional.binary_cross_entropy_with_logits(torch.tensor(s), torch.tensor(y))
    assert torch.equal(loss0.detach(), plain)


def test_hidden_state_term_and_the_teacher_is_never_updated():
    student = _Fixed([[1.0, 0.0]], hidden=[[[1.0, 2.0], [3.0, 4.0]]])
    teacher = _Fixed([[0.0, 1.0]], hidden=[[[0.0, 2.0], [3.0, 2.0]]])
    before = {n: p.detach().clone() for n, p in teacher.named_parameters()}
    fn = TeacherLogitsLoss(False, 0.0, 1.0, hidden_weight=2.0, teacher=teacher)
    batch = {"input_ids": torch.zeros(1, 2, dtype=torch.long), "labels": torch.tensor([0])}
    opt = torch.optim.SGD(student.parameters(), lr=0.5)
    loss, extra = fn(student, batch)
    assert extra["hidden_mse"] == pytest.approx((1 + 0 + 0 + 4) / 4)
    ce = -_log_softmax([1.0, 0.0])[0]
    assert float(loss.detach()) == pytest.approx(ce + 2.0 * 1.25, rel=1e-6)
    for _ in range(3):
        loss, _ = fn(student, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert all(not p.requires_grad for p in teacher.parameters())
    for n, p in teacher.named_parameters():
        assert torch.equal(p, before[n]), n


class _Layered(torch.nn.Module):
    """A 'model' with fixed logits and per-layer hidden states (entry 0 the embeddings), and a
    config whose layer_heads / layer_intermediate say which layers a structured prune removed."""

    def __init__(self, logits, hidden, layer_heads=None, layer_intermediate=None):
        super().__init__()
        self.logits = torch.nn.Parameter(torch.tensor(logits))
        self.hidden = torch.nn.ParameterList([torch.nn.Parameter(torch.tensor(h)) for h in hidden])
        self.config = SimpleNamespace(num_hidden_layers=len(hidden) - 1, layer_heads=layer_heads,
                                      layer_intermediate=layer_intermediate)

    def forward(self, input_ids, attention_mask=None, output_hidden_states=False):
        return _Out(self.logits, tuple(self.hidden) if output_hidden_states else None)


def test_layerwise_term_is_added_with_its_weight_over_the_kept_layers_and_real_tokens():
    # one sequence of 2 tokens, the second padding; 3 layers, layer 1 removed by structured pruning
    s_hidden = [[[5.0, 5.0], [5.0, 5.0]], [[1.0, 2.0], [7.0, 7.0]], [[9.0, 9.0], [9.0, 9.0]],
                [[0.0, 3.0], [7.0, 7.0]]]
    t_hidden = [[[0.0, 0.0], [0.0, 0.0]], [[0.0, 2.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]],
                [[2.0, 3.0], [0.0, 0.0]]]
    student = _Layered([[1.0, 0.0]], [[h] for h in s_hidden], layer_heads=[2, 0, 0],
                       layer_intermediate=[8, 0, 4])
    teacher = _Layered([[0.0, 1.0]], [[h] for h in t_hidden])
    batch = {"input_ids": torch.zeros(1, 2, dtype=torch.long), "attention_mask": torch.tensor([[1, 0]]),
             "labels": torch.tensor([0])}
    loss, extra = TeacherLogitsLoss(False, 0.0, 1.0, teacher=teacher, layers_weight=3.0)(student, batch)
    # layer 0: (1 + 0) / 2; layer 1 maps to nothing; layer 2: (4 + 0) / 2; the pad token never counts
    layer_mse = (0.5 + 2.0) / 2
    assert extra["layer_mse"] == pytest.approx(layer_mse)
    assert "hidden_mse" not in extra
    ce = -_log_softmax([1.0, 0.0])[0]
    assert float(loss.detach()) == pytest.approx(ce + 3.0 * layer_mse, rel=1e-6)
    # layers given by the caller win over the config; with --kd-hidden both terms add up
    fn = TeacherLogitsLoss(False, 0.0, 1.0, hidden_weight=0.5, teacher=teacher, layers_weight=1.0,
                           layers=[1])
    loss, extra = fn(student, batch)
    hidden_mse = (4 + 0 + 49 + 49) / 4  # the last layer's MSE over every token, padding included
    assert extra["layer_mse"] == pytest.approx(81.0) and extra["hidden_mse"] == pytest.approx(hidden_mse)
    assert float(loss.detach()) == pytest.approx(ce + 0.5 * hidden_mse + 81.0, rel=1e-6)
    # every layer's blocks removed: no layer to match, the term is left out (not an error)
    emptied = _Layered([[1.0, 0.0]], [[h] for h in s_hidden], layer_heads=[0, 0, 0],
                       layer_intermediate=[0, 0, 0])
    loss, extra = TeacherLogitsLoss(False, 0.0, 1.0, teacher=teacher, layers_weight=3.0)(emptied, batch)
    assert "layer_mse" not in extra and float(loss.detach()) == pytest.approx(ce, rel=1e-6)
    with pytest.raises(ValueError, match="needs the teacher module"):
        TeacherLogitsLoss(False, 1.0, 1.0, layers_weight=1.0)


@pytest.mark.parametrize("config, want", [
    (dict(num_hidden_layers=3), [0, 1, 2]),
    (dict(num_hidden_layers=3, layer_heads=[2, 0, 0], layer_intermediate=[8, 0, 4]), [0, 2]),
    (dict(num_hidden_layers=3, layer_heads=[0, 0, 0], layer_intermediate=None), [0, 1, 2]),  # FFNs kept
    (dict(num_hidden_layers=2, layer_heads=None, layer_intermediate=[0, 0]), [0, 1]),  # attention kept
    (dict(num_hidden_layers=2, layer_heads=[0, 0], layer_intermediate=[0, 0]), []),
    # ALBERT: entries per shared layer, hidden states per pass; 4 passes over 2 groups of 1 layer
    (dict(num_hidden_layers=4, num_hidden_groups=2, layer_heads=[0, 2], layer_intermediate=[0, 5]), [2, 3]),
    # one group of 2 inner layers, one of them removed: every pass still runs the other
    (dict(num_hidden_layers=3, num_hidden_groups=1, layer_heads=[0, 1], layer_intermediate=[0, 0]),
     [0, 1, 2]),
])
def test_kept_layers_reads_the_structured_prune_from_the_config(config, want):
    from compress.distill.teacher_kd import kept_layers

    model = SimpleNamespace(config=SimpleNamespace(**{"layer_heads": None, "layer_intermediate": None,
                                                      **config}))
    assert kept_layers(model) == want
    assert kept_layers(SimpleNamespace(module=model)) == want  # a DDP-wrapped model


def test_kept_layers_of_a_real_structured_prune_is_every_layer():
    from transformers import BertConfig, BertForSequenceClassification

    from compress.distill.teacher_kd import kept_layers
    from compress.pruning.structured import prune_structured

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=3,
                                                     num_attention_heads=4, intermediate_size=32))
    prune_structured(model, 0.5)
    assert model.config.layer_heads is not None and kept_layers(model) == [0, 1, 2]


def test_a_teacher_whose_layers_do_not_pair_up_is_refused_for_hidden_state_distillation():
    from transformers import BertConfig

    from compress.core.errors import ModelError
    from compress.distill.teacher_kd import check_teacher_shapes

    def model(layers, hidden):
        return SimpleNamespace(config=BertConfig(num_hidden_layers=layers, hidden_size=hidden,
                                                 num_attention_heads=2))

    def cfg(kd_hidden=0.0, kd_layers=0.0):
        return SimpleNamespace(kd_hidden=kd_hidden, kd_layers=kd_layers)

    student = model(2, 16)
    check_teacher_shapes(model(4, 32), student, cfg(), "big")  # logits only: anything that fits labels
    check_teacher_shapes(model(4, 16), student, cfg(kd_hidden=1.0), "deep")  # the last layer pairs up
    check_teacher_shapes(model(2, 16), student, cfg(kd_layers=1.0), "same")
    with pytest.raises(ModelError, match="teacher 'deep' has 4 layers of hidden size 16, the student 2 "
                                         "of 16; --kd-layers needs the same layers and hidden size"):
        check_teacher_shapes(model(4, 16), student, cfg(kd_layers=1.0), "deep")
    with pytest.raises(ModelError, match="--kd-hidden needs the same hidden size"):
        check_teacher_shapes(model(2, 32), student, cfg(kd_hidden=1.0), "wide")


def test_one_recovery_step_with_kd_layers_on_a_tiny_pruned_bert(tiny_bert):
    """A structured-pruned tiny BERT, its dense original as teacher: one training step of the loss
    teacher_training builds with --kd-layers gives a finite loss that the layer-wise term changes,
    and a different update, against the same step with the teacher's logits only."""
    import copy

    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from compress.api.prune_stages import PruneConfig
    from compress.distill.teacher_kd import teacher_training
    from compress.pruning.structured import prune_structured
    from compress.training.loop import TrainConfig, make_collate, train

    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    torch.manual_seed(0)
    dense = BertForSequenceClassification(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32,
                                                     num_hidden_layers=2, num_attention_heads=4,
                                                     intermediate_size=64))
    texts = ["a fine film", "dull", "one of the worst things i have seen this year", "good"]
    enc = tokenizer(texts, truncation=True, max_length=16)
    feats = [{"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i], "labels": i % 2}
             for i in range(len(texts))]  # lengths differ: the batch is padded
    cfg = PruneConfig(stage="post-training", teacher="self", recovery_steps=1, kd_layers=2.0)
    train_cfg = TrainConfig(max_steps=1, batch_size=4, lr=1e-3, log_every=1, seed=3)
    runs = {}
    for name in ("logits", "layers"):
        student = copy.deepcopy(dense)
        prune_structured(student, 0.5)
        if name == "layers":
            kd = teacher_training(cfg, copy.deepcopy(dense), None, tokenizer, None, feats, False, None)
        else:  # what the cached teacher logits give, the teacher run per step instead
            kd = {"feats": feats, "collate": make_collate(tokenizer),
                  "loss_fn": TeacherLogitsLoss(False, cfg.lambda_for(False), cfg.temperature,
                                               teacher=copy.deepcopy(dense))}
        logged = []
        out = train(student, tokenizer, kd.pop("feats"), train_cfg, [], log=logged.append, **kd)
        runs[name] = (out["final_loss"], logged[-1], student.state_dict())
    (plain, plain_log, plain_w), (layered, layered_log, layered_w) = runs["logits"], runs["layers"]
    assert math.isfinite(plain) and math.isfinite(layered)
    assert "layer_mse" not in plain_log and layered_log["layer_mse"] > 0
    assert layered == pytest.approx(plain + 2.0 * layered_log["layer_mse"], rel=1e-5)
    assert layered != pytest.approx(plain)
    assert any(not torch.equal(plain_w[k], layered_w[k]) for k in plain_w)  # the term moved the weights


def test_teacher_logits_travel_with_examples_through_the_collate():
    feats = [{"input_ids": [1, 2], "labels": 0}, {"input_ids": [3], "labels": 1}]
    rows = attach_teacher_logits(feats, [[0.5, -0.5], [1.0, 2.0]])
    assert TEACHER_LOGITS not in feats[0]  # copies, the originals are untouched

    def base(rs):
        assert all(TEACHER_LOGITS not in r for r in rs)
        return {"n": torch.tensor(len(rs))}

    batch = teacher_logits_collate(base)(rows)
    assert torch.equal(batch[TEACHER_LOGITS], torch.tensor([[0.5, -0.5], [1.0, 2.0]]))
    with pytest.raises(ValueError):
        attach_teacher_logits(feats, [[0.0, 0.0]])


def test_agreement():
    s = [[1.0, 0.0], [0.0, 1.0], [2.0, 1.0]]
    t = [[1.0, 0.0], [1.0, 0.0], [0.0, 3.0]]
    assert agreement(s, t, multilabel=False) == pytest.approx(1 / 3)
    assert agreement([[1.0, -1.0]], [[1.0, 1.0]], multilabel=True) == 0.5


@pytest.mark.parametrize("kw, needle", [
    (dict(kd_lambda=2.0), "--kd-lambda applies with --teacher only"),
    (dict(teacher="x", kd_lambda=-1.0), "--kd-lambda must be in"),
    (dict(teacher="x", temperature=0.0), "--temperature must be in"),
    (dict(kd_hidden=1.0), "--kd-hidden applies with --teacher only"),
    (dict(kd_layers=1.0), "--kd-layers applies with --teacher only"),
    (dict(kd_hidden=1.0, kd_layers=2.0), "--kd-hidden, --kd-layers applies with --teacher only"),
    (dict(teacher="x", kd_layers=-0.5), r"--kd-layers must be in \[0, 10000.0\]"),
    (dict(teacher="x", kd_layers=float("nan")), "--kd-layers must be in"),
    (dict(teacher="x", temperature=100.5), r"--temperature must be in \(0, 100.0\], got 100.5"),
    (dict(teacher="x", temperature=float("inf")), "--temperature must be in"),
    (dict(teacher="x", kd_lambda=1e4 + 1), r"--kd-lambda must be in \[0, 10000.0\]"),
    (dict(teacher=""), "--teacher '' is empty"),
    (dict(teacher=" \t"), r"--teacher ' \\t' is empty"),
])
def test_bad_options(kw, needle):
    with pytest.raises(UsageError, match=needle):
        TeacherKDOptions(**kw)


def test_bounds_are_inclusive_where_documented():
    TeacherKDOptions(teacher="x", temperature=100.0, kd_lambda=1e4)
    TeacherKDOptions(teacher="x", kd_lambda=0.0)


def test_lambda_defaults_follow_compress_distill():
    assert TeacherKDOptions(teacher="x").lambda_for(False) == 4.0
    assert TeacherKDOptions(teacher="x").lambda_for(True) == 1.0
    assert TeacherKDOptions(teacher="x", kd_lambda=0.5).lambda_for(True) == 0.5


def test_span_kd_loss_equals_a_hand_computation():
    import numpy as np

    from compress.distill.teacher_kd import span_kd_loss

    s_start, s_end = torch.tensor([[1.0, 0.0, -1.0]]), torch.tensor([[0.5, 0.5, 0.0]])
    t_start, t_end = torch.tensor([[0.0, 2.0, 0.0]]), torch.tensor([[1.0, -1.0, 0.0]])
    T = 2.0

    def kl(s, t):  # KL(softmax(t/T) || softmax(s/T)) by hand
        p = np.exp(t / T) / np.exp(t / T).sum()
        q = np.exp(s / T) / np.exp(s / T).sum()
        return float((p * np.log(p / q)).sum())

    want = T ** 2 * (kl(s_start.numpy()[0], t_start.numpy()[0]) + kl(s_end.numpy()[0], t_end.numpy()[0])) / 2
    assert float(span_kd_loss(s_start, s_end, t_start, t_end, T)) == pytest.approx(want, rel=1e-6)
    assert float(span_kd_loss(t_start, t_end, t_start, t_end, T)) == pytest.approx(0.0, abs=1e-7)


def test_span_distillation_lambda_zero_is_the_plain_objective_and_the_teacher_stays_out():
    from transformers import BertConfig, BertForQuestionAnswering

    from compress.distill.teacher_kd import SpanDistillation
    from compress.qa.objectives import PlainObjective

    cfg = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    student, teacher = BertForQuestionAnswering(cfg), BertForQuestionAnswering(cfg)
    batch = {"input_ids": torch.randint(0, 50, (3, 7)), "attention_mask": torch.ones(3, 7, dtype=torch.long),
             "start_positions": torch.tensor([1, 2, 3]), "end_positions": torch.tensor([2, 2, 5])}
    plain, _ = PlainObjective().loss(student, batch)
    kd0, extra = SpanDistillation(teacher, 0.0, 1.0).loss(student, batch)
    assert torch.equal(plain, kd0) and extra["kd_loss"] > 0
    kd = SpanDistillation(teacher, 3.0, 1.0)
    loss, extra = kd.loss(student, batch)
    assert float(loss) == pytest.approx(float(plain) + 3.0 * extra["kd_loss"], rel=1e-4)
    # the teacher is no parameter, state or trainable part of the objective, and does not train
    assert list(kd.parameters()) == [] and kd.state_dict() == {} and kd.trainable_parameters() == []
    t_before = {k: v.clone() for k, v in teacher.state_dict().items()}
    loss.backward()
    assert all(p.grad is None for p in teacher.parameters())
    assert all(torch.equal(t_before[k], v) for k, v in teacher.state_dict().items())


def test_a_teacher_that_does_not_fit_is_a_model_error_whatever_the_mismatch():
    """Other labels and another tokenizer are the same kind of error (a model that does not fit,
    exit 1), not one a usage error (exit 2) and the other a model error."""
    from compress.core.errors import ModelError
    from compress.distill.teacher_kd import check_teacher_fits

    class Tok:
        def __init__(self, vocab):
            self.vocab = vocab
            self.all_special_ids = [0]

        def get_vocab(self):
            return dict(self.vocab)

        def __len__(self):
            return len(self.vocab)

    same, other = Tok({"[PAD]": 0, "a": 1}), Tok({"<pad>": 0, "a": 1, "b": 2})
    check_teacher_fits(same, Tok({"[PAD]": 0, "a": 1}), ("neg", "pos"), ("neg", "pos"), "t")
    errors = []
    for args in ((same, same, ("neg", "pos"), ("a", "b", "c")),
                 (other, same, ("neg", "pos"), ("neg", "pos"))):
        with pytest.raises(ModelError) as err:
            check_teacher_fits(*args, "t")
        errors.append(err.value)
    assert [e.exit_code for e in errors] == [1, 1]
    assert "predicts labels" in str(errors[0]) and "another tokenizer" in str(errors[1])
