#!/usr/bin/env bash
# A third party's whole path, against the installed SDK only: `keel plugins new` writes a loss
# plugin project, which builds and passes its own test with nothing but the SDK's pkg-config
# files (keel-sdk for the plugin, keel-testing for its test);
# `keel plugins pack` makes a package, `keel plugins install` installs it (XDG data dir of a
# temporary HOME), a manifest requires and uses it, `keel plugins lock` locks it, and it trains.
# Then the installed .so is replaced by a different build whose constructor leaves a mark: the
# locked run must refuse it before any of its code runs (no mark), while loading it without the
# lock does run it (the mark is real). Also: a tampered package is refused at install, leaving
# the install directory as it was, and a requirement no installed version meets is an error.
# Usage: test_third_party.sh BUILD_DIR SOURCE_ROOT
set -euo pipefail
build=$(cd "$1" && pwd) src=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

meson install -C "$build" --destdir "$work/stage" --no-rebuild --quiet
prefix=$(meson introspect "$build" --buildoptions |
         /usr/bin/python3 -c 'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"]=="prefix"))')
keel="$work/stage$prefix/bin/keel"
pc=$(dirname "$(find "$work/stage" -name keel-sdk.pc)")
# The staged keel looks for its own plugins under the real prefix: point it at the staged ones.
export KEEL_PLUGIN_PATH
KEEL_PLUGIN_PATH=$(dirname "$(find "$work/stage" -name 'libkeel-models.so')")
export HOME="$work/home" XDG_DATA_HOME="" KEEL_TEST_MARK="$work/mark"
mkdir -p "$HOME"
installed="$HOME/.local/share/keel/plugins"

# 1. Write, build and test a plugin project outside the tree.
"$keel" plugins new acme-loss --kind loss "$work/acme"
(cd "$work/acme" && PKG_CONFIG_PATH="$pc" meson setup build --buildtype=release >/dev/null &&
  ninja -C build >/dev/null && meson test -C build --print-errorlogs >/dev/null) ||
  fail "the generated project does not build and pass its test against the installed SDK"

# 2. Pack and install it.
"$keel" plugins pack "$work/acme/build" --output "$work/acme-loss-0.1.0.tar.gz"
"$keel" plugins install "$work/acme-loss-0.1.0.tar.gz"
so=$(find "$installed/acme-loss/0.1.0" -name '*.so')
[ -n "$so" ] || fail "nothing installed under $installed/acme-loss/0.1.0"
"$keel" plugins | grep -q "acme-loss .*0.1.0 .*(searched)  from $work/acme-loss-0.1.0.tar.gz" ||
  fail "keel plugins does not list the installed package with its source"

# 3. A manifest that requires and uses it; lock it; train.
cat > "$work/run.toml" <<TOML
extends = "$src/configs/quickstart.toml"
[plugins]
require = { "acme-loss" = ">=0.1, <1" }
[run]
output_dir = "$work/runs"
threads = 1
[train]
max_steps = 3
log_every = 1
[data.train]
limit = 256
[data.test]
limit = 100
[loss]
type = "acme_loss"
TOML
"$keel" plugins lock "$work/run.toml"
grep -q "name = 'acme-loss'" "$work/run.toml.lock" || fail "the lock does not list acme-loss"
grep -q "sha256 = '$(sha256sum "$so" | cut -d' ' -f1)'" "$work/run.toml.lock" ||
  fail "the lock does not hold the installed file's sha256"
"$keel" train "$work/run.toml" >"$work/out" 2>&1 || { cat "$work/out"; fail "the locked run"; }
/usr/bin/python3 - "$work/runs/metrics.jsonl" <<'PY'
import json, math, sys
train = [r for r in map(json.loads, open(sys.argv[1])) if r["split"] == "train"]
assert [r["step"] for r in train] == [1, 2, 3], train
assert all(math.isfinite(r["loss"]) for r in train), train
PY
[ ! -e "$work/mark" ] || fail "the mark exists before the replaced build was ever loaded"

# 4. Replace the installed .so with a different build whose constructor leaves a mark.
main_src=$(grep -rl "KEEL_PLUGIN\|keel_plugin_entry" "$work/acme/src" | head -1)
[ -n "$main_src" ] || fail "cannot find the generated plugin's source"
cat >> "$main_src" <<'CPP'

#include <cstdio>
#include <cstdlib>
__attribute__((constructor)) static void leave_mark() {
  if (const char* p = std::getenv("KEEL_TEST_MARK"))
    if (std::FILE* f = std::fopen(p, "a")) {
      std::fputs("the replaced acme-loss ran\n", f);
      std::fclose(f);
    }
}
CPP
ninja -C "$work/acme/build" >/dev/null
new_so=$(find "$work/acme/build" -maxdepth 1 -name "$(basename "$so")")
cmp -s "$new_so" "$so" && fail "the rebuilt plugin is identical to the installed one"
chmod u+w "$so" && cp "$new_so" "$so" && chmod 0644 "$so"
if "$keel" train "$work/run.toml" --set run.output_dir="$work/runs2" >"$work/out" 2>"$work/err"; then
  fail "the locked run loaded a replaced plugin"
fi
cat "$work/err"
grep -q "^keel: error: $work/run.toml.lock: plugin acme-loss 0.1.0 (sha256 .*) is locked but was not loaded: $so: not loaded: its sha256 .* differs" "$work/err" ||
  fail "the refusal does not name the lock, the plugin and the file"
[ "$(wc -l <"$work/err")" -eq 1 ] || fail "more than one error line"
[ ! -e "$work/mark" ] || fail "the replaced plugin's code ran although the lock refused it"
# Without a lock (keel plugins reads none) the replaced file is loaded: its constructor runs.
"$keel" plugins show acme_loss >/dev/null
grep -q "the replaced acme-loss ran" "$work/mark" || fail "the mark fixture never leaves a mark"
echo "ok: a replaced plugin is refused by the lock before its code runs"

# 5. A requirement no installed version meets.
sed 's/">=0.1, <1"/">=2"/' "$work/run.toml" > "$work/run2.toml"
if "$keel" validate "$work/run2.toml" 2>"$work/err"; then fail "an unmet requirement validated"; fi
cat "$work/err"
grep -q "^keel: error: $work/run2.toml:[0-9]*:[0-9]*: plugins.require: acme-loss >=2: no installed version meets it (installed: 0.1.0)" "$work/err" ||
  fail "the unmet requirement's message"

# 6. A tampered package is refused at install, and the install directory stays as it was.
mkdir "$work/tampered" && tar -xzf "$work/acme-loss-0.1.0.tar.gz" -C "$work/tampered"
pkg=$(find "$work/tampered" -mindepth 1 -maxdepth 1 -type d)
printf 'x' >> "$(find "$pkg" -name '*.so')"
sed -i 's/^version = .*/version = "0.2.0"/' "$pkg/keel-plugin.toml"
before=$(find "$installed" | sort)
if "$keel" plugins install "$pkg" 2>"$work/err"; then fail "a tampered package was installed"; fi
cat "$work/err"
grep -q "sha256" "$work/err" || fail "the tampered package's refusal does not name the hash"
[ "$(find "$installed" | sort)" = "$before" ] || fail "a refused install changed $installed"
echo "ok: third-party plugin packaged, installed, required, locked, trained, and guarded"
