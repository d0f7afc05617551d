#!/usr/bin/env bash
# Regenerate src/xpuprof/formats/proto/xplane_pb2.py (+ .pyi) from xplane.proto (XProf's XSpace,
# read without TensorFlow). How and why the output is edited: scripts/gen_proto.sh.
set -euo pipefail
exec "$(dirname "$0")/gen_proto.sh" xplane gen_xplane_proto.sh --format
