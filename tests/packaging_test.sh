#!/usr/bin/env bash
# Builds the Debian package with CPack from a built tree and checks it:
# its control data (name, dependencies on the runtime libraries, maintainer
# scripts), its files (binaries, JSON schemas, docs, systemd units), and that
# the installed binaries run: the package is unpacked into a scratch root
# (dpkg -x) and `canopy --help` is run from there; the node's unit and config
# example are checked against what `canopy node` accepts.
#   tests/packaging_test.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
for tool in cpack dpkg-deb dpkg-shlibdeps; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIP: $tool is missing (Debian packages cmake, dpkg-dev)"
    exit 77
  fi
done
work=$(mktemp -d /tmp/canopy-packaging.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

(cd "$build" && cpack -G DEB -B "$work/out" --config "$build/CPackConfig.cmake" >"$work/cpack.log" 2>&1) ||
  { cat "$work/cpack.log" >&2; fail "cpack did not build the package"; }
deb=$(ls "$work"/out/canopy_*.deb 2>/dev/null | head -1)
[[ -n "$deb" ]] || fail "no canopy_*.deb in $work/out: $(ls "$work/out")"

# Control data.
dpkg-deb -f "$deb" Package | grep -qx canopy || fail "package name"
depends=$(dpkg-deb -f "$deb" Depends)
for lib in libboost-program-options libprometheus-cpp-core libfmt libstdc++6 libc6 adduser; do
  grep -q "$lib" <<<"$depends" || fail "Depends lacks $lib: $depends"
done
control_files=$(dpkg-deb --ctrl-tarfile "$deb" | tar -t)
grep -qx './postinst' <<<"$control_files" || fail "no postinst in: $control_files"

# Files.
dpkg-deb -c "$deb" >"$work/contents"
for path in ./usr/bin/canopy ./usr/bin/canopy-rcopy ./usr/bin/canopy-bench ./usr/bin/canopy-httpd \
            ./usr/bin/canopy-get ./usr/bin/canopy-load \
            ./usr/share/canopy/schemas/rcopy.schema.json ./usr/share/canopy/schemas/get.schema.json \
            ./usr/share/canopy/schemas/bench.schema.json ./usr/share/canopy/schemas/load.schema.json \
            ./usr/share/doc/canopy/README.md ./usr/share/doc/canopy/rcopy.md \
            ./usr/share/doc/canopy/examples/node.conf \
            ./usr/lib/systemd/system/canopy-node@.service ./usr/lib/systemd/system/canopy-rcopy-server.service; do
  grep -q " $path\$" "$work/contents" || fail "$path is not in the package"
done

# Unpacked into a scratch root, the binaries run.
root="$work/root"
dpkg -x "$deb" "$root"
"$root/usr/bin/canopy" --help >"$work/help" || fail "canopy --help failed"
grep -q "usage: canopy COMMAND" "$work/help" || fail "canopy --help printed: $(cat "$work/help")"
"$root/usr/bin/canopy-rcopy" --help >/dev/null || fail "canopy-rcopy --help failed"
"$root/usr/bin/canopy" node --help >"$work/node-help" || fail "canopy node --help failed"
grep -q -- "--config" "$work/node-help" || fail "canopy node has no --config"

# The unit starts the node from /etc/canopy/%i.conf, and the shipped example
# is a config canopy node runs with (here with the paths and ports of a
# scratch node given on the command line, which wins over the file).
grep -q '^ExecStart=/usr/bin/canopy node --config /etc/canopy/%i.conf$' "$root/usr/lib/systemd/system/canopy-node@.service" ||
  fail "canopy-node@.service ExecStart"
grep -q '^ExecStart=/usr/bin/canopy-rcopy --server' "$root/usr/lib/systemd/system/canopy-rcopy-server.service" ||
  fail "canopy-rcopy-server.service ExecStart"
echo "a secret of the scratch node" >"$work/secret"
set +e
timeout -s TERM 3 "$root/usr/bin/canopy" node --config "$root/usr/share/doc/canopy/examples/node.conf" \
  --secret-file "$work/secret" --data "$work/node" --listen tcp://127.0.0.1:0 --metrics 127.0.0.1:0 \
  >"$work/node.out" 2>&1
rc=$?
set -e
[[ $rc -eq 124 ]] || fail "canopy node with the example config exited $rc: $(cat "$work/node.out")"
grep -q "^node 1 listening on tcp://127.0.0.1:" "$work/node.out" || fail "node output: $(cat "$work/node.out")"
grep -q "^metrics on http://127.0.0.1:" "$work/node.out" || fail "node output: $(cat "$work/node.out")"
if command -v systemd-analyze >/dev/null && [[ -d /run/systemd/system ]]; then
  systemd-analyze verify "$root/usr/lib/systemd/system/canopy-rcopy-server.service" || fail "systemd-analyze verify"
fi
echo "PASS: $(basename "$deb") ($(du -h "$deb" | cut -f1)), Depends: $depends"
