# Sourced by the device-call scripts (bench/*_session.sh, bench/bf16_peer_check.sh) on the H200:
# $out ($OUT, what comes back) and $log (the logs, which the script packs with pack_logs: the
# device tool returns few files), the binaries unpacked from .carry/ (scripts/pack-for-device.sh)
# and their shared libraries on the path.
set -u
out=${OUT:-/tmp/out}
log=$out/logs
mkdir -p "$log"
if [ ! -x build/moekit ]; then tar -xJf .carry/moekit-bins.tar.xz || exit 1; fi
export LD_LIBRARY_PATH=$PWD/build/runtime:${LD_LIBRARY_PATH:-}
# Packs $log into $out/all.tgz — or all-2.tgz, all-3.tgz, ... when an earlier script of the same
# device call already wrote one (two scripts in one call must not overwrite each other's logs) —
# and removes $log.
pack_logs() {
  local name=$out/all.tgz n=2
  while [ -e "$name" ]; do name=$out/all-$n.tgz; n=$((n + 1)); done
  tar czf "$name" -C "$out" logs && rm -rf "$log"
}
