"""compress: magnitude pruning, distillation, measurement and export for BERT-family encoders."""

__version__ = "0.1.0"
