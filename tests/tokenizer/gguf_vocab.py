#!/usr/bin/env python3
"""Turns one of llama.cpp's tokenizer test vocabularies (models/ggml-vocab-llama-bpe.gguf,
models/ggml-vocab-qwen2.gguf, models/ggml-vocab-gpt-2.gguf: GGUF v3 files holding only metadata)
into the Hugging Face tokenizer.json that Llama 3, Qwen2 or GPT-2 ships, so that kvedge's
tokenizer can be run on llama.cpp's .inp/.out cases.

GGUF v3 (ggml/docs/gguf.md): "GGUF", u32 version, u64 tensor count, u64 key count, then the keys:
a string (u64 length + bytes), a u32 value type, the value. The vocabulary is in
tokenizer.ggml.{model,pre,tokens,token_type,merges,bos_token_id,eos_token_id,add_bos_token}.
Token types (llama.h, llama_token_type): 1 normal, 2 unknown, 3 control, 4 user-defined,
5 unused, 6 byte; control tokens become special added tokens, user-defined ones added tokens.

Usage: gguf_vocab.py VOCAB.gguf OUT/tokenizer.json
"""
import json
import struct
import sys

# The pre-tokenizer regexes of the original tokenizer.json files (llama.cpp's llama-vocab.cpp
# quotes them above its adapted forms), whether the BPE model ignores merges, and whether the
# template adds BOS when the file does not say (llama.cpp's llama-vocab.cpp decides it by "pre").
FORMS = {
    "llama-bpe": {
        "pattern": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
                   "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        "ignore_merges": True,
        "normalizer": None,
        "add_bos": True,
    },
    "qwen2": {
        "pattern": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
                   "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        "ignore_merges": False,
        "normalizer": {"type": "NFC"},
        "add_bos": False,
    },
    # GPT-2's form: ByteLevel with its own regex, no Split.
    "gpt-2": {
        "pattern": None,
        "ignore_merges": False,
        "normalizer": None,
        "add_bos": False,
    },
}

GGUF_MAGIC = b"GGUF"
# Value types: (struct format, size) of the fixed-size ones; 8 is a string, 9 an array.
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
MAX_STRING = 1 << 20  # bytes in one string (a token, a merge, a key)
MAX_ARRAY = 1 << 22  # items in one array


class GgufError(Exception):
    pass


class Reader:
    def __init__(self, data, path):
        self.data, self.pos, self.path = data, 0, path

    def take(self, n):
        if self.pos + n > len(self.data):
            raise GgufError(f"{self.path}: truncated at byte {self.pos}")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def scalar(self, fmt):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self):
        n = self.scalar("<Q")
        if n > MAX_STRING:
            raise GgufError(f"{self.path}: a string of {n} bytes at byte {self.pos}")
        return self.take(n).decode("utf-8")

    def value(self, vtype):
        if vtype in SCALARS:
            return self.scalar(SCALARS[vtype])
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            itype, n = self.scalar("<I"), self.scalar("<Q")
            if n > MAX_ARRAY:
                raise GgufError(f"{self.path}: an array of {n} items at byte {self.pos}")
            return [self.value(itype) for _ in range(n)]
        raise GgufError(f"{self.path}: unknown value type {vtype} at byte {self.pos}")


def read_metadata(path):
    with open(path, "rb") as f:
        data = f.read()
    r = Reader(data, path)
    if r.take(4) != GGUF_MAGIC:
        raise GgufError(f"{path}: not a GGUF file")
    version = r.scalar("<I")
    if version != 3:
        raise GgufError(f"{path}: GGUF version {version}, only 3 is read")
    r.scalar("<Q")  # tensors: the vocabulary files have none, and nothing here needs them
    keys = r.scalar("<Q")
    meta = {}
    for _ in range(keys):
        key = r.string()
        meta[key] = r.value(r.scalar("<I"))
    return meta


def to_tokenizer_json(meta, path):
    model = meta.get("tokenizer.ggml.model")
    pre = meta.get("tokenizer.ggml.pre")
    if model != "gpt2" or pre not in FORMS:
        raise GgufError(f"{path}: tokenizer.ggml.model {model!r} / pre {pre!r}: "
                        f"only gpt2 with {sorted(FORMS)} is converted")
    form = FORMS[pre]
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta["tokenizer.ggml.token_type"]
    merges = meta["tokenizer.ggml.merges"]
    if len(types) != len(tokens):
        raise GgufError(f"{path}: {len(tokens)} tokens but {len(types)} token types")
    vocab, added = {}, []
    for i, (tok, ty) in enumerate(zip(tokens, types)):
        if ty in (3, 4):  # control, user-defined: added tokens, matched before the regex
            added.append({"id": i, "content": tok, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": ty == 3})
        elif ty == 1 or ty == 6:
            vocab[tok] = i
        else:
            raise GgufError(f"{path}: token {i} has type {ty}, not expected in a BPE vocabulary")
    post = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
            "use_regex": True}
    add_bos = meta.get("tokenizer.ggml.add_bos_token", form["add_bos"])
    if add_bos:
        bos = tokens[meta["tokenizer.ggml.bos_token_id"]]
        bos_id = meta["tokenizer.ggml.bos_token_id"]
        post = {"type": "Sequence", "processors": [post, {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}}}]}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": form["pattern"] is None}
    pre_tokenizer = byte_level
    if form["pattern"] is not None:
        pre_tokenizer = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": form["pattern"]}, "behavior": "Isolated",
             "invert": False}, byte_level]}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": form["normalizer"],
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": form["ignore_merges"], "vocab": vocab,
                  "merges": merges},
    }


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: gguf_vocab.py VOCAB.gguf OUT/tokenizer.json")
    try:
        doc = to_tokenizer_json(read_metadata(sys.argv[1]), sys.argv[1])
    except (GgufError, KeyError, UnicodeDecodeError, OSError) as e:
        sys.exit(f"gguf_vocab: {e}")
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)
    print(f"gguf_vocab: {sys.argv[2]}: {len(doc['model']['vocab'])} tokens, "
          f"{len(doc['added_tokens'])} added, {len(doc['model']['merges'])} merges")


if __name__ == "__main__":
    main()
