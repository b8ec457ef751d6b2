#!/usr/bin/env bash
# Third-party plugins build against the installed SDK alone: install keel into a staging
# directory, build tests/sdk/halving.cpp with nothing but `pkg-config keel-sdk`, and check that
# the installed keel loads it, shows its options and validates a manifest that uses it.
# Usage: test_sdk_install.sh BUILD_DIR SOURCE_ROOT
set -euo pipefail
build=$1 src=$2
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

meson install -C "$build" --destdir "$stage" --no-rebuild --quiet
prefix=$(meson introspect "$build" --buildoptions |
         /usr/bin/python3 -c 'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"]=="prefix"))')
pc=$(dirname "$(find "$stage" -name keel-sdk.pc)")
keel="$stage$prefix/bin/keel"
# The staged keel looks for its plugins under the real prefix: point it at the staged ones.
installed_plugins=$(dirname "$(find "$stage" -name 'libkeel-models.so')")

mkdir "$stage/third_party"
# shellcheck disable=SC2046
g++ -std=c++17 -O1 -fPIC -shared -fvisibility=hidden "$src/tests/sdk/halving.cpp" \
    -o "$stage/third_party/libhalving.so" \
    $(PKG_CONFIG_PATH="$pc" pkg-config --define-variable=prefix="$stage$prefix" --cflags --libs keel-sdk)

out=$(KEEL_PLUGIN_PATH="$stage/third_party:$installed_plugins" "$keel" plugins show halving)
echo "$out"
grep -q "lr_scheduler halving  (plugin my-schedules 1.0.0" <<<"$out"
grep -q "every .*integer in \[1, 1e+12\] .*default 1000" <<<"$out"

cat > "$stage/m.toml" <<TOML
extends = "$src/configs/quickstart.toml"
[lr_scheduler]
type = "halving"
every = 500
TOML
KEEL_PLUGIN_PATH="$stage/third_party:$installed_plugins" "$keel" validate "$stage/m.toml"
# and a typo in its option is caught like any first-party one
if KEEL_PLUGIN_PATH="$stage/third_party:$installed_plugins" "$keel" validate "$stage/m.toml" --set lr_scheduler.evry=3 2>"$stage/err"; then
  echo "expected a validation error"; exit 1
fi
grep -q "unknown key 'evry' in \[lr_scheduler\]; did you mean 'every'?" "$stage/err"
echo "ok: a plugin built against the installed SDK loads and validates"
