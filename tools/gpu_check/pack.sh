#!/usr/bin/env bash
# Packs the keel of a wheel build (-Dtorch=wheel, CUDA and NCCL linked) for a GPU machine that
# holds only PyTorch 2.11 in a virtual environment and has no network (docs/gpu-check.md):
#   tools/gpu_check/pack.sh [--build DIR] [--output DIR] [--fashion-mnist DIR] [--fortunes DIR]
#                           [--allow-cpu-build]
# Builds nothing. --build defaults to build-wheel/, --output to build-wheel/gpu-check/ (ignored
# by git, so a device run can carry it). Writes OUTPUT/keel-gpu-check.tar.xz holding one
# directory, keel-gpu-check/:
#   bin/keel            the build's keel, its RPATH or RUNPATH (if any) rewritten to
#                       $ORIGIN/../lib
#   plugins/*.so        the first-party plugins, their RUNPATH or RPATH (if any) rewritten to
#                       $ORIGIN (keel refuses a plugin whose RUNPATH names a directory that does
#                       not exist, as this machine's venv does not there; run.sh's
#                       LD_LIBRARY_PATH finds LibTorch and the bundle's lib/)
#   lib/                every library ldd resolves for those outside the build's Python
#                       environment and outside glibc and the compiler's runtime: the Debian
#                       libraries keel links (spdlog, fmt, Boost, toml++, libarchive and what it
#                       pulls in, ...), which the GPU machine may lack or hold in other versions
#   lib/compat/         this machine's libstdc++ and libgcc_s, which run.sh puts first only when
#                       the GPU machine's libstdc++ is too old for keel
#   configs/            quickstart.toml and char_gpt.toml as in the checkout
#   data/               Fashion-MNIST (--fashion-mnist, default Debian's dataset-fashion-mnist)
#                       and the fortunes tokens (--fortunes, default data/fortunes: made by
#                       configs/prepare_fortunes.sh)
#   run.sh, judge.py    the check script and its judge of each run's records
#   BUNDLE.txt          where the bundle came from (commit, build, the
#                       versions keel --version prints, each file's size and SHA-256)
# Prints the size unpacked and packed; fails when the tarball is 64 MiB or more (the most a
# device run carries). The build must link libtorch_cuda; --allow-cpu-build packs a CPU-only
# build anyway (only run.sh --device cpu can pass with it).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$root/build-wheel
output=$root/build-wheel/gpu-check
fashion=/usr/share/datasets/fashion-mnist
fortunes=$root/data/fortunes
allow_cpu=0
limit=$((64 * 1024 * 1024))

die() { echo "pack: $*" >&2; exit 1; }
trap 'echo "pack: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
while [[ $# -gt 0 ]]; do
  case $1 in
    --build) build=${2:?--build needs a directory}; shift 2 ;;
    --output) output=${2:?--output needs a directory}; shift 2 ;;
    --fashion-mnist) fashion=${2:?--fashion-mnist needs a directory}; shift 2 ;;
    --fortunes) fortunes=${2:?--fortunes needs a directory}; shift 2 ;;
    --allow-cpu-build) allow_cpu=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1'; hint: tools/gpu_check/pack.sh --help" ;;
  esac
done
build=$(cd "$build" 2>/dev/null && pwd) || die "--build: no directory $build"
keel=$build/kernel/keel
[[ -x $keel ]] || die "$keel does not exist; hint: build it first (ninja -C $build)"
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz \
         t10k-labels-idx1-ubyte.gz; do
  [[ -f $fashion/$f ]] || die "--fashion-mnist: $fashion/$f does not exist; hint: install Debian's dataset-fashion-mnist (./setup.sh does)"
done
for f in tokens.bin vocab.json; do
  [[ -f $fortunes/$f ]] || die "--fortunes: $fortunes/$f does not exist; hint: configs/prepare_fortunes.sh $keel $fortunes"
done
for tool in readelf ldd tar xz python3 sha256sum; do
  command -v "$tool" >/dev/null || die "needs $tool on PATH"
done

