"""Pruning building blocks.

Unstructured magnitude pruning (Gordon, Duh & Andrews 2020), as pure pieces plus one stateful object:

- ``schedules``: ``sparsity_at(step)`` for oneshot and Zhu & Gupta gradual (cubic) schedules;
- ``masks``: ``mask_from_scores(scores, sparsity)``, local/global scopes, magnitude/random criteria;
- ``targets``: which parameters (Q, K, V, attention output, FFN in/out, word embeddings by default);
- ``pruner``: ``ScheduledPruner`` (initialize / step / apply_masks / finalize) and training hooks;
- ``integrity``: masked weights must stay zero (``check_masks``, ``verify_run``);
- ``mlm``: continued masked-LM pre-training (corpus, 80/10/10 masking, held-out loss).

``structured`` (whole heads / FFN neurons, by weight magnitude) is separate, and so is
``fisher_structured`` (the same removal guided by the mask Fisher under a FLOPs target, after Kwon
et al. 2022; helpers in ``fisher_masks``, ``fisher_search``, ``fisher_tuning``).
The workflows live in ``compress.recipes.prune`` (while training) and
``compress.recipes.post_training`` (once, from calibration data; its library pieces in
``compress.api.post_training``).
"""
