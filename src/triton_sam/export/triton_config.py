"""Write Triton `config.pbtxt` files for exported encoder and decoder models.

Encoder and decoder run on the ONNX Runtime backend with dynamic batching. The decoder's queue
rejects work that waited too long (stale hover requests), and a client may cancel queued requests
over gRPC. The session model (python backend, `server/models/python_model.py`) keeps features on
the server so that a decode request carries only a handle and the prompts.
"""

from __future__ import annotations

import json

from .. import contract
from ..registry import ModelSpec

ENCODER_MAX_BATCH = 4
DECODER_MAX_BATCH = 16


def _trt_block(profile: dict[str, str] | None = None) -> str:
    """The TensorRT FP16 accelerator; `profile` gives the min/opt/max shapes of dynamic inputs
    (ONNX Runtime's `trt_profile_*_shapes`, which Triton passes on since 24.04)."""
    parameters = {
        "precision_mode": "FP16",
        "max_workspace_size_bytes": "4294967296",
        "trt_engine_cache_enable": "1",
        "trt_engine_cache_path": "/tmp/triton_sam_trt_cache",
        **{f"trt_profile_{k}_shapes": v for k, v in (profile or {}).items()},
    }
    lines = "".join(f'      parameters {{ key: "{k}" value: "{v}" }}\n' for k, v in parameters.items())
    return (
        "optimization {\n  execution_accelerators {\n    gpu_execution_accelerator: [ {\n"
        f'      name: "tensorrt"\n{lines}    }} ]\n  }}\n}}\n'
    )


def _encoder_profile(spec: ModelSpec) -> dict[str, str]:
    """The encoder input varies in H, W and channels (`ModelSpec.sent_hw`): one TensorRT profile
    covers every image shape and batch size instead of an engine built per shape."""
    name, side, largest = contract.ENCODER_INPUT, spec.input_size, spec.max_sent_side
    return {
        "min": f"{name}:1x1x1x1",
        "opt": f"{name}:1x{side}x{side}x3",
        "max": f"{name}:{ENCODER_MAX_BATCH}x{largest}x{largest}x3",
    }


def _tensor(name: str, data_type: str, dims: tuple[int, ...], optional: bool = False) -> str:
    flag = " optional: true" if optional else ""
    return f'  {{ name: "{name}" data_type: {data_type} dims: [ {", ".join(map(str, dims))} ]{flag} }}'


def _tensors(entries: list[str]) -> str:
    return "[\n" + ",\n".join(entries) + "\n]"


SESSION_MAX_BATCH = 16
SESSION_CACHE_SIZE = 16
SESSION_LOGITS_CACHE_SIZE = 256  # masks' low-res logits kept for refinement (256 KiB each for SAM2.1)
SESSION_MEMORY_CACHE_SIZE = 512  # mask memories kept for volumes (1 MiB each for SAM2.1)


def _parameters(spec: ModelSpec, component: str, **extra: str) -> str:
    values = {
        contract.MODEL_ID_PARAMETER: spec.model_id,
        contract.COMPONENT_PARAMETER: component,
        contract.CONTRACT_VERSION_PARAMETER: str(contract.CONTRACT_VERSION),
        **extra,
    }
    return "".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in values.items())


def _warmup(name: str, inputs: list[tuple[str, str, tuple[int, ...]]]) -> str:
    body = "".join(
        f'    inputs {{ key: "{n}" value: {{ data_type: {t} dims: [ {", ".join(map(str, d))} ] zero_data: true }} }}\n'
        for n, t, d in inputs
    )
    return f'model_warmup [ {{\n    name: "{name}"\n    batch_size: 1\n{body}}} ]\n'


def _header(name: str, max_batch: int) -> str:
    return f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {max_batch}\n'


def _footer(spec: ModelSpec, component: str, tensorrt: bool, trt_profile: dict[str, str] | None = None) -> str:
    text = "instance_group [ { count: 1 kind: KIND_GPU } ]\n" + _parameters(spec, component)
    return text + (_trt_block(trt_profile) if tensorrt else "")


def encoder_config(spec: ModelSpec, tensorrt: bool = False) -> str:
    """config.pbtxt of the encoder: one uint8 HWC image of any size in, the feature maps out."""
    image = (contract.ENCODER_INPUT, "TYPE_UINT8", (-1, -1, -1))
    outputs = [_tensor(name, "TYPE_FP32", shape) for name, shape in spec.feature_shapes.items()]
    return (
        _header(spec.encoder_name, ENCODER_MAX_BATCH)
        + f"input {_tensors([_tensor(*image)])}\n"
        + f"output {_tensors(outputs)}\n"
        + "dynamic_batching { max_queue_delay_microseconds: 2000 }\n"
        + _warmup("zero_image", [(*image[:2], (spec.input_size, spec.input_size, 3))])
        + _footer(spec, "encoder", tensorrt, _encoder_profile(spec))
    )


