#!/usr/bin/env bash
# `keel plugins new` writes projects that build and pass their own tests, and that keel loads.
#  - The first project is written by the build tree's keel (BUILD_DIR/kernel/keel, as the
#    README's set-up leaves it, nothing installed), and built as its author would: the `next:`
#    line keel prints, run verbatim with bash in the directory keel ran in, with no
#    PKG_CONFIG_PATH of ours (the line names the build's uninstalled SDK); then the commands of
#    its README's "Build and test" section, in the project's directory (the setup is the next
#    line's, already done; its test runs again); then the first command of its README's "Use it"
#    section, which must show the component.
#  - The others (when more than one LANG:KIND is given) are built against the installed SDK
#    alone: keel is installed into a staging directory, the staged keel writes them (its `next:`
#    line names the staged keel-sdk.pc's directory), and they are built together with nothing but
#    PKG_CONFIG_PATH pointing at the staged keel-sdk.pc and keel-testing.pc (no
#    --define-variable, no include path into this tree), in one build at -O0: a wrapper meson
#    project whose subprojects/ holds them; each keeps its own meson.build and its own test.
# For every project: its own doctest test ran and passed, the plugin exports keel_plugin_entry
# alone, a C plugin does not link LibTorch, and the keel that wrote it loads it and shows its one
# documented option with the project's version. With --bad-input it also checks that bad
# arguments (unknown kind, non-empty DIR, bad NAME, C for a kind C cannot do) exit 2 with one
# error line and write nothing, and that the project's version has one source (meson.build):
# the standalone project, its version changed there and rebuilt with `meson compile`, shows the
# new version in `keel plugins show` and in its keel-plugin.toml.
# Prints the seconds each phase took.
# Usage: test_plugins_new.sh BUILD_DIR [--bad-input] LANG:KIND...
set -euo pipefail
build=$(cd "$1" && pwd)
shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
t0=$(date +%s.%N)
phase() {  # phase WHAT: prints the seconds since the last phase
  local now
  now=$(date +%s.%N)
  awk -v w="$1" -v a="$t0" -v b="$now" 'BEGIN { printf "ok: %-58s %6.1f s\n", w, b - a }'
  t0=$now
}

# The build tree's keel, as the README's set-up leaves it.
keel="$build/kernel/keel"
# No installed packages of the user's may join in (keel also searches the XDG data dir), and no
# PKG_CONFIG_PATH of the caller's may help the printed line.
export HOME="$work/home" XDG_DATA_HOME=""
unset PKG_CONFIG_PATH
mkdir -p "$HOME"
# A compiler cache could only miss (each file is compiled once, into a cache in that HOME) and
# would preprocess each file a second time to look.
export CCACHE_DISABLE=1

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
  [step]='weight +float >= 0 +default 0.1'
)

