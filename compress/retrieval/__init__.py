"""Sentence retrieval for ReQA: BM25 baseline, dual encoder, cross-attention supervised mining."""
