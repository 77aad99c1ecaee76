"""Serve a GGUF model with llama.cpp's server (the xllamacpp wheel) until SIGTERM.

python llamacpp_server.py MODEL.gguf PORT ALIAS [N_PARALLEL] [CTX_PER_SLOT]

Started by .ci/engines.sh with the engine's own venv; listens on 127.0.0.1 only, with
the Prometheus /metrics endpoint on and prompt caching on (llama.cpp's default).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import xllamacpp


def main() -> None:
    model, port, alias = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    n_parallel = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    ctx_per_slot = int(sys.argv[5]) if len(sys.argv) > 5 else 4096
    params = xllamacpp.CommonParams()
    params.model.path = model
    params.model_alias = {alias}
    params.hostnames = ["127.0.0.1"]
    params.port = port
    params.n_parallel = n_parallel
    params.n_ctx = n_parallel * ctx_per_slot  # split evenly between the slots
    params.endpoint_metrics = True
    params.cache_prompt = True
    threads = int(os.environ.get("LLAMACPP_THREADS", str(os.cpu_count() or 2)))
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    t0 = time.monotonic()
    server = xllamacpp.Server(params)
    sys.stdout.write(
        f"llama.cpp server (xllamacpp {xllamacpp.__version__}) on "
        f"{server.listening_address} in {time.monotonic() - t0:.1f}s\n"
    )
    sys.stdout.flush()
    stop.wait()
    sys.stdout.write("llama.cpp server: stopping\n")
    sys.stdout.flush()
    # The server's threads are native; leave without running interpreter teardown
    # against them.
    os._exit(0)


if __name__ == "__main__":
    main()
