"""Student models for distillation; one file per student and the registry in ``registry.py``."""
