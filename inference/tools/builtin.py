"""Redline's own tools, which need no network and no server: ``read_file`` (a file the user allowed, read as the
chat's attachments are: PDF, DOCX, Markdown, text, source) and ``calculate`` (arithmetic, evaluated over Python's
``ast`` with nothing but numbers, operators and a few math functions, each result bounded in size)."""

from __future__ import annotations

import ast
import math
import operator
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from ..attachments.read import read_attachment
from ..attachments.types import AttachmentError, Document
from ..errors import RedlineError
from .mcp_client import ToolResult

READ_FILE = "read_file"
CALCULATE = "calculate"
MAX_READ_CHARS = 20_000  # of a file's text, per call (``offset`` reads on)
MAX_EXPRESSION = 500  # characters
EXPRESSION_PATTERN = r"^[0-9a-z_+\-*/%^()., ]+$"
MAX_INT_BITS = 4_000  # about 1,200 digits: below Python's 4,300-digit limit on int -> str
MAX_FACTORIAL = 300


class CalculationError(RedlineError):
    """An expression ``calculate`` refuses or cannot evaluate: one sentence saying why."""


# -- calculate -----------------------------------------------------------------------------------------------
_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_CONSTANTS = {"pi": math.pi, "e": math.e, "tau": math.tau}


def _factorial(n):
    if not isinstance(n, int) or n < 0:
        raise CalculationError("factorial takes a whole number of 0 or more.")
    if n > MAX_FACTORIAL:
        raise CalculationError(f"factorial({n}) is too large; calculate takes factorials up to {MAX_FACTORIAL}.")
    return math.factorial(n)


_FUNCTIONS: dict[str, Callable] = {
    "sqrt": math.sqrt,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "asin": math.asin,
    "acos": math.acos,
    "atan": math.atan,
    "atan2": math.atan2,
    "log": math.log,
    "log10": math.log10,
    "log2": math.log2,
    "exp": math.exp,
    "abs": abs,
    "round": round,
    "floor": math.floor,
    "ceil": math.ceil,
    "hypot": math.hypot,
    "degrees": math.degrees,
    "radians": math.radians,
    "factorial": _factorial,
    "min": min,
    "max": max,
}
FUNCTION_NAMES = ", ".join(_FUNCTIONS)


def calculate(expression: str) -> str:
    """The value of an arithmetic ``expression`` as text ("42", "0.3", "1.4142135623731"); raises
    CalculationError with a sentence for anything else (names, attributes, calls other than the math functions,
    strings, results too large)."""
    if not isinstance(expression, str) or not expression.strip():
        raise CalculationError("There is no expression to calculate.")
    if len(expression) > MAX_EXPRESSION:
        raise CalculationError(f"The expression is longer than {MAX_EXPRESSION} characters.")
    try:
        tree = ast.parse(expression.strip().replace("^", "**"), mode="eval")
    except SyntaxError as exc:
        raise CalculationError(f"{expression!r} is not an arithmetic expression ({exc.msg}).") from None
    except (RecursionError, MemoryError, ValueError):
        raise CalculationError("The expression is nested too deeply.") from None
    try:
        value = _eval(tree.body)
    except CalculationError:
        raise
    except ZeroDivisionError:
        raise CalculationError("The expression divides by zero.") from None
    except OverflowError:
        raise CalculationError("The result is too large to calculate.") from None
    except RecursionError:
        raise CalculationError("The expression is nested too deeply.") from None
    except (ValueError, TypeError) as exc:
        raise CalculationError(f"The expression cannot be evaluated: {exc}.") from None
    return _format(value)


def _eval(node: ast.AST):
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise CalculationError(f"calculate takes numbers only, not {type(node.value).__name__} values.")
        return _checked(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        return _checked(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Name):
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        raise CalculationError(f"calculate does not know {node.id!r}; it knows pi, e, tau and {FUNCTION_NAMES}.")
    if isinstance(node, ast.Call):
        name = node.func.id if isinstance(node.func, ast.Name) else None
        if name not in _FUNCTIONS or node.keywords:
            shown = name or ast.unparse(node.func)
            raise CalculationError(f"calculate cannot call {shown!r}; it calls {FUNCTION_NAMES} only.")
        return _checked(_FUNCTIONS[name](*(_eval(a) for a in node.args)))
    raise CalculationError(
        f"calculate takes numbers, + - * / // % **, parentheses and {FUNCTION_NAMES}; "
        f"{ast.unparse(node)!r} is none of those."
    )


def _check_power(base, exponent) -> None:
    """Refuses a power whose result would be too large to compute quickly (``9**9**9``)."""
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
        if math.log2(abs(base)) * exponent > MAX_INT_BITS:
            raise CalculationError("The result is too large to calculate (a power of more than about 1,200 digits).")
    elif isinstance(exponent, (int, float)) and abs(exponent) > 1e6 and abs(base) not in (0, 1):
        raise CalculationError("The power's exponent is too large.")


def _checked(value):
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_INT_BITS:
        raise CalculationError("The result is too large to calculate (more than about 1,200 digits).")
    if isinstance(value, complex):
        raise CalculationError("The result is not a real number.")
    return value


def _format(value) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.15g}"


