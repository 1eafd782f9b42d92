"""Stop-string matching across token boundaries.

Text that could be the start of a stop string is held back until it is decided. On a match the
text up to the stop string is released (plus the stop string with include_stop_str) and the
rest of the output is dropped.
"""
from __future__ import annotations

from typing import NamedTuple


class StopResult(NamedTuple):
    text: str          # text released now
    matched: bool      # a stop string completed


def held_len(buf: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of buf that is a proper prefix of some stop string."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(buf)), best, -1):
            if buf.endswith(stop[:n]):
                best = n
                break
    return best


def feed(held: str, text: str, stops: tuple[str, ...], include_stop_str: bool) -> tuple[StopResult, str]:
    """(what to release, the new held-back text) after appending text to held."""
    buf = held + text
    if not stops:
        return StopResult(buf, False), ""
    first, first_stop = -1, ""
    for stop in stops:
        i = buf.find(stop)
        if i >= 0 and (first < 0 or i < first or (i == first and len(stop) > len(first_stop))):
            first, first_stop = i, stop
    if first >= 0:
        end = first + (len(first_stop) if include_stop_str else 0)
        return StopResult(buf[:end], True), ""
    keep = held_len(buf, stops)
    return StopResult(buf[:len(buf) - keep], False), buf[len(buf) - keep:]
