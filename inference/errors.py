"""Errors the engine raises on purpose. Each carries a one-line fix for the user."""


class RedlineError(Exception):
    """An expected failure with a message a user can act on.

    ``str(err)`` is the full sentence: what happened, then what to change.
    """

    def __init__(self, message: str, hint: str = ""):
        self.message = message
        self.hint = hint
        super().__init__(f"{message} {hint}".strip())


class ModelSourceError(RedlineError):
    """The model argument does not name anything we can load."""


class ModelLoadError(RedlineError):
    """The model was found but could not be loaded (broken folder, bad weights)."""


class UnsupportedConfiguration(RedlineError):
    """This precision/strategy/device combination cannot run on this machine."""


class IncompatibleDraft(RedlineError):
    """The draft model cannot be paired with the target model."""


class OutOfMemory(RedlineError):
    """Ran out of device or host memory; the hint names the setting to lower."""


class Cancelled(RedlineError):
    """The user cancelled a load or fetch."""

    def __init__(self, message: str = "Cancelled.", hint: str = ""):
        super().__init__(message, hint)


class StarterUnavailable(RedlineError):
    """The starter model could not be fetched (offline with nothing cached)."""


class NeedsOptIn(UnsupportedConfiguration):
    """Loading would run or unpickle code from the model folder; the user must opt in.

    ``kind`` is "remote_code" or "pickle"; ``files`` are what would run or be
    unpickled; ``fingerprint`` identifies their current content, so an opt-in can
    be remembered and asked again when a file changes.
    """

    def __init__(self, message: str, hint: str, kind: str, folder, files: list[str], fingerprint: str):
        super().__init__(message, hint)
        self.kind = kind
        self.folder = folder
        self.files = files
        self.fingerprint = fingerprint


class ContextExceeded(UnsupportedConfiguration):
    """A prompt (``what="prompt"``), or its new tokens (``what="max_new_tokens"``), does not fit the context of
    ``limit`` tokens (``prompt_tokens`` long, leaving ``room``)."""

    def __init__(
        self, message: str, hint: str = "", what: str = "prompt", prompt_tokens: int = 0, limit: int = 0, room: int = 0
    ):
        super().__init__(message, hint)
        self.what, self.prompt_tokens, self.limit, self.room = what, prompt_tokens, limit, room


class Busy(RedlineError):
    """The engine's queue is full: try again shortly (an HTTP server answers 429)."""


class Refused(RedlineError):
    """The request can never run as asked (it cannot fit, or asks for something the model cannot do)."""
