#!/usr/bin/env bash
# Installs moekit's build and test dependencies from Debian packages (skips apt when all are
# present).
set -euo pipefail
# clang + libclang-rt-14-dev: the libFuzzer / ASan / UBSan runtimes of the fuzz tests (tests/fuzz).
packages=(cmake g++ make nlohmann-json3-dev libfmt-dev libspdlog-dev libcli11-dev libdlpack-dev
          libgtest-dev libgmock-dev clang libclang-rt-14-dev
          python3 python3-numpy python3-torch python3-pytest  # python/: the package and its tests
          libopenmpi-dev openmpi-bin)  # the MPI communicator of CPU ranks and its mpirun tests
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
