#!/usr/bin/env bash
# Installs dependencies, builds tspemu and runs its main job on the built-in default
# (`tspemu run` with no arguments). Extra arguments are passed to `tspemu`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target tspemu
if [ "$#" -eq 0 ]; then set -- run; fi
./build/apps/tspemu "$@"
