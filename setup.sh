#!/usr/bin/env bash
# Sets up keel on Debian 12: installs the missing Debian packages, makes sure the system BLAS
# is OpenBLAS's OpenMP build (not the 25x slower reference BLAS), then configures and builds
# into ./build and tokenizes the fortunes corpus for configs/char_gpt.toml into ./data/fortunes.
#   ./setup.sh            install what is missing + build
#   BUILD_DIR=out ./setup.sh
set -euo pipefail
cd "$(dirname "$0")"
BUILD_DIR=${BUILD_DIR:-build}

PACKAGES=(
  g++ pkg-config meson ninja-build
  libtorch-dev libgloo-dev            # LibTorch 1.13 (CPU) and c10d's gloo backend
  libopenblas0-openmp                 # the BLAS LibTorch calls (without it, reference BLAS),
                                      # built on OpenMP, whose threads LibTorch's are too
  libboost-dev libboost-program-options-dev
  libtomlplusplus-dev libspdlog-dev doctest-dev zlib1g-dev
  nlohmann-json3-dev                  # JSON: metrics.jsonl, Chrome traces, safetensors headers,
                                      # checkpoint commit records
  libxxhash-dev                       # XXH3 checksums of checkpoint files
  libssl-dev                          # SHA-256 of plugin files (lock files, packages)
  libarchive-dev                      # .tar.gz plugin packages
  python3-torch                       # the same LibTorch build, for tests against PyTorch
  dataset-fashion-mnist
  fortunes                            # text for configs/char_gpt.toml (configs/prepare_fortunes.sh)
  chromium                            # tests: test_report.py renders `keel report` headless
  clang-14 libclang-rt-14-dev         # .ci/run: the libFuzzer targets (tests/fuzz)
  abigail-tools                       # tests: abidiff of the ABI against tests/abi/
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# libblas.so.3 and libopenblas.so.0 (LibTorch links both) must resolve to the OpenMP build of
# OpenBLAS: its threads are LibTorch's OpenMP threads (one pool), so matrix products use every
# core without oversubscribing them. The pthread build has a pool of its own, which spins against
# LibTorch's, so keel runs that one single-threaded (half the cores for matrix products on 2).
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
for lib in libblas.so.3 libopenblas.so.0; do
  current=$(readlink -f "/usr/lib/$arch/$lib" || true)
  if [[ "$current" != */openblas-openmp/* ]]; then
    echo "setup: selecting OpenBLAS (OpenMP) as $lib (was $current)"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO update-alternatives --set "$lib-$arch" "/usr/lib/$arch/openblas-openmp/$lib"
  fi
done

if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  meson setup "$BUILD_DIR" --buildtype=release
fi
ninja -C "$BUILD_DIR"
echo "setup: built into $BUILD_DIR (keel: $BUILD_DIR/kernel/keel)"
# The character-level corpus of configs/char_gpt.toml (once; a few seconds).
if [ ! -f data/fortunes/tokens.bin ]; then
  configs/prepare_fortunes.sh "$BUILD_DIR/kernel/keel" data/fortunes
fi