# The build's LibTorch, as keel resolves it here: its Python environment (site-packages, which
# holds torch/ and nvidia/) is what the GPU machine has, so nothing under it is packed.
torch_lib=$(ldd "$keel" | awk '$1 == "libtorch_cpu.so" && $3 ~ /^\// && !n++ {print $3}')
[[ -n $torch_lib ]] || die "ldd $keel does not resolve libtorch_cpu.so: is $build a -Dtorch=wheel build?"
torch_lib=$(dirname "$(readlink -f "$torch_lib")")
site=$(dirname "$(dirname "$torch_lib")")
[[ -d $site/torch ]] || die "$torch_lib is not inside a Python environment's torch/lib"
if ! readelf -d "$keel" | grep -q 'NEEDED.*\[libtorch_cuda\.so\]'; then
  [[ $allow_cpu == 1 ]] || die "$keel does not link libtorch_cuda (a CPU-only build); hint: configure $build with -Dtorch_cuda=enabled, or pass --allow-cpu-build for a dry run on the CPU"
  echo "pack: warning: $keel does not link libtorch_cuda: a CPU-only bundle (run.sh --device cpu only)"
fi

stage=$(mktemp -d "${TMPDIR:-/tmp}/keel-gpu-check-pack.XXXXXX")
trap 'rm -rf "$stage"' EXIT
b=$stage/keel-gpu-check
mkdir -p "$b"/{bin,plugins,lib/compat,configs,data/fortunes,data/fashion-mnist}

