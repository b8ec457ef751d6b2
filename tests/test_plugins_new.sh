#!/usr/bin/env bash
# `keel plugins new` writes projects that build and pass their own tests against the installed
# SDK alone. Installs keel into a staging directory; then for each LANG:KIND given, the staged
# keel writes a project, which is configured with nothing but PKG_CONFIG_PATH pointing at the
# staged keel-sdk.pc (no --define-variable, no include path into this tree), built, and tested
# (`meson test`, the project's own doctest test). The plugin must export keel_plugin_entry
# alone, a C plugin must not link LibTorch, and the staged keel must load it and show its one
# documented option with the project's version. With --bad-input it also checks that bad
# arguments (unknown kind, non-empty DIR, bad NAME, C for a kind C cannot do) exit 2 with one
# error line and write nothing, and that the project's version has one source (meson.build).
# Prints the seconds each project took (generate, configure, build, test).
# Usage: test_plugins_new.sh BUILD_DIR [--bad-input] LANG:KIND...
set -euo pipefail
build=$(cd "$1" && pwd)
shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

meson install -C "$build" --destdir "$work/stage" --no-rebuild --quiet
prefix=$(meson introspect "$build" --buildoptions |
         /usr/bin/python3 -c 'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"]=="prefix"))')
keel="$work/stage$prefix/bin/keel"
pc=$(dirname "$(find "$work/stage" -name keel-sdk.pc)")
# The staged keel-sdk.pc is relocatable: read as it lies, its paths lead into the stage.
for var in includedir plugin_map; do
  path=$(PKG_CONFIG_PATH="$pc" pkg-config --variable="$var" keel-sdk)
  [[ -e "$path" && "$(realpath "$path")" == "$work/stage/"* ]] ||
    fail "keel-sdk.pc's $var ($path) does not lead into the stage $work/stage"
done
# No installed packages of the user's may join in (keel also searches the XDG data dir).
export HOME="$work/home" XDG_DATA_HOME=""
mkdir -p "$HOME"

# The option each kind's component documents, as `keel plugins show` prints its line.
declare -A option=(
  [model]='layers +list of integers in \[1, 1e\+09\] +default \[784, 256, 10\]'
  [dataset]='batch_size +integer in \[1, 1e\+06\] +default 32'
  [optimizer]='lr +float >= 0 +default 0.01'
  [lr_scheduler]='gamma +float in \[0, 1\] +default 0.999'
  [loss]='label_smoothing +float in \[0, 1\] +default 0.1'
  [grad_clipper]='max_norm +float >= 0 +default 1.0'
  [mfu]='peak_tflops +float >= 1e-09 +default \(required\)'
  [profiler]='path +string +default "phases.tsv"'
  [checkpoint]='checksum +bool +default true'
  [hook]='target_loss +float >= 0 +default 0.0'
)

bad_input=0
if [ "${1:-}" = --bad-input ]; then bad_input=1; shift; fi

