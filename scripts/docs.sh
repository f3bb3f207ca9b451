#!/usr/bin/env bash
# The documentation site (mkdocs.yml, docs/): built with --strict into build/site, so a broken
# link, a missing benchmark result or a docstring mkdocstrings cannot read fails it.
source "$(dirname "$0")/env.sh"
"$ROOT/scripts/bootstrap.sh"
# (material prints a banner about its successor on every build; the build itself is what counts)
export NO_MKDOCS_2_WARNING=1
log "mkdocs build --strict -d build/site"
cd "$ROOT"
"$PY" -m mkdocs build --strict -d build/site "$@"
