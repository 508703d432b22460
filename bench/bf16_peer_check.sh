#!/usr/bin/env bash
# The bf16 layer against the Triton peer in one device call (after a change to the shared kernel
# kit): moekit bench and the peer on every preset, the ratio table; packed into $OUT/all.tgz.
# shellcheck source=bench/device_prelude.sh
. bench/device_prelude.sh
{
  OUT=$log timeout 240 bash bench/h200_session.sh bench peer
} 2>&1 | tee "$log/session.log"
pack_logs
