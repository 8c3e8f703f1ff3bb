#!/usr/bin/env bash
# The include-graph check: passes on the repository, and fails on trees that break each rule
# (so it is known to be able to fail).
set -euo pipefail
check=${1:?usage: test_layout.sh scripts/check_layout.sh}
repo=$(cd "$(dirname "$check")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

"$check" "$repo" >/dev/null || { echo "FAIL: the repository breaks the module graph"; exit 1; }

# expect_fail NAME FILE LINE: a one-file tree whose file holds LINE must be refused.
expects=0
expect() {
    expects=$((expects + 1))
    local want=$1 name=$2 file=$3 line=$4 out rc
    rm -rf "${tmp:?}/$name"
    mkdir -p "$tmp/$name/$(dirname "$file")"
    printf '%s\n' "/* fixture */" "$line" >"$tmp/$name/$file"
    set +e
    out=$("$check" "$tmp/$name" 2>&1)
    rc=$?
    set -e
    if [ "$want" = fail ] && { [ $rc -eq 0 ] || ! grep -qE "^$file(:2:|: not in)" <<<"$out"; }; then
        echo "FAIL: $name: '$line' in $file was accepted (rc $rc): $out"
        failures=$((failures + 1))
    elif [ "$want" = pass ] && [ $rc -ne 0 ]; then
        echo "FAIL: $name: '$line' in $file was refused: $out"
        failures=$((failures + 1))
    fi
}

expect fail access_clients access/client.c '#include "clients/lib/kvedge.h"'
expect fail proxy_clients proxy/proxy.c '#include "clients/lib/pipeline.h"'
expect fail proxy_engine proxy/plan.c '#include "store/engine/engine.h"'
expect fail proxy_master proxy/proxy.c '#include "store/master/master.h"'
expect fail codec_access access/codec/block.c '#include "access/frame.h"'
expect fail codec_rocksdb access/codec/chunk.c '#include <rocksdb/c.h>'
expect fail codec_engine access/codec/model.h '#include "store/engine/engine.h"'
expect fail access_rocksdb access/frame.c '#include <rocksdb/c.h>'
expect fail access_node runtime/mview.c '#include "store/node/server.h"'
expect fail node_master store/node/node.c '#include "store/master/master.h"'
expect fail node_clients store/node/hsync.c '#include "clients/lib/kvedge.h"'
expect fail master_node store/master/master.c '#include "store/node/node.h"'
expect fail gpu_access gpu/stage.c '#include "access/client.h"'
expect fail gpu_czmq gpu/stage.c '#include <czmq.h>'
expect fail monitor_store monitor/metrics.c '#include "access/codec/error.h"'
expect fail libkvedge_engine clients/lib/pipeline.c '#include "store/engine/engine.h"'
expect fail libkvedge_rocksdb clients/lib/kvedge.c '#include <rocksdb/c.h>'
expect fail engine_zmq store/engine/engine.c '#include <zmq.h>'
expect fail access_runtime access/client.c '#include "runtime/log.h"'
expect fail lib_runtime clients/lib/pipeline.c '#include "runtime/settings.h"'
expect fail lib_e2e clients/lib/kvedge.c '#include "clients/e2e/e2e.h"'
expect fail e2e_lab clients/e2e/e2e.c '#include "clients/lab/eval.h"'
expect fail decoder_lib clients/decoder/decoder.c '#include "clients/lib/kvedge.h"'
expect fail runtime_proxy runtime/settings.c '#include "proxy/plan.h"'
expect fail loose_store store/block.c '#include <stdint.h>'
expect fail loose_clients clients/kvedge.c '#include <stdint.h>'
expect fail unknown_folder access/wire/frame.c '#include <stdint.h>'
expect pass engine_rocksdb store/engine/engine.c '#include <rocksdb/c.h>'
expect pass master_rocksdb store/master/master.c '#include <rocksdb/c.h>'
expect pass node_engine store/node/node.c '#include "store/engine/engine.h"'
expect pass proxy_access proxy/proxy.c '#include "access/client.h"'
expect pass cli_everything clients/cli/main.c '#include "store/node/node.h"'
expect pass gpu_codec gpu/dequant.h '#include "access/codec/block.h"'
expect pass runtime_access runtime/mview.c '#include "access/transport.h"'
expect pass lab_e2e clients/lab/eval.c '#include "clients/e2e/e2e.h"'

if [ "$failures" -ne 0 ]; then
    echo "$failures failed"
    exit 1
fi
echo "$expects passed, 0 failed"
