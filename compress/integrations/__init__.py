"""Integrations with other training libraries (``hf_trainer``: ``transformers.Trainer``)."""