def decoder_inputs(spec: ModelSpec) -> list[tuple[str, str, tuple[int, ...]]]:
    """Decoder inputs as (name, Triton type, dims without batch); -1 = any number of points."""
    low = spec.low_res_size
    features = [(name, "TYPE_FP32", shape) for name, shape in spec.feature_shapes.items()]
    return features + [
        (contract.POINT_COORDS, "TYPE_FP32", (-1, 2)),
        (contract.POINT_LABELS, "TYPE_INT32", (-1,)),
        (contract.MASK_INPUT, "TYPE_FP32", (1, low, low)),
        (contract.HAS_MASK_INPUT, "TYPE_FP32", (1,)),
    ]


def decoder_outputs(spec: ModelSpec) -> list[tuple[str, str, tuple[int, ...]]]:
    low = spec.low_res_size
    return [
        (contract.MULTI_MASKS, "TYPE_FP32", (3, low, low)),
        (contract.MULTI_SCORES, "TYPE_FP32", (3,)),
        (contract.SINGLE_MASK, "TYPE_FP32", (1, low, low)),
        (contract.SINGLE_SCORE, "TYPE_FP32", (1,)),
        (contract.OBJECT_SCORE, "TYPE_FP32", (1,)),
    ]


def _rejecting_batcher(queue_delay_us: int, timeout_us: int, max_queue: int = 64) -> str:
    """Dynamic batching whose queue rejects requests older than `timeout_us` (clients may override)
    and new ones beyond `max_queue` waiting."""
    return (
        "dynamic_batching {\n"
        + f"  max_queue_delay_microseconds: {queue_delay_us}\n"
        + "  default_queue_policy {\n"
        + "    timeout_action: REJECT\n"
        + f"    default_timeout_microseconds: {timeout_us}\n"
        + "    allow_timeout_override: true\n"
        + f"    max_queue_size: {max_queue}\n"
        + "  }\n"
        + "}\n"
    )


def decoder_config(spec: ModelSpec, tensorrt: bool = False) -> str:
    """config.pbtxt of the stateless decoder: feature maps and prompts in, mask logits out."""
    inputs = decoder_inputs(spec)
    warmup = [(n, t, tuple(1 if d == -1 else d for d in dims)) for n, t, dims in inputs]
    return (
        _header(spec.decoder_name, DECODER_MAX_BATCH)
        + f"input {_tensors([_tensor(*i) for i in inputs])}\n"
        + f"output {_tensors([_tensor(*o) for o in decoder_outputs(spec)])}\n"
        + _rejecting_batcher(queue_delay_us=500, timeout_us=2_000_000)
        + _warmup("one_point", warmup)
        + _footer(spec, "decoder", tensorrt)
    )


def _video_tensors(spec: ModelSpec) -> tuple[list[str], list[str]]:
    """The session model's inputs (all optional) and outputs of SAM2.1 volumes (see `contract`)."""
    low, channels = spec.low_res_size, spec.feature_shapes["image_embed"][0]
    inputs = [
        (contract.MEMORY_HANDLES, "TYPE_STRING", (-1,)),
        (contract.MEMORY_TPOS, "TYPE_INT64", (-1,)),
        (contract.OBJ_PTRS, "TYPE_FP32", (-1, channels)),
        (contract.OBJ_PTR_TPOS, "TYPE_FP32", (-1,)),
        (contract.MASK_LOGITS, "TYPE_FP32", (1, low, low)),
        (contract.MASK_SCORE, "TYPE_FP32", (1,)),
        (contract.BINARIZE, "TYPE_FP32", (1,)),
        (contract.MASK, "TYPE_UINT8", (-1, -1)),
    ]
    outputs = [
        (contract.OBJ_PTR, "TYPE_FP32", (4, channels)),
        (contract.MEMORY_HANDLE, "TYPE_STRING", (1,)),
        (contract.LOW_RES_LOGITS, "TYPE_FP32", (1, low, low)),
        (contract.MASK_OBJ_PTR, "TYPE_FP32", (channels,)),
    ]
    return [_tensor(*i, optional=True) for i in inputs], [_tensor(*o) for o in outputs]


def _session_decode_options() -> list[tuple[str, str, tuple[int, ...]]]:
    """The session model's optional decode inputs besides the prompts (see `contract`)."""
    return [
        (contract.CROP_THRESHOLD, "TYPE_FP32", (1,)),
        (contract.KEEP_LOGITS, "TYPE_BOOL", (1,)),
        (contract.MASK_INPUT_KEY, "TYPE_STRING", (1,)),
        (contract.BEST_OF_MULTIMASK, "TYPE_BOOL", (1,)),
    ]


