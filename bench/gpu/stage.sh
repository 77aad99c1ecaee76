#!/bin/bash
# On the lent GPU machine: unpack the bundle carried in .gpu/ into /tmp (vLLM and its
# missing dependencies into /tmp/site, the replayer into /tmp/wt, the trace into /tmp/shared).
set -e
mkdir -p /tmp/stage /tmp/wt /tmp/shared/data
if [ "$1" = a ]; then
  cp .gpu/a/* /tmp/stage/
  tar xzf .gpu/c/code.tgz -C /tmp/wt
  tar xJf .gpu/c/weka.tar.xz -C /tmp/shared/data
  cp .gpu/c/tok/* /tmp/wt/bench/gpu/model/
  echo "staged part a"; exit 0
fi
cp .gpu/b/vllm.tar.xz.part* /tmp/stage/
cat /tmp/stage/vllm.tar.xz.part0* > /tmp/stage/vllm.tar.xz
(cd /tmp/stage && sha256sum -c "$OLDPWD/.gpu/b/vllm.sha256")
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .gpu/b/deps/*.whl
tar xJf /tmp/stage/vllm.tar.xz -C /tmp/site
echo "staged part b"
# Without FA2/FA3 in the bundle, vllm_flash_attn refuses to import even under
# TRITON_ATTN (seen on the H100, 2026-12-07); and run with VLLM_USE_FLASHINFER_SAMPLER=0.
sed -i 's/^if not (FA2_AVAILABLE or FA3_AVAILABLE):/if False:  # bench\/gpu: no FA kernels/' \
  /tmp/site/vllm/vllm_flash_attn/__init__.py
