# Sourced by the device-call scripts (bench/*_session.sh, bench/bf16_peer_check.sh) on the H200:
# $out ($OUT, what comes back) and $log (the logs, which the script packs into $out/all.tgz: the
# device tool returns few files), the binaries unpacked from .carry/ (scripts/pack-for-device.sh)
# and their shared libraries on the path.
set -u
out=${OUT:-/tmp/out}
log=$out/logs
mkdir -p "$log"
if [ ! -x build/moekit ]; then tar -xJf .carry/moekit-bins.tar.xz || exit 1; fi
export LD_LIBRARY_PATH=$PWD/build/runtime:${LD_LIBRARY_PATH:-}
