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

# A plain C hook written against the core hook struct plus one extension (keel.hook.model/1,
# tests/sdk/model_reader.c), compiled as strict C99 with nothing but the installed headers: it
# sees every entry of the model, and the sum of the parameters it reads at step 4 is the sum of
# the step-4 checkpoint's parameters (within 1e-9 relative: both sum the same float32 values in
# double, in different orders). Handing evaluations a wrong-shaped tensor ends the run with one
# error line naming the hook and the entry.
cc -std=c99 -pedantic -Wall -Wextra -Werror -O1 -fPIC -shared -fvisibility=hidden \
   "$src/tests/sdk/model_reader.c" -o "$stage/third_party/model_reader.so" \
   $(PKG_CONFIG_PATH="$pc" pkg-config --cflags-only-I keel-sdk | tr ' ' '\n' | grep -v torch | tr '\n' ' ')
reader_run() {  # reader_run RUN_NAME [--set ...]...: quickstart's hooks[0] becomes the reader
  local name=$1
  shift
  KEEL_PLUGIN_PATH="$stage/third_party:$installed_plugins" "$keel" train \
    "$src/configs/quickstart.toml" --set data.train.limit=256 --set data.test.limit=100 \
    --set train.max_steps=4 --set run.threads=1 --set hooks[0].type=c_model_reader \
    --set hooks[0].path="$stage/$name.txt" --set run.output_dir="$stage/runs/$name" "$@"
}
reader_run reader >"$stage/out" 2>"$stage/err" || { cat "$stage/err"; exit 1; }
/usr/bin/python3 - "$stage/reader.txt" "$stage/runs/reader/checkpoints/step-4/model.safetensors" \
  "$src/tests/cli" <<'PY'
import sys
sys.path.insert(0, sys.argv[3])
from safetensors_np import read_arrays
lines = open(sys.argv[1]).read().split("\n")
weights = read_arrays(sys.argv[2])
entries = [l.split() for l in lines if l.startswith("entry ")]
assert lines[0] == f"attach {len(entries)}", lines[0]
assert [e[2] for e in entries] == list(weights), (entries, list(weights))
assert all(e[3] == "1" and int(e[4]) == weights[e[2]].size for e in entries), entries
steps = [l.split() for l in lines if l.startswith("step ")]
assert [s[1] for s in steps] == ["1", "2", "3", "4"], steps
expected = sum(float(w.astype("float64").sum()) for w in weights.values())
assert abs(float(steps[-1][2]) - expected) <= 1e-9 * abs(expected), (steps[-1], expected)
assert float(steps[0][2]) != float(steps[-1][2]), steps
print(f"c_model_reader: step-4 parameter sum {steps[-1][2]}, checkpoint's {expected!r}")
PY
if reader_run bad --set hooks[0].bad_eval_weights=true >"$stage/out" 2>"$stage/err"; then
  echo "a hook's wrong-shaped evaluation weights must end the run"; exit 1
fi
cat "$stage/err"
[ "$(wc -l <"$stage/err")" -eq 1 ] || { echo "expected one error line"; exit 1; }
grep -q "^keel: error: \[hooks\[0\]\] hook 'c_model_reader' (plugin test-model-reader): .*set_eval_weights: entry 0 ('fc1.weight') is Float \[1\] on cpu, the model's is Float \[256, 784\] on cpu" "$stage/err"
echo "ok: a C hook built against the core and keel.hook.model/1 reads the model"
