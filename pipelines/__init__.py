"""Staged workflows built on the library; the library never imports this package."""
