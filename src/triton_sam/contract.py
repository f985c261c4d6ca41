"""The tensor contract shared by exported models, engines, Triton configs and clients.

Bump `CONTRACT_VERSION` whenever a name, dtype or layout below changes: clients refuse models
exported under another version instead of producing wrong masks, and say to export them again.

The export writes this file next to the session model's `model.py` as `triton_sam_contract.py`
(`server.models.write_python_model`), which imports it from there: keep it standard library only.

Glossary (one name per concept throughout the code):
- image / plane: a 2D picture as the user has it (a plane of a napari layer); encoder input: the
  uint8 image the client sends (`image.encoder_input`); model input: what the network sees after
  the encoder's resize (`ModelSpec.input_hw`; prompts are scaled to it).
- features: everything the encoder computes for one image, its feature maps
  (`ModelSpec.feature_shapes`), held by `engines.ImageFeatures` and cached by `features.FeatureCache`.
  Users and SAM's own API call them the image embedding (`Predictor.get_image_embedding`, "Keep
  embeddings on disk"); the code says features.
- content signature: the hash of an encoder input and a model id (`features.content_signature`);
  the server hands it back as the handle of features it keeps.
- session: `session.InteractiveSession`, one user's interactive segmentation. The session model is
  the Triton python model `<model>_session` that keeps features on the server. ONNX Runtime's
  sessions are `ort_session` / `ort_sessions.shared_session`.
- engine: runs one model's encoder and decoder (local ONNX Runtime, Triton, or auto).
- prompts: points, a box and a previous round's low-res logits; decode: one decoder call for them;
  low-res logits: its 256x256 (SAM3: 288x288) mask logits; masks: logits above the threshold at the
  image's size (`masks.MaskResizer`); preview: the mask shown under the cursor; commit: the object
  becomes a label. One prompt set travels as a `prompts.Prompts` value (plane -> tile -> request).
- plane (`planes.Plane`): an image being segmented, with its contrast and its tiles; tile
  (`tiles.Tile`): a window of a large plane encoded as an image of its own; window: where a mask
  or tile sits in its plane (`offset`).
- object in progress (`objects.ObjectInProgress`): the prompts and last candidates of the object
  being built on one plane; scheduler (`speculative.DecodeScheduler`): runs its decodes latest-wins.
- crop: only the automatic generator's crops (`crop_n_layers`, as SAM's generator says); the
  session model's cropped logits are a logits crop (`CROP_BOX` below).
"""

from __future__ import annotations

# 2: the encoder takes the plane as it is and resizes it itself (SAM2, SAM3). 3: the session model
# always answers crops, keeps logits and chooses the best candidate (below), and imports this file.
CONTRACT_VERSION = 3

# Encoder: one image, uint8 [B, H, W, C], C = 1 (grayscale, repeated to RGB in the encoder) or 3.
# SAM2/SAM3 take any H x W (`ModelSpec.sent_hw`) and resize it in float in the graph, as their
# official predictors do; SAM1 takes the image its `ResizeLongestSide` made on the client.
ENCODER_INPUT = "image"

# Decoder inputs besides the feature maps named in `ModelSpec.feature_shapes`.
POINT_COORDS = "point_coords"  # float32 [B, P, 2], (x, y) in model input pixels
POINT_LABELS = "point_labels"  # int32 [B, P]: 1 positive, 0 negative, 2/3 box corners, -1 padding
MASK_INPUT = "mask_input"  # float32 [B, 1, 256, 256], low-res logits of a previous round
HAS_MASK_INPUT = "has_mask_input"  # float32 [B, 1], 1.0 when mask_input is used

# Decoder outputs.
MULTI_MASKS = "masks"  # float32 [B, 3, 256, 256] multimask logits
MULTI_SCORES = "iou_predictions"  # float32 [B, 3]
SINGLE_MASK = "single_mask"  # float32 [B, 1, 256, 256], chosen as the official model does
SINGLE_SCORE = "single_iou"  # float32 [B, 1]
OBJECT_SCORE = "object_score_logits"  # float32 [B, 1]
OBJ_PTR = "obj_ptr"  # float32 [B, 4, 256]: SAM2 video's object pointers (single-mask token, then the 3 multimask ones)

