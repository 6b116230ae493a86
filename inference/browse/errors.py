"""Hub errors as one sentence, for browsing (searching, reading a repository's variants)."""

from __future__ import annotations

import os

from ..errors import ModelSourceError
from ..sources.hub import LOGIN

OFFLINE_TEXT = (
    "The Hugging Face hub is not used while HF_HUB_OFFLINE is set, so only the models on this machine are listed."
)


def offline() -> bool:
    # lazy: the hub client loads only when the hub is used
    from huggingface_hub import constants

    env = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    return env or bool(getattr(constants, "HF_HUB_OFFLINE", False))


def check_online() -> None:
    if offline():
        raise ModelSourceError(OFFLINE_TEXT, "Unset HF_HUB_OFFLINE to search the hub.")


PROBE_TIMEOUT_S = 5.0


def check_reachable(what: str) -> None:
    """One quick request to the hub, without retries, before a call that would retry: huggingface_hub's backoff
    tries a failed connection five more times with growing waits (about 30 s on a machine without network),
    where a user deserves the sentence at once. Any HTTP answer means the hub is reachable."""
    # lazy: the hub client loads only when the hub is used
    from huggingface_hub import constants

    # lazy: the hub client loads only when the hub is used
    from huggingface_hub.utils import get_session

    try:
        get_session().get(
            f"{constants.ENDPOINT}/api/models", params={"limit": 1}, timeout=PROBE_TIMEOUT_S, follow_redirects=True
        )
    except Exception as exc:
        raise explain(what, exc) from exc


def explain(what: str, exc: BaseException) -> ModelSourceError:
    """``exc`` (raised while ``what``, e.g. "searching the hub") as one sentence a user can act on."""
    # lazy: the hub client loads only when the hub is used
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, OfflineModeIsEnabled, RepositoryNotFoundError

    if isinstance(exc, ModelSourceError):
        return exc
    if isinstance(exc, OfflineModeIsEnabled):
        return ModelSourceError(OFFLINE_TEXT, "Unset HF_HUB_OFFLINE to search the hub.")
    if isinstance(exc, GatedRepoError):
        return ModelSourceError(
            f"Could not finish {what}: the model is gated, its authors ask you to accept their terms first.",
            f"Accept them on the model's page on the Hugging Face hub, then {LOGIN}.",
        )
    if isinstance(exc, RepositoryNotFoundError):
        return ModelSourceError(
            f"Could not finish {what}: the repository was not found on the Hugging Face hub, or it is private.",
            f"Check the id; for a private model, {LOGIN}.",
        )
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, HfHubHTTPError) and status in (401, 403):
        return ModelSourceError(
            f"The Hugging Face hub refused {what} (HTTP {status}).", f"If the model is private or gated, {LOGIN}."
        )
    if isinstance(exc, HfHubHTTPError):
        return ModelSourceError(f"The Hugging Face hub answered HTTP {status} while {what}.", "Try again later.")
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return ModelSourceError(
        f"Could not reach the Hugging Face hub while {what} ({text}).",
        "Check your connection; the models on this machine are still listed.",
    )
