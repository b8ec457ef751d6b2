#!/bin/bash
# The plugin ABI against its committed libabigail baselines: reads the ABI's types from the
# surface library (tests/abi/surface.c, built against the current <keel/abi.h>) with abidw and
# compares them with abidiff against every baseline tests/abi/keel-abi-<major>.<minor>.abi of
# the current major. What a minor version may add passes: data members appended at the end of
# a struct (tests/abi/appends.suppr), new types (new functions of the surface library) and new
# enumerators. Anything else fails with the full abidiff output.
#
# Usage: test_abi_diff.sh SURFACE_LIBRARY SOURCE_ROOT [--update]
#   --update  writes the baseline of the current version (after the same check against the
#             baselines that exist); `meson test -C build abi_diff --test-args=--update`
set -u

me=test_abi_diff
if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  echo "$me: expected SURFACE_LIBRARY SOURCE_ROOT [--update], got $# arguments; hint: meson" \
       "test -C build abi_diff runs it with the right ones" >&2
  exit 1
fi
lib=$1
src=$(cd "$2" && pwd)
update=${3:-}

for tool in abidw abidiff; do
  if ! command -v "$tool" >/dev/null; then
    echo "$me: $tool not found; hint: ./setup.sh installs abigail-tools" >&2
    exit 1
  fi
done
if [ -n "$update" ] && [ "$update" != --update ]; then
  echo "$me: unknown argument '$update'; hint: the only option is --update" >&2
  exit 1
fi

header=$src/sdk/include/keel/abi.h
major=$(sed -n 's/^#define KEEL_ABI_MAJOR \([0-9]*\)$/\1/p' "$header")
minor=$(sed -n 's/^#define KEEL_ABI_MINOR \([0-9]*\)$/\1/p' "$header")
if [ -z "$major" ] || [ -z "$minor" ]; then
  echo "$me: $header: no '#define KEEL_ABI_MAJOR <n>' and '#define KEEL_ABI_MINOR <n>' lines;" \
       "hint: the script reads the version from them" >&2
  exit 1
fi
baseline=$src/tests/abi/keel-abi-$major.$minor.abi
suppr=$src/tests/abi/appends.suppr

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The ABI as abidw reads it, without what depends on the build: the corpus and compilation
# paths, DT_NEEDED, the architecture, source locations, and the source file's path (the name
# the compiler was given, relative to the build directory).
if ! abidw --no-corpus-path --no-comp-dir-path --no-elf-needed --no-architecture \
     --no-show-locs --out-file "$tmp/raw.abi" "$lib"; then
  echo "$me: abidw could not read $lib; hint: build it with -g (meson test builds it)" >&2
  exit 1
fi
sed "s|path='[^']*surface\\.c'|path='surface.c'|" "$tmp/raw.abi" >"$tmp/current.abi"

# Prints every line of an `abidiff --leaf-changes-only` report that is not part of a pure
# append: a struct whose size grew, with members inserted at or beyond its old size. Exits 1
# when there is one.
not_appends() {
  awk '
    /^(Leaf changes summary|Changed leaf types summary): / { next }
    /^Removed\/Changed\/Added (functions|variables) summary: / { next }
    /^$/ { next }
    /^\047struct [A-Za-z0-9_]+\047 changed:$/ { old = -1; next }
    /^  type size changed from [0-9]+ to [0-9]+ \(in bits\)$/ { old = $5; next }
    /^  [0-9]+ data member insertions?:$/ { next }
    /^    \047[^\047]*\047, at offset [0-9]+ \(in bits\)$/ {
      if (old >= 0 && $(NF - 2) + 0 >= old + 0) next
    }
    { bad = 1; print }
    END { exit bad }' "$1"
}

# check BASELINE: 0 when the surface only adds to BASELINE, else prints why and returns 1.
check() {
  local base=$1 rc leaf_rc
  # 1. Nothing removed or changed, except structs grown by members at their end (the
  #    suppression still reports a struct that lost a member or shrank, or whose new member lies
  #    before the end of its old last member).
  abidiff --no-added-syms --suppressions "$suppr" "$base" "$tmp/current.abi" >"$tmp/suppressed"
  rc=$?
  # 2. The suppression does not look at the members that were already there (a swap or a
  #    retyped member of the same size passes it), nor at the old tail padding: every leaf
  #    change must be a pure append.
  abidiff --no-added-syms --leaf-changes-only --no-show-locs "$base" "$tmp/current.abi" \
    >"$tmp/leaf"
  leaf_rc=$?
  if [ "$rc" -eq 0 ] && [ $((leaf_rc & 3)) -eq 0 ] && not_appends "$tmp/leaf" >/dev/null; then
    if [ "$leaf_rc" -eq 0 ]; then
      echo "$me: ${base#"$src"/}: nothing removed or changed"
    else
      echo "$me: ${base#"$src"/}: only appended members:"
      cat "$tmp/leaf"
    fi
    return 0
  fi
  echo "$me: the plugin ABI changed incompatibly against ${base#"$src"/}" \
       "(abidiff exit $rc; leaf changes exit $leaf_rc); hint: within ABI $major only appended" \
       "struct members, new types and new enumerators are allowed (docs/abi.md); anything" \
       "else needs KEEL_ABI_MAJOR $((major + 1))"
  echo "--- abidiff --suppressions ${suppr#"$src"/} (changes that are not appends):"
  cat "$tmp/suppressed"
  echo "--- abidiff --leaf-changes-only (every changed type):"
  cat "$tmp/leaf"
  echo "--- lines of that report that are not part of an append:"
  not_appends "$tmp/leaf"
  return 1
}

shopt -s nullglob
baselines=("$src"/tests/abi/keel-abi-"$major".*.abi)
if [ -z "$update" ] && [ ! -f "$baseline" ]; then
  echo "$me: no baseline for ABI $major.$minor: ${baseline#"$src"/} is missing; hint: after a" \
       "minor bump, write it with \`meson test -C build abi_diff --test-args=--update\`" \
       "(docs/abi.md)" >&2
  exit 1
fi
failed=0
for base in "${baselines[@]}"; do
  check "$base" || failed=1
done
[ "$failed" -eq 0 ] || exit 1

if [ -n "$update" ]; then
  cp "$tmp/current.abi" "$baseline"
  echo "$me: wrote ${baseline#"$src"/}"
fi