for spec in "$@"; do
  lang=${spec%%:*} kind=${spec#*:}
  [ -n "${option[$kind]:-}" ] || fail "$spec: unknown kind in this test"
  name="acme-$lang-${kind//_/-}" component="acme_${lang}_$kind"
  dir="$work/$name"
  start=$(date +%s.%N)
  "$keel" plugins new "$name" --kind "$kind" --lang "$lang" "$dir" >/dev/null
  (cd "$dir" && PKG_CONFIG_PATH="$pc" meson setup build >"$work/log" 2>&1 &&
    ninja -C build >>"$work/log" 2>&1 && meson test -C build --print-errorlogs >>"$work/log" 2>&1) ||
    { cat "$work/log"; fail "$spec: the generated project does not build and pass its test"; }
  grep -q "^1/1 $component *OK" "$work/log" || { cat "$work/log"; fail "$spec: its test did not run"; }
  end=$(date +%s.%N)

  so="$dir/build/lib$name.so"
  exported=$(nm -D --defined-only "$so" | awk '{print $3}')
  [ "$exported" = keel_plugin_entry ] || fail "$spec: exports more than keel_plugin_entry: $exported"
  if [ "$lang" = c ] && readelf -d "$so" | grep -q 'NEEDED.*\(torch\|c10\)'; then
    fail "$spec: the C plugin links LibTorch"
  fi
  out=$(KEEL_PLUGIN_PATH="$dir/build" "$keel" plugins show "$component")
  grep -q "^$kind $component  (plugin $name 0.1.0, " <<<"$out" ||
    { echo "$out"; fail "$spec: keel plugins show does not show the component"; }
  grep -Eq "^  ${option[$kind]}" <<<"$out" ||
    { echo "$out"; fail "$spec: keel plugins show does not show the option ${option[$kind]}"; }
  awk -v s="$spec" -v a="$start" -v b="$end" \
    'BEGIN { printf "ok: %-18s built and tested in %5.1f s\n", s, b - a }'
done

[ "$bad_input" = 1 ] || exit 0

# Bad arguments: exit 2, one error line (plus the usage line), nothing written.
expect_usage_error() {  # expect_usage_error PATTERN ARGS...
  local pattern=$1 rc=0
  shift
  "$keel" plugins new "$@" >"$work/out" 2>"$work/err" || rc=$?
  [ "$rc" -eq 2 ] || { cat "$work/err"; fail "keel plugins new $*: exit $rc, expected 2"; }
  [ "$(grep -c '^keel: error: ' "$work/err")" -eq 1 ] || { cat "$work/err"; fail "$*: not one error line"; }
  grep -q "^keel: error: $pattern" "$work/err" || { cat "$work/err"; fail "$*: the message"; }
  [ ! -s "$work/out" ] || fail "$*: wrote to stdout"
  echo "ok: keel plugins new $*: $(head -1 "$work/err")"
}
expect_usage_error "--kind 'los': not a component kind; hint: did you mean 'loss'?" \
  acme --kind los "$work/typo"
[ ! -e "$work/typo" ] || fail "a refused kind created DIR"
mkdir "$work/full" && touch "$work/full/keep"
expect_usage_error "DIR '$work/full' exists and is not empty; hint: " acme --kind loss "$work/full"
[ "$(ls -A "$work/full")" = keep ] || fail "a refused DIR was changed"
expect_usage_error "NAME 'Acme': not a plugin name: it does not start with a lowercase letter; hint: " \
  Acme --kind loss "$work/bad-name"
expect_usage_error "NAME 'acme.loss': not a plugin name: it holds '\.'; hint: " \
  acme.loss --kind loss "$work/bad-name"
[ ! -e "$work/bad-name" ] || fail "a refused NAME created DIR"
expect_usage_error "--lang c: a loss needs LibTorch .*; hint: --lang cpp, or a kind C can implement: dataset, lr_scheduler, mfu, profiler, hook" \
  acme --kind loss --lang c "$work/c-loss"
[ ! -e "$work/c-loss" ] || fail "a refused --lang c created DIR"

# One source for the version: meson.build's project(version: ...) reaches the descriptor and
# keel-plugin.toml.
dir="$work/versioned"
"$keel" plugins new versioned --kind hook --lang c "$dir" >/dev/null
sed -i "s/version : '0.1.0'/version : '0.2.0'/" "$dir/meson.build"
(cd "$dir" && PKG_CONFIG_PATH="$pc" meson setup build >/dev/null && ninja -C build >/dev/null) ||
  fail "the versioned project does not build"
KEEL_PLUGIN_PATH="$dir/build" "$keel" plugins show versioned | grep -q "(plugin versioned 0.2.0, " ||
  fail "the plugin's version is not meson.build's"
grep -q '^version = "0.2.0"' "$dir/build/keel-plugin.toml" ||
  fail "keel-plugin.toml's version is not meson.build's"
echo "ok: the version comes from meson.build alone"
