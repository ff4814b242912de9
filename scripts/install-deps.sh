#!/usr/bin/env bash
# Installs the Debian packages kvbridge needs, only those that are missing.
set -euo pipefail
pkgs=(build-essential cmake pkg-config ccache clang-format libucx-dev ucx-utils nlohmann-json3-dev
      libcpp-httplib-dev libhttp-parser-dev libcli11-dev libfmt-dev libspdlog-dev libgtest-dev libgmock-dev
      libbenchmark-dev prometheus-cpp-dev libssl-dev pybind11-dev python3-dev python3-pytest python3-numpy etcd-server
      etcd-client iproute2 procps clang libclang-rt-14-dev)
# Hosts in network namespaces and their faults (tests/integration/netns):
# nftables for drops and loss, util-linux for unshare/nsenter, iputils-ping
# to measure the link delay (tests/integration/netns/link_delay_test.cc).
pkgs+=(nftables util-linux iputils-ping)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
