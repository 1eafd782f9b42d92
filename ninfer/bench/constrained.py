"""The constrained-decoding rows of `ninfer bench decode --json-schema-mask`: the compile time of a 50-field
JSON schema, and the decode round with that schema's mask on every row beside the unconstrained round.

    compile   the Frontend's `compile_constraint` of SCHEMA_50 (cold: a new (kind, spec), the vocabulary's
              grammar view already built; median of COMPILE_REPS variants) and of a cache hit
    decode    per B, B greedy requests with the schema as their constraint (50 required fields: no row
              completes within the bench's budget), timed like the plain rows; `mask_ratio` is the
              constrained round / the plain round of the same B and context
"""
from __future__ import annotations

import json
import statistics
import time

COMPILE_REPS = 5


def schema_50(variant: int = 0) -> dict:
    """A 50-field object schema: strings with a length bound, bounded integers, numbers, booleans, enums,
    all required (`variant` renames the fields: a new schema for the compile cache)."""
    kinds = [{"type": "string", "maxLength": 24}, {"type": "integer", "minimum": 0, "maximum": 100000},
             {"type": "number"}, {"type": "boolean"}, {"enum": ["red", "green", "blue", "unknown"]}]
    props = {f"field_{variant}_{i}": kinds[i % len(kinds)] for i in range(50)}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def constraint(variant: int = 0):
    from ninfer.contract.frontend import OutputConstraint
    return OutputConstraint("json_schema", json.dumps(schema_50(variant)), "bench")


def compile_row(frontend) -> dict:
    """The compile time of a 50-field schema: the first compile (the grammar library's view of the vocabulary
    built on the way, reported apart), then cold compiles of new schemas and a cache hit, in ms."""
    t0 = time.perf_counter()
    frontend.compile_constraint(constraint(0))
    first_ms = (time.perf_counter() - t0) * 1e3
    cold = []
    for v in range(1, COMPILE_REPS + 1):
        t0 = time.perf_counter()
        frontend.compile_constraint(constraint(v))
        cold.append((time.perf_counter() - t0) * 1e3)
    t0 = time.perf_counter()
    frontend.compile_constraint(constraint(1))
    hit_ms = (time.perf_counter() - t0) * 1e3
    return dict(kind="compile", fields=50, first_ms=first_ms, compile_ms=statistics.median(cold),
                compile_max_ms=max(cold), cache_hit_ms=hit_ms)
