"""config.pbtxt files parse with Triton's own model-config protobuf and say what we rely on."""

import pytest
from google.protobuf import text_format

from triton_sam import contract
from triton_sam.export.triton_config import decoder_config, encoder_config, session_config
from triton_sam.registry import MODELS, STRETCH

model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")


def parse(text: str):
    return text_format.Parse(text, model_config_pb2.ModelConfig())


@pytest.mark.parametrize("model_id", sorted(MODELS))
@pytest.mark.parametrize("tensorrt", [False, True])
def test_encoder_config(model_id, tensorrt):
    spec = MODELS[model_id]
    config = parse(encoder_config(spec, tensorrt=tensorrt))
    assert config.name == spec.encoder_name and config.platform == "onnxruntime_onnx"
    assert config.max_batch_size > 0 and config.HasField("dynamic_batching")
    (image,) = config.input
    assert image.name == contract.ENCODER_INPUT and image.data_type == model_config_pb2.TYPE_UINT8
    assert list(image.dims) == [-1, -1, -1]  # any size (the encoder resizes, or SAM1's client did), grey or RGB
    assert {o.name: tuple(o.dims) for o in config.output} == spec.feature_shapes
    assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
    assert config.model_warmup[0].inputs[contract.ENCODER_INPUT].zero_data
    accelerators = config.optimization.execution_accelerators.gpu_execution_accelerator
    assert [a.name for a in accelerators] == (["tensorrt"] if tensorrt else [])
    if tensorrt:
        assert accelerators[0].parameters["precision_mode"] == "FP16"
        assert accelerators[0].parameters["trt_engine_cache_enable"] == "1"
        profile = {k: v for k, v in accelerators[0].parameters.items() if k.startswith("trt_profile_")}
        largest = spec.max_sent_side  # one profile for every image shape and batch size the config allows
        assert profile == {
            "trt_profile_min_shapes": "image:1x1x1x1",
            "trt_profile_opt_shapes": f"image:1x{spec.input_size}x{spec.input_size}x3",
            "trt_profile_max_shapes": f"image:{config.max_batch_size}x{largest}x{largest}x3",
        }
        assert largest == (4 * spec.input_size if spec.resize == STRETCH else spec.input_size)
    assert config.parameters["triton_sam_contract_version"].string_value == str(contract.CONTRACT_VERSION)


@pytest.mark.parametrize("model_id", sorted(MODELS))
def test_decoder_config_batches_and_rejects_stale_work(model_id):
    spec = MODELS[model_id]
    config = parse(decoder_config(spec))
    assert config.name == spec.decoder_name and config.max_batch_size >= 8
    inputs = {i.name: list(i.dims) for i in config.input}
    assert inputs[contract.POINT_COORDS] == [-1, 2] and inputs[contract.POINT_LABELS] == [-1]
    assert set(inputs) == {*spec.feature_shapes, *contract.PROMPT_INPUTS}
    assert {o.name for o in config.output} == set(contract.DECODER_OUTPUTS)
    policy = config.dynamic_batching.default_queue_policy
    assert policy.timeout_action == model_config_pb2.ModelQueuePolicy.REJECT
    assert policy.default_timeout_microseconds > 0 and policy.allow_timeout_override and policy.max_queue_size > 0
    warmup_points = config.model_warmup[0].inputs[contract.POINT_COORDS].dims
    assert list(warmup_points) == [1, 2]
    assert config.parameters["triton_sam_model_id"].string_value == model_id


@pytest.mark.parametrize("model_id", sorted(MODELS))
def test_session_config_is_one_python_instance_with_optional_inputs(model_id):
    spec = MODELS[model_id]
    config = parse(session_config(spec, cache_size=5))
    assert config.name == spec.session_name and config.backend == "python" and config.max_batch_size > 0
    (group,) = config.instance_group
    assert group.count == 1  # every request must see the same feature cache
    inputs = {i.name: i for i in config.input}
    # A model with micro-sam's instance decoder also takes its maps' requests (answered where exported).
    instance = {contract.MAPS_REGION, contract.IMAGE_HW} if spec.decoder_url else set()
    # SAM3 also takes concept requests (answered where its concept graphs are exported).
    concept = {contract.TEXT_TOKENS, contract.EXEMPLAR_BOXES, contract.EXEMPLAR_LABELS, contract.SCORE_FLOOR}
    concept |= {contract.VOCABULARY_WANTED}  # (or the tokenizer's merges file)
    concept = concept if spec.family == "sam3" else set()
    assert set(inputs) == instance | concept | {
        contract.ENCODER_INPUT,
        contract.HANDLE,
        contract.POINT_COORDS,
        contract.POINT_LABELS,
        contract.MASK_INPUT,
        contract.CROP_THRESHOLD,
        contract.KEEP_LOGITS,
        contract.MASK_INPUT_KEY,
        contract.BEST_OF_MULTIMASK,
    }
    assert all(i.optional for i in inputs.values())
    assert inputs[contract.HANDLE].data_type == model_config_pb2.TYPE_STRING
    assert inputs[contract.MASK_INPUT_KEY].data_type == model_config_pb2.TYPE_STRING
    assert inputs[contract.KEEP_LOGITS].data_type == inputs[contract.BEST_OF_MULTIMASK].data_type == model_config_pb2.TYPE_BOOL
    outputs = {o.name: o for o in config.output}
    crops = {contract.SINGLE_MASK_CROP, contract.MULTI_MASK_CROP, contract.CROP_BOX, contract.KEPT_KEYS}
    maps = {contract.INSTANCE_MAPS} if instance else set()
    found = {*contract.CONCEPT_OUTPUTS, contract.VOCABULARY} if concept else set()
    assert set(outputs) == {contract.HANDLE, *contract.DECODER_OUTPUTS, *crops} | maps | found
    if instance:
        assert inputs[contract.IMAGE_HW].data_type == model_config_pb2.TYPE_INT64 and list(inputs[contract.IMAGE_HW].dims) == [2]
        assert list(outputs[contract.INSTANCE_MAPS].dims) == [3, -1, -1]
    assert list(outputs[contract.SINGLE_MASK_CROP].dims) == [1, -1, -1] and list(outputs[contract.CROP_BOX].dims) == [4]
    assert list(outputs[contract.MULTI_MASK_CROP].dims) == [3, -1, -1] and list(outputs[contract.KEPT_KEYS].dims) == [-1]
    assert outputs[contract.KEPT_KEYS].data_type == model_config_pb2.TYPE_STRING
    # Batched, without a queue policy (with one, Triton's batcher left decodes ~540 ms in its queue).
    assert config.HasField("dynamic_batching") and not config.dynamic_batching.HasField("default_queue_policy")
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert params["encoder_model"] == spec.encoder_name and params["decoder_model"] == spec.decoder_name
    assert params["cache_size"] == "5" and params["triton_sam_component"] == "session"
    assert int(params["logits_cache_size"]) > 0
