"""Extractive question answering: features, post-processing, the official metric, loss plug-ins."""
