"""The public Python API: ``functions`` (prune, distil, measure, export inside your own code) and
the argument ``checks`` it runs at each call. ``import compress`` re-exports the public names.

Beside them, not re-exported, the stage functions the recipes share (a recipe never imports another
recipe): ``prune_stages`` (the prune config and the pieces every prune stage uses),
``post_training`` and ``embedding_prune`` (one post-training prune, on data the caller loads once),
``finetuning`` (a classifier's fine-tuning, also the teacher of ``compress distill``)."""
