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
expect() {
    local want=$1 name=$2 file=$3 line=$4 out rc
    rm -rf "${tmp:?}/$name"
    mkdir -p "$tmp/$name/$(dirname "$file")"
    printf '%s\n' "/* fixture */" "$line" >"$tmp/$name/$file"
    set +e
    out=$("$check" "$tmp/$name" 2>&1)
    rc=$?
    set -e
    if [ "$want" = fail ] && { [ $rc -eq 0 ] || ! grep -q "$file:2:" <<<"$out"; }; then
        echo "FAIL: $name: '$line' in $file was accepted (rc $rc): $out"
        failures=$((failures + 1))
    elif [ "$want" = pass ] && [ $rc -ne 0 ]; then
        echo "FAIL: $name: '$line' in $file was refused: $out"
        failures=$((failures + 1))
    fi
}

expect fail access_clients access/client.c '#include "clients/kvedge.h"'
expect fail proxy_clients proxy/proxy.c '#include "clients/pipeline.h"'
expect fail proxy_engine proxy/plan.c '#include "store/engine.h"'
expect fail proxy_master proxy/proxy.c '#include "store/master/master.h"'
expect fail codec_access store/block.c '#include "access/frame.h"'
expect fail codec_rocksdb store/chunk.c '#include <rocksdb/c.h>'
expect fail codec_engine store/model.h '#include "store/engine.h"'
expect fail access_rocksdb access/frame.c '#include <rocksdb/c.h>'
expect fail access_node access/mview.c '#include "store/node/server.h"'
expect fail node_master store/node/node.c '#include "store/master/master.h"'
expect fail node_clients store/node/hsync.c '#include "clients/kvedge.h"'
expect fail master_node store/master/master.c '#include "store/node/node.h"'
expect fail gpu_access gpu/stage.c '#include "access/client.h"'
expect fail gpu_czmq gpu/stage.c '#include <czmq.h>'
expect fail monitor_store monitor/metrics.c '#include "store/error.h"'
expect fail libkvedge_engine clients/pipeline.c '#include "store/engine.h"'
expect fail libkvedge_rocksdb clients/kvedge.c '#include <rocksdb/c.h>'
expect fail engine_zmq store/engine.c '#include <zmq.h>'
expect pass engine_rocksdb store/engine.c '#include <rocksdb/c.h>'
expect pass master_rocksdb store/master/master.c '#include <rocksdb/c.h>'
expect pass node_engine store/node/node.c '#include "store/engine.h"'
expect pass proxy_access proxy/proxy.c '#include "access/client.h"'
expect pass cli_everything clients/cli/main.c '#include "store/node/node.h"'
expect pass gpu_codec gpu/dequant.h '#include "store/block.h"'

if [ "$failures" -ne 0 ]; then
    echo "$failures failed"
    exit 1
fi
echo "24 passed, 0 failed"