def _concept_tensors() -> tuple[list[str], list[str]]:
    """The session model's inputs (optional) and outputs of SAM3's concept request (see `contract`)."""
    inputs = [
        (contract.TEXT_TOKENS, "TYPE_INT64", (-1,)),
        (contract.EXEMPLAR_BOXES, "TYPE_FP32", (-1, 4)),
        (contract.EXEMPLAR_LABELS, "TYPE_INT64", (-1,)),
        (contract.SCORE_FLOOR, "TYPE_FP32", (1,)),
        (contract.VOCABULARY_WANTED, "TYPE_BOOL", (1,)),
    ]
    outputs = [
        (contract.QUERY_BOXES, "TYPE_FP32", (-1, 4)),
        (contract.QUERY_LOGITS, "TYPE_FP32", (-1,)),
        (contract.PRESENCE_LOGIT, "TYPE_FP32", (1,)),
        (contract.CROPPED_QUERIES, "TYPE_INT32", (-1,)),
        (contract.MASK_CROP_BOXES, "TYPE_INT32", (-1, 4)),
        (contract.MASK_CROPS, "TYPE_FP32", (-1,)),
        (contract.VOCABULARY, "TYPE_UINT8", (-1,)),
    ]
    return [_tensor(*i, optional=True) for i in inputs], [_tensor(*o) for o in outputs]


def _instance_tensors() -> tuple[list[str], list[str]]:
    """The session model's inputs (optional) and output of micro-sam's instance-segmentation maps (see `contract`)."""
    inputs = [(contract.MAPS_REGION, "TYPE_INT64", (2,)), (contract.IMAGE_HW, "TYPE_INT64", (2,))]
    return [_tensor(*i, optional=True) for i in inputs], [_tensor(contract.INSTANCE_MAPS, "TYPE_FP32", (3, -1, -1))]


def session_config(spec: ModelSpec, cache_size: int = SESSION_CACHE_SIZE, video_settings: dict | None = None) -> str:
    """config.pbtxt of the session model: encode (image -> handle) or decode (handle + prompts);
    with `video_settings` (the model has video graphs) also the requests of volumes; for a model
    with micro-sam's instance-segmentation decoder also its maps, for SAM3 its concept requests
    (each answered only where its graphs are exported).

    One instance, so every request sees the same feature cache; the model chooses its own ONNX
    Runtime device. gRPC cancellation removes queued requests before they run (Triton >= 2.57),
    and a client's deadline cancels what waited too long.
    """
    prompts = [i for i in decoder_inputs(spec) if i[0] in (contract.POINT_COORDS, contract.POINT_LABELS, contract.MASK_INPUT)]
    inputs = [
        _tensor(contract.ENCODER_INPUT, "TYPE_UINT8", (-1, -1, -1), optional=True),
        _tensor(contract.HANDLE, "TYPE_STRING", (1,), optional=True),
    ] + [_tensor(*i, optional=True) for i in [*prompts, *_session_decode_options()]]
    crops = [
        (contract.SINGLE_MASK_CROP, "TYPE_FP32", (1, -1, -1)),
        (contract.MULTI_MASK_CROP, "TYPE_FP32", (3, -1, -1)),
        (contract.CROP_BOX, "TYPE_INT32", (4,)),
        (contract.KEPT_KEYS, "TYPE_STRING", (-1,)),
    ]
    outputs = [_tensor(contract.HANDLE, "TYPE_STRING", (1,))] + [_tensor(*o) for o in [*decoder_outputs(spec), *crops]]
    if spec.decoder_url is not None:
        instance_inputs, instance_outputs = _instance_tensors()
        inputs, outputs = inputs + instance_inputs, outputs + instance_outputs
    if spec.family == "sam3":
        concept_inputs, concept_outputs = _concept_tensors()
        inputs, outputs = inputs + concept_inputs, outputs + concept_outputs
    video = {}
    if video_settings is not None:
        video_inputs, video_outputs = _video_tensors(spec)
        inputs, outputs = inputs + video_inputs, outputs + video_outputs
        video = {
            contract.VIDEO_SETTINGS_PARAMETER: json.dumps(video_settings, separators=(",", ":")).replace('"', '\\"'),
            contract.MEMORY_CACHE_SIZE_PARAMETER: str(SESSION_MEMORY_CACHE_SIZE),
        }
    session = {
        contract.ENCODER_MODEL_PARAMETER: spec.encoder_name,
        contract.DECODER_MODEL_PARAMETER: spec.decoder_name,
        contract.CACHE_SIZE_PARAMETER: str(cache_size),
        contract.LOGITS_CACHE_SIZE_PARAMETER: str(SESSION_LOGITS_CACHE_SIZE),
        contract.MASK_INPUT_CLAMP_PARAMETER: "" if spec.low_res_clamp is None else str(spec.low_res_clamp),
        contract.ENCODE_BATCH_PARAMETER: str(ENCODER_MAX_BATCH),
    }
    parameters = _parameters(spec, "session", **session, **video)
    return (
        f'name: "{spec.session_name}"\nbackend: "python"\nmax_batch_size: {SESSION_MAX_BATCH}\n'
        + f"input {_tensors(inputs)}\n"
        + f"output {_tensors(outputs)}\n"
        # No queue policy: with one (a size bound, timeouts) Triton 2.51's batcher often missed the
        # instance coming free and slept its default 500 ms, so 3-7 % of one client's back-to-back
        # decodes waited ~540 ms in the queue (tests/engines/test_triton.py). Stale requests go
        # by the clients' deadlines (gRPC cancellation, Triton >= 2.57).
        + "dynamic_batching { max_queue_delay_microseconds: 0 }\n"
        + "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
        + parameters
    )
