#!/usr/bin/env bash
# Copy the interpreter prefix $SRC_PREFIX into $PREFIX (see recipe.yaml).
set -euo pipefail
src="$SRC_PREFIX"; v="$PY_SHORT"
mkdir -p "$PREFIX/bin" "$PREFIX/lib" "$PREFIX/include"
cp -a "$src/bin/python$v" "$PREFIX/bin/"
ln -sf "python$v" "$PREFIX/bin/python3"
ln -sf "python$v" "$PREFIX/bin/python"
if [[ -f "$src/bin/python$v-config" ]]; then
  cp -a "$src/bin/python$v-config" "$PREFIX/bin/"
  ln -sf "python$v-config" "$PREFIX/bin/python3-config"
fi
cp -a "$src"/lib/libpython3*.so* "$PREFIX/lib/"
[[ -d "$src/lib/pkgconfig" ]] && cp -a "$src/lib/pkgconfig" "$PREFIX/lib/"
cp -a "$src/include/python$v" "$PREFIX/include/"
# The standard library without site-packages content, test suites, bytecode and the
# static libpython (a build of an extension module needs neither).
(cd "$src/lib" && tar cf - \
    --exclude="python$v/site-packages/*" --exclude="python$v/test" \
    --exclude='*/tests' --exclude='*/test' --exclude='*/idle_test' \
    --exclude='__pycache__' --exclude='*.pyc' --exclude="libpython$v*.a" --exclude='python.o' \
    "python$v") | (cd "$PREFIX/lib" && tar xf -)
touch "$PREFIX/lib/python$v/site-packages/README.txt"
# Text files naming the old prefix (sysconfigdata, python-config, pkg-config files) now
# name $PREFIX; rattler-build records them for prefix replacement at install time.
grep -rlI --null -F "$src" "$PREFIX" | xargs -0 -r sed -i "s|$src|$PREFIX|g"
