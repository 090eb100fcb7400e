"""pruning building blocks."""
