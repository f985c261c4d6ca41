"""Exceptions raised by triton-sam; each message says what went wrong and what to do."""


class TritonSamError(Exception):
    """Base class for every error triton-sam raises on purpose."""


class InvalidInputError(TritonSamError, ValueError):
    """An image, prompt or argument that cannot be used; nothing was changed."""


class ModelNotFoundError(TritonSamError):
    """A model id that is unknown, or a model that has not been exported yet."""


class ModelFileError(TritonSamError):
    """A model file that exists but cannot be loaded (corrupt, foreign, wrong contract)."""


class CheckpointError(TritonSamError):
    """A checkpoint that cannot be read or does not match the chosen model."""


class DownloadError(TritonSamError):
    """A download that failed; no partial file is left behind."""


class DecodeCancelled(TritonSamError):
    """A decode that was cancelled before it finished."""


class ServerUnavailableError(TritonSamError):
    """A Triton server that cannot be reached or stopped answering."""


class ServerModelError(TritonSamError):
    """A Triton server that answers but does not serve the model as this client needs it."""


class ServerBusyError(TritonSamError):
    """A Triton server that answers but turned the request away for load (queue full or timed out)."""
