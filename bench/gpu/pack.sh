#!/bin/bash
# Builds the bundle that bench/gpu/stage.sh unpacks on a GPU machine without network:
# vLLM 0.26.0 cut to what an H100 needs, its missing dependencies, this code, the trace.
# Usage: bench/gpu/pack.sh DEST [WORK]   (DEST: an ignored folder of the checkout, e.g. .gpu)
set -euo pipefail
dest=$(realpath -m "$1"); work=${2:-/tmp/gpu-pack}
repo=$(cd "$(dirname "$0")/../.." && pwd)
trace=${TRACE:-$repo/../shared/data/weka}
tok=${TOKENIZER_DIR:-$repo/../shared/models/tiny-random-llama}
plat=(--python-version 3.12 --implementation cp --only-binary=:all:
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64
      --platform manylinux_2_35_x86_64 --platform manylinux_2_5_x86_64
      --platform manylinux1_x86_64)
mkdir -p "$work" "$dest"/{a,b,c/tok}
cd "$work"

# 1. vLLM without the Ampere FA2 kernel, FA3 (TRITON_ATTN serves instead), the MoE
#    kernels, the vllm-rs binary, the sm100 FMHA sources and DeepGEMM's headers.
python3 -m pip download --no-deps -d wheel "${plat[@]}" vllm==0.26.0
rm -rf src && mkdir src && (cd src && unzip -q ../wheel/vllm-0.26.0-*.whl \
  -x 'vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so' 'vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so' \
     'vllm/_moe_C_stable_libtorch.abi3.so' 'vllm/vllm-rs' 'vllm/third_party/fmha_sm100/*' \
     'vllm/third_party/deep_gemm/include/*' 'vllm/third_party/deep_gemm/_C.cpython-31[0134]-*')
(cd src && tar cf - vllm vllm-0.26.0.dist-info) | xz -6 -T2 > vllm.tar.xz
rm -f vllm.tar.xz.part*; split -b 58000000 -d vllm.tar.xz vllm.tar.xz.part
sha256sum vllm.tar.xz | sed 's#  .*#  vllm.tar.xz#' > "$dest/b/vllm.sha256"
cp vllm.tar.xz.part00 "$dest/a/"; cp vllm.tar.xz.part0[1-9] "$dest/b/"

# 2. Its dependencies, less torch, the NVIDIA libraries, the optional kernel packages
#    and what the device image already has (KINDS.md's list), plus orjson (replayer).
unzip -p wheel/vllm-0.26.0-*.whl '*/METADATA' | sed -n 's/^Requires-Dist: //p' | grep -v extra \
  | grep -viE '^(torch|torchaudio|torchvision|torchcodec|PyNvVideoCodec|flashinfer|apache-tvm-ffi|tilelang|nvidia-|nvtx|fastsafetensors|quack-kernels|tokenspeed-mla|humming-kernels|numba|opencv|compressed-tensors|numpy|mistral_common)' \
  > reqs.txt
echo 'mistral_common>=1.11.5' >> reqs.txt
python3 -m pip install --dry-run --ignore-installed --report report.json "${plat[@]}" \
  --target "$work/tgt" -r reqs.txt -q
python3 "$repo/bench/gpu/deps.py" report.json > urls.txt
rm -rf deps && mkdir deps && (cd deps && while read -r u; do
  case $u in file://*) cp "${u#file://}" . ;; *) curl -sSLO "$u" ;; esac; done < ../urls.txt)
python3 -m pip download --no-deps -d deps "${plat[@]}" orjson compressed-tensors==0.17.0
rm -rf "$dest/b/deps"; cp -r deps "$dest/b/deps"

# 3. This code, the trace, the tokenizer beside bench/gpu/model/config.json.
(cd "$repo" && tar czf "$dest/c/code.tgz" --exclude=__pycache__ --exclude=bench/gpu/runs \
  replayer traces analysis setup.cfg pyproject.toml bench/gpu)
(cd "$(dirname "$trace")" && tar cJf "$dest/c/weka.tar.xz" "$(basename "$trace")")
cp "$tok"/{tokenizer.json,tokenizer_config.json,generation_config.json} "$dest/c/tok/"
cp "$repo/bench/gpu/stage.sh" "$dest/c/"
du -sh "$dest"/*