# Session model (features stay on the server): encode returns a handle, decode takes it.
HANDLE = "handle"  # bytes [B, 1]
UNKNOWN_HANDLE = "UNKNOWN_HANDLE"  # starts the error message for an evicted or unknown handle

# Session model, a decode whose logits are used as masks (`DecodeRequest.logits_above`: hover
# previews, clicks): CROP_THRESHOLD in; out, the mask logits cropped to the low-res samples above
# the threshold (in any row and candidate) grown by CROP_MARGIN on every side (CROP_BOX: rows
# y0:y1, columns x0:x1), as SINGLE_MASK_CROP or MULTI_MASK_CROP. A bilinear resize (SAM1's two
# included) reads at most 3 neighbouring samples a side, so a mask made from the crop, everything
# outside it at or below the threshold, is the full logits' mask.
CROP_THRESHOLD = "crop_threshold"  # float32 [B, 1]
SINGLE_MASK_CROP = "single_mask_crop"  # float32 [B, 1, h, w]: the same box for every row
MULTI_MASK_CROP = "masks_crop"  # float32 [B, 3, h, w]: the same box for every row and candidate
CROP_BOX = "crop_box"  # int32 [B, 4]
CROP_MARGIN = 2

# Session model, refinement without sending the logits again: a decode with KEEP_LOGITS keeps the
# mask logits it answers on the server, each under the signature of its bytes
# (`triton_sam_arrays.logits_signature`) and answers those signatures as KEPT_KEYS when asked (a
# client that received a crop cannot compute them); a later decode may send them as MASK_INPUT_KEY
# instead of MASK_INPUT. A key the server does not keep (evicted) fails with a message starting
# with UNKNOWN_MASK_INPUT; the client then sends the logits, or, where it only received a crop,
# decodes again what made them.
KEEP_LOGITS = "keep_logits"  # bool [B, 1]
KEPT_KEYS = "kept_keys"  # bytes [B, C]: of the masks answered (C = 3 multimask, else 1)
MASK_INPUT_KEY = "mask_input_key"  # bytes [B, 1]
UNKNOWN_MASK_INPUT = "UNKNOWN_MASK_INPUT"

# Session model, a single-mask decode that asks for the best multimask candidate instead
# (`DecodeRequest.best_of_multimask`): SINGLE_MASK, SINGLE_SCORE and the crop are that candidate's.
BEST_OF_MULTIMASK = "best_of_multimask"  # bool [B, 1]

# Session model, SAM2.1 volumes (`engines.triton_video.TritonVideo`; memories stay on the server behind handles).
# track: HANDLE, MEMORY_HANDLES [B, T], MEMORY_TPOS int64 [B, T], OBJ_PTRS [B, P, C], OBJ_PTR_TPOS
# [B, P] and the prompts -> the decoder's outputs and OBJ_PTR. remember: HANDLE, MASK_LOGITS
# [B, 1, S, S], MASK_SCORE [B, 1], BINARIZE [B, 1] -> MEMORY_HANDLE. mask as output: HANDLE,
# MASK [B, H, W] uint8 -> LOW_RES_LOGITS, OBJECT_SCORE, MASK_OBJ_PTR [B, C].
MEMORY_HANDLES = "memory_handles"
MEMORY_TPOS = "memory_tpos"
OBJ_PTRS = "obj_ptrs"
OBJ_PTR_TPOS = "obj_ptr_tpos"
MASK_LOGITS = "mask_logits"
MASK_SCORE = "mask_score"
BINARIZE = "binarize"
MASK = "mask"
MEMORY_HANDLE = "memory_handle"
LOW_RES_LOGITS = "low_res_logits"
MASK_OBJ_PTR = "mask_obj_ptr"
UNKNOWN_MEMORY = "UNKNOWN_MEMORY"  # starts the error message for an evicted or unknown memory handle

