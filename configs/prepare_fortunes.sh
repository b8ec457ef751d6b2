#!/usr/bin/env bash
# Tokenizes the text of Debian's `fortunes` package (about 2.5 MB of English text) at character
# level for configs/char_gpt.toml:
#   configs/prepare_fortunes.sh [KEEL_BINARY] [OUTPUT_DIR]
# KEEL_BINARY defaults to build/kernel/keel, OUTPUT_DIR to data/fortunes (both relative to the
# repository root). Writes OUTPUT_DIR/tokens.bin and OUTPUT_DIR/vocab.json (`keel prepare`).
# setup.sh runs it once after the build.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
keel=${1:-$root/build/kernel/keel}
out=${2:-$root/data/fortunes}
src=/usr/share/games/fortunes
if [[ ! -d $src ]]; then
  echo "prepare_fortunes: $src does not exist; hint: install Debian's fortunes package (./setup.sh does)" >&2
  exit 1
fi
# The fortune files themselves, in name order: not the .dat indexes or the .u8 links.
mapfile -t files < <(find "$src" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | LC_ALL=C sort)
text=$(mktemp "${TMPDIR:-/tmp}/fortunes.XXXXXX.txt")
trap 'rm -f "$text"' EXIT
cat "${files[@]}" > "$text"
"$keel" prepare "$text" --output "$out" --level char
