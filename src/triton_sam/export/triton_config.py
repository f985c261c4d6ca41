"""Write Triton `config.pbtxt` files for exported encoder and decoder models.

Both run on the ONNX Runtime backend with dynamic batching. The decoder's queue rejects work that
waited too long (stale hover requests), and a client may cancel queued requests over gRPC.
"""

from __future__ import annotations

from .. import contract
from ..registry import ModelSpec

ENCODER_MAX_BATCH = 4
DECODER_MAX_BATCH = 16

_TRT_BLOCK = """optimization {
  execution_accelerators {
    gpu_execution_accelerator: [ {
      name: "tensorrt"
      parameters { key: "precision_mode" value: "FP16" }
      parameters { key: "max_workspace_size_bytes" value: "4294967296" }
      parameters { key: "trt_engine_cache_enable" value: "1" }
      parameters { key: "trt_engine_cache_path" value: "/tmp/triton_sam_trt_cache" }
    } ]
  }
}
"""


def _tensor(name: str, data_type: str, dims: tuple[int, ...]) -> str:
    return f'  {{ name: "{name}" data_type: {data_type} dims: [ {", ".join(map(str, dims))} ] }}'


def _tensors(entries: list[str]) -> str:
    return "[\n" + ",\n".join(entries) + "\n]"


def _parameters(spec: ModelSpec, component: str) -> str:
    values = {
        "triton_sam_model_id": spec.model_id,
        "triton_sam_component": component,
        "triton_sam_contract_version": str(contract.CONTRACT_VERSION),
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


def _footer(spec: ModelSpec, component: str, tensorrt: bool) -> str:
    text = 'instance_group [ { count: 1 kind: KIND_GPU } ]\n' + _parameters(spec, component)
    return text + (_TRT_BLOCK if tensorrt else "")


def encoder_config(spec: ModelSpec, tensorrt: bool = False) -> str:
    """config.pbtxt of the encoder: one uint8 HWC image in, the feature maps out."""
    size = spec.input_size
    image = (contract.ENCODER_INPUT, "TYPE_UINT8", (size, size, 3))
    outputs = [_tensor(name, "TYPE_FP32", shape) for name, shape in spec.feature_shapes.items()]
    return (
        _header(spec.encoder_name, ENCODER_MAX_BATCH)
        + f"input {_tensors([_tensor(*image)])}\n"
        + f"output {_tensors(outputs)}\n"
        + "dynamic_batching { max_queue_delay_microseconds: 2000 }\n"
        + _warmup("zero_image", [image])
        + _footer(spec, "encoder", tensorrt)
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


def decoder_config(spec: ModelSpec, tensorrt: bool = False) -> str:
    """config.pbtxt of the stateless decoder: feature maps and prompts in, mask logits out."""
    inputs = decoder_inputs(spec)
    warmup = [(n, t, tuple(1 if d == -1 else d for d in dims)) for n, t, dims in inputs]
    return (
        _header(spec.decoder_name, DECODER_MAX_BATCH)
        + f"input {_tensors([_tensor(*i) for i in inputs])}\n"
        + f"output {_tensors([_tensor(*o) for o in decoder_outputs(spec)])}\n"
        + "dynamic_batching {\n"
        + "  max_queue_delay_microseconds: 500\n"
        + "  default_queue_policy {\n"
        + "    timeout_action: REJECT\n"
        + "    default_timeout_microseconds: 2000000\n"
        + "    allow_timeout_override: true\n"
        + "    max_queue_size: 64\n"
        + "  }\n"
        + "}\n"
        + _warmup("one_point", warmup)
        + _footer(spec, "decoder", tensorrt)
    )