# Session model, micro-sam's instance-segmentation maps (`engines.triton_instance`): HANDLE,
# MAPS_REGION [B, 2] (the rows and columns of the decoder's maps that show the image:
# `ModelSpec.input_hw`) and IMAGE_HW [B, 2] -> INSTANCE_MAPS [B, 3, h, w], that region at the
# image's size or as it is, whichever is fewer samples (the client then resizes it). A model
# exported without its decoder fails with a message starting with NO_INSTANCE_DECODER.
MAPS_REGION = "maps_region"  # int64
IMAGE_HW = "image_hw"  # int64
NO_INSTANCE_DECODER = "NO_INSTANCE_DECODER"

# SAM3 concepts (`triton_sam.concepts`): the text encoder, run once per phrase, in CONCEPTS_DIR
# next to the session model. TEXT_TOKENS: int64 [B, 32] CLIP BPE ids (0: padding) -> TEXT_FEATURES
# float32 [B, 32, 256]; a token is padding for the detector where its id is 0.
CONCEPTS_DIR = "concepts"
TEXT_ENCODER_FILE = "text_encoder.onnx"
TEXT_TOKENS = "text_tokens"
TEXT_FEATURES = "text_features"

# The detector (`export.sam3_detector_onnx`), per phrase and exemplar set: DETECTOR_MAPS float32
# [1, 256, s, s] (s = 288, 144, 72: SAM3's detector neck), TEXT_FEATURES [1, 32, 256] and
# TEXT_PADDING bool [1, 32] (token id 0), EXEMPLAR_BOXES float32 [1, N, 4] (cx, cy, w, h in [0, 1])
# and EXEMPLAR_LABELS int64 [1, N] (1 positive, 0 negative; N >= 0) -> per query (200): QUERY_BOXES
# [1, 200, 4] (cx, cy, w, h in [0, 1]), QUERY_LOGITS [1, 200], QUERY_MASKS [1, 200, 288, 288] logits,
# and PRESENCE_LOGIT [1, 1]; a query's score is sigmoid(logit) * sigmoid(presence).
DETECTOR_FILE = "detector.onnx"
DETECTOR_MAPS = ("detector_map_288", "detector_map_144", "detector_map_72")
DETECTOR_MAP_SHAPES = {name: (256, side, side) for name, side in zip(DETECTOR_MAPS, (288, 144, 72))}
# SAM3's encoder answers the DETECTOR_MAPS after the tracker's features (`ModelSpec.feature_shapes`),
# from the same trunk run: optional outputs that the decoder and the session model ignore; an
# engine keeps them only when asked (`LocalEngine(detector_maps=True)`: 111 MB an image).
TEXT_PADDING = "text_padding"
EXEMPLAR_BOXES = "exemplar_boxes"
EXEMPLAR_LABELS = "exemplar_labels"
QUERY_BOXES = "query_boxes"
QUERY_LOGITS = "query_logits"
QUERY_MASKS = "query_masks"
PRESENCE_LOGIT = "presence_logit"
DETECTOR_INPUTS = (*DETECTOR_MAPS, TEXT_FEATURES, TEXT_PADDING, EXEMPLAR_BOXES, EXEMPLAR_LABELS)
DETECTOR_OUTPUTS = (QUERY_BOXES, QUERY_LOGITS, QUERY_MASKS, PRESENCE_LOGIT)

# The session model's concept request (`server/models/triton_sam_concepts.py`): HANDLE, TEXT_TOKENS
# int64 [1, 32], EXEMPLAR_BOXES [1, N, 4] and EXEMPLAR_LABELS [1, N] (both left out where N = 0) and
# SCORE_FLOOR float32 [1, 1] -> QUERY_BOXES [1, Q, 4], QUERY_LOGITS [1, Q] and PRESENCE_LOGIT [1, 1]
# as the detector answers them, and for the K queries scoring above the floor: CROPPED_QUERIES int32
# [1, K], MASK_CROP_BOXES int32 [1, K, 4] (y0, x0, y1, x1 in the 288 x 288 logits) and MASK_CROPS
# float32 [1, M] (each query's logits inside its box, row-major, one after the other). A server
# whose repository has no concept graphs fails with a message starting with NO_CONCEPT_GRAPHS.
SCORE_FLOOR = "score_floor"
CROPPED_QUERIES = "cropped_queries"
MASK_CROP_BOXES = "mask_crop_boxes"
MASK_CROPS = "mask_crops"
CONCEPT_OUTPUTS = (QUERY_BOXES, QUERY_LOGITS, PRESENCE_LOGIT, CROPPED_QUERIES, MASK_CROP_BOXES, MASK_CROPS)
NO_CONCEPT_GRAPHS = "NO_CONCEPT_GRAPHS"
# A concept request may ask instead for the tokenizer's merges file beside the graphs
# (VOCABULARY_WANTED bool [1, 1], with the handle of an image the server keeps): the answer is
# VOCABULARY uint8 [1, n], the file's bytes, so that a client without the export's files (napari
# on a laptop) tokenizes phrases as the server's text encoder expects.
VOCABULARY_FILE = "bpe_simple_vocab_16e6.txt.gz"  # CLIP's BPE merges (`concepts.tokenizer`)
VOCABULARY_WANTED = "concepts_vocabulary_wanted"
VOCABULARY = "concepts_vocabulary"

