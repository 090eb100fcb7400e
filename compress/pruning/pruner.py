"""The stateful pruner and the training hooks that drive it.

``ScheduledPruner`` owns the masks of a set of parameters and follows a strict lifecycle:
``initialize()`` -> ``step(t)`` after each optimizer step (masks are recomputed on the schedule's
pruning steps and re-applied on every step) -> ``finalize()``. Calling these out of order raises
``PrunerStateError``. Pre-training and fine-tuning use the same pruner with different configs.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from compress.core.distributed import assert_same_across_ranks, tensor_checksum
from compress.core.errors import IntegrityError, UsageError
from compress.core.hooks import TrainHook
from compress.pruning.criteria import weight_only
from compress.pruning.integrity import MASKS_FILE, check_masks, load_masks, save_masks
from compress.pruning.masks import NMPattern, get_scope
from compress.pruning.schedules import Schedule
from compress.pruning.targets import named_weights


class PrunerStateError(RuntimeError):
    """A pruner method was called out of order (a programming error, not a user error)."""


# What to do instead, by the phase the pruner was in when a method was called out of order.
_FIX = {"new": "call pruner.initialize() once before the first training step",
        "final": "finalize() already fixed the masks; build a new pruner to prune again"}


@torch.no_grad()
def apply_masks(params: dict[str, torch.Tensor], masks: dict[str, torch.Tensor],
                pruned: dict[str, torch.Tensor] | None = None) -> None:
    """Zero every masked entry in place (+0.0, so the stored bits are the same every time).

    ``pruned`` (the negated masks) can be passed to save a negation per tensor and step. A mask on
    another device than its parameter (hooks are built before the trainer moves the model to the
    GPU) is moved there, in ``masks`` and ``pruned`` too, so that happens once."""
    for name in masks:
        p = params[name]
        m = _on_device(masks, name, p.device)
        p.masked_fill_(_on_device(pruned, name, p.device) if pruned is not None else ~m, 0.0)


def _on_device(tensors: dict[str, torch.Tensor], name: str, device: torch.device) -> torch.Tensor:
    """``tensors[name]`` on ``device``, moved there in the dict the first time it is not."""
    if tensors[name].device != device:
        tensors[name] = tensors[name].to(device)
    return tensors[name]


@torch.no_grad()
def mask_grads(params: dict[str, torch.Tensor], pruned: dict[str, torch.Tensor]) -> None:
    """Zero the gradients of pruned weights (``pruned``: True where pruned), as a forward pass
    through ``weight * mask`` would (Gordon et al.'s TensorFlow pruning), so that they neither count
    in the clipped gradient norm nor feed the optimizer's moments."""
    for name in pruned:
        g = params[name].grad
        if g is not None:
            g.masked_fill_(_on_device(pruned, name, g.device), 0.0)


class ScheduledPruner:
    """Unstructured pruning of ``params`` (canonical name -> parameter) on ``schedule``, by a
    criterion that scores weights alone (magnitude or random; ``compress.pruning.criteria``).

    ``initial_masks`` (e.g. from an already pruned model) stay pruned: masks only ever shrink.
    With ``pattern`` (N:M semi-structured, ``NMPattern``) each matrix loses the N lowest of every
    group of M along its input dimension in place of the scope's threshold; a gradual schedule's
    sparsity s prunes that pattern in a fraction s / (N/M) of the groups, all of them at its end.
    """

    def __init__(self, params: dict[str, torch.nn.Parameter], schedule: Schedule,
                 criterion: str = "magnitude", scope: str = "local", seed: int = 0,
                 initial_masks: dict[str, torch.Tensor] | None = None, pattern: NMPattern | None = None):
        self.params = dict(sorted(params.items()))
        self.schedule = schedule
        self.criterion_name, self.scope_name = criterion, scope
        self._criterion = weight_only(criterion).score
        self._scope = get_scope(scope)
        self.pattern = pattern
        if pattern is not None:
            check_pattern_fits(pattern, self.params, criterion, scope, schedule.final_sparsity)
            self._scope = pattern.masks
        self.seed = seed
        self.initial_masks = initial_masks or {}
        self.masks: dict[str, torch.Tensor] = {}
        self._pruned: dict[str, torch.Tensor] = {}  # ~masks, kept to make the per-step apply cheap
        self.phase = "new"
        self.last_pruned_step: int | None = None
        self.history: list[dict] = []
        self._fixed_scores: dict[str, torch.Tensor] | None = None

    # lifecycle -------------------------------------------------------------------------------
    def initialize(self) -> None:
        if self.phase != "new":
            raise PrunerStateError(f"initialize() called twice (pruner is {self.phase}); call it once, "
                                   "before the first training step")
        self.masks = {n: torch.ones_like(p, dtype=torch.bool) for n, p in self.params.items()}
        for n, m in self.initial_masks.items():
            if n in self.masks:
                self.masks[n] &= m.to(self.masks[n].device)
        self._pruned = {n: ~m for n, m in self.masks.items()}
        if self.criterion_name == "random":
            # Drawn once in sorted-name order from one seeded generator: the same on every rank,
            # and nested across gradual steps.
            g = torch.Generator().manual_seed(self.seed)
            self._fixed_scores = {n: self._criterion(p, None, g) for n, p in self.params.items()}
        self.phase = "active"
        if self.schedule.is_prune_step(0):
            self._prune(0)
        self.apply_masks()

    def step(self, step: int) -> None:
        """Call after optimizer step ``step`` (1-based): prune if scheduled, then re-apply masks."""
        if self.phase != "active":
            raise PrunerStateError(f"step() needs an initialized, unfinished pruner (it is {self.phase}); "
                                   + _FIX[self.phase])
        if self.schedule.is_prune_step(step) and (self.last_pruned_step is None
                                                  or step > self.last_pruned_step):
            self._prune(step)
        self.apply_masks()

    def register_grad_masks(self) -> list:
        """Zero the gradients of pruned weights during ``backward`` (a tensor hook per target that
        reads the current masks), so that they neither count in a gradient clipping done after
        ``backward`` nor feed the optimizer's moments: for loops such as ``transformers.Trainer``
        that call nothing between ``backward`` and clipping. Returns the hook handles
        (``handle.remove()`` takes one off)."""
        handles = []
        for name, p in self.params.items():
            if p.requires_grad:
                handles.append(p.register_hook(lambda g, n=name: self._masked_grad(n, g)))
        return handles

    def _masked_grad(self, name: str, grad: torch.Tensor) -> torch.Tensor:
        if name not in self._pruned:  # not initialized yet: nothing is pruned
            return grad
        return grad.masked_fill(_on_device(self._pruned, name, grad.device), 0.0)

    def mask_grads(self) -> None:
        if self.phase == "new":
            raise PrunerStateError("mask_grads() before initialize(); " + _FIX["new"])
        mask_grads(self.params, self._pruned)

    def apply_masks(self) -> None:
        if self.phase == "new":
            raise PrunerStateError("apply_masks() before initialize(); " + _FIX["new"])
        apply_masks(self.params, self.masks, self._pruned)

    def finalize(self) -> dict[str, torch.Tensor]:
        """Fix the masks. If training ended before the schedule did, prune to the final sparsity
        now (recorded in ``history`` as ``at_finalize``), so the output has the requested sparsity."""
        if self.phase != "active":
            raise PrunerStateError(f"finalize() needs an initialized, unfinished pruner (it is "
                                   f"{self.phase}); " + _FIX[self.phase])
        if self.last_pruned_step is None or self.last_pruned_step < self.schedule.end_step:
            self._prune(self.schedule.end_step, at_finalize=True)
        self.apply_masks()
        self.phase = "final"
        return {n: m.detach().cpu() for n, m in self.masks.items()}

    # internals -------------------------------------------------------------------------------
    @torch.no_grad()
    def _prune(self, step: int, at_finalize: bool = False) -> None:
        target = self.schedule.sparsity_at(step)
        if target > 0:  # nothing to compute at zero sparsity (initial masks are already in)
            g = torch.Generator().manual_seed(self.seed)
            scores = {}
            for n, p in self.params.items():
                s = (self._fixed_scores[n].clone() if self._fixed_scores is not None
                     else self._criterion(p, None, g))
                scores[n] = s.masked_fill_(self._pruned[n], float("-inf"))  # pruned go first: nested
            new = self._scope(scores, target)
            self.masks = {n: new[n].to(self.masks[n].device) & self.masks[n] for n in self.params}
            self._pruned = {n: ~m for n, m in self.masks.items()}
        assert_same_across_ranks(tensor_checksum(self.masks), f"pruning masks at step {step}")
        self.last_pruned_step = step
        pruned = sum(int(torch.count_nonzero(m)) for m in self._pruned.values())
        total = sum(m.numel() for m in self.masks.values())
        self.history.append({"step": step, "target": round(target, 6), "sparsity": pruned / total,
                             **({"at_finalize": True} if at_finalize else {})})

    def state_dict(self) -> dict:
        return {"masks": {n: m.cpu() for n, m in self.masks.items()}, "phase": self.phase,
                "last_pruned_step": -1 if self.last_pruned_step is None else self.last_pruned_step,
                "history": json.dumps(self.history)}

    def load_state_dict(self, state: dict) -> None:
        self.masks = {n: state["masks"][n].to(self.masks[n].device if n in self.masks else "cpu")
                      for n in self.params}
        self._pruned = {n: ~m for n, m in self.masks.items()}
        self.phase = state["phase"]
        last = int(state["last_pruned_step"])
        self.last_pruned_step = None if last < 0 else last
        self.history = json.loads(state["history"])
        self.apply_masks()


# The name it had while magnitude was its only criterion; kept so existing code keeps working.
MagnitudePruner = ScheduledPruner


def check_pattern_fits(pattern: NMPattern, params: dict[str, torch.Tensor], criterion: str = "magnitude",
                       scope: str = "local", sparsity: float | None = None) -> None:
    """UsageError in one line when an N:M pattern cannot prune ``params`` as asked: another criterion
    or scope, a final sparsity other than N/M, or a matrix whose input (last) dimension is not a
    multiple of M (the first such matrix named)."""
    if criterion == "random":
        raise UsageError(f"--pattern {pattern} prunes the lowest-scoring weights of each group; drop "
                         f"--criterion '{criterion}' (magnitude, wanda or sparsegpt)")
    if scope != "local":
        raise UsageError(f"--pattern {pattern} prunes every group of every matrix alike (no threshold "
                         f"across matrices); drop --scope '{scope}'")
    if sparsity is not None and abs(sparsity - pattern.sparsity) > 1e-9:
        raise UsageError(f"--pattern {pattern} prunes {pattern.n} of every {pattern.m} weights, "
                         f"sparsity {pattern.sparsity:g} by definition, not {sparsity:g}; drop "
                         "--sparsity or set it to that")
    misfits = [n for n, p in params.items() if not pattern.fits(tuple(p.shape))]
    if misfits:
        name = misfits[0]
        more = f" (and {len(misfits) - 1} more)" if len(misfits) > 1 else ""
        raise UsageError(f"--pattern {pattern} groups {pattern.m} weights along each pruned matrix's "
                         f"input (last) dimension, but {name} is {list(params[name].shape)}{more}; "
                         f"leave it out with --exclude '{name}' or choose an M that divides it")


class _MaskGuard:
    """The integrity check a hook runs after every optimizer step: ``module`` still holds the very
    tensors the masks were just applied to, so a replaced or re-tied parameter cannot silently
    escape its mask. (A full pass comparing every masked weight with zero right after the masks
    were applied to those same tensors could not fail; the full check runs on the saved model
    after it is loaded back, in ``write_masks_and_sparsity`` and ``KeepMasksHook.save``.)
    """

    def __init__(self, module: torch.nn.Module):
        self.module = module

    def __call__(self, params: dict[str, torch.Tensor]) -> None:
        live = named_weights(self.module)
        for n, p in params.items():
            if live.get(n) is not p:
                raise IntegrityError(f"parameter {n} was replaced during training, so its mask no longer "
                                     "applies to the model's weights")


class PruningHook(TrainHook):
    """Drives a ``ScheduledPruner`` from the training loop and checks ``module`` after each step."""

    def __init__(self, pruner: ScheduledPruner, module: torch.nn.Module):
        self.pruner, self.module = pruner, module
        self.guard = _MaskGuard(module)

    def on_train_begin(self, model, total_steps: int) -> None:
        if self.pruner.phase == "new":
            self.pruner.initialize()

    def on_after_backward(self, model) -> None:
        self.pruner.mask_grads()

    def on_step_end(self, model, step: int) -> None:
        self.pruner.step(step)
        self.guard(self.pruner.params)

    def state_dict(self) -> dict:
        return self.pruner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.pruner.load_state_dict(state)


class KeepMasksHook(TrainHook):
    """Fine-tuning a pruned model: re-apply its fixed masks after every optimizer step.

    AdamW's moments and weight decay would move pruned weights off zero; zeroing them after each
    step keeps the zero pattern bit-identical. ``save`` writes the masks beside the saved model.
    """

    def __init__(self, module: torch.nn.Module, masks: dict[str, torch.Tensor], meta: dict):
        self.module, self.meta = module, meta
        params = named_weights(module)
        self.params = {n: params[n] for n in masks}
        self.masks = {n: m.to(self.params[n].device) for n, m in masks.items()}
        self._pruned = {n: ~m for n, m in self.masks.items()}
        self.guard = _MaskGuard(module)

    def on_train_begin(self, model, total_steps: int) -> None:
        apply_masks(self.params, self.masks, self._pruned)

    def on_after_backward(self, model) -> None:
        mask_grads(self.params, self._pruned)

    def on_step_end(self, model, step: int) -> None:
        apply_masks(self.params, self.masks, self._pruned)
        self.guard(self.params)

    def save(self, run_path: Path) -> None:
        model_dir = Path(run_path) / "model"
        save_masks(self.masks, model_dir / MASKS_FILE)
        add_meta(model_dir, {"pruning": {**self.meta, "kept_masks": True}})
        from compress.pruning.integrity import load_saved_model

        check_masks(load_saved_model(model_dir), self.masks)


class InformationDeletionHook(TrainHook):
    """The paper's control: zero the pruned weights once, then let them regrow (no masks kept)."""

    def __init__(self, module: torch.nn.Module, masks: dict[str, torch.Tensor], meta: dict):
        params = named_weights(module)
        self.params = {n: params[n] for n in masks}
        self.masks = {n: m.to(self.params[n].device) for n, m in masks.items()}
        self.meta = meta
        self.applied = False

    def on_train_begin(self, model, total_steps: int) -> None:
        if not self.applied:
            apply_masks(self.params, self.masks)
            self.applied = True

    def save(self, run_path: Path) -> None:
        add_meta(Path(run_path) / "model", {"information_deletion": {**self.meta}})


def add_meta(model_dir: Path, extra: dict) -> None:
    """Merge ``extra`` into the saved model's ``compress.json``."""
    f = model_dir / "compress.json"
    meta = json.loads(f.read_text(encoding="utf-8")) if f.is_file() else {}
    meta.update(extra)
    f.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


def matching_masks(module: torch.nn.Module, masks: dict[str, torch.Tensor]) -> tuple[dict, list[str]]:
    """The masks whose parameter exists with the same shape (a fresh task head drops out)."""
    params = named_weights(module)
    keep, dropped = {}, []
    for n, m in masks.items():
        if n in params and tuple(params[n].shape) == tuple(m.shape):
            keep[n] = m
        else:
            dropped.append(n)
    return keep, dropped


def fine_tuning_hooks(module: torch.nn.Module, model_dir: str | Path, information_deletion: bool = False,
                      hook_factory=None) -> list[TrainHook]:
    """The hooks of a fine-tuning workflow: ``hook_factory(module)``'s (pruning, when the run
    prunes), then those that keep the saved model's masks (``saved_mask_hooks``). When a
    ``PruningHook`` is among the first, it started from those masks (they only shrink) and writes
    the new ones, so no kept-masks hook is added: it would write the old masks over them."""
    hooks = list(hook_factory(module)) if hook_factory else []
    if any(isinstance(h, PruningHook) for h in hooks):
        return hooks
    return hooks + saved_mask_hooks(module, model_dir, information_deletion)


def saved_mask_hooks(module: torch.nn.Module, model_dir: str | Path,
                     information_deletion: bool = False) -> list[TrainHook]:
    """Hooks for fine-tuning the model saved in ``model_dir``: keep its masks (default), or with
    ``information_deletion`` zero the same weights once and let them regrow. [] for a dense model."""
    model_dir = Path(model_dir)
    has_masks = (model_dir / MASKS_FILE).is_file()
    if not has_masks:
        if information_deletion:
            raise UsageError(f"--information-deletion needs a pruned model, but {model_dir} has no "
                             f"{MASKS_FILE}; pass a run folder written by 'compress prune'")
        return []
    masks, dropped = matching_masks(module, load_masks(model_dir / MASKS_FILE))
    meta_file = model_dir / "compress.json"
    saved = json.loads(meta_file.read_text(encoding="utf-8")) if meta_file.is_file() else {}
    meta = {**saved.get("pruning", {}), "masks_from": str(model_dir)}
    if dropped:
        meta["dropped_masks"] = dropped
    if information_deletion:
        return [InformationDeletionHook(module, masks, meta)]
    return [KeepMasksHook(module, masks, meta)]
