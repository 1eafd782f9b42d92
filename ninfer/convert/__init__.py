"""Hugging Face checkpoint -> `.ninfer` conversion (`ninfer convert`)."""
from ninfer.convert.converter import convert, frontend_resources
from ninfer.convert.source import ConvertError

__all__ = ["ConvertError", "convert", "frontend_resources"]
