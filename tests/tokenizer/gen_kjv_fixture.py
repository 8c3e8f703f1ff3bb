#!/usr/bin/python3
"""Writes the fixtures that tie the C tokenizer to the project's trained vocabulary
(models/kjv: vocab.json + merges.txt, written by scripts/train_models.py):

    tests/fixtures/tokenizer/kjv_heldout.json   the first CHAPTERS chapters of
                                                models/kjv/heldout.txt and the ids that
                                                scripts/train_models.py's Tokenizer gives them
    tests/fixtures/tokenizer/kjv_llama_heldout.json the same text and the ids of its Llama form
                                                (models/kjv/llama/tokenizer.json)
    tests/fixtures/tokenizer/kjv/tokenizer.json the same vocabulary as a Hugging Face
                                                tokenizer.json (merges as [a, b] pairs)

    /usr/bin/python3 tests/tokenizer/gen_kjv_fixture.py

Standard library only (train_models.py imports torch only when training)."""
import importlib.util
import json
import os
import sys

CHAPTERS = 3
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MODEL = os.path.join(ROOT, "models", "kjv")
OUT = os.path.join(ROOT, "tests", "fixtures", "tokenizer")


def main():
    spec = importlib.util.spec_from_file_location(
        "train_models", os.path.join(ROOT, "scripts", "train_models.py"))
    tm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tm)
    tok = tm.Tokenizer(MODEL)

    chapters = tm.load_chapters(os.path.join(MODEL, "heldout.txt"))[:CHAPTERS]
    text = "".join(chapters)
    if not text.isascii():
        sys.exit("gen_kjv_fixture: the Python encoder's classes are ASCII; the text is not")
    ids = tok.encode(text)
    with open(os.path.join(OUT, "kjv_heldout.json"), "w") as f:
        json.dump({"source": f"models/kjv/heldout.txt, first {CHAPTERS} chapters",
                   "encoder": "scripts/train_models.py Tokenizer",
                   "text": text, "ids": ids}, f, ensure_ascii=False)
        f.write("\n")

    # The Llama pair's form of the same vocabulary (models/kjv/llama/tokenizer.json): Llama 3's
    # regex, ignore_merges, <s> first.
    lids = tm.Tokenizer(MODEL, llama=True).encode(text)
    with open(os.path.join(OUT, "kjv_llama_heldout.json"), "w") as f:
        json.dump({"source": f"models/kjv/heldout.txt, first {CHAPTERS} chapters",
                   "encoder": "scripts/train_models.py Tokenizer(llama=True)",
                   "tokenizer": "models/kjv/llama/tokenizer.json",
                   "text": text, "ids": lids}, f, ensure_ascii=False)
        f.write("\n")

    vocab = json.load(open(os.path.join(MODEL, "vocab.json")))
    lines = open(os.path.join(MODEL, "merges.txt")).read().splitlines()
    merges = [l.split(" ") for l in lines[1:] if l]
    special = [{"id": vocab[s], "content": s, "single_word": False, "lstrip": False,
                "rstrip": False, "normalized": False, "special": True}
               for s in tm.SPECIALS]
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": special,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
                  "byte_fallback": False, "ignore_merges": False, "vocab": vocab,
                  "merges": merges},
    }
    os.makedirs(os.path.join(OUT, "kjv"), exist_ok=True)
    with open(os.path.join(OUT, "kjv", "tokenizer.json"), "w") as f:
        json.dump(doc, f, ensure_ascii=False)
        f.write("\n")
    print(f"gen_kjv_fixture: {len(text)} bytes -> {len(ids)} ids; "
          f"tokenizer.json with {len(vocab)} tokens, {len(merges)} merges")


if __name__ == "__main__":
    main()
