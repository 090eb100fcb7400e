"""distill building blocks."""
