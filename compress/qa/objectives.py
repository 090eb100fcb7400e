"""SQuAD training objectives as loss plug-ins: ``OBJECTIVES[name](model, options)``.

Each objective is an ``nn.Module`` with ``loss(model, batch) -> (loss, logs)``; ``batch`` holds the
model inputs plus ``start_positions``/``end_positions``. Its own parameters (a perturbation MLP,
say; ``trainable_parameters()``) are trained with the model by ``compress.training.loop.train`` and
checkpointed with its state_dict, but never saved with the model: evaluation and export see the
plain QA model.

- ``plain``: the model's own loss (mean of start and end cross-entropy).
- ``pfa``, perturbation for alignment (Yao et al. 2023, "Towards robust token embeddings for EQA"):
  an MLP with a bottleneck (hidden -> 500/768 * hidden -> hidden, LeakyReLU) perturbs the token
  embeddings; loss = L(original) + L(perturbed) + alpha * alignment(last hidden states). The paper
  gives no public code; here the perturbation is scaled to ``epsilon`` times each embedding's norm
  and trained adversarially through a gradient-reversal layer (it seeks the variation that hurts
  most, the encoder learns to tolerate it); without that the MLP would just learn to output zero.
  Alignment: cosine distance, KL or JS divergence of the token features' softmax, or W1 estimated
  by a critic MLP H trained on the side with a gradient penalty on interpolates (WGAN-GP).
- ``hl-aacl`` (Chen et al. 2022, "From Good to Best: Two-Stage Training for xMRC"): hard learning
  = cross-entropy of the gold span against the model's own top-k spans (k = 20, scored start + end
  logit, from the detached current model, i.e. the first stage is the model being trained); plus
  answer-aware contrastive learning: the [CLS] representation (question-aware) as anchor, the gold
  span's mean token representation as positive, the top-k wrong span most similar to the gold as
  negative, temperature tau, weight alpha.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

INPUT_KEYS = ("input_ids", "token_type_ids", "attention_mask")


def _inputs(batch: dict) -> dict:
    return {k: batch[k] for k in INPUT_KEYS if k in batch}


def span_loss(start_logits, end_logits, start_positions, end_positions) -> torch.Tensor:
    """Mean of start and end cross-entropy, as ``BertForQuestionAnswering`` computes it."""
    return (F.cross_entropy(start_logits, start_positions)
            + F.cross_entropy(end_logits, end_positions)) / 2


class PlainObjective(nn.Module):
    def trainable_parameters(self):
        return []

    def loss(self, model, batch: dict):
        out = model(**_inputs(batch))
        loss = span_loss(out.start_logits, out.end_logits, batch["start_positions"],
                         batch["end_positions"])
        return loss, {}


# ---------------------------------------------------------------- PFA ---------------------------


class _GradReverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return -g


class EmbeddingPerturbation(nn.Module):
    """x -> x + delta, delta = epsilon * |x| * d/|d|, d = MLP(x); shape (B, T, H) -> (B, T, H)."""

    def __init__(self, hidden: int, bottleneck: int, epsilon: float = 0.1):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(hidden, bottleneck), nn.LeakyReLU(0.2),
                                 nn.Linear(bottleneck, hidden))
        self.epsilon = epsilon

    def forward(self, x: torch.Tensor, adversarial: bool = True) -> torch.Tensor:
        d = self.mlp(x)
        if adversarial:
            d = _GradReverse.apply(d)
        d = d / (d.norm(dim=-1, keepdim=True) + 1e-6)
        return x + self.epsilon * x.norm(dim=-1, keepdim=True).detach() * d


def _masked_mean(values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return values.mean()
    m = mask.to(values.dtype)
    return (values * m).sum() / m.sum().clamp_min(1.0)


def cosine_alignment(a, b, mask=None) -> torch.Tensor:
    """Mean over tokens of 1 - cos(a_t, b_t); a, b: (B, T, H), mask (B, T)."""
    return _masked_mean(1 - F.cosine_similarity(a, b, dim=-1), mask)


def kl_alignment(a, b, mask=None) -> torch.Tensor:
    """Mean over tokens of KL(softmax(a_t) || softmax(b_t))."""
    la, lb = F.log_softmax(a, -1), F.log_softmax(b, -1)
    return _masked_mean((la.exp() * (la - lb)).sum(-1), mask)


def js_alignment(a, b, mask=None) -> torch.Tensor:
    """Mean over tokens of the Jensen-Shannon divergence of softmax(a_t) and softmax(b_t)."""
    pa, pb = F.softmax(a, -1), F.softmax(b, -1)
    m = ((pa + pb) / 2).clamp_min(1e-12).log()
    kl_am = (pa * (pa.clamp_min(1e-12).log() - m)).sum(-1)
    kl_bm = (pb * (pb.clamp_min(1e-12).log() - m)).sum(-1)
    return _masked_mean((kl_am + kl_bm) / 2, mask)


def gradient_penalty(critic: nn.Module, real: torch.Tensor, fake: torch.Tensor,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """WGAN-GP: mean over interpolates x = u*real + (1-u)*fake of (|grad_x critic(x)| - 1)^2.

    ``real``/``fake``: (N, H) feature rows; one u ~ U(0, 1) per row.
    """
    u = torch.rand(real.size(0), 1, generator=generator, device=real.device, dtype=real.dtype)
    x = (u * real.detach() + (1 - u) * fake.detach()).requires_grad_(True)
    (g,) = torch.autograd.grad(critic(x).sum(), x, create_graph=True)
    return ((g.norm(dim=-1) - 1) ** 2).mean()


class W1Critic(nn.Module):
    """H: features (N, H) -> scores (N,); W1(P, Q) ~ E_P[H] - E_Q[H] for a 1-Lipschitz H."""

    def __init__(self, hidden: int, width: int = 128):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(hidden, width), nn.LeakyReLU(0.2), nn.Linear(width, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


class PFAObjective(nn.Module):
    ALIGNMENTS: dict[str, Callable] = {"cosine": cosine_alignment, "kl": kl_alignment,
                                       "js": js_alignment}

    def __init__(self, hidden: int, alignment: str = "cosine", alpha: float = 0.5,
                 epsilon: float = 0.1, gp_weight: float = 10.0, critic_lr: float = 1e-4):
        super().__init__()
        bottleneck = max(8, round(hidden * 500 / 768))  # 768 -> 500 -> 768 in the paper, scaled
        self.perturb = EmbeddingPerturbation(hidden, bottleneck, epsilon)
        self.alignment, self.alpha, self.gp_weight = alignment, alpha, gp_weight
        self.critic = W1Critic(hidden) if alignment == "w1" else None
        # The critic has its own optimizer and is not among parameters() handed to the model's.
        self._critic_opt = (torch.optim.Adam(self.critic.parameters(), lr=critic_lr, betas=(0.5, 0.9))
                            if self.critic is not None else None)

    def trainable_parameters(self):
        return list(self.perturb.parameters())

    def get_extra_state(self) -> dict:
        # The critic's optimizer travels with the module's state_dict, so a training checkpoint
        # (which saves the objective's state_dict) resumes the critic's Adam moments too.
        return {"critic_optimizer": self._critic_opt.state_dict()} if self._critic_opt is not None else {}

    def set_extra_state(self, state: dict) -> None:
        if self._critic_opt is not None:
            self._critic_opt.load_state_dict(state["critic_optimizer"])

    def align(self, a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None,
              update_critic: bool = True) -> torch.Tensor:
        """Alignment term between features a and b: (B, T, H); zero when a == b."""
        if self.alignment != "w1":
            return self.ALIGNMENTS[self.alignment](a, b, mask)
        fa, fb = a.reshape(-1, a.size(-1)), b.reshape(-1, b.size(-1))
        if mask is not None:
            keep = mask.reshape(-1).bool()
            fa, fb = fa[keep], fb[keep]
        if update_critic and self.training:
            self._critic_step(fa, fb)
        # The critic's parameters get gradients from this term too; _critic_step zeroes them.
        return self.critic(fa).mean() - self.critic(fb).mean()

    def _critic_step(self, fa, fb) -> None:
        self._critic_opt.zero_grad(set_to_none=True)
        w1 = self.critic(fa.detach()).mean() - self.critic(fb.detach()).mean()
        loss = -w1 + self.gp_weight * gradient_penalty(self.critic, fa, fb)
        loss.backward()
        self._critic_opt.step()
        self._critic_opt.zero_grad(set_to_none=True)

    def loss(self, model, batch: dict):
        inputs = _inputs(batch)
        ids = inputs.pop("input_ids")
        emb = model.get_input_embeddings()(ids)
        out_o = model(inputs_embeds=emb, output_hidden_states=True, **inputs)
        out_p = model(inputs_embeds=self.perturb(emb), output_hidden_states=True, **inputs)
        sp, ep = batch["start_positions"], batch["end_positions"]
        l_o = span_loss(out_o.start_logits, out_o.end_logits, sp, ep)
        l_p = span_loss(out_p.start_logits, out_p.end_logits, sp, ep)
        a = self.align(out_o.hidden_states[-1], out_p.hidden_states[-1], inputs.get("attention_mask"))
        loss = l_o + l_p + self.alpha * a
        return loss, {"loss_original": float(l_o.detach()), "loss_perturbed": float(l_p.detach()),
                      "alignment": float(a.detach())}


# ------------------------------------------------------------- HL-AACL --------------------------


def topk_spans(start_logits: torch.Tensor, end_logits: torch.Tensor, k: int, max_answer_length: int,
               valid: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The k best spans per row by start + end logit.

    start/end_logits: (B, T); valid: (B, T) bool, tokens a span may use (context tokens).
    Returns (starts, ends, scores), each (B, k).
    """
    B, T = start_logits.shape
    scores = start_logits[:, :, None] + end_logits[:, None, :]
    i = torch.arange(T, device=scores.device)
    ok = (i[None, :] >= i[:, None]) & (i[None, :] - i[:, None] < max_answer_length)
    ok = ok[None].expand(B, T, T)
    if valid is not None:
        ok = ok & valid[:, :, None] & valid[:, None, :]
    scores = scores.masked_fill(~ok, float("-inf"))
    top, flat = scores.reshape(B, -1).topk(min(k, T * T), dim=-1)
    return flat // T, flat % T, top


