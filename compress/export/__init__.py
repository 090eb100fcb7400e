"""export building blocks."""
