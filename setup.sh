#!/usr/bin/env bash
# Sets up keel on Debian 12: installs the missing Debian packages (OpenBLAS's OpenMP build among
# them), then configures and builds (release) into ./build. keel's executables load that BLAS by
# path (meson.build, option blas_dir), not the 25x slower reference BLAS; the machine's BLAS
# alternatives stay as they are.
#   ./setup.sh            what building keel and training configs/quickstart.toml need, + build
#                         keel and the first-party plugins
#   ./setup.sh --tests    also what `meson test -C build` needs (python3-torch, chromium,
#                         abigail-tools, fortunes), + build everything
#   ./setup.sh --ci       also what .ci/run needs beyond that: clang-14, its sanitizer/libFuzzer
#                         runtime and llvm-14's symbolizer for the sanitizer build and the
#                         fuzzers (implies --tests), + build
#   ./setup.sh --torch wheel [...]
#                         against PyTorch 2.11's LibTorch instead of Debian's 1.13: makes the
#                         virtual environment .venv-torch/ (Debian's python3 -m venv) with
#                         torch==2.11.0 (CUDA 13.0 and NCCL with it, about 3.5 GB) and numpy from
#                         the Python package index, then configures and builds build-wheel/
#                         (-Dtorch=wheel, -Dtorch_cuda=auto: keel links CUDA and NCCL when the
#                         wheel has them, and runs on the CPU without a GPU; docs/torch.md)
#   ./setup.sh --torch wheel --venv-only [...]
#                         only the packages and .venv-torch/, no build (.ci/run makes it beside
#                         another phase's build)
#   BUILD_DIR=out ./setup.sh [...]
#   ./setup.sh [...] -- MESON_OPTION...
#                         options for `meson setup` when it makes the build directory (a build
#                         directory that exists keeps its own; `meson configure DIR -D...`
#                         changes it): .ci/run builds build-wheel/ with -- -Doptimization=0
#                         (and CC=clang-14 CXX=clang++-14, which meson setup reads)
# doctest-dev stays in the base set: the build compiles the doctest test executables by default,
# and without the package meson would download doctest (subprojects/doctest.wrap).
# The plugin SDK needs no install: the build holds it uninstalled (BUILD_DIR/meson-uninstalled/:
# keel-sdk, keel-testing and keel-embedding, over sdk/ and the libraries keel and the plugins
# link), and `BUILD_DIR/kernel/keel plugins new` prints the line that builds a new project
# against it (docs/plugins.md, "Writing a plugin in C++").
# The fortunes corpus of configs/char_gpt.toml (not the quickstart): the package is test-only
# (tests/plugins/test_gpt.py); when it is installed, data/fortunes/ is tokenized once after the build
# (a few seconds), otherwise one line says how to get it.
set -euo pipefail
cd "$(dirname "$0")"

# The pinned PyTorch of --torch wheel: the release keel's GPU machines have (docs/torch.md).
TORCH_WHEEL=torch==2.11.0
VENV=.venv-torch

tests=0 ci=0 torch=debian venv_only=0 meson_options=()
while (($#)); do
  case "$1" in
    --) shift; meson_options=("$@"); break ;;
    --tests) tests=1 ;;
    --venv-only) venv_only=1 ;;
    --ci) tests=1 ci=1 ;;
    --torch)
      torch=${2-}
      shift
      if [ "$torch" != debian ] && [ "$torch" != wheel ]; then
        echo "setup.sh: error: --torch '$torch' is not a LibTorch keel builds against; hint:" \
             "--torch debian (Debian's 1.13, the default) or --torch wheel (PyTorch 2.11)" >&2
        exit 2
      fi
      ;;
    *)
      echo "setup.sh: error: unknown option '$1'; hint: ./setup.sh [--tests | --ci]" \
           "[--torch debian|wheel [--venv-only]] [-- MESON_OPTION...]" >&2
      exit 2
      ;;
  esac
  shift
done
if ((venv_only)) && [ "$torch" != wheel ]; then
  echo "setup.sh: error: --venv-only makes the virtual environment of --torch wheel; hint:" \
       "./setup.sh --torch wheel --venv-only" >&2
  exit 2
fi
if [ "$torch" = wheel ]; then
  BUILD_DIR=${BUILD_DIR:-build-wheel}
else
  BUILD_DIR=${BUILD_DIR:-build}
fi

