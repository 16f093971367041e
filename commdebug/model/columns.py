"""Getters of :class:`~commdebug.model.trace.CollectiveEvent` fields, made once and run in C
(:func:`operator.attrgetter`): the analyses that work a column at a time map them over a rank's
events (``list(map(SEQ, events))``) instead of looping over the events in Python."""

from __future__ import annotations

from functools import partial
from operator import attrgetter, is_not

__all__ = ["OP", "SEQ", "STEP", "SIZE", "LATENCY", "BUSBW", "IN_FLIGHT", "INPUT_BYTES", "OUTPUT_BYTES",
           "GROUP_SIZE", "GROUP_NAME", "CALL", "MODULE", "SOURCE", "START", "SPLITS", "IS_NOT_NONE"]

OP = attrgetter("op")
SEQ = attrgetter("seq")
STEP = attrgetter("step")
SIZE = attrgetter("size_bytes")
LATENCY = attrgetter("latency_s")
BUSBW = attrgetter("busbw_factor")
IN_FLIGHT = attrgetter("in_flight")
INPUT_BYTES = attrgetter("input_bytes")
OUTPUT_BYTES = attrgetter("output_bytes")
GROUP_SIZE = attrgetter("group.size")
GROUP_NAME = attrgetter("group.name")
CALL = attrgetter("op", "size_bytes", "dtype", "module", "source")  # a call's signature and site, as check compares them
MODULE = attrgetter("module")
SOURCE = attrgetter("source")
START = attrgetter("start_s")
SPLITS = attrgetter("send_splits", "recv_splits")
IS_NOT_NONE = partial(is_not, None)
