"""Hugging Face checkpoint -> `.ninfer` conversion (`ninfer convert`)."""
from ninfer.convert.cache import ensure_converted
from ninfer.convert.converter import convert, frontend_resources
from ninfer.convert.source import ConvertError

__all__ = ["ConvertError", "convert", "ensure_converted", "frontend_resources"]
