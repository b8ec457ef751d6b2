#!/usr/bin/env bash
# The GPU check (docs/gpu-check.md): runs the keel that tools/gpu_check/pack.sh packed against the
# LibTorch of this machine's PyTorch 2.11, and prints one line per check:
#   PASS|FAIL|SKIP <n> <check>: <numbers, or why>
# then a summary line; exits 1 when a check failed (2 for bad arguments).
#   tools/gpu_check/run.sh [--bundle TARBALL|DIR] [--python PYTHON] [--device cuda|cpu]
#                          [--work DIR] [--keep DIR] [--budget SECONDS]
# --bundle   the packed tarball (default build-wheel/gpu-check/keel-gpu-check.tar.xz of this
#            checkout), or a directory it was unpacked to (default: this script's own
#            directory, when it is the run.sh inside an unpacked bundle)
# --python   the Python whose torch package provides LibTorch (default: $KEEL_GPU_CHECK_PYTHON,
#            else the first of python3 on PATH, $VIRTUAL_ENV, ./.venv, ./venv, ~/.venv, ~/venv,
#            /opt/venv, /opt/conda that imports torch); its torch.distributed.run launches check 5
# --device   cuda (default) runs the checks as written; cpu is the dry run of the packing and
#            of this script on a machine without a GPU: every check on the CPU, fewer steps, the
#            Gloo backend for check 5, fp16 skipped, no overall time budget unless --budget
# --work     where the bundle is unpacked and the runs write: a new or empty directory
#            (default: a new one under $TMPDIR or /tmp, kept; its path is printed)
# --keep     copy each check's log and its runs' run.log, metrics.jsonl and
#            manifest.resolved.toml there (a device run's $OUT, say)
# --budget   seconds for all checks (default 480, 8 minutes, on cuda; none on cpu); each
#            check's time limit is cut to what is left, 0 is no budget
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
start=$(date +%s)
bundle_arg="" python_arg=${KEEL_GPU_CHECK_PYTHON:-} device=cuda work="" keep="" budget=""

usage() { sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }
bad_usage() { echo "run.sh: $*; hint: run.sh --help" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --bundle) bundle_arg=${2:-}; [[ -n $bundle_arg ]] || bad_usage "--bundle needs a path"; shift 2 ;;
    --python) python_arg=${2:-}; [[ -n $python_arg ]] || bad_usage "--python needs a path"; shift 2 ;;
    --device) device=${2:-}; shift 2
              [[ $device == cuda || $device == cpu ]] || bad_usage "--device takes cuda or cpu" ;;
    --work) work=${2:-}; [[ -n $work ]] || bad_usage "--work needs a directory"; shift 2 ;;
    --keep) keep=${2:-}; [[ -n $keep ]] || bad_usage "--keep needs a directory"; shift 2 ;;
    --budget) budget=${2:-}; shift 2
              [[ $budget =~ ^[0-9]+$ ]] || bad_usage "--budget takes whole seconds" ;;
    -h|--help) usage; exit 0 ;;
    *) bad_usage "unknown argument '$1'" ;;
  esac
done

