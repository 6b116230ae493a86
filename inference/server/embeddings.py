"""OpenAI's embeddings endpoint (``POST /v1/embeddings``): the request as the server reads it (strict), the job that
embeds on the engine's thread (where the model lives), and the response (floats, or base64 of little-endian float32
as OpenAI's ``encoding_format: "base64"`` is)."""

from __future__ import annotations

import base64
import struct
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from ..errors import RedlineError


class EmbeddingsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: str = Field(min_length=1)
    input: Union[str, list[str], list[int], list[list[int]]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[int] = None
    user: Optional[str] = None  # accepted and ignored

    def unsupported(self) -> None:
        """What the server refuses beyond the fields' own checks: nothing here (read by ``Preparation.read``)."""
        return None

    def texts(self) -> list:
        """The inputs: strings, or token-id lists."""
        if isinstance(self.input, str):
            return [self.input]
        if self.input and isinstance(self.input[0], int):
            return [list(self.input)]
        return list(self.input)


def embeddings_job(inputs: list):
    """A job for ``EngineService.call``: (vectors, tokens, model name) from the model loaded."""

    def job(engine, report):
        target = engine.target
        if target is None:
            raise RedlineError("No model is loaded.", "Load a model first.")
        vectors, tokens = target.embed(inputs)
        return vectors, tokens, target.name

    return job


def _base64(vector: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def embeddings_response(vectors: list, tokens: int, name: str, encoding: str) -> dict:
    data = [
        {"object": "embedding", "index": i, "embedding": _base64(v) if encoding == "base64" else v}
        for i, v in enumerate(vectors)
    ]
    return {
        "object": "list",
        "data": data,
        "model": name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
