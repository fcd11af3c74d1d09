#!/usr/bin/env bash
# Fetches what tests/backends/llvm_cpu/test_foreign_arch.py needs to run the aarch64 part of a FatELF plugin on
# an x86_64 host: Debian's qemu-user-static, an aarch64 glibc sysroot, and the aarch64
# iree-base-runtime wheel (iree-run-module for aarch64). riscv64 has no IREE runtime wheel,
# so riscv64 ELFs stay checked by reading them.
#   tests/foreign/setup_qemu.sh DIR && PYREE_QEMU_DIR=DIR pytest tests/backends/llvm_cpu/test_foreign_arch.py
set -euo pipefail
dir="$(mkdir -p "$1" && cd "$1" && pwd)"
cd "$dir"
apt_opts=(-oAPT::Architecture=arm64 -oAPT::Architectures=arm64 -oDir::State::Lists="$dir/lists")
mkdir -p lists/partial debs
(cd debs && apt-get download qemu-user-static)
apt-get "${apt_opts[@]}" update >/dev/null
(cd debs && apt-get "${apt_opts[@]}" download libc6 libgcc-s1 libstdc++6)
dpkg -x debs/qemu-user-static_*.deb qemu
for deb in debs/*_arm64.deb; do dpkg -x "$deb" sysroot-aarch64; done
python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_28_aarch64 \
  --python-version 3.11 -d wheels "iree-base-runtime==3.13.*"
python3 -m zipfile -e wheels/iree_base_runtime-*.whl runtime-aarch64
chmod +x runtime-aarch64/iree/_runtime_libs/*
echo "ready: PYREE_QEMU_DIR=$dir"