def hard_learning_loss(start_logits, end_logits, gold_start, gold_end, top_starts, top_ends
                       ) -> torch.Tensor:
    """-log softmax of the gold span's score among {gold} + top-k spans (gold removed from them).

    Rows whose gold is [CLS] (answer outside the window) are left out; 0 if none remain.
    """
    gold = start_logits.gather(1, gold_start[:, None]) + end_logits.gather(1, gold_end[:, None])
    cand = start_logits.gather(1, top_starts) + end_logits.gather(1, top_ends)
    is_gold = (top_starts == gold_start[:, None]) & (top_ends == gold_end[:, None])
    cand = cand.masked_fill(is_gold | ~torch.isfinite(cand), float("-inf"))
    logits = torch.cat([gold, cand], dim=1)
    per_row = -F.log_softmax(logits, dim=1)[:, 0]
    has = gold_start > 0
    return per_row[has].mean() if has.any() else start_logits.sum() * 0


def span_representation(hidden: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Mean hidden state over tokens start..end: hidden (B, T, H), starts/ends (B, K) -> (B, K, H)."""
    T = hidden.size(1)
    i = torch.arange(T, device=hidden.device)
    m = ((i[None, None, :] >= starts[..., None]) & (i[None, None, :] <= ends[..., None])).to(hidden.dtype)
    return (m @ hidden) / m.sum(-1, keepdim=True).clamp_min(1.0)


def answer_aware_contrastive_loss(hidden, gold_start, gold_end, top_starts, top_ends, tau: float
                                  ) -> torch.Tensor:
    """InfoNCE with anchor = [CLS] state, positive = gold span, negative = the top-k wrong span whose
    representation is most similar to the gold one. Rows with the answer outside the window and rows
    with no wrong span are left out; 0 if none remain."""
    anchor = F.normalize(hidden[:, 0], dim=-1)
    pos = F.normalize(span_representation(hidden, gold_start[:, None], gold_end[:, None])[:, 0], dim=-1)
    cands = F.normalize(span_representation(hidden, top_starts, top_ends), dim=-1)
    wrong = ~((top_starts == gold_start[:, None]) & (top_ends == gold_end[:, None]))
    sim_to_gold = (cands @ pos[:, :, None]).squeeze(-1).masked_fill(~wrong, float("-inf"))
    j = sim_to_gold.argmax(dim=1)
    neg = cands[torch.arange(cands.size(0)), j]
    logits = torch.stack([(anchor * pos).sum(-1), (anchor * neg).sum(-1)], dim=1) / tau
    per_row = -F.log_softmax(logits, dim=1)[:, 0]
    keep = (gold_start > 0) & wrong.any(dim=1)
    return per_row[keep].mean() if keep.any() else hidden.sum() * 0


class HLAACLObjective(nn.Module):
    def __init__(self, k: int = 20, alpha: float = 0.5, tau: float = 0.1, max_answer_length: int = 30):
        super().__init__()
        self.k, self.alpha, self.tau, self.max_answer_length = k, alpha, tau, max_answer_length

    def trainable_parameters(self):
        return []

    def loss(self, model, batch: dict):
        inputs = _inputs(batch)
        out = model(**inputs, output_hidden_states=True)
        sl, el = out.start_logits, out.end_logits
        sp, ep = batch["start_positions"], batch["end_positions"]
        valid = None  # spans within the context (the features' context_mask, from sequence_ids)
        if "context_mask" in batch:
            valid = batch["context_mask"].bool()
        elif "token_type_ids" in inputs:
            valid = (inputs["token_type_ids"] == 1) & inputs["attention_mask"].bool()
        with torch.no_grad():
            ts, te, _ = topk_spans(sl.detach(), el.detach(), self.k, self.max_answer_length, valid)
        plain = span_loss(sl, el, sp, ep)
        hl = hard_learning_loss(sl, el, sp, ep, ts, te)
        cl = answer_aware_contrastive_loss(out.hidden_states[-1], sp, ep, ts, te, self.tau)
        return plain + hl + self.alpha * cl, {"loss_plain": float(plain.detach()),
                                               "loss_hl": float(hl.detach()),
                                               "loss_aacl": float(cl.detach())}


def _hidden_size(model) -> int:
    return int(model.config.hidden_size)


OBJECTIVES: dict[str, Callable[[object, object], nn.Module]] = {
    "plain": lambda model, o: PlainObjective(),
    "pfa": lambda model, o: PFAObjective(_hidden_size(model), o.pfa_alignment, o.objective_alpha,
                                         o.pfa_epsilon),
    "hl-aacl": lambda model, o: HLAACLObjective(o.hl_top_k, o.objective_alpha, o.aacl_tau,
                                                o.max_answer_length),
}


def make_objective(name: str, model, options) -> nn.Module:
    if name not in OBJECTIVES:
        from compress.core.errors import UsageError

        raise UsageError(f"unknown objective '{name}'; choose one of: {', '.join(OBJECTIVES)}")
    return OBJECTIVES[name](model, options)