passed=0 failed=0 skipped=0
report() {  # STATUS N CHECK TEXT
  printf '%s %s %s: %s\n' "$1" "$2" "$3" "$4"
  case $1 in PASS) passed=$((passed + 1)) ;; FAIL) failed=$((failed + 1)) ;; *) skipped=$((skipped + 1)) ;; esac
}
finish() {
  if [[ -n $keep && -d ${work:-} ]]; then
    mkdir -p "$keep"
    cp -r "$work/logs" "$keep/" 2>/dev/null
    for r in "$work"/runs/*/; do
      [[ -d $r ]] || continue
      mkdir -p "$keep/runs/$(basename "$r")"
      cp "$r"/run.log "$r"/metrics.jsonl "$r"/manifest.resolved.toml "$keep/runs/$(basename "$r")/" 2>/dev/null
    done
    [[ -f ${bundle:-}/BUNDLE.txt ]] && cp "$bundle/BUNDLE.txt" "$keep/"
  fi
  echo "gpu-check: $passed passed, $failed failed, $skipped skipped in $(( $(date +%s) - start )) s on $device (work: ${work:-none})"
  [[ $failed -eq 0 ]]
  exit $?
}
# A failure before the checks can run: one FAIL line for check 0, then the summary.
setup_fail() { report FAIL 0 setup "$1"; finish; }

# The Python with torch, and what its torch says about itself and the machine.
find_python() {
  local c
  for c in "$python_arg" python3 "${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/python}" ./.venv/bin/python \
           ./venv/bin/python "$HOME/.venv/bin/python" "$HOME/venv/bin/python" /opt/venv/bin/python \
           /opt/conda/bin/python; do
    [[ -n $c ]] || continue
    if "$c" -c 'import torch' >/dev/null 2>&1; then
      # Absolute, not resolved: a venv's python is a link whose target is outside the venv.
      c=$(command -v "$c")
      [[ $c == /* ]] || c=$(cd "$(dirname "$c")" && pwd)/$(basename "$c")
      echo "$c"
      return 0
    fi
    [[ -n $python_arg && $c == "$python_arg" ]] && return 1
  done
  return 1
}
py=$(find_python) || setup_fail "no Python that imports torch${python_arg:+ at $python_arg}; hint: --python PATH/TO/venv/bin/python"
info=$("$py" - <<'EOF' 2>&1
import os, torch
print("torch_dir=" + os.path.dirname(torch.__file__))
print("version=" + torch.__version__)
print("cuda=" + str(torch.version.cuda))
ok = torch.cuda.is_available()
print("cuda_available=" + str(int(ok)))
print("gpu=" + (torch.cuda.get_device_name(0) + ", " +
                str(torch.cuda.get_device_properties(0).total_memory >> 30) + " GiB" if ok else "none"))
try:
    v = torch.cuda.nccl.version()
    print("nccl=" + ".".join(map(str, v)) if isinstance(v, tuple) else "nccl=" + str(v))
except Exception as e:
    print("nccl=none (" + type(e).__name__ + ")")
EOF
) || setup_fail "$py cannot describe its torch: $(tail -1 <<<"$info")"
val() { sed -n "s/^$1=//p" <<<"$info"; }
torch_dir=$(val torch_dir)
site=$(dirname "$torch_dir")
echo "gpu-check: Python $py, torch $(val version) (CUDA $(val cuda), NCCL $(val nccl)), GPU: $(val gpu)"

# The bundle: a directory as given, this script's own, or the tarball unpacked under --work.
if [[ -z $work ]]; then
  work=$(mktemp -d "${TMPDIR:-/tmp}/keel-gpu-check.XXXXXX") || setup_fail "cannot create a work directory"
else
  mkdir -p "$work" && work=$(cd "$work" && pwd) || setup_fail "cannot create --work $work"
  [[ -z $(ls -A "$work/runs" 2>/dev/null) ]] ||
    setup_fail "--work $work holds the runs of an earlier check; hint: name a new directory"
fi
chmod go-w "$work"
mkdir -p "$work/logs" "$work/runs" "$work/cache" "$work/share"
if [[ -z $bundle_arg ]]; then
  if [[ -x $here/bin/keel ]]; then bundle_arg=$here
  else bundle_arg=$here/../../build-wheel/gpu-check/keel-gpu-check.tar.xz; fi
fi
if [[ -d $bundle_arg ]]; then
  bundle=$(cd "$bundle_arg" && pwd)
elif [[ -f $bundle_arg ]]; then
  # Python's tarfile, since the machine may have no xz; the 'data' filter (where this Python
  # has it) refuses links and paths out of the directory and clears group and other write bits.
  "$py" - "$bundle_arg" "$work" <<'EOF' || setup_fail "cannot unpack $bundle_arg into $work"
import sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    if hasattr(tarfile, "data_filter"):
        t.extractall(sys.argv[2], filter="data")
    else:
        t.extractall(sys.argv[2])
EOF
  bundle=$work/keel-gpu-check
else
  setup_fail "no bundle at $bundle_arg; hint: tools/gpu_check/pack.sh on the build machine, then --bundle PATH"
fi
[[ -x $bundle/bin/keel ]] || setup_fail "$bundle has no bin/keel: not a bundle from tools/gpu_check/pack.sh"
# keel loads no plugin from a directory that group or others may write (docs/plugins.md).
chmod -R go-w "$bundle"
judge() { "$py" "$bundle/judge.py" "$@"; }

# keel finds the bundle's libraries by its RPATH ($ORIGIN/../lib) and LibTorch, CUDA's
# libraries and NCCL by LD_LIBRARY_PATH, set for keel's processes only; the plugins' libraries
# (zlib, abseil, ...) by LD_LIBRARY_PATH too, bundle first. No empty entry (keel refuses
# plugins then).
ldp=$bundle/lib:$torch_dir/lib
for d in "$site"/nvidia/*/lib; do [[ -d $d ]] && ldp=$ldp:$d; done
keel_env() {
  env LD_LIBRARY_PATH="$ldp" KEEL_PLUGIN_PATH="$bundle/plugins" XDG_CACHE_HOME="$work/cache" \
    XDG_DATA_HOME="$work/share" "$@"
}
version=$(keel_env "$bundle/bin/keel" --version 2>&1)
rc=$?
if [[ $rc -ne 0 ]] && grep -q -E 'GLIBCXX|CXXABI' <<<"$version"; then
  # This machine's libstdc++ is older than the one keel was built with: use the packed one.
  ldp=$bundle/lib/compat:$ldp
  echo "gpu-check: this machine's libstdc++ is too old for keel ($(grep -o -m1 -E '(GLIBCXX|CXXABI)_[0-9.]+' <<<"$version")): using the bundle's lib/compat"
  version=$(keel_env "$bundle/bin/keel" --version 2>&1)
  rc=$?
fi
[[ $rc -eq 0 ]] || setup_fail "keel --version failed: $(tail -1 <<<"$version")"
sed 's/^/gpu-check: keel --version: /' <<<"$version"
if [[ $device == cuda ]]; then
  [[ $(val cuda_available) == 1 ]] || setup_fail "torch sees no GPU (torch.cuda.is_available() is False)"
  cuda_line=$(grep '^CUDA: ' <<<"$version")
  [[ $cuda_line == "CUDA: CUDA "* ]] || setup_fail "this keel was built without CUDA ($cuda_line)"
  [[ $cuda_line =~ ,\ [1-9][0-9]*\ GPUs?$ ]] || setup_fail "keel sees no GPU ($cuda_line) where torch sees $(val gpu)"
fi

# keel with its environment, as timeout and torchrun run it.
keel=(env LD_LIBRARY_PATH="$ldp" KEEL_PLUGIN_PATH="$bundle/plugins" XDG_CACHE_HOME="$work/cache"
      XDG_DATA_HOME="$work/share" "$bundle/bin/keel")

# Steps, limits and thresholds: as the docs say on cuda; a short dry run on the CPU.
if [[ $device == cuda ]]; then
  lm_steps=200 ckpt_steps=100 resume_steps=120 nccl_steps=100 qs_sets=() qs_accuracy=0.85
  limit_qs=120 limit_lm=90 limit_nccl=120 limit_ckpt=60 limit_resume=90 min_peak=5 backend=nccl
  limit_ctr=90 ctr_sets=() budget=${budget:-480}
else
  lm_steps=20 ckpt_steps=10 resume_steps=14 nccl_steps=10 qs_sets=(--set train.max_steps=300)
  qs_accuracy=0.65 limit_qs=300 limit_lm=300 limit_nccl=300 limit_ckpt=300 limit_resume=300
  min_peak=0 backend=gloo limit_ctr=300 ctr_sets=(--set model.table_tensor_ops=true)
  budget=${budget:-0}
fi
dev_set="run.device=\"$device\""
char=$bundle/configs/char_gpt.toml

# Runs one command with a time limit (the smaller of LIMIT and what the budget leaves) into
# logs/NAME.log; its exit status, 124 on a timeout.
run_limited() {  # NAME LIMIT COMMAND...
  local name=$1 limit=$2; shift 2
  if [[ $budget -gt 0 ]]; then
    local left=$((budget - ($(date +%s) - start)))
    [[ $left -lt $limit ]] && limit=$left
    if [[ $limit -le 5 ]]; then echo "no time left in the budget" >"$work/logs/$name.log"; return 124; fi
  fi
  echo "+ $*" >"$work/logs/$name.log"
  timeout --kill-after=10 "$limit" "$@" >>"$work/logs/$name.log" 2>&1
}
# Why a command failed: its exit status, and its log's last error line (else its last line).
why() {  # NAME STATUS
  local log=$work/logs/$1.log line
  line=$(grep -a -E 'error|Error|ERROR' "$log" | tail -1)
  [[ -n $line ]] || line=$(tail -1 "$log")
  [[ $2 -eq 124 || $2 -eq 137 ]] && echo "timed out ($(tail -1 "$log" | cut -c1-200))" && return
  echo "exit $2: ${line:0:400} (log: $log)"
}
# PASS or FAIL from judge.py's line, prefixed with the seconds the step took.
verdict() {  # N CHECK SECONDS JUDGE-ARGS...
  local n=$1 check=$2 secs=$3 out; shift 3
  out=$(judge "$@")
  report "${out%%$'\t'*}" "$n" "$check" "${out#*$'\t'} [${secs} s]"
}
keel_train() {  # NAME LIMIT ARGS...: keel train into runs/NAME
  local name=$1 limit=$2; shift 2
  run_limited "$name" "$limit" "${keel[@]}" train "$@" \
    --set "run.output_dir=\"$work/runs/$name\""
}
lm_sets() {  # STEPS [MAX]: char_gpt logged every STEPS/10, evaluated every STEPS/2, for MAX
            # steps (default STEPS)
  echo --set "train.max_steps=${2:-$1}" --set "train.log_every=$(( $1 / 10 > 0 ? $1 / 10 : 1 ))" \
    --set "train.eval_every_steps=$(( $1 / 2 > 0 ? $1 / 2 : 1 ))"
}

# 1. The quickstart (MLP on Fashion-MNIST), the manifest as shipped, on the device.
t0=$(date +%s)
keel_train quickstart "$limit_qs" "$bundle/configs/quickstart.toml" --set "$dev_set" \
  --set "data.train.path=\"$bundle/data/fashion-mnist\"" \
  --set "data.test.path=\"$bundle/data/fashion-mnist\"" "${qs_sets[@]}"
rc=$?
if [[ $rc -eq 0 ]]; then verdict 1 "quickstart on $device" $(( $(date +%s) - t0 )) quickstart "$work/runs/quickstart" "$qs_accuracy"
else report FAIL 1 "quickstart on $device" "$(why quickstart $rc)"; fi

# 2, 3. The char-GPT, bf16 and fp16 autocast (fp16 with the loss scaler), a fresh MFU peak.
for precision in bf16 fp16; do
  n=$([[ $precision == bf16 ]] && echo 2 || echo 3)
  if [[ $precision == fp16 && $device != cuda ]]; then
    report SKIP $n "char-GPT fp16 on $device" "fp16 autocast needs device = \"cuda\" (a dry run on the CPU)"
    continue
  fi
  t0=$(date +%s)
  # shellcheck disable=SC2046
  keel_train "char_gpt_$precision" "$limit_lm" "$char" --set "$dev_set" \
    --set "train.precision=\"$precision\"" $(lm_sets "$lm_steps")
  rc=$?
  if [[ $rc -eq 0 ]]; then verdict $n "char-GPT $precision on $device" $(( $(date +%s) - t0 )) lm "$work/runs/char_gpt_$precision" "$lm_steps"
  else report FAIL $n "char-GPT $precision on $device" "$(why "char_gpt_$precision" $rc)"; fi
done

# 4. MFU of the bf16 run against the peak keel measured on this device (the cache starts empty).
if [[ -f $work/runs/char_gpt_bf16/metrics.jsonl ]]; then
  verdict 4 "char-GPT bf16 MFU" 0 mfu "$work/runs/char_gpt_bf16" "$min_peak"
else
  report FAIL 4 "char-GPT bf16 MFU" "the bf16 run wrote no metrics.jsonl"
fi

# 5. One rank under torchrun with the backend named (NCCL on cuda) and shard = "parameters".
t0=$(date +%s)
# shellcheck disable=SC2046
run_limited nccl "$limit_nccl" "$py" -m torch.distributed.run --standalone --nproc_per_node=1 \
  --no_python "${keel[@]}" train "$char" \
  --set "$dev_set" --set "distributed.backend=\"$backend\"" \
  --set 'distributed.shard="parameters"' $(lm_sets "$nccl_steps") \
  --set "run.output_dir=\"$work/runs/nccl\""
rc=$?
if [[ $rc -eq 0 ]]; then verdict 5 "one rank, $backend, shard = parameters" $(( $(date +%s) - t0 )) lm "$work/runs/nccl" "$nccl_steps" "$backend"
else report FAIL 5 "one rank, $backend, shard = parameters" "$(why nccl $rc)"; fi

# 6. A checkpoint saved on the device (char_gpt.toml saves at the end), resumed on the CPU:
# the device is a key whose change breaks exactness, so --resume-changed accepts it.
t0=$(date +%s)
# shellcheck disable=SC2046
keel_train checkpoint "$limit_ckpt" "$char" --set "$dev_set" $(lm_sets "$ckpt_steps")
rc=$?
if [[ $rc -ne 0 ]]; then
  report FAIL 6 "checkpoint saved on $device, resumed on cpu" "saving: $(why checkpoint $rc)"
elif [[ ! -d $work/runs/checkpoint/checkpoints/step-$ckpt_steps ]]; then
  report FAIL 6 "checkpoint saved on $device, resumed on cpu" "no checkpoints/step-$ckpt_steps after the first run"
else
  # shellcheck disable=SC2046
  run_limited checkpoint_resume "$limit_resume" "${keel[@]}" train "$char" \
    --set 'run.device="cpu"' $(lm_sets "$ckpt_steps" "$resume_steps") \
    --set "run.output_dir=\"$work/runs/checkpoint\"" --resume --resume-changed
  rc=$?
  if [[ $rc -eq 0 ]]; then verdict 6 "checkpoint saved on $device, resumed on cpu" $(( $(date +%s) - t0 )) resume "$work/runs/checkpoint" "$ckpt_steps" "$resume_steps"
  else report FAIL 6 "checkpoint saved on $device, resumed on cpu" "resuming: $(why checkpoint_resume $rc)"; fi
fi

# 7. The CTR model (dlrm) with its embedding tables on the device (table_device = "run"; the
# CPU dry run reads and writes them with tensor operations instead, table_tensor_ops = true):
# two generated windows of 20,000 records, the first trained, the second evaluated.
t0=$(date +%s)
run_limited ctr_data 60 "$bundle/bin/keel-criteo-generate" --output "$work/data/ctr" \
  --windows 2 --records 20000 --seed 7
rc=$?
if [[ $rc -ne 0 ]]; then
  report FAIL 7 "CTR with its tables on $device" "generating its data: $(why ctr_data $rc)"
else
  keel_train ctr "$limit_ctr" "$bundle/configs/ctr.toml" --set "$dev_set" \
    --set "data.train.path=\"$work/data/ctr\"" --set "data.test.path=\"$work/data/ctr\"" \
    --set 'data.train.pattern="day_000.tsv*"' --set 'data.test.pattern="day_001.tsv*"' \
    --set train.epochs=1 "${ctr_sets[@]}"
  rc=$?
  if [[ $rc -eq 0 ]]; then verdict 7 "CTR with its tables on $device" $(( $(date +%s) - t0 )) ctr "$work/runs/ctr" 0.7 "$device"
  else report FAIL 7 "CTR with its tables on $device" "$(why ctr $rc)"; fi
fi

finish
