#!/usr/bin/env bash
# libFuzzer over every entry point of the C ABI (tests/fuzz/: fuzz_c_abi), the core and the
# target under AddressSanitizer + UndefinedBehaviorSanitizer, built with clang into build/fuzz
# (FUSELET_FUZZ=ON); make sanitize runs it last. Any report fails the run:
#   1. every file of tests/fuzz/regressions/ (inputs that once crashed) is replayed;
#   2. libFuzzer runs from the seed corpus tests/fuzz/corpus/ into a fresh working corpus,
#      build/fuzz/corpus; what it finds goes to build/fuzz/artifacts/ (crash-*, leak-*,
#      timeout-*, oom-*). Without SECONDS (make sanitize, CI): a reproducible run, seed
#      FUSELET_FUZZ_SEED (1) and FUSELET_FUZZ_RUNS inputs (100000, about two minutes here; at
#      most 10 minutes whatever the machine), so that a finding fails every run of the same tree,
#      not one run in some. With SECONDS: a search of that many seconds from a random seed, to
#      find what the reproducible run does not reach.
#   scripts/fuzz.sh [SECONDS]
# clang and its libFuzzer runtime come from Debian (apt-get, as root or through sudo -n) when
# a probe compile finds them missing.
source "$(dirname "$0")/env.sh"
if [[ -n "${1:-}" ]]; then
  bound=(-max_total_time="$1")
  what="a search of $1 s from a random seed"
else
  runs="${FUSELET_FUZZ_RUNS:-100000}" seed="${FUSELET_FUZZ_SEED:-1}"
  bound=(-seed="$seed" -runs="$runs" -max_total_time=600)
  what="$runs inputs from seed $seed"
fi
build="$ROOT/build/fuzz"
mkdir -p "$build"

probe() {  # can clang++ link a libFuzzer target with both sanitizers?
  command -v clang++ >/dev/null &&
    printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' |
    clang++ -x c++ -fsanitize=fuzzer,address,undefined - -o "$build/probe" >"$build/probe.log" 2>&1
}
if ! probe; then
  log "fuzz: installing clang and its libFuzzer runtime from Debian"
  sudo=()
  [[ $(id -u) -eq 0 ]] || sudo=(sudo -n)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq clang >/dev/null
  # libclang_rt.fuzzer: libclang-rt-N-dev since Debian 12 (libclang-common-N-dev before).
  major="$(clang++ --version | sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -n 1)"
  if apt-cache show "libclang-rt-$major-dev" >/dev/null 2>&1; then
    "${sudo[@]}" apt-get install -y -qq "libclang-rt-$major-dev" >/dev/null
  fi
  probe || { cat "$build/probe.log"; log "fuzz: clang++ cannot build a libFuzzer target"; exit 1; }
fi

"$ROOT/scripts/bootstrap.sh"   # cmake and ninja
compiler_cache
log "fuzz: building tests/fuzz/ (fuzz_c_abi) in $build"
cmake -S "$ROOT" -B "$build" -G Ninja "${LAUNCHER_ARGS[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFUSELET_FRAMEWORK=none \
  -DFUSELET_PYTHON=OFF -DFUSELET_TESTS=OFF -DFUSELET_FUZZ=ON -DPython_EXECUTABLE="$PY" \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >"$build.log" 2>&1 || { cat "$build.log"; exit 1; }
cmake --build "$build" --target fuzz_c_abi
fuzzer="$build/tests/fuzz/fuzz_c_abi"

# The process state the target resets itself; none of the environment's choices.
unset FUSELET_CPU_ISA FUSELET_CPU_BASELINE FUSELET_NUM_THREADS
export ASAN_OPTIONS="detect_leaks=1:strict_string_checks=1:allocator_may_return_null=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
start=$(date +%s)
failed=()
# 1. The regressions, one process each: every one is reported, not only the first.
shopt -s nullglob
regressions=("$ROOT"/tests/fuzz/regressions/*)
mkdir -p "$build/regressions"
for input in "${regressions[@]}"; do
  name="$(basename "$input")"
  if ! "$fuzzer" -timeout=10 "$input" >"$build/regressions/$name.log" 2>&1; then
    log "fuzz: tests/fuzz/regressions/$name fails (log: build/fuzz/regressions/$name.log)"
    grep -m 3 -E '^(SUMMARY|==[0-9]+==ERROR|terminate called|fuzz_c_abi:|.*runtime error)|what\(\)' \
      "$build/regressions/$name.log" || tail -n 20 "$build/regressions/$name.log"
    failed+=("tests/fuzz/regressions/$name")
  fi
done
log "fuzz: ${#regressions[@]} regression inputs replayed, ${#failed[@]} failed"

# 2. Fuzzing, from the seed corpus into a fresh working corpus (the first folder: new inputs go
# there, tests/fuzz/corpus is only read).
rm -rf "$build/corpus" "$build/artifacts"
mkdir -p "$build/corpus" "$build/artifacts"
log "fuzz: libFuzzer, $what (log: build/fuzz/fuzz.log)"
rc=0
"$fuzzer" "${bound[@]}" -timeout=10 -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1 \
  -artifact_prefix="$build/artifacts/" "$build/corpus" "$ROOT/tests/fuzz/corpus" >"$build/fuzz.log" 2>&1 || rc=$?
if [[ $rc -ne 0 ]]; then
  grep -v -E '^#[0-9]+|NEW_FUNC' "$build/fuzz.log" | tail -n 60
  for artifact in "$build"/artifacts/*; do log "fuzz: found $artifact (add it to tests/fuzz/regressions/)"; done
  failed+=("libFuzzer (exit status $rc)")
else
  grep -E '^(stat::|Done|INFO: Seed)' "$build/fuzz.log"
fi
if [[ ${#failed[@]} -gt 0 ]]; then
  log "fuzz: failed: ${failed[*]}"
  exit 1
fi
log "fuzz: no reports ($(( $(date +%s) - start )) s)"
