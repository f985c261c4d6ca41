#!/usr/bin/env bash
# The packages the lent GPU machine lacks for scripts/bench-gpu.sh, taken there in pieces: it has no
# pip index and takes at most 64 MiB a call (see ../shared/reference/gpu.md). Its python3 has torch
# (CUDA 13), numpy 2, onnxruntime (CPU only), grpcio; it lacks onnxruntime-gpu, tritonclient, sam2
# and the server's nvidia-pytriton and numpy<2.
#
#   here:   bash scripts/device-kit.sh stage            wheels for Python $PY (3.12) -> .device/c0 .. cN
#   there:  bash scripts/device-kit.sh receive .device/cK   one device run per piece, carry=[".device/cK"],
#                                                       each within 30 s of the last (the machine stays warm)
#           bash scripts/device-kit.sh setup            installs them under /tmp/kit, writes /tmp/kit/env.sh
#           . /tmp/kit/env.sh && bash scripts/bench-gpu.sh /tmp/gpu triton && bash scripts/bench-gpu.sh /tmp/gpu probe
#           tar -czf "$OUT/gpu.tgz" -C /tmp gpu
#                                                       (a run brings back at most 8 files: one archive)
#
# The client's packages go to /tmp/kit/site (first on PYTHONPATH); the server's to /tmp/kit/server,
# used only by /tmp/kit/server-python (TRITON_SAM_SERVER_PYTHON), so the client keeps numpy 2.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
kit=${KIT:-/tmp/kit}
PY=${PY:-3.12}
HERE_PYTHON=${HERE_PYTHON:-$repo/.venv/bin/python}  # stage: pip, and torch to build sam2
PIECE_MIB=${PIECE_MIB:-60}
SERVER_WHEELS=(numpy==1.26.4 nvidia-pytriton==0.7.0)
CLIENT_WHEELS=(onnxruntime-gpu==1.31.1 tritonclient==2.73.0 grpcio==1.85.3 protobuf==6.33.6 python-rapidjson==1.25
    platformdirs==4.14.8 hydra-core==1.3.8 omegaconf==2.3.1)
CLIENT_SDISTS=(sam2==1.1.0 antlr4-python3-runtime==4.9.3 iopath==0.1.10)  # built here: pure Python

download() {  # download DIR SPEC...: binary wheels for the GPU machine's Python, without their dependencies
    local dir=$1
    shift
    "$HERE_PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "$PY" --implementation cp \
        --platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$dir" "$@"
}

stage() {
    local work=$repo/.device
    rm -rf "$work" && mkdir -p "$work/wheels/server" "$work/wheels/site"
    download "$work/wheels/server" "${SERVER_WHEELS[@]}"
    download "$work/wheels/site" "${CLIENT_WHEELS[@]}"
    # sam2 without its CUDA extension (SAM2_BUILD_CUDA=0) and the two sdists it needs are pure Python
    SAM2_BUILD_CUDA=0 "$HERE_PYTHON" -m pip wheel -q --no-deps --no-build-isolation -w "$work/wheels/site" "${CLIENT_SDISTS[@]}"
    tar -C "$work" -cf "$work/kit.tar" wheels
    split -b "${PIECE_MIB}m" -d -a 2 "$work/kit.tar" "$work/part."
    rm -rf "$work/kit.tar" "$work/wheels"
    local i=0 parts=("$work"/part.*)
    for part in "${parts[@]}"; do
        mkdir -p "$work/c$i" && mv "$part" "$work/c$i/"
        echo "${#parts[@]}" >"$work/c$i/pieces"
        i=$((i + 1))
    done
    du -sh "$work"/c* >&2
    echo "carry one per device run, in order: $(cd "$repo" && ls -d .device/c* | tr '\n' ' ')" >&2
}

receive() {  # receive .device/cK: keep that piece on the warm machine
    mkdir -p "$kit/parts"
    cp "$repo/${1:?which piece}"/part.* "$kit/parts/"
    cp "$repo/$1/pieces" "$kit/pieces"
    echo "pieces here: $(ls "$kit/parts" | tr '\n' ' ')"
}

setup() {
    local have
    have=$(shopt -s nullglob && parts=("$kit"/parts/part.*) && echo "${#parts[@]}")
    if [[ ! -f $kit/pieces || $have != "$(cat "$kit/pieces")" ]]; then
        echo "$have of $(cat "$kit/pieces" 2>/dev/null || echo '?') pieces here (the machine went back between runs?): receive them all again" >&2
        exit 1
    fi
    mkdir -p "$kit/wheels"
    cat "$kit"/parts/part.* | tar -C "$kit" -xf -
    local install=(python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade)
    "${install[@]}" --target "$kit/site" "$kit"/wheels/site/*.whl
    "${install[@]}" --target "$kit/server" "$kit"/wheels/server/*.whl
    cat >"$kit/server-python" <<EOF
#!/bin/sh
# The Triton server's python: numpy<2 and nvidia-pytriton before the client's packages
PYTHONPATH=$kit/server:$kit/site exec python3 "\$@"
EOF
    chmod +x "$kit/server-python"
    cat >"$kit/env.sh" <<EOF
export PYTHONPATH=$kit/site:$repo/src\${PYTHONPATH:+:\$PYTHONPATH}
export TRITON_SAM_SERVER_PYTHON=$kit/server-python
EOF
    echo "installed; now: . $kit/env.sh" >&2
}

case ${1:-} in
stage | setup) "$1" ;;
receive) receive "${2:-}" ;;
*)
    echo "usage: bash scripts/device-kit.sh stage | receive .device/cK | setup" >&2
    exit 2
    ;;
esac
