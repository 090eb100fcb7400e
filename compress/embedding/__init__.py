"""Sentence-embedding models: load, pool, score, prune against their own embeddings, save for
sentence-transformers."""
