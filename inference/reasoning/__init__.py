"""Reasoning models: their format found from the chat template (``formats.py``), the one streaming parser that splits
a reply into reasoning and answer (``parser.py``), thinking switched on, off, to an effort and within a budget in each
family's own way (``switch.py``), and a reply split as it runs (``split.py``)."""

from .formats import EFFORTS, FORMATS, ReasoningFormat, detect
from .parser import ReasoningStream, Split, prompt_state
from .switch import PromptPlan, Thinking, ThinkingBudget, plan

__all__ = [
    "EFFORTS",
    "FORMATS",
    "PromptPlan",
    "ReasoningFormat",
    "ReasoningStream",
    "Split",
    "Thinking",
    "ThinkingBudget",
    "detect",
    "plan",
    "prompt_state",
]