bad_input=0
if [ "${1:-}" = --bad-input ]; then bad_input=1; shift; fi
[ $# -ge 1 ] || fail "no LANG:KIND given"

# check_plugin SPEC NAME COMPONENT PLUGIN_DIR KEEL: the built plugin's exports and libraries, and
# what KEEL (the keel that wrote it) shows of it.
check_plugin() {
  local spec=$1 name=$2 component=$3 plugin_dir=$4 keel=$5 lang=${1%%:*} kind=${1#*:}
  local so="$plugin_dir/lib$name.so" exported out
  [ -f "$so" ] || fail "$spec: no $so"
  exported=$(nm -D --defined-only "$so" | awk '{print $3}')
  [ "$exported" = keel_plugin_entry ] || fail "$spec: exports more than keel_plugin_entry: $exported"
  if [ "$lang" = c ] && readelf -d "$so" | grep -q 'NEEDED.*\(torch\|c10\)'; then
    fail "$spec: the C plugin links LibTorch"
  fi
  out=$(KEEL_PLUGIN_PATH="$plugin_dir" "$keel" plugins show "$component")
  grep -q "^$kind $component  (plugin $name 0.1.0, " <<<"$out" ||
    { echo "$out"; fail "$spec: keel plugins show does not show the component"; }
  grep -Eq "^  ${option[$kind]}" <<<"$out" ||
    { echo "$out"; fail "$spec: keel plugins show does not show the option ${option[$kind]}"; }
}

specs=() names=() components=()
for spec in "$@"; do
  lang=${spec%%:*} kind=${spec#*:}
  [ -n "${option[$kind]:-}" ] || fail "$spec: unknown kind in this test"
  specs+=("$spec") names+=("acme-$lang-${kind//_/-}") components+=("acme_${lang}_$kind")
done

# The standalone project: written by the build tree's keel into a directory named relative to
# where it runs, and built by the `next:` line it prints, verbatim.
spec=${specs[0]} name=${names[0]} component=${components[0]} dir="$work/${names[0]}"
(cd "$work" && "$keel" plugins new "$name" --kind "${spec#*:}" --lang "${spec%%:*}" "$name") \
  >"$work/new.out" || { cat "$work/new.out"; fail "$spec: keel plugins new failed"; }
next=$(sed -n 's/^next: //p' "$work/new.out")
[ "$next" = "cd $name && PKG_CONFIG_PATH=$build/meson-uninstalled meson setup build && meson compile -C build && meson test -C build" ] ||
  { cat "$work/new.out"; fail "$spec: the next line is not the build tree's"; }
(cd "$work" && echo "\$ $next" && bash -ec "$next") >"$work/log" 2>&1 ||
  { cat "$work/log" "$dir/build/meson-logs/testlog.txt" 2>/dev/null
    fail "$spec: the next line keel plugins new printed does not build and pass the project's test"; }
grep -q "^1/1 $component *OK" "$work/log" || { cat "$work/log"; fail "$spec: its test did not run"; }
check_plugin "$spec" "$name" "$component" "$dir/build" "$keel"
phase "$spec written and built by the next line of the build tree's keel"

# Its README: the commands of "Build and test" (its setup, the next line's, is done: `meson
# setup` says so and exits 0), and the first of "Use it", which shows the component.
readme_commands() {  # readme_commands SECTION: the indented lines of that section
  awk -v want="## $1" '/^## / { section = $0 } section == want && /^    [^ ]/ {
                         sub(/^    /, ""); print }' "$dir/README.md"
}
mapfile -t commands < <(readme_commands "Build and test")
[ ${#commands[@]} -gt 0 ] || fail "$spec: its README gives no commands under 'Build and test'"
[[ "$next" == *" && ${commands[0]} && "* ]] ||
  fail "$spec: the README's setup (${commands[0]}) is not the next line's ($next)"
mapfile -t use < <(readme_commands "Use it")
(cd "$dir" &&
  for command in "${commands[@]}" "${use[0]}"; do echo "\$ $command"; bash -ec "$command" || exit 1; done
) >"$work/log" 2>&1 ||
  { cat "$work/log"; fail "$spec: the commands of its README fail"; }
grep -q "^1/1 $component *OK" "$work/log" || { cat "$work/log"; fail "$spec: its test did not run"; }
grep -q "^${spec#*:} $component  (plugin $name 0.1.0, " "$work/log" ||
  { cat "$work/log"; fail "$spec: the README's '${use[0]}' does not show the component"; }
phase "$spec: its README's commands run"

# The others: one build at -O0, each project a subproject of a wrapper.
n=$(( ${#specs[@]} - 1 ))
if [ "$n" -gt 0 ]; then
  meson install -C "$build" --destdir "$work/stage" --no-rebuild --quiet
  prefix=$(meson introspect "$build" --buildoptions |
           /usr/bin/python3 -c 'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"]=="prefix"))')
  staged_keel="$work/stage$prefix/bin/keel"
  pc=$(dirname "$(find "$work/stage" -name keel-sdk.pc)")
  # The staged keel-sdk.pc is relocatable: read as it lies, its paths lead into the stage.
  for var in includedir plugin_map; do
    path=$(PKG_CONFIG_PATH="$pc" pkg-config --variable="$var" keel-sdk)
    [[ -e "$path" && "$(realpath "$path")" == "$work/stage/"* ]] ||
      fail "keel-sdk.pc's $var ($path) does not lead into the stage $work/stage"
  done
  phase "keel installed into the stage"
  shared="$work/shared"
  mkdir -p "$shared/subprojects"
  for i in $(seq 1 "$n"); do
    spec=${specs[i]} name=${names[i]}
    "$staged_keel" plugins new "$name" --kind "${spec#*:}" --lang "${spec%%:*}" \
      "$shared/subprojects/$name" >"$work/new.out"
    # The staged keel finds its own SDK, where pkg-config does not look by default.
    grep -qxF "next: cd $shared/subprojects/$name && PKG_CONFIG_PATH=$pc meson setup build && meson compile -C build && meson test -C build" \
      "$work/new.out" || { cat "$work/new.out"; fail "$spec: the staged keel's next line"; }
  done
  phase "$n projects generated by the staged keel"
  {
    echo "project('plugins-new-shared', default_options : ['optimization=0', 'debug=false'])"
    for name in "${names[@]:1}"; do echo "subproject('$name')"; done
  } >"$shared/meson.build"
  (cd "$shared" && PKG_CONFIG_PATH="$pc" meson setup build >"$work/log" 2>&1) ||
    { cat "$work/log"; fail "the wrapper of the generated projects does not configure"; }
  phase "$n projects configured in one build"
  ninja -C "$shared/build" -j "$(nproc)" >"$work/log" 2>&1 ||
    { cat "$work/log"; fail "the generated projects do not build"; }
  grep -q -- ' -O0 ' "$shared/build/build.ninja" && ! grep -Eq -- ' -O[1-3gs] ' "$shared/build/build.ninja" ||
    fail "the shared build is not at -O0"
  phase "$n projects built at -O0"
  meson test -C "$shared/build" --print-errorlogs >"$work/log" 2>&1 ||
    { cat "$work/log"; fail "a generated project's test failed"; }
  [ "$(grep -Ec "^ *[0-9]+/$n " "$work/log")" -eq "$n" ] ||
    { cat "$work/log"; fail "not $n tests ran (one per project)"; }
  for i in $(seq 1 "$n"); do
    spec=${specs[i]} name=${names[i]} component=${components[i]}
    grep -Eq "^ *[0-9]+/$n ([^ ]+ / )?$component +OK" "$work/log" ||
      { cat "$work/log"; fail "$spec: its test did not run"; }
    check_plugin "$spec" "$name" "$component" "$shared/build/subprojects/$name" "$staged_keel"
    echo "ok: $spec built, tested and shown"
  done
  phase "$n projects tested and shown"
fi

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
# keel-plugin.toml. The standalone project, its version changed, rebuilt by `meson compile`.
name=${names[0]} dir="$work/${names[0]}"
sed -i "s/version : '0.1.0'/version : '0.2.0'/" "$dir/meson.build"
grep -q "version : '0.2.0'" "$dir/meson.build" || fail "$name: no version : '0.1.0' in meson.build"
(cd "$dir" && meson compile -C build >"$work/log" 2>&1) ||
  { cat "$work/log"; fail "$name: does not rebuild with version 0.2.0"; }
KEEL_PLUGIN_PATH="$dir/build" "$keel" plugins show "${components[0]}" | grep -q "(plugin $name 0.2.0, " ||
  fail "the plugin's version is not meson.build's"
grep -q '^version = "0.2.0"' "$dir/build/keel-plugin.toml" ||
  fail "keel-plugin.toml's version is not meson.build's"
echo "ok: the version comes from meson.build alone"
phase "bad arguments and the version refused or checked"
