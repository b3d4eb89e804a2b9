#!/usr/bin/env bash
# Installs llama-cpp-python (the engine's CPU backend) into the virtualenv whose python is $1, from a wheel
# built once for this CPU, without llama.cpp's AMX kernels.
#
# Why not plain `pip install`: pip builds llama.cpp with -march=native, and on a Xeon with AMX (Sapphire
# Rapids and later) that compiles in ggml's AMX backend, which takes the Q4_K/Q6_K weights first and
# crashes on the first forward of more than one id (a segfault in ggml_backend_amx_mul_mat: llama.cpp
# issue 20824, still open; its Q4_0 path gave wrong numbers, PR 16315). Without it those weights take the
# AVX-512 VNNI kernels (CPU_REPACK), as on an AMD EPYC. pip's own wheel cache keys a built wheel by the
# source archive, not by the flags or the CPU, so the wheel is kept here instead, under a key made of the
# version, the build flags and this CPU's feature flags: a cache shared by two kinds of CPU never hands one
# the other's build.
set -euo pipefail
python=${1:?usage: build-llama-cpp.sh VENV_PYTHON}
version=$(sed -n 's/^llama_cpp_python==//p' "$(dirname "$0")/../requirements/constraints.txt")
[ -n "$version" ] || { echo "requirements/constraints.txt pins no llama_cpp_python" >&2; exit 1; }
flags=""
if [ "$(uname -m)" = "x86_64" ]; then
  flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"  # GCC lets these win over -march=native
fi
cpu=$(grep -m1 -E '^(flags|Features)' /proc/cpuinfo | sha256sum | cut -c1-12)
key=$(printf '%s %s %s' "$version" "$flags" "$cpu" | sha256sum | cut -c1-12)
wheels="${VOICEAGENT_CACHE:-$HOME/.cache/voiceagent}/wheels/llama-cpp-python-$key"
if ! ls "$wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
  echo "building llama-cpp-python $version for this CPU without AMX (~10-20 min on 2 cores, once) into $wheels"
  mkdir -p "$wheels.partial"
  CFLAGS="$flags" CXXFLAGS="$flags" "$python" -m pip wheel --no-deps --no-binary llama-cpp-python \
    --no-cache-dir --disable-pip-version-check -w "$wheels.partial" "llama-cpp-python==$version"
  rm -rf "$wheels" && mv "$wheels.partial" "$wheels"
fi
"$python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$wheels"/llama_cpp_python-*.whl
