"""The wheels a GPU machine lacks for vLLM, from `pip install --dry-run --report`:
the resolved set less torch, the NVIDIA/CUDA libraries and what the device image has."""

import json
import sys

# The device image's packages (/work/.library/device/KINDS.md, 2026-11-17), less the
# three whose versions vLLM 0.26 needs newer than an image may hold.
IMAGE = set(
    "absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio "
    "attrs certifi charset-normalizer click cloudpickle cmake colorama contourpy cycler "
    "cython einops filelock fonttools frozenlist fsspec grpcio h11 h5py hf-xet httpcore "
    "httpx idna jinja2 joblib kiwisolver llvmlite markdown markdown-it-py markupsafe "
    "matplotlib mdurl mpmath msgpack multidict networkx ninja numba numpy "
    "opencv-python-headless packaging pandas pillow pip prometheus-client propcache "
    "protobuf psutil pyarrow py-cpuinfo pygments pyparsing python-dateutil pyyaml regex "
    "requests rich safetensors scipy sentencepiece setuptools shellingham six sympy "
    "tiktoken torch tqdm triton typer typing-extensions urllib3 uvloop wheel yarl".split()
)
SKIP_PREFIX = ("nvidia-", "cuda-")
SKIP = {"torch", "triton", "numpy", "kernels"}  # apache-tvm-ffi: xgrammar needs it
# Not needed to serve a dense model offline (telemetry, cloud CLI, crypto for JWT).
OPTIONAL = {"cryptography", "sentry-sdk", "fastapi-cloud-cli", "rignore",
            "fastar", "supervisor"}  # fmt: skip

report = json.load(open(sys.argv[1]))
for item in report["install"]:
    name = item["metadata"]["name"].lower().replace("_", "-")
    if name.startswith(SKIP_PREFIX) or name in SKIP | IMAGE | OPTIONAL:
        continue
    print(item["download_info"]["url"])
