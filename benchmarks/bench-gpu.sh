#!/usr/bin/env bash
# The GPU figures of BENCHMARKS.md (issue #16). Needs a machine with an NVIDIA GPU where triton-sam
# runs on onnxruntime-gpu with the export extra (torch, sam2); the `triton` part also needs the
# server environment (`triton-sam server-env`, or $TRITON_SAM_SERVER_PYTHON). Run from a checkout.
# Usage: bash benchmarks/bench-gpu.sh OUTDIR [local|triton|probe|all]   (JSON and logs land in OUTDIR;
#        MODELS="sam2.1_hiera_tiny" picks the models of the local part, HOVER=0 skips its hover run)
set -uo pipefail
cd "$(dirname "$0")/.."  # python -m benchmarks needs the checkout's root
out=${1:?usage: bash benchmarks/bench-gpu.sh OUTDIR [local|triton|probe|all]}
part=${2:-all}
mkdir -p "$out"
PYTHON=${PYTHON:-python3}

run() {  # run NAME COMMAND...: stdout to NAME.json, stderr to NAME.log; a failure does not stop the rest
    local name=$1
    shift
    echo "== $name ($(date +%T))" >&2
    "$@" >"$out/$name.json" 2>"$out/$name.log" || echo "FAILED: $name (see $out/$name.log)" >&2
}

# Triton first: in a short lease (15 minutes) the part measured least comes back first.
if [[ $part == triton || $part == all ]]; then
    run hover-triton "$PYTHON" -m benchmarks hover --backends triton --duration 20  # as `serve`: batcher on a GPU
    run hover-triton-no-batching "$PYTHON" -m benchmarks hover --backends triton --duration 20 --no-session-batching
    echo "== suite-triton ($(date +%T))" >&2  # its results file is the JSON; what it prints is a log
    "$PYTHON" -m benchmarks all --only click annotators triton --output "$out/suite-triton-results.json" >"$out/suite-triton.log" 2>&1 ||
        echo "FAILED: suite-triton (see $out/suite-triton.log)" >&2
fi
if [[ $part == probe || $part == all ]]; then  # where predict's time goes on the GPU (#16)
    run decoder-probe "$PYTHON" -m benchmarks.gpu_decoder_probe  # predict as it is: with CUDA-graph decodes
fi
if [[ $part == local || $part == all ]]; then
    for model in ${MODELS:-sam2.1_hiera_tiny sam2.1_hiera_large}; do
        for fp16 in "" --fp16; do
            tag=$model${fp16:+-fp16}
            run "predictor-$tag" "$PYTHON" -m benchmarks predictor --device cuda --model "$model" $fp16 --encodes 20 --decodes 50 --json
            run "parity-$tag" "$PYTHON" -m benchmarks parity --device cuda --model "$model" $fp16
        done
        # without the CUDA-graph decodes (#38; the default on CUDA), against the same official predictor
        TRITON_SAM_CUDA_GRAPHS=0 run "predictor-$model-no-graphs" "$PYTHON" -m benchmarks predictor --device cuda --model "$model" --encodes 5 --decodes 50 --json
    done
    [[ ${HOVER:-1} == 1 ]] && run hover-local "$PYTHON" -m benchmarks hover --backends local --duration 20
fi
