"""What the python models here share to read Triton requests and answer them: inputs, responses,
errors, ONNX Runtime sessions on the GPU where there is one, and runs stopped when cancelled.
Written next to `model.py`; numpy, onnxruntime and Triton's `triton_python_backend_utils` only.
"""

import ctypes
import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils
import triton_sam_contract as contract

CANCEL_POLL_S = 0.003


class Cancelled(Exception):
    """Every request of a run was cancelled by its client while it ran; the run was stopped."""


class UnknownHandle(KeyError):
    """The handle was never encoded here or has been evicted."""


class UnknownMemory(KeyError):
    """A mask memory handle was never made here or has been evicted."""


class UnknownMaskInput(KeyError):
    """A mask input key names logits never kept here or evicted."""


def cuda_devices() -> int:
    """The CUDA devices this process sees (`CUDA_VISIBLE_DEVICES` applies) that ONNX Runtime could
    use: 0 without a driver, a device or ONNX Runtime's CUDA provider."""
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return 0
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        count = ctypes.c_int(0)
        return count.value if cuda.cuInit(0) == 0 and cuda.cuDeviceGetCount(ctypes.byref(count)) == 0 else 0
    except OSError:
        return 0


def ort_session(path: Path, device_id: int = 0, fixed: dict | None = None) -> "ort.InferenceSession":
    """An ONNX Runtime session on GPU `device_id` when there is a GPU (asking for CUDA without one
    only logs errors), with `contract.CUDA_PROVIDER_OPTIONS`. ONNX Runtime falls back to the CPU
    when it cannot load its CUDA libraries (CUDA and cuDNN of its build: pip's nvidia-* packages, or
    the system's): said in Triton's log.

    On the CPU, with ONNX Runtime's arena but no memory patterns (planned per input shape, each a
    second block): runs with a large peak give the arena's unused memory back as they end
    (`released`). Without the arena every intermediate is a fresh allocation, its pages faulted in
    anew: a ViT-B encode took 10.4 s instead of 6.7 s, a one-point decode 64 ms instead of 34 ms
    (`vit_b_lm`, 2-core CPU). `fixed`: symbolic dimensions (name -> size) fixed in this session."""
    providers: list = ["CPUExecutionProvider"]
    if cuda_devices() > 0:
        if hasattr(ort, "preload_dlls"):
            ort.preload_dlls()  # from pip's nvidia-* packages, where installed
        providers.insert(0, ("CUDAExecutionProvider", {"device_id": device_id, **contract.CUDA_PROVIDER_OPTIONS}))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if providers == ["CPUExecutionProvider"]:
        options.enable_mem_pattern = False
    for name, size in (fixed or {}).items():
        options.add_free_dimension_override_by_name(name, size)
    session = ort.InferenceSession(str(path), options, providers=providers)
    if len(providers) > 1 and "CUDAExecutionProvider" not in session.get_providers():
        pb_utils.Logger.log_warn(
            f"{path}: this machine has a GPU, but ONNX Runtime {ort.__version__} could not load its CUDA "
            "libraries (the CUDA and cuDNN versions it was built for): running on the CPU"
        )
    return session


def released(session: "ort.InferenceSession", options: "ort.RunOptions | None" = None) -> "ort.RunOptions | None":
    """`options` (new ones if None) for a run of `session` with a large peak (an encode, the instance
    decoder, a decode of several prompt sets), set on the CPU to give the arena's unused memory back
    when the run ends; an arena otherwise keeps its largest run's intermediates for good. GPU
    sessions' options as they are. Small, frequent runs (one prompt set's decode) keep theirs."""
    if session.get_providers() != ["CPUExecutionProvider"]:
        return options
    options = ort.RunOptions() if options is None else options
    options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    return options


def cancelled() -> "pb_utils.InferenceResponse":
    return error_response("request cancelled before it ran", pb_utils.TritonError.CANCELLED)


def failure(error: Exception) -> "pb_utils.InferenceResponse":
    """The error response for a request that could not be served."""
    if isinstance(error, Cancelled):
        return error_response("request cancelled while it ran", pb_utils.TritonError.CANCELLED)
    if isinstance(error, UnknownHandle):
        message = f"{contract.UNKNOWN_HANDLE}: no embedding for handle {error.args[0]} (evicted or never encoded)"
        return error_response(message, pb_utils.TritonError.NOT_FOUND)
    if isinstance(error, UnknownMemory):
        message = f"{contract.UNKNOWN_MEMORY}: no mask memory {error.args[0]} (evicted or never made)"
        return error_response(message, pb_utils.TritonError.NOT_FOUND)
    if isinstance(error, UnknownMaskInput):
        message = f"{contract.UNKNOWN_MASK_INPUT}: no kept mask logits {error.args[0]} (evicted or never kept)"
        return error_response(message, pb_utils.TritonError.NOT_FOUND)
    return error_response(f"invalid request: {error}", pb_utils.TritonError.INVALID_ARG)


def response(names: list, arrays: list) -> "pb_utils.InferenceResponse":
    return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, a) for n, a in zip(names, arrays)])


def requested_outputs(request, available) -> list:
    """The outputs the client asked for (all of them if it did not say)."""
    return [n for n in request.requested_output_names() if n in available] or list(available)


def run_cancellable(run, requests: list) -> list:
    """`run(options)` of an ONNX Runtime session, stopped (`options.terminate`) as soon as every
    request is cancelled.

    A hover decode superseded while it runs thus frees the instance within milliseconds instead
    of making the newest request wait behind it.
    """
    options = ort.RunOptions()
    finished = threading.Event()

    def watch() -> None:
        while not finished.wait(CANCEL_POLL_S):
            if all(r.is_cancelled() for r in requests):
                options.terminate = True
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        return run(options)
    except Exception as error:
        if options.terminate:
            raise Cancelled() from error
        raise
    finally:
        finished.set()
        watcher.join()


def required(request, name: str) -> np.ndarray:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        raise ValueError(f"this request needs input '{name}'")
    return tensor.as_numpy()


def flag(request, name: str) -> bool:
    """Whether the request sends input `name` set (any of its values true)."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return tensor is not None and bool(tensor.as_numpy().any())


def text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def error_response(message: str, code) -> "pb_utils.InferenceResponse":
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))
