#!/usr/bin/env bash
# The locks: each requirements/NAME.txt compiled by uv (requirements/lock-tool.txt, in .venv-lock)
# into requirements/NAME.lock, exact versions with their hashes, for this platform and
# Python 3.11. scripts/bootstrap.sh installs a lock where there is one, so every fresh clone gets
# the same packages until someone moves a lock:
#   scripts/lock.sh              re-lock, keeping every version still allowed (add a package)
#   scripts/lock.sh --upgrade    take the newest release of everything allowed (move the lock)
#   scripts/lock.sh --check      fail naming each lock not made from its requirements file as it is
# Each lock's first line records the sha256 of the requirements file it was made from.
source "$(dirname "$0")/env.sh"
names=(dev stable-abi cuda bench)
# bench (scripts/bench.sh) is installed with --no-deps beside .venv: its lock holds its own packages only
no_deps() { [[ "$1" == bench ]]; }
sha() { sha256sum "$1" | cut -d' ' -f1; }
if [[ "${1:-}" == --check ]]; then
  stale=0
  for name in "${names[@]}"; do
    txt="$ROOT/requirements/$name.txt" lock="$ROOT/requirements/$name.lock"
    if [[ ! -f "$lock" ]] || [[ "$(head -n1 "$lock")" != "# from requirements/$name.txt sha256 $(sha "$txt")" ]]; then
      echo "lock: requirements/$name.lock was not made from requirements/$name.txt as it is now: run make lock" >&2
      stale=1
    fi
  done
  exit "$stale"
fi
tool="$ROOT/.venv-lock"
"$ROOT/scripts/bootstrap.sh" "$tool" "$ROOT/requirements/lock-tool.txt"
upgrade=()
[[ "${1:-}" == --upgrade ]] && upgrade=(--upgrade)
for name in "${names[@]}"; do
  txt="requirements/$name.txt" lock="requirements/$name.lock"
  log "lock: $txt -> $lock"
  # The machine's find-links folder (torch's CPU wheel, where it has one) is searched as pip
  # searches it; the lock names no machine path.
  links=()
  for folder in ${PIP_FIND_LINKS:-$(python3 -m pip config get global.find-links 2>/dev/null || true)}; do
    [[ -d "$folder" ]] && links+=(--find-links "$folder")
  done
  body="$(mktemp)"
  [[ -f "$ROOT/$lock" ]] && tail -n +2 "$ROOT/$lock" >"$body"
  deps=()
  no_deps "$name" && deps=(--no-deps)
  (cd "$ROOT" && UV_NATIVE_TLS=1 "$tool/bin/uv" pip compile --quiet "$txt" --generate-hashes --python-version 3.11 \
    --python-platform x86_64-manylinux_2_28 --index-strategy unsafe-best-match --no-header "${links[@]}" \
    "${upgrade[@]}" "${deps[@]}" -o "$body")
  { echo "# from $txt sha256 $(sha "$ROOT/$txt")"
    echo "# made by scripts/lock.sh (make lock) with uv; install: scripts/$(no_deps "$name" && echo bench || echo bootstrap).sh"
    grep -v '^# made by scripts/lock.sh' "$body"; } >"$ROOT/$lock"
  rm -f "$body"
done