PROMPT_INPUTS = (POINT_COORDS, POINT_LABELS, MASK_INPUT, HAS_MASK_INPUT)
DECODER_OUTPUTS = (MULTI_MASKS, MULTI_SCORES, SINGLE_MASK, SINGLE_SCORE, OBJECT_SCORE)


def decoder_output_names(multimask_output: bool) -> list[str]:
    """Outputs to request: masks, their scores and the object score, multimask or single."""
    if multimask_output:
        return [MULTI_MASKS, MULTI_SCORES, OBJECT_SCORE]
    return [SINGLE_MASK, SINGLE_SCORE, OBJECT_SCORE]


def graph_prompts(low_res: int) -> dict[str, tuple[list, str]]:
    """The prompts of a decode of one prompt set replayed as a CUDA graph: name -> (shape, dtype),
    "points" standing for the point count."""
    return {
        POINT_COORDS: ([1, "points", 2], "float32"),
        POINT_LABELS: ([1, "points"], "int32"),
        MASK_INPUT: ([1, 1, low_res, low_res], "float32"),
        HAS_MASK_INPUT: ([1, 1], "float32"),
    }


def graph_outputs(low_res: int) -> dict[str, list]:
    """Every output of such a decode (a replay writes them all): name -> shape."""
    masks = {MULTI_MASKS: [1, 3, low_res, low_res], SINGLE_MASK: [1, 1, low_res, low_res]}
    return {**masks, MULTI_SCORES: [1, 3], SINGLE_SCORE: [1, 1], OBJECT_SCORE: [1, 1]}


# Point labels understood by the decoder.
LABEL_PADDING = -1  # SAM1 only: stands for "no box" (see registry.SAM1_PROMPTS)
LABEL_NEGATIVE = 0
LABEL_POSITIVE = 1
LABEL_BOX_TOP_LEFT = 2
LABEL_BOX_BOTTOM_RIGHT = 3

METADATA_FILE = "triton_sam.json"

