#!/usr/bin/env bash
# Static checks, each a function below (the one list of them: CHECKS):
#   scripts/lint.sh            every check, in order
#   scripts/lint.sh CHECK...   only those (.pre-commit-config.yaml's hooks call them this way)
# ruff and ruff format over the Python code, clang-format (.clang-format) over the tracked
# C++/CUDA files, bash -n over the scripts, no trailing whitespace nor a missing or doubled
# final newline in any tracked text file, and no CUDA construct in the kernels that fuselet's CUDA
# emulator does not implement (scripts/emu_surface.py).
source "$(dirname "$0")/env.sh"
CHECKS=(ruff ruff-format clang-format bash whitespace emu)
PYTHON_DIRS=(python tools tests benchmarks scripts backend docs)
# The C++/CUDA files clang-format checks: every tracked one.
CXX_GLOBS=('*.h' '*.hh' '*.hpp' '*.c' '*.cc' '*.cpp' '*.cxx' '*.cu' '*.cuh')

check_ruff() {
  (cd "$ROOT" && "$PY" -m ruff check "${PYTHON_DIRS[@]}")
}

check_ruff-format() {
  (cd "$ROOT" && "$PY" -m ruff format --check "${PYTHON_DIRS[@]}")
}

check_clang-format() {
  # The clang-format of requirements/dev.txt (its PyPI wheel), whatever else is on PATH.
  local clang_format
  clang_format="$("$PY" -c 'import clang_format; print(clang_format.get_executable("clang-format"))')"
  (cd "$ROOT" && git ls-files -z -- "${CXX_GLOBS[@]}" |
    xargs -0 "$clang_format" --style=file:"$ROOT/.clang-format" --dry-run -Werror)
}

check_bash() {
  local f
  for f in "$ROOT"/scripts/*.sh "$ROOT"/.ci/run; do bash -n "$f"; done
}

check_whitespace() {
  (cd "$ROOT" && git ls-files -z | "$PY" -c '
import sys
bad = []
for path in sys.stdin.buffer.read().decode().split("\0"):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except (FileNotFoundError, IsADirectoryError):
        continue  # deleted in the work tree, or a submodule
    if not data or b"\0" in data:
        continue  # empty, or binary
    for n, line in enumerate(data.split(b"\n"), 1):
        if line.rstrip(b"\r") != line.rstrip(b"\r").rstrip():
            bad.append(f"{path}:{n}: trailing whitespace")
    if not data.endswith(b"\n"):
        bad.append(f"{path}: no newline at the end of the file")
    elif data.endswith(b"\n\n"):
        bad.append(f"{path}: blank lines at the end of the file")
print("\n".join(bad), file=sys.stderr)
sys.exit(1 if bad else 0)
')
}

check_emu() {
  "$PY" "$ROOT/scripts/emu_surface.py"
}

[[ $# -eq 0 ]] && set -- "${CHECKS[@]}"
for check in "$@"; do
  if [[ " ${CHECKS[*]} " != *" $check "* ]]; then
    echo "lint.sh: unknown check '$check' (checks: ${CHECKS[*]})" >&2
    exit 2
  fi
done
"$ROOT/scripts/bootstrap.sh"
# Every check runs, so one failure hides no other; the exit status says whether any failed.
failed=()
for check in "$@"; do
  log "$check"
  "check_$check" || failed+=("$check")
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "lint.sh: failed: ${failed[*]}" >&2
  exit 1
fi