# Executables and plugins, their search paths rewritten (set_runpath.py), each rewrite checked:
# everything readelf shows of the dynamic section, the dynamic symbols and the version tables
# is unchanged but the path line.
elf_view() {
  readelf -d "$1" | grep -v -E '\((RUNPATH|RPATH)\)'
  readelf --dyn-syms -W "$1"
  readelf -V -W "$1"
}
rewrite() {  # FILE NEW_PATH: a file without RPATH or RUNPATH stays as it is
  local before after
  readelf -d "$1" | grep -q -E '\((RUNPATH|RPATH)\)' || return 0
  before=$(elf_view "$1")
  python3 "$here/set_runpath.py" "$1" "$2"
  after=$(elf_view "$1")
  [[ $before == "$after" ]] || die "rewriting the search path of $1 changed more than the path"
  [[ $(readelf -d "$1" | sed -n 's/.*(R[UN]*PATH).*\[\(.*\)\]$/\1/p') == "$2" ]] ||
    die "$1: the search path is not '$2' after the rewrite"
}
elves=("$keel")
install -m 755 "$keel" "$b/bin/keel"
rewrite "$b/bin/keel" '$ORIGIN/../lib'
# The CTR check's data generator (no LibTorch; its libraries are packed as keel's are).
generator=$build/plugins/criteo/keel-criteo-generate
[[ -x $generator ]] || die "no $generator; hint: build it (ninja -C $build)"
elves+=("$generator")
install -m 755 "$generator" "$b/bin/keel-criteo-generate"
rewrite "$b/bin/keel-criteo-generate" '$ORIGIN/../lib'
mapfile -t plugins < <(find "$build/plugins" -maxdepth 2 -name 'libkeel-*.so' -type f | LC_ALL=C sort)
[[ ${#plugins[@]} -gt 0 ]] || die "no plugins under $build/plugins; hint: build them (ninja -C $build)"
for p in "${plugins[@]}"; do
  elves+=("$p")
  install -m 755 "$p" "$b/plugins/$(basename "$p")"
  rewrite "$b/plugins/$(basename "$p")" '$ORIGIN'
done

# The libraries: ldd's closure of each file (with the build's LibTorch and NVIDIA libraries on
# LD_LIBRARY_PATH, so that it resolves them there and leaves them out), less what every glibc
# system has (glibc's own libraries, the dynamic loader) and the compiler's runtime (libstdc++,
# libgcc_s: in lib/compat instead, see below). Each library is packed under the name keel
# needs (its soname), from the file that name resolves to.
nvidia_dirs=$(find "$site/nvidia" -mindepth 2 -maxdepth 2 -name lib -type d 2>/dev/null | LC_ALL=C sort | paste -sd: -)
ldd_path=$torch_lib${nvidia_dirs:+:$nvidia_dirs}
basics='^(linux-vdso|libc|libm|libpthread|libdl|librt|libutil|libresolv|libmvec|ld-linux-x86-64|libgcc_s|libstdc\+\+)\.so'
declare -A packed=()
for f in "${elves[@]}"; do
  while read -r name arrow path _; do
    [[ $arrow == "=>" ]] || continue
    [[ $path == "not" ]] && die "ldd $f: $name not found; hint: install it here (./setup.sh --torch wheel), then pack again"
    [[ $name =~ $basics ]] && continue
    case $(readlink -f "$path") in "$site"/*) continue ;; esac
    [[ -n ${packed[$name]:-} ]] && continue
    packed[$name]=$path
    install -m 644 "$(readlink -f "$path")" "$b/lib/$name"
  done < <(LD_LIBRARY_PATH=$ldd_path ldd "$f")
done
for name in libstdc++.so.6 libgcc_s.so.1; do
  path=$(LD_LIBRARY_PATH=$ldd_path ldd "$keel" | awk -v n="$name" '$1 == n && !k++ {print $3}')
  [[ -n $path ]] || die "ldd $keel does not resolve $name"
  install -m 644 "$(readlink -f "$path")" "$b/lib/compat/$name"
done

install -m 644 "$root/configs/quickstart.toml" "$root/configs/char_gpt.toml" \
  "$root/configs/ctr.toml" "$b/configs/"
install -m 644 "$fashion"/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz "$b/data/fashion-mnist/"
install -m 644 "$fortunes/tokens.bin" "$fortunes/vocab.json" "$b/data/fortunes/"
install -m 755 "$here/run.sh" "$here/judge.py" "$b/"

{
  echo "keel GPU check bundle (tools/gpu_check/pack.sh; docs/gpu-check.md)"
  echo "packed: $(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -n)"
  echo "commit: $(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "build: $build (LibTorch of $site)"
  echo "torch: $(cat "$site"/torch/version.py 2>/dev/null | sed -n "s/^__version__ = '\(.*\)'.*/\1/p")"
  echo "needs: glibc >= $(objdump -T "${elves[@]}" 2>/dev/null | grep -o 'GLIBC_2\.[0-9]*' | sort -uV | tail -1 | cut -d_ -f2)," \
    "libstdc++ with $(objdump -T "${elves[@]}" 2>/dev/null | grep -o 'GLIBCXX_[0-9.]*' | sort -uV | tail -1) (else lib/compat's)"
  echo "keel --version (here):"
  "$keel" --version 2>&1 | sed 's/^/  /'
  echo "files:"
  (cd "$b" && find . -type f ! -name BUNDLE.txt | LC_ALL=C sort | while read -r f; do
    printf '  %10d  %s  %s\n' "$(stat -c %s "$f")" "$(sha256sum "$f" | cut -c1-64)" "${f#./}"
  done)
} > "$b/BUNDLE.txt"
chmod 644 "$b/BUNDLE.txt"
find "$b" -type d -exec chmod 755 {} +

mkdir -p "$output"
tarball=$output/keel-gpu-check.tar.xz
rm -f "$tarball.tmp"
XZ_OPT=${XZ_OPT:--6 -T0} tar -C "$stage" --owner=0 --group=0 --numeric-owner --sort=name \
  -cJf "$tarball.tmp" keel-gpu-check
mv "$tarball.tmp" "$tarball"
unpacked=$(du -sb "$b" | cut -f1)
packed_size=$(stat -c %s "$tarball")
mib() { awk -v n="$1" 'BEGIN { printf "%.1f MiB", n / 1048576 }'; }
echo "pack: keel $(mib "$(stat -c %s "$b/bin/keel")"), ${#plugins[@]} plugins $(mib "$(du -cb "$b"/plugins/*.so | tail -1 | cut -f1)"), ${#packed[@]} libraries $(mib "$(du -sb "$b/lib" | cut -f1)") (compat/ included), data $(mib "$(du -sb "$b/data" | cut -f1)")"
echo "pack: $tarball: $(mib "$packed_size") ($(mib "$unpacked") unpacked)"
[[ $packed_size -lt $limit ]] || die "$tarball is $(mib "$packed_size"), not under 64 MiB"
