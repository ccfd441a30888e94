"""Source lines of profiled ops (capture/profiled.py): the caller line of the innermost call made
from user code; and for ops a user frame ran itself through operator slots (`x - y`: no call of
their own, so no line recorded), a line inferred from the frame's calls and the statement's AST.
"""

from __future__ import annotations

import ast
import os
import re
import sys

import torch

from .opgraph import shown_path

SKIP_DIRS = (os.path.dirname(os.path.dirname(__file__)), os.path.dirname(torch.__file__))
FRAME = re.compile(r"(.+)\((\d+)\): ")  # how the profiler names a Python function's frame
_ABSOLUTE: dict[str, str] = {}


def absolute(path: str) -> str:
    """The profiler names a file relative to the sys.path entry it was imported from."""
    if path not in _ABSOLUTE:
        found = path
        if not os.path.isabs(path):
            for base in sys.path:
                candidate = os.path.join(base or os.getcwd(), path)
                if os.path.exists(candidate):
                    found = os.path.abspath(candidate)
                    break
        _ABSOLUTE[path] = found
    return _ABSOLUTE[path]


_TAILS: dict[str, dict[int, int]] = {}
_SLOTS = (ast.BinOp, ast.UnaryOp, ast.Subscript, ast.Compare)


def _tail_lines(path: str) -> dict[int, int]:
    """line -> how many operator-slot expressions (`a @ b`, `x[i]`, `-y`) its statement
    evaluates after its last call (an upper bound on the tensor ops that follow that call), for
    the statements where there are any; an augmented assignment counts its in-place op."""
    if path not in _TAILS:
        lines: dict[int, int] = {}
        try:
            tree = ast.parse(open(path).read())
        except (OSError, SyntaxError, ValueError):
            tree = None
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, (ast.Assign, ast.Return, ast.Expr, ast.AnnAssign, ast.AugAssign)):
                if node.value is None:
                    continue
                after = 0
                for sub in _post_order(node.value):
                    if isinstance(sub, ast.Call):
                        after = 0
                    elif isinstance(sub, _SLOTS):
                        after += 1
                after += isinstance(node, ast.AugAssign)
                if after:
                    for ln in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                        lines[ln] = after
        _TAILS[path] = lines
    return _TAILS[path]


def _post_order(node):
    """Expression nodes in the order Python evaluates them (operands before their operation)."""
    for child in ast.iter_child_nodes(node):
        yield from _post_order(child)
    yield node


def caller_line(stack) -> str:
    """The user line of an op reached through Python calls (stack: the Python call events
    around it, innermost last): the caller line of the innermost call made from user code."""
    for ev in reversed(stack):
        caller = ev.extra_fields.caller
        shown = shown_path(absolute(caller.file_name), SKIP_DIRS)
        if shown is not None:
            return f"{shown}:{caller.line_number}"
    return "?"


def frame_shown(name: str, cache: dict) -> str | None:
    """How the file of a Python function's frame (the profiler's "path(LINE): name") is shown;
    None when it is not user code. cache: name -> answer (a step makes many calls of few
    functions)."""
    if name not in cache:
        m = FRAME.match(name)
        cache[name] = None if m is None else shown_path(absolute(m.group(1)), SKIP_DIRS)
    return cache[name]


def resolve_slots(frame_name: str, shown: str, items: list, made_in) -> None:
    """Set the lines of the slot ops of one user frame. items, in order: ("call", line, (start,
    end)) for each call made from the frame, ("slot", [line], allocations read, (start, end)) for
    each op it ran itself. made_in(allocations, ranges): whether one of them was made in one of
    the ranges.

    An op between two calls of the same line is on that line; with no call after it, on the last
    call's line; with none before, on the next call's (or the function's first line). Between
    calls of lines P and N the ops on P come first: an op stays on P while P's statement goes on
    after its last call (`q @ k.T / math.sqrt(d)`, `softmax(s) @ v`) and either it reads what P
    made or it is among the first few after the call, as many as P's statement has operator
    expressions after its last call; otherwise, and for every op after it, it is on N
    (`(x - m) ** 2` before `.mean()`)."""
    m = FRAME.match(frame_name)
    first = int(m.group(2))
    tails = _tail_lines(absolute(m.group(1)))
    next_call: list = [None] * len(items)  # the line of the first call after each item
    nxt = None
    for k in range(len(items) - 1, -1, -1):
        next_call[k] = nxt
        if items[k][0] == "call":
            nxt = items[k][1]
    made: dict[int, list] = {}  # line -> (start, end) of its calls and slot ops, latest last
    prev = None  # (index, line) of the last call so far
    gap_moved_on = None  # the call index after which a slot op went on to the next line
    on_prev = 0  # slot ops put on the previous call's line in this gap
    for k, it in enumerate(items):
        if it[0] == "call":
            made.setdefault(it[1], []).append(it[2])
            prev, on_prev = (k, it[1]), 0
            continue
        nxt = next_call[k]
        if prev is None or nxt is None or prev[1] == nxt:
            line = prev[1] if prev is not None else nxt if nxt is not None else first
        elif (
            gap_moved_on != prev[0]
            and prev[1] in tails
            and (made_in(it[2], made.get(prev[1], ())) or on_prev < tails[prev[1]])
        ):
            line, on_prev = prev[1], on_prev + 1
        else:
            line, gap_moved_on = nxt, prev[0]
        it[1][0] = f"{shown}:{line}"
        made.setdefault(line, []).append(it[3])
