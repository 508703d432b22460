#!/usr/bin/env bash
# Device call: every fixture scheme (moekit make-fixture --scheme all) through
# `moekit run --checkpoint` on the GPU, each checked against float64 by the command itself.
# Prints one line per scheme (rc and the verdict); the logs go to $log (device_prelude.sh), which
# the caller packs (or this script, when run alone with PACK=1).
# shellcheck source=bench/device_prelude.sh
. bench/device_prelude.sh
fx=$(mktemp -d)
build/moekit make-fixture --scheme all --out "$fx" >"$log/make_fixture.log" 2>&1
for d in "$fx"/*; do
  s=$(basename "$d")
  timeout 60 build/moekit run --checkpoint "$d" --device auto >"$log/fx_$s.log" 2>&1
  echo "fixture $s rc=$? $(grep -h 'OK\|FAIL\|rror' "$log/fx_$s.log" | tail -n 1)"
done | tee "$log/fixtures.txt"
if [ "${PACK:-0}" = 1 ]; then pack_logs; fi