# Building keel and running configs/quickstart.toml.
PACKAGES=(
  g++ pkg-config meson ninja-build
  libtorch-dev libgloo-dev            # LibTorch 1.13 (CPU) and c10d's gloo backend
  libopenblas0-openmp                 # the BLAS keel's LibTorch calls (meson.build loads it
                                      # by path), on LibTorch's own OpenMP threads
  libboost-dev libboost-program-options-dev
  libtomlplusplus-dev libspdlog-dev zlib1g-dev
  doctest-dev                         # the test executables, built by default (see above)
  nlohmann-json3-dev                  # JSON: metrics.jsonl, Chrome traces, safetensors headers,
                                      # checkpoint commit records
  libxxhash-dev                       # XXH3 checksums of checkpoint files
  libssl-dev                          # SHA-256 of plugin files (lock files, packages)
  libarchive-dev                      # .tar.gz plugin packages
  libabsl-dev                         # Abseil's flat_hash_map: keel::EmbeddingTable's id -> row
                                      # map (sdk/embedding, pkg-config keel-embedding)
  dataset-fashion-mnist               # the quickstart's data
  libzstd-dev                         # .zst window files of the criteo dataset (plugins/criteo)
)
# --torch wheel: the virtual environment (the wheel brings LibTorch; Gloo's headers, which it
# lacks, stay libgloo-dev's).
[ "$torch" = wheel ] && PACKAGES+=(python3-venv)
# --tests: `meson test -C build`.
TEST_PACKAGES=(
  python3-torch                       # the same LibTorch build, for tests against PyTorch
  chromium                            # test_report.py renders `keel report` headless
  abigail-tools                       # abi_diff: abidiff of the ABI against tests/abi/
  fortunes                            # test_gpt.py; text for configs/char_gpt.toml
)
# --ci: .ci/run's sanitizer build and fuzzers.
CI_PACKAGES=(
  clang-14 libclang-rt-14-dev         # the sanitizer build and the libFuzzer targets (tests/fuzz)
  llvm-14                             # llvm-symbolizer: function names in sanitizer reports
)
((tests)) && PACKAGES+=("${TEST_PACKAGES[@]}")
((ci)) && PACKAGES+=("${CI_PACKAGES[@]}")

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
else
  echo "setup: nothing to install (${#PACKAGES[@]} packages already installed)"
fi

setup_args=()
if [ "$torch" = wheel ]; then
  # The pinned torch and numpy (the tests' PyTorch side), once; pip keeps its downloads in
  # ~/.cache/pip. Where the package index cannot be reached this is the one line that says so.
  # --no-compile: Python compiles a module when it is first imported, not all 5,948 of the
  # environment's at install (27 s of CPU here, beside .ci/run's sanitizer build).
  if ! "$VENV/bin/python" -c 'import torch, numpy, sys; sys.exit(torch.__version__.split("+")[0] != "'"${TORCH_WHEEL#torch==}"'")' 2>/dev/null; then
    /usr/bin/python3 -m venv "$VENV"
    echo "setup: installing $TORCH_WHEEL and numpy into $VENV/ (about 3.5 GB with CUDA and NCCL)"
    if ! "$VENV/bin/pip" install -q --disable-pip-version-check --no-compile "$TORCH_WHEEL" numpy; then
      echo "setup.sh: error: pip could not install $TORCH_WHEEL into $VENV/ (is the Python" \
           "package index reachable?); hint: ./setup.sh without --torch builds against" \
           "Debian's LibTorch" >&2
      exit 1
    fi
  fi
  setup_args=(-Dtorch=wheel "-Dtorch_python=$PWD/$VENV/bin/python")
  if ((venv_only)); then
    echo "setup: $VENV/ holds $TORCH_WHEEL (--venv-only: nothing built)"
    exit 0
  fi
fi

build_start=$SECONDS
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  meson setup "$BUILD_DIR" --buildtype=release "${setup_args[@]}" "${meson_options[@]}"
else
  if ((${#meson_options[@]})); then
    echo "setup: $BUILD_DIR/ exists and keeps its options: ${meson_options[*]} not applied; hint:" \
         "meson configure $BUILD_DIR ${meson_options[*]}"
  fi
  if ((${#missing[@]})); then
    # finds what was just installed (OpenBLAS's OpenMP build)
    meson setup --reconfigure "$BUILD_DIR"
  fi
fi
if ((tests)); then
  ninja -C "$BUILD_DIR"  # everything: keel, the plugins, the tests' executables and fixtures
else
  # keel and the first-party plugins: what the quickstart runs (./setup.sh --tests builds the
  # rest).
  mapfile -t targets < <(meson introspect "$BUILD_DIR" --targets | /usr/bin/python3 -c '
import json, os, sys
build, plugins = os.path.realpath(sys.argv[1]), os.path.realpath("plugins") + os.sep
for t in json.load(sys.stdin):
    if (t["name"] == "keel" and t["type"] == "executable") or \
            os.path.realpath(t["defined_in"]).startswith(plugins):
        print("\n".join(os.path.relpath(f, build) for f in t["filename"]))' "$BUILD_DIR")
  ninja -C "$BUILD_DIR" "${targets[@]}"
fi
s=$((SECONDS - build_start))
printf 'setup: build took %dm %02ds\n' $((s / 60)) $((s % 60))
echo "setup: built into $BUILD_DIR (keel: $BUILD_DIR/kernel/keel; a plugin of your own:" \
     "$BUILD_DIR/kernel/keel plugins new NAME --kind KIND DIR, then the line it prints)"

# The character-level corpus of configs/char_gpt.toml (once; a few seconds).
if [ ! -f data/fortunes/tokens.bin ]; then
  if [ -d /usr/share/games/fortunes ]; then
    configs/prepare_fortunes.sh "$BUILD_DIR/kernel/keel" data/fortunes
  else
    echo "setup: data/fortunes/ (configs/char_gpt.toml) not prepared;" \
         "hint: ./setup.sh --tests, or apt-get install fortunes && configs/prepare_fortunes.sh"
  fi
fi
