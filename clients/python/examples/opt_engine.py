#!/usr/bin/env python3
"""The two roles with the PyTorch OPT engine over kvedge (docs/python.md):

  cloud: prefill a shared context and store every layer's K/V on a cloud store node as soon as
         the layer is computed (KVLoader.save_layer);
  edge:  decode a private prompt over the context's layers fetched through an edge proxy
         (KVLoader.wait_for_layer), computing the layers the proxy's plan leaves to the edge,
         and compare with the C decoder (`kvedge -H PROXY decode`) on the same request.

    /usr/bin/python3 clients/python/examples/opt_engine.py --node NODE_EP --proxy PROXY_EP \\
        --weights models/kjv/cloud/model.safetensors --model-id kjv-cloud \\
        --tokenizer models/kjv --context-file models/kjv/heldout.txt --tokens 300 \\
        --prompt "And Noah said unto his sons," [--kvedge build/clients/kvedge] \\
        [--server-key NODE_CERT --cert MY_CERT_SECRET [--proxy-key PROXY_CERT]]

It imports the installed kvedge package (`pip install --no-build-isolation clients/python`, or
`make install`); from a source tree without installing, run it with PYTHONPATH=clients/python.
For a CURVE deployment --server-key is the cloud node's public key or certificate, --proxy-key
the edge proxy's and --cert this client's secret certificate (`kvedge keygen`); without them
the connections are plaintext (--insecure daemons, loopback only).

Text becomes token ids through `kvedge tokenize` (the C byte-level BPE), so both decoders see
the same ids. The prompt never leaves this process: the proxy only gets the context's chunk
ids.
"""
import argparse
import json
import subprocess
import sys
import time

import kvedge
from kvedge.engine import KVLoader
from kvedge.opt import OPT


def tokenize(kv, tokenizer, text):
    out = subprocess.run([kv, "tokenize", "--tokenizer", tokenizer], input=text,
                         capture_output=True, text=True, check=True).stdout
    return [int(x) for x in out.split()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--node", required=True, help="cloud store node endpoint (cloud role)")
    ap.add_argument("--proxy", required=True, help="edge proxy endpoint (edge role)")
    ap.add_argument("--weights", required=True)
    ap.add_argument("--model-id", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--context-file", required=True)
    ap.add_argument("--tokens", type=int, default=300, help="context tokens")
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--max-new", type=int, default=16)
    ap.add_argument("--chunk-tokens", type=int, default=256)
    ap.add_argument("--repetition-penalty", type=float, default=1.3)
    ap.add_argument("--kvedge", default="build/clients/kvedge")
    ap.add_argument("--server-key", metavar="FILE",
                    help="CURVE: the cloud node's public key or certificate (kvedge.Client "
                         "server_key)")
    ap.add_argument("--proxy-key", metavar="FILE",
                    help="CURVE: the edge proxy's public key or certificate")
    ap.add_argument("--cert", metavar="FILE",
                    help="CURVE: this client's secret certificate (kvedge.Client cert)")
    a = ap.parse_args()
    if (a.server_key or a.proxy_key) and not a.cert:
        ap.error("--server-key and --proxy-key need --cert (this client's secret certificate)")
    if a.cert and not (a.server_key or a.proxy_key):
        ap.error("--cert needs --server-key or --proxy-key (the daemon's public key)")
    node_keys = dict(server_key=a.server_key, cert=a.cert if a.server_key else None)
    proxy_keys = dict(server_key=a.proxy_key, cert=a.cert if a.proxy_key else None)
    proxy_flags = ["--server-key", a.proxy_key, "--cert", a.cert] if a.proxy_key else []

    with open(a.context_file) as f:
        ctx = tokenize(a.kvedge, a.tokenizer, f.read())[:a.tokens]
    prompt = tokenize(a.kvedge, a.tokenizer, a.prompt)
    eng = OPT(a.weights)
    model = eng.store_model(a.model_id)  # kv_heads = heads, head_dim, layers

    # Cloud role: every layer's K/V goes to the node as soon as the layer is computed.
    t0 = time.perf_counter()
    with KVLoader(a.node, model, role="cloud", chunk_tokens=a.chunk_tokens, scheme="int8",
                  **node_keys) as cloud:
        eng.prefill(ctx, loader=cloud)
    print(f"cloud: prefilled {len(ctx)} tokens, {eng.n_layers} layers stored "
          f"({(time.perf_counter() - t0) * 1e3:.0f} ms)")

    # Edge role: layers stream in through the proxy while the engine computes.
    with kvedge.Client(a.proxy, deadline_ms=10000, **proxy_keys) as proxy:
        chain = kvedge.chunk_ids(ctx, model, a.chunk_tokens)
        # The proxy learns the model and where its blocks are from its master: wait until a
        # FETCH delivers every layer, so both decoders below see the same plan.
        for _ in range(100):
            try:
                r = proxy.fetch(chain, model=model)
                if all(x["status"] == 0 for x in r["layers"]):
                    break
            except kvedge.NoModel:
                pass
            time.sleep(0.1)
        with KVLoader(proxy, model, role="edge", chunk_tokens=a.chunk_tokens) as edge:
            t0 = time.perf_counter()
            h = edge.start_load(ctx)
            tokens, logits, how = eng.decode(ctx, prompt, a.max_new, loader=edge, handle=h,
                                             repetition_penalty=a.repetition_penalty)
            ms = (time.perf_counter() - t0) * 1e3
            plan = h.plan
            edge.finish(h)
    for l, x in enumerate(how):
        src = plan["layers"][l] if plan else {}
        print(f"  layer {l}: {x:8s} plan {src.get('source_name', '-')} ({src.get('reason', '-')})")
    text = subprocess.run([a.kvedge, "tokenize", "--tokenizer", a.tokenizer, "--decode"],
                          input=" ".join(map(str, tokens)), capture_output=True,
                          text=True).stdout
    print(f"edge (PyTorch): {tokens} in {ms:.0f} ms\n  {text!r}")

    r = subprocess.run([a.kvedge, "--json", "-H", a.proxy, *proxy_flags, "decode", "--weights", a.weights,
                        "--model-id", a.model_id, "--chunk-tokens", str(a.chunk_tokens),
                        "--context-ids", ",".join(map(str, ctx)), "--prompt-ids",
                        ",".join(map(str, prompt)), "--max-new", str(a.max_new),
                        "--repetition-penalty", str(a.repetition_penalty)],
                       capture_output=True, text=True, check=True)
    c_tokens = json.loads(r.stdout)["tokens"]["kvedge"]
    print(f"edge (C decoder): {c_tokens}\nsame tokens: {tokens == c_tokens}")
    return 0 if tokens == c_tokens else 1


if __name__ == "__main__":
    sys.exit(main())