# -- the tools -------------------------------------------------------------------------------------------------
class BuiltinTools:
    """``read_file`` over ``allowed`` (files, or folders whose files it may read; none: the tool is not offered) and
    ``calculate``; ``definitions()`` are their OpenAI function tools, ``call`` runs one."""

    def __init__(self, allowed: Sequence[str | Path] = (), calculator: bool = True, max_chars: int = MAX_READ_CHARS):
        self.allowed = [Path(p).expanduser().resolve() for p in allowed]
        self.calculator = calculator
        self.max_chars = max_chars

    @property
    def names(self) -> list[str]:
        return [d["function"]["name"] for d in self.definitions()]

    def definitions(self) -> list[dict]:
        tools = []
        if self.allowed:
            listed = ", ".join(str(p) + ("/" if p.is_dir() else "") for p in self.allowed[:20])
            tools.append(
                _function(
                    READ_FILE,
                    "Read a text file the user allowed (PDF, DOCX, Markdown, text or source code) and return its "
                    f"text, {self.max_chars:,} characters at a time. Allowed: {listed}",
                    {
                        "path": {"type": "string", "description": "the file's path (one of the allowed)"},
                        "offset": {
                            "type": "integer",
                            "minimum": 0,
                            "description": "the character to start at (to read on in a long file); default 0",
                        },
                    },
                    ["path"],
                )
            )
        if self.calculator:
            tools.append(
                _function(
                    CALCULATE,
                    "Evaluate an arithmetic expression exactly: numbers, + - * / // % ** (or ^), parentheses, "
                    f"pi, e and the functions {FUNCTION_NAMES}.",
                    {
                        "expression": {
                            "type": "string",
                            "maxLength": MAX_EXPRESSION,
                            # what an expression can hold: a model constrained by the call grammar writes no other
                            # characters (a small model otherwise wrote '}}  # 17*23 = 342.222…' until its limit)
                            "pattern": EXPRESSION_PATTERN,
                            "description": "e.g. sqrt(2)*3",
                        }
                    },
                    ["expression"],
                )
            )
        return tools

    def call(self, name: str, arguments: dict) -> ToolResult:
        start = time.perf_counter()
        try:
            if name == CALCULATE and self.calculator:
                result = ToolResult(calculate(arguments.get("expression", "")))
            elif name == READ_FILE and self.allowed:
                result = ToolResult(self.read_file(arguments.get("path", ""), arguments.get("offset", 0)))
            else:
                result = ToolResult(f"There is no built-in tool named {name!r}.", True)
        except RedlineError as exc:
            result = ToolResult(str(exc), True)
        result.ms = (time.perf_counter() - start) * 1000
        return result

    def read_file(self, path: str, offset: Any = 0) -> str:
        """The text of ``path`` from character ``offset``, at most ``max_chars`` of it with a line saying how to read
        on; raises RedlineError for a path outside the allowed ones, a missing file, an image."""
        target = self.resolve(path)
        try:
            attachment = read_attachment(target)
        except AttachmentError as exc:
            raise RedlineError(str(exc)) from None
        if not isinstance(attachment, Document):
            raise RedlineError(f"{target.name} is an image; read_file reads text.")
        text = attachment.text
        start = offset if isinstance(offset, int) and not isinstance(offset, bool) and offset > 0 else 0
        part = text[start : start + self.max_chars]
        end = start + len(part)
        if end < len(text):
            part += (
                f"\n\n[characters {start:,} to {end:,} of {len(text):,}; call read_file with offset {end} to read on]"
            )
        return part

    def resolve(self, path: str) -> Path:
        """``path`` as one of the allowed files (a relative path or a bare name is looked for among them), or
        RedlineError naming it."""
        if not isinstance(path, str) or not path.strip():
            raise RedlineError("read_file needs a path.")
        given = Path(path.strip()).expanduser()
        candidates = [given] if given.is_absolute() else [p / given for p in self.allowed if p.is_dir()]
        if not given.is_absolute():
            candidates += [p for p in self.allowed if p.is_file() and p.name == given.name and len(given.parts) == 1]
        missing = False
        for candidate in candidates:
            try:
                real = candidate.resolve()
            except (OSError, RuntimeError):
                continue
            if self._allowed(real):
                if real.exists():
                    return real
                missing = True
        if missing:
            raise RedlineError(f"{path} does not exist.")
        raise RedlineError(
            f"{path} is not among the files the user allowed read_file to read.",
            "Ask the user to allow it (in the CLI, --allow-read PATH).",
        )

    def _allowed(self, real: Path) -> bool:
        return any(real == p or (p.is_dir() and real.is_relative_to(p)) for p in self.allowed)


def _function(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }
