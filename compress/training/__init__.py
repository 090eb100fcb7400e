"""Training: the fine-tuning loop that pruning and distillation hook into, its finite-loss guard,
experiment trackers, and one evaluation for every runtime."""
