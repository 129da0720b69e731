#!/bin/sh
# Installs jitmap's C library under PREFIX: include/jitmap.h,
# lib/libjitmap.so.VERSION with its SONAME link libjitmap.so.MAJOR and the
# link-time name libjitmap.so, lib/libjitmap.a and lib/pkgconfig/jitmap.pc.
#
#   capi/install.sh /usr/local            # builds it (cargo build --release)
#   JITMAP_LIB_DIR=target/debug capi/install.sh /tmp/jitmap   # a built copy
#
# Then: cc host.c $(pkg-config --cflags --libs jitmap)
# (with PKG_CONFIG_PATH=PREFIX/lib/pkgconfig for a prefix pkg-config does not
# search, and ldconfig or -Wl,-rpath,PREFIX/lib for one the loader does not).
set -eu
if [ $# -ne 1 ]; then
    echo "usage: capi/install.sh PREFIX" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
prefix=$1
if [ -z "${JITMAP_LIB_DIR:-}" ]; then
    # Where cargo put it, wherever CARGO_TARGET_DIR or a config sends it:
    # the last artifact line naming the shared library.
    messages=$(mktemp)
    trap 'rm -f "$messages"' EXIT
    (cd "$here/.." && cargo build --release -p jitmap-capi \
        --message-format=json-render-diagnostics) > "$messages"
    lib=$(sed -n 's/.*"\([^"]*libjitmap_capi\.so\)".*/\1/p' "$messages" | tail -n 1)
    if [ -z "$lib" ]; then
        echo "capi/install.sh: cargo built no libjitmap_capi.so" >&2
        exit 1
    fi
    JITMAP_LIB_DIR=$(dirname "$lib")
fi
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$here/Cargo.toml" | head -n 1)
install -d "$prefix/include" "$prefix/lib/pkgconfig"
install -m 644 "$here/include/jitmap.h" "$prefix/include/jitmap.h"
major=${version%%.*}
install -m 755 "$JITMAP_LIB_DIR/libjitmap_capi.so" "$prefix/lib/libjitmap.so.$version"
ln -sf "libjitmap.so.$version" "$prefix/lib/libjitmap.so.$major"
ln -sf "libjitmap.so.$major" "$prefix/lib/libjitmap.so"
install -m 644 "$JITMAP_LIB_DIR/libjitmap_capi.a" "$prefix/lib/libjitmap.a"
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" "$here/jitmap.pc.in" \
    > "$prefix/lib/pkgconfig/jitmap.pc"
echo "installed jitmap $version under $prefix"
