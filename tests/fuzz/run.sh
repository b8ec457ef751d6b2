#!/usr/bin/env bash
# Runs each libFuzzer target for a bounded time on a copy of its seed corpus.
#   tests/fuzz/run.sh BUILD_DIR SECONDS [TARGET...]
# BUILD_DIR: configured with  CC=clang-14 CXX=clang++-14 meson setup BUILD_DIR -Dfuzzers=true
# and built (ninja -C BUILD_DIR). Per target, BUILD_DIR/fuzz-run/<target>/ receives the corpus
# copy (grown by the run), the log, and artifacts/ with any crash, leak, timeout or oom input.
# Prints one summary line per target; exits 1 if any target crashed (the input and the reason
# are printed), 2 on usage errors or a target that is not built.
set -uo pipefail

if (($# < 2)) || ! [[ "$2" =~ ^[0-9]+$ ]]; then
  echo "usage: $0 BUILD_DIR SECONDS [TARGET...]" >&2
  exit 2
fi
build=$(cd "$1" && pwd) || exit 2
seconds=$2
shift 2
src=$(cd "$(dirname "$0")" && pwd)
targets=("$@")
((${#targets[@]})) || targets=(fuzz_manifest fuzz_safetensors fuzz_checkpoint_meta fuzz_commit_record fuzz_elf fuzz_pt_reader fuzz_criteo_line)

# Scratch files of the targets (fuzz_manifest writes its manifests there): in memory when possible.
scratch=$(mktemp -d /dev/shm/keel-fuzz.XXXXXX 2>/dev/null || mktemp -d)
trap 'rm -rf "$scratch"' EXIT

status=0
for t in "${targets[@]}"; do
  bin="$build/tests/fuzz/$t"
  if [ ! -x "$bin" ]; then
    echo "$t: NOT BUILT ($bin missing; ninja -C $build)"
    status=2
    continue
  fi
  work="$build/fuzz-run/$t"
  rm -rf "$work"
  mkdir -p "$work/corpus" "$work/artifacts" "$scratch/$t"
  cp "$src/corpus/$t/"* "$work/corpus/"
  seeds=$(ls "$work/corpus" | wc -l)

  TMPDIR="$scratch/$t" "$bin" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
    -max_len=8192 -print_final_stats=1 -artifact_prefix="$work/artifacts/" \
    "$work/corpus" >"$work/log" 2>&1
  rc=$?

  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/log" | tail -1)
  rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$work/log" | tail -1)
  last=$(grep -E '^#[0-9]+.*cov: [0-9]+' "$work/log" | tail -1)
  cov=$(sed -n 's/.*cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.*ft: \([0-9]*\).*/\1/p' <<<"$last")
  corpus=$(ls "$work/corpus" | wc -l)
  artifact=$(ls -t "$work/artifacts" | head -1)

  if ((rc == 0)) && [ -z "$artifact" ]; then
    verdict="ok"
  else
    verdict="CRASH"
    status=1
  fi
  printf '%s: %s, %s runs, %s exec/s, cov: %s ft: %s, corpus %s -> %s, peak rss %s MB\n' \
    "$t" "$verdict" "${runs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "$seeds" "$corpus" "${rss:-?}"
  if [ "$verdict" = CRASH ]; then
    echo "  log: $work/log (exit status $rc)"
    grep -m 3 -E '^==[0-9]+==ERROR|terminate called|what\(\)|runtime error:|^fuzz_[a-z_]+: |ALARM|out-of-memory' "$work/log" | sed 's/^/  /'
    if [ -n "$artifact" ]; then
      echo "  input: $work/artifacts/$artifact (reproduce: $bin $work/artifacts/$artifact)"
      head -c 2000 "$work/artifacts/$artifact" | cat -v | sed 's/^/  | /'
      echo
    fi
  fi
done
exit $status
