#!/usr/bin/env python3
"""The two roles with llama.cpp over kvedge, from Python (docs/llamacpp.md, "From Python"):

  cloud: llama.cpp prefills a shared context and the bridge puts its K/V to a cloud store node;
  edge:  the context's K/V fetched through an edge proxy into llama.cpp, which decodes a private
         prompt on top (--compare: and recomputes context + prompt itself, for the same tokens).

    /usr/bin/python3 clients/python/examples/llamacpp_roles.py cloud --node NODE_EP \\
        --gguf kjv-cloud.gguf --model-id kjv --context-file models/kjv/heldout.txt \\
        [--scheme int8]
    /usr/bin/python3 clients/python/examples/llamacpp_roles.py edge --proxy PROXY_EP \\
        --gguf kjv-cloud.gguf --model-id kjv --context-file models/kjv/heldout.txt \\
        --prompt "And Noah said" [--max-new 16] [--compare]

The context is a text file (--context-file: tokenized with the GGUF's vocabulary and no BOS,
as `kvedge prefill --engine llama.cpp --file` does) or a file of token ids (--context-ids:
whitespace- or comma-separated), the same on both sides with the same --chunk-tokens; the prompt
is text (--prompt) or ids (--prompt-ids 271,674). It imports the installed kvedge
package with the llama.cpp bridge (`make install` of a kvedge configured with
-DKVEDGE_LLAMACPP=DIR); from a build tree, run it with PYTHONPATH=clients/python,
KVEDGE_LIB=build/clients/libkvedge.so and KVEDGE_LLAMACPP_LIB=build/clients/libkvedge_llamacpp.so.
"""
import argparse
import re
import sys

import kvedge
from kvedge.llamacpp import Engine


def ids(text):
    return [int(x) for x in re.split(r"[\s,]+", text.strip()) if x]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("role", choices=("cloud", "edge"))
    ap.add_argument("--node", help="the cloud store node (cloud)")
    ap.add_argument("--proxy", help="the edge proxy (edge)")
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--model-id", required=True)
    ctx_arg = ap.add_mutually_exclusive_group(required=True)
    ctx_arg.add_argument("--context-file", help="the context as text")
    ctx_arg.add_argument("--context-ids", help="a file of the context's token ids")
    prompt_arg = ap.add_mutually_exclusive_group()
    prompt_arg.add_argument("--prompt", help="the prompt as text (edge)")
    prompt_arg.add_argument("--prompt-ids", help="the prompt's token ids, comma-separated (edge)")
    ap.add_argument("--chunk-tokens", type=int, default=256)
    ap.add_argument("--scheme", default="int8", choices=("lossless", "int8", "int4"))
    ap.add_argument("--dtype", default="fp16", choices=("fp16", "fp32"))
    ap.add_argument("--cache", default="f16", choices=("f16", "f32"))
    ap.add_argument("--max-new", type=int, default=16)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--compare", action="store_true",
                    help="edge: also let llama.cpp recompute context + prompt itself")
    a = ap.parse_args()
    if a.role == "edge" and not (a.proxy and (a.prompt or a.prompt_ids)):
        ap.error("edge needs --proxy and --prompt or --prompt-ids")
    if a.role == "cloud" and not a.node:
        ap.error("cloud needs --node")
    # The vocabulary is the GGUF's: a small engine reads text to ids, then the real one opens.
    ctx, prompt = None, []
    if a.context_ids:
        with open(a.context_ids) as f:
            ctx = ids(f.read())
    if a.prompt_ids:
        prompt = ids(a.prompt_ids)
    if a.context_file or a.prompt:
        with Engine(a.gguf, a.model_id, n_ctx=16, threads=1) as tok:
            if a.context_file:
                with open(a.context_file) as f:
                    ctx = tok.tokenize(f.read())
            if a.prompt:
                prompt = tok.tokenize(a.prompt)
    n_ctx = len(ctx) + len(prompt) + a.max_new

    if a.role == "cloud":
        with kvedge.Client(a.node) as node, \
                Engine(a.gguf, a.model_id, n_ctx=n_ctx, cache=a.cache, threads=a.threads) as llm:
            put = llm.export_context(node, ctx, chunk_tokens=a.chunk_tokens, scheme=a.scheme,
                                     dtype=a.dtype)
            print(f"stored {len(ctx)} context tokens of {llm.model.id} on {a.node}: "
                  f"{len(put['chain'])} chunks, {put['blocks']} blocks ({a.scheme}); "
                  f"llama.cpp prefill {put['prefill_ms']:.1f} ms, put {put['put_ms']:.1f} ms")
        return 0

    with kvedge.Client(a.proxy) as proxy, \
            Engine(a.gguf, a.model_id, n_ctx=n_ctx, cache=a.cache, threads=a.threads) as llm:
        st = llm.import_context(proxy, ctx, chunk_tokens=a.chunk_tokens)
        tokens = llm.generate(prompt, a.max_new)
        print(f"imported {len(ctx)} context tokens of {llm.model.id}: {st['fetched']} of "
              f"{llm.model.layers} layers fetched in {st['fetch_ms']:.1f} ms"
              + (", a layer missed: llama.cpp prefilled the context" if st["prefilled"] else ""))
        print(f"TTFT after the import {llm.ttft_ms:.1f} ms")
        print("tokens:", " ".join(map(str, tokens)))
        print("text:", llm.detokenize(tokens))
        if a.compare:
            llm.clear()
            llm.prefill(ctx)
            alone = llm.generate(prompt, a.max_new)
            print("llama.cpp alone:", " ".join(map(str, alone)))
            print("tokens equal:", "yes" if alone == tokens else "no")
            return 0 if alone == tokens else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
