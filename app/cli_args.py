"""Numeric options of the subcommands, checked while the command line is read, before anything loads.

Each option states what it accepts; a value outside that is refused with one sentence naming the option,
the rule and the value given, e.g. ``--temperature must be 0 or more (0 is greedy), not -1``, and the
usual argparse exit status 2. Use the helpers as keyword arguments of ``add_argument``::

    p.add_argument("--temperature", default=None, **at_least(0.0, note="0 is greedy"))
"""

from __future__ import annotations

import argparse
import math
from typing import Callable, Optional

SEED_MAX = 2**64 - 1  # the largest seed torch.manual_seed takes


class CheckedNumber(argparse.Action):
    """Converts the option's text with ``kind`` and refuses it unless ``accepts(value)``; ``rule`` says why."""

    def __init__(self, option_strings, dest, kind=int, accepts=None, rule="", **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.kind = kind
        self.accepts: Callable = accepts or (lambda _v: True)
        self.rule = rule

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            value = self.kind(values)
        except ValueError:
            value = None
        if value is None or (isinstance(value, float) and not math.isfinite(value)) or not self.accepts(value):
            parser.error(f"{option_string} must be {self.rule}, not {values}")
        setattr(namespace, self.dest, value)


def _note(note: str) -> str:
    return f" ({note})" if note else ""


def whole_number(minimum: int, note: str = "", maximum: Optional[int] = None) -> dict:
    """An integer option: ``minimum`` or more (and at most ``maximum``)."""
    if maximum is None:
        rule = f"a whole number, {minimum} or more{_note(note)}"
    else:
        rule = f"a whole number from {minimum} to {maximum}{_note(note)}"
    top = maximum if maximum is not None else math.inf
    return dict(action=CheckedNumber, kind=int, accepts=lambda v: minimum <= v <= top, rule=rule)


def at_least(minimum: float, note: str = "") -> dict:
    """A number option: ``minimum`` or more."""
    return dict(
        action=CheckedNumber, kind=float, accepts=lambda v: v >= minimum, rule=f"{minimum:g} or more{_note(note)}"
    )


def above(minimum: float, note: str = "", maximum: Optional[float] = None) -> dict:
    """A number option: more than ``minimum`` (and at most ``maximum``)."""
    if maximum is None:
        rule, top = f"more than {minimum:g}{_note(note)}", math.inf
    else:
        rule, top = f"more than {minimum:g} and at most {maximum:g}{_note(note)}", maximum
    return dict(action=CheckedNumber, kind=float, accepts=lambda v: minimum < v <= top, rule=rule)


def _sizes(text: str) -> Optional[list[int]]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        return None
    return sizes if sizes and all(s >= 1 for s in sizes) else None


def whole_number_list() -> dict:
    """Comma-separated whole numbers, each 1 or more (e.g. batch sizes ``1,2,4,8``); read as a list."""
    return dict(
        action=CheckedNumber,
        kind=_sizes,
        accepts=lambda v: v is not None,
        rule="whole numbers, each 1 or more, separated by commas (e.g. 1,2,4,8)",
    )
