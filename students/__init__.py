"""Student models for distillation; one file per student and the registry in ``registry.py``."""

from students.registry import STUDENTS, StudentEntry, build_student, get_student, load_student

__all__ = ["STUDENTS", "StudentEntry", "build_student", "get_student", "load_student"]
