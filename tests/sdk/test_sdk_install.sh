#!/usr/bin/env bash
# Third-party plugins build against the installed SDK alone: install keel into a staging
# directory, build tests/sdk/halving.cpp with nothing but `pkg-config keel-sdk`, and check that
# the installed keel loads it, shows its options and validates a manifest that uses it; build
# tests/sdk/embedding_user.cpp with nothing but `pkg-config keel-embedding` and run it.
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
    $(PKG_CONFIG_PATH="$pc" pkg-config --cflags --libs keel-sdk)

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
grep -q "unknown key 'evry' in \[lr_scheduler\]; hint: did you mean 'every'?" "$stage/err"
echo "ok: a plugin built against the installed SDK loads and validates"

# keel::EmbeddingTable from the installed static library, with nothing but `pkg-config
# keel-embedding` (which names Abseil's libraries too).
# shellcheck disable=SC2046
g++ -std=c++17 -O1 "$src/tests/sdk/embedding_user.cpp" -o "$stage/third_party/embedding_user" \
    $(PKG_CONFIG_PATH="$pc" pkg-config --cflags --libs keel-embedding)
"$stage/third_party/embedding_user"
echo "ok: a program built against the installed keel-embedding runs"

# Losses built the same way train with gradient accumulation. my_cross_entropy does not
# override Loss::count_items: with the default accum_normalization = "auto" the run must fall
# back to the mean (not fail), and "items" must be refused up front. my_counted_cross_entropy
# reports item counts: "items" trains, and with equal full micro-batches it weighs each by 1/4,
# exactly like the mean.
# shellcheck disable=SC2046
g++ -std=c++17 -O1 -fPIC -shared -fvisibility=hidden "$src/tests/sdk/my_loss.cpp" \
    -o "$stage/third_party/libmy_loss.so" \
    $(PKG_CONFIG_PATH="$pc" pkg-config --cflags --libs keel-sdk)

train() {  # train RUN_NAME [--set ...]...
  local name=$1
  shift
  KEEL_PLUGIN_PATH="$stage/third_party:$installed_plugins" "$keel" train \
    "$src/configs/quickstart.toml" --set data.train.limit=1024 --set data.test.limit=200 \
    --set train.max_steps=4 --set train.grad_accum=4 --set train.log_every=1 \
    --set lr_scheduler.warmup_steps=1 --set run.threads=1 \
    --set run.output_dir="$stage/runs/$name" "$@"
}
# Prints the training losses of a run, after checking there is one finite record per step.
train_losses() {
  /usr/bin/python3 - "$stage/runs/$1/metrics.jsonl" <<'PY'
import json, math, sys
records = [json.loads(line) for line in open(sys.argv[1])]
train = [r for r in records if r["split"] == "train"]
assert [r["step"] for r in train] == [1, 2, 3, 4], train
assert all(math.isfinite(r["loss"]) and r["loss"] > 0 for r in train), train
print(" ".join(repr(r["loss"]) for r in train))
PY
}

if ! train auto-mean --set loss.type=my_cross_entropy >"$stage/out" 2>"$stage/err"; then
  cat "$stage/err"
  echo "accum_normalization = auto with a loss that does not count items must train"; exit 1
fi
mean_losses=$(train_losses auto-mean)
echo "auto, my_cross_entropy: losses $mean_losses"

if ! train items --set loss.type=my_counted_cross_entropy \
     --set train.accum_normalization=items >"$stage/out" 2>"$stage/err"; then
  cat "$stage/err"
  echo "accum_normalization = items with a loss that counts items must train"; exit 1
fi
items_losses=$(train_losses items)
echo "items, my_counted_cross_entropy: losses $items_losses"
if [[ "$items_losses" != "$mean_losses" ]]; then
  echo "equal full micro-batches: item-normalised losses must equal the mean's"; exit 1
fi

if train items-refused --set loss.type=my_cross_entropy \
     --set train.accum_normalization=items >"$stage/out" 2>"$stage/err"; then
  echo "accum_normalization = items with a loss that does not count items must fail"; exit 1
fi
cat "$stage/err"
grep -q "^keel: error: .*'my_cross_entropy' (plugin my-losses).*does not report item counts" \
  "$stage/err"
echo "ok: third-party losses train with gradient accumulation (auto and items)"