# Names the client and the server side (configs, the python model, `triton-sam serve`) share.
MODEL_ID_PARAMETER = "triton_sam_model_id"  # config.pbtxt parameters
COMPONENT_PARAMETER = "triton_sam_component"  # "encoder", "decoder" or "session"
CONTRACT_VERSION_PARAMETER = "triton_sam_contract_version"
VIDEO_SETTINGS_PARAMETER = "triton_sam_video_settings"  # the session model's SAM2.1 video settings (JSON), if it has video graphs
ENCODE_BATCH_PARAMETER = "encode_batch"  # the session model's images to one encoder run (1 if absent)
# The session model's other parameters (see `server/models/python_model.py`).
ENCODER_MODEL_PARAMETER = "encoder_model"  # sibling models whose `1/model.onnx` it runs
DECODER_MODEL_PARAMETER = "decoder_model"
CACHE_SIZE_PARAMETER = "cache_size"  # images kept
LOGITS_CACHE_SIZE_PARAMETER = "logits_cache_size"  # masks' logits kept for refinement
MASK_INPUT_CLAMP_PARAMETER = "mask_input_clamp"  # kept logits clamped to +-this ("": not at all)
FEATURE_BUFFERS_PARAMETER = "feature_buffers"  # "auto", "on" or "off"
MEMORY_CACHE_SIZE_PARAMETER = "memory_cache_size"  # mask memories kept for volumes
GATHER_FILE = "gather_features.onnx"  # next to the session model: gathers rows of its feature buffers
# Next to the session model: the graphs copying an image's features and a decode's prompts into the
# buffers its CUDA-graph decodes replay from (`server/models/triton_sam_graphs.py`); without them, none.
GRAPH_COPY_FILES = ("graph_copy_features.onnx", "graph_copy_prompts.onnx")
GRAPH_DECODES_PARAMETER = "graph_decodes"  # "auto" (on a GPU unless CUDA_GRAPHS_ENV says 0), "on" or "off"
VIDEO_DIR = "video"  # next to the session model: its SAM2.1 video graphs, if exported
INSTANCE_DECODER_DIR = "instance_decoder"  # next to the session model: micro-sam's instance-segmentation decoder, if exported
INSTANCE_EMBED = "image_embed"  # its input: the image embedding (the features of that name)
INSTANCE_MAPS = "instance_maps"  # its output: foreground, center and boundary distances [B, 3, H, W]
SESSION_REQUESTS_METRIC = "triton_sam_session_requests_total"  # {model, outcome} on Triton's metrics endpoint
# What the session model did with a request, the metric's `outcome` (its description lists them from here):
# "unknown_handle" is a request about features this server does not hold (evicted, restarted, or
# encoded on another server): the client encodes the image again, so it is no failure a user sees.
SESSION_REQUEST_OUTCOMES = (
    "encoded",
    "decoded",
    "video",
    "instance_maps",
    "concepts",
    "cancelled_queued",
    "cancelled_running",
    "unknown_handle",
    "unknown_kept",  # a mask memory or kept mask logits no longer held (the client sends them again)
    "failed",
)
# What each device of the session model did ({model, device}): images encoded there, prompt sets decoded there.
DEVICE_ENCODED_METRIC = "triton_sam_session_device_encoded_images_total"
DEVICE_DECODED_METRIC = "triton_sam_session_device_decoded_rows_total"
# ONNX Runtime's CUDA provider options for every session on a GPU (the local engine's and the
# session model's). With cuDNN 9, ORT's Conv and ConvTranspose keep only their last input shape's
# cuDNN plan and rebuild it whenever the shape changes; its default search ("EXHAUSTIVE", cuDNN
# heuristics mode B) makes each rebuild costly, and the decoder's 5 convs see a new batch size on
# nearly every run of a server batching decodes (3, 1, 3, 1, ...). "HEURISTIC" is mode A, the
# cheap query: on an H200 it took most of that cost away without slowing the encoder
# (`benchmarks.gpu_decoder_probe`'s "session_batch"; BENCHMARKS.md, GPU).
CUDA_PROVIDER_OPTIONS = {"cudnn_conv_algo_search": "HEURISTIC"}
CUDA_GRAPHS_ENV = "TRITON_SAM_CUDA_GRAPHS"  # 0: decodes on CUDA run without CUDA graphs, local or served (#38)


def cuda_graphs_allowed(value: str | None) -> bool:
    """Whether `$TRITON_SAM_CUDA_GRAPHS` (`value`; None where unset) leaves CUDA-graph decodes on."""
    return (value or "1").strip().lower() not in ("0", "false", "off", "no")


DEVICES_ENV = "TRITON_SAM_DEVICES"  # devices the session model drives: at most this many GPUs, or CPU stand-ins
API_KEY_NAME = "triton-sam-key"  # `triton-sam serve` with an API key: HTTP clients send this header,
API_KEY_GRPC_HEADER = f"triton-grpc-protocol-{API_KEY_NAME}"  # gRPC clients this one (Triton's prefix)
# gRPC metadata of every request about one image: its content signature (hex), so that a balancer
# hashing this header sends all of an image's requests to the server that holds its features. A
# volume's requests (its planes' encodes too) carry one key of the volume's instead: a plane attends
# to other planes' memories, so they all go to one server (`engines.triton_video`).
AFFINITY_HEADER = "triton-sam-image"
