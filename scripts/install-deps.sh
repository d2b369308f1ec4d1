#!/usr/bin/env bash
# Installs everything tspemu needs on a fresh Debian 12 machine (run as root).
# python3-torch is Debian's PyTorch, used only by the reference conformance test (Debian's
# /usr/bin/python3 owns it). CLI11 parses the tspemu command's arguments; nlohmann-json reads and
# writes JSON (safetensors headers, reports). clang builds the fuzzing harnesses; libFuzzer is in
# libclang-rt-14-dev, which clang-14 only recommends (and --no-install-recommends skips).
# chromium opens the page `tspemu paper` writes, headless, in tests/apps (every figure rendered).
# clang-tidy (with its run-clang-tidy) is test.sh's static-analysis step. libdnnl-dev is oneDNN,
# the bf16 GEMMs on AVX512_BF16 processors (cmake/tspemuOneDNN.cmake says why a library).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
  cmake g++ make ninja-build git ca-certificates \
  libtbb-dev libopenblas-dev libdnnl-dev libgtest-dev libgmock-dev libbenchmark-dev \
  nlohmann-json3-dev libcli11-dev pkg-config \
  python3 python3-torch python3-numpy \
  clang-format clang clang-tidy libclang-rt-14-dev \
  libopenmpi-dev openmpi-bin \
  chromium >/dev/null
