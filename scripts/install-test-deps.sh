#!/usr/bin/env bash
# Everything the test suite needs on a fresh Debian machine (as root): Chromium for the
# HTML/dashboard tests, mount/loop/ext4 tools, and the Python test extras.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null || ! command -v mkfs.ext4 >/dev/null || ! command -v losetup >/dev/null; then
  apt-get update && apt-get install -y chromium e2fsprogs util-linux
fi
pip install -e '.[test,bench,analytics]'
