#!/usr/bin/env bash
# Regenerate src/xpuprof/formats/proto/et_def_pb2.py (+ .pyi) from et_def.proto (Chakra ET,
# written by export/chakra.py). How and why the output is edited: scripts/gen_proto.sh.
set -euo pipefail
exec "$(dirname "$0")/gen_proto.sh" et_def gen_chakra_proto.sh --format
