#!/usr/bin/env bash
# Regenerates smollm2_llama_cpp_tokens.json: llama.cpp's token ids for the
# corpus below, for the SmolLM2 GGUF. The Rust test
# (tests/llama_cpp_parity.rs) asserts fathom gives the same ids.
#
# Each text goes to llama-tokenize through a file with --no-escape, so the
# bytes it tokenizes are exactly the corpus bytes (control characters, CR,
# trailing newlines included). BOS follows the model (SmolLM2: none).
#
# The same vocabulary is also tokenized under other pre-tokenizers: copies
# of the file's metadata (no tensors; llama-tokenize reads the vocabulary
# only) with tokenizer.ggml.pre replaced, written with the `gguf` Python
# package. Those ids land under "pre_tokenizers", one list per case.
#
# Last, a small SentencePiece ("llama") vocabulary defined below, in the same
# metadata, and its ids for a few texts: under "sentencepiece".
#
#   LLAMA_TOKENIZE  llama-tokenize binary (default: /work/peer/llama.cpp/build/bin/llama-tokenize,
#                   as scripts/build-llama-cpp.sh builds it)
#   MODEL           the GGUF (default: models/SmolLM2-135M-Instruct.Q4_1.gguf)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../../.." && pwd)"
LLAMA_TOKENIZE="${LLAMA_TOKENIZE:-/work/peer/llama.cpp/build/bin/llama-tokenize}"
MODEL="${MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}"

python3 - "$LLAMA_TOKENIZE" "$MODEL" "$here/smollm2_llama_cpp_tokens.json" <<'PY'
import hashlib, json, os, subprocess, sys, tempfile

tokenize, model, out = sys.argv[1:4]

# (text, parse_special)
corpus = [
    ("", False),
    ("Hello world", False),
    (" Hello world", False),
    ("   three leading spaces", False),
    ("Hello  world   with    runs     of spaces", False),
    ("tabs\tand\t\ttabs\t", False),
    ("new\nlines\n\nand\r\nCRLF\rCR", False),
    ("trailing spaces   ", False),
    ("\n\n\n", False),
    (" ", False),
    ("    ", False),
    ("don't", False),
    ("I'LL", False),
    ("I'll we've they're she'd it's can't I'M YOU'VE", False),
    ("'s 't 're 've 'm 'll 'd", False),
    ("rock 'n' roll ''quoted'' ' '", False),
    ("'", False),
    ("don\u2019t \u2018curly\u2019 \u201cquotes\u201d \u02bbokina", False),
    ("12345678901234567890123456789012345678901234567890", False),
    ("3.14159 and 1,000,000 and 2024-11-30T03:59:15Z", False),
    ("x=42; y = -7.5e-3; z=0x1F|0b1010", False),
    ("1 2 3  4   5    6", False),
    (" 123 456", False),
    ("\u00b9\u00b2\u00b3 \u00bd \u0663\u0664\u0665 \u2460 \u216b", False),
    ("\u4e2d\u6587\u6d4b\u8bd5\uff1a\u4f60\u597d\uff0c\u4e16\u754c\uff01", False),
    ("\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3068\u30ab\u30bf\u30ab\u30ca", False),
    ("\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8", False),
    ("Emoji \U0001F600\U0001F44D\U0001F3FD family \U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466 flag \U0001F1EB\U0001F1F7", False),
    ("Combining: e\u0301 a\u0308 n\u0303 (NFD) vs \u00e9 \u00e4 \u00f1 (NFC)", False),
    ("Zalgo: Z\u0335\u0321\u0322a\u0336l\u0337g\u0338o\u0334", False),
    ("\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u0438 \u0420\u0443\u0441\u0441\u043a\u0438\u0439 \u044f\u0437\u044b\u043a", False),
    ("\u05e2\u05d1\u05e8\u05d9\u05ea \u0648\u0627\u0644\u0639\u0631\u0628\u064a\u0629", False),
    ("\u0939\u093f\u0928\u094d\u0926\u0940 \u092e\u0947\u0902 \u0932\u093f\u0916\u093e", False),
    ("def foo(x):\n    return x ** 2  # square\n", False),
    ("fn main() {\n\tprintln!(\"hi {}\", 1 + 2);\n}\n", False),
    ("<div class=\"a\">&amp; &lt;tag&gt;</div>", False),
    ("SELECT * FROM users WHERE id = 1;", False),
    ("https://example.com/path?q=1&r=two#frag user@example.com", False),
    ("$$$ %%% ^^^ &&& *** ~~~ ```", False),
    ("...!!!???---___", False),
    ("<|im_start|>user\nhi<|im_end|>", True),
    ("<|im_start|>user\nhi<|im_end|>", False),
    ("<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n", True),
    ("<|endoftext|>", True),
    ("text<|im_end|>more", True),
    ("<|im_start|><|im_start|> <|im_end|>", True),
    ("<repo_name>x<file_sep>y<reponame>", True),
    ("< |im_start| > <|im_start <im_start|>", True),
    ("\u00a0non-breaking\u2003em space\u3000ideographic", False),
    ("\u0085NEL and \u000bVT \u000cFF", False),
    ("Mixed123abc456 ABC-def_ghi", False),
    ("CamelCaseWordsAndALLCAPS", False),
    ("a" * 64, False),
    ("The quick brown fox jumps over the lazy dog.", False),
    ("    indented code line", False),
    ("\t\tdouble tab indent", False),
    ("ma\u00f1ana \u00fcber stra\u00dfe fa\u00e7ade na\u00efve", False),
    ("\uff26\uff55\uff4c\uff4c\uff57\uff49\uff44\uff54\uff48\u3000\uff21\uff22\uff23\u3000\uff11\uff12\uff13", False),
    ("\u00a9\u00ae\u2122 \u00b0C \u00b15 \u00b5s \u20ac \u00a3 \u00a5", False),
    ("\u2200x\u2208\u211d: x\u00b2 \u2265 0 \u2192 \u221ax", False),
    ("line1\n  line2\n\tline3\n \n", False),
    ("\u200bzero\u200dwidth\ufeff", False),
    ("\u00dcn\u00efc\u00f6d\u00e9 \u00c7\u00c0PS", False),
    ("\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! 123", False),
    ("ctrl\u0001\u0007\u001f chars\u007f", False),
    ("private \ue000 and astral \U0001D54F\U00010348", False),
    ("NaN inf -0 1e10 +5 5%", False),
    ("Hi!!\n\n\nBye?\r\n\r\n", False),
    ("word's WORD'S Word'Ll it'LL", False),
    (" \t \n x\n \n y  \n", False),
    ("a\u3000b\u00a0\u00a0c \u2028d", False),
    ("\U0001F600\U0001F600 \U0001F600\n\U0001F600", False),
    ("$x = 'a' . \"b\";\n// comment\n/* block */", False),
    ("Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et dolore magna aliqua. " * 8, False),
]

def run(args):
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout

# One name per distinct rule list in llama.cpp's llm_tokenizer_bpe.
variants = [
    "default", "llama-bpe", "qwen2", "gpt-2", "falcon", "deepseek-llm", "deepseek-v3",
    "deepseek-coder", "bloom", "viking", "tekken", "chameleon", "gpt-4o", "superbpe",
    "bailingmoe", "seed-coder",
]

# A SentencePiece vocabulary: <unk> <s> </s>, byte tokens, then these
# (text, score, token type) with 1 normal, 3 control, 4 user-defined.
spm_words = [
    ("\u2581", -10.0, 1), ("h", -20.0, 1), ("e", -20.0, 1), ("l", -20.0, 1), ("o", -20.0, 1),
    ("w", -20.0, 1), ("r", -20.0, 1), ("d", -20.0, 1), ("a", -20.0, 1), ("b", -20.0, 1),
    ("c", -20.0, 1), ("ll", -3.0, 1), ("llo", -4.0, 1), ("or", -4.0, 1), ("ld", -5.0, 1),
    ("\u2581h", -6.0, 1), ("\u2581w", -6.0, 1), ("he", -7.0, 1), ("\u2581he", -5.0, 1),
    ("\u2581hello", -1.0, 1), ("\u2581wor", -2.0, 1), ("\u2581world", -1.0, 1), ("ab", -1.0, 1),
    ("bc", -0.5, 1), ("\u2581\u2581", -8.0, 1), ("\u4e2d", -9.0, 1), ("hello", -1.5, 1),
    ("<tool>", 0.0, 4), ("<|end|>", 0.0, 3),
]
spm_tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + [w for w, _, _ in spm_words]
spm_scores = [0.0] * 259 + [s for _, s, _ in spm_words]
spm_types = [2, 3, 3] + [6] * 256 + [t for _, _, t in spm_words]
spm_corpus = [
    ("", False), ("hello world", False), ("hello world", True), ("abc", False),
    ("hello w\u00e9", False), (" hello", False), ("  hello  world ", False), ("<s>hello", True),
    ("<s>hello", False), ("\u4e2d\u6587 hello", False), ("\n", False), ("hello\nworld", False),
    ("</s> x <unk>", True), ("a<tool>b", False), ("<|end|>hello<|end|>", True),
    ("<|end|>hello", False), ("hellohello", False), ("\u2581hello", False), ("\U0001F600!", False),
]

def write_gguf(path, overrides, keep_tokenizer=True):
    import gguf
    src = gguf.GGUFReader(model)
    w = gguf.GGUFWriter(path, arch=src.fields["general.architecture"].contents())
    fields = {}
    for name, field in src.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if not keep_tokenizer and name.startswith("tokenizer."):
            continue
        fields[name] = (field.contents(), field.types)
    fields.update(overrides)
    for name, (value, types) in fields.items():
        if types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, value, types[0], sub_type=types[1])
        else:
            w.add_key_value(name, value, types[0])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

def write_variant(path, pre):
    import gguf
    write_gguf(path, {"tokenizer.ggml.pre": (pre, [gguf.GGUFValueType.STRING])})

def write_spm(path):
    import gguf
    T = gguf.GGUFValueType
    write_gguf(path, {
        "tokenizer.ggml.model": ("llama", [T.STRING]),
        "tokenizer.ggml.tokens": (spm_tokens, [T.ARRAY, T.STRING]),
        "tokenizer.ggml.scores": (spm_scores, [T.ARRAY, T.FLOAT32]),
        "tokenizer.ggml.token_type": (spm_types, [T.ARRAY, T.INT32]),
    }, keep_tokenizer=False)

def tokenize_all(gguf_path, tmp, corpus=corpus):
    path = os.path.join(tmp, "text")
    out = []
    for text, parse_special in corpus:
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        args = [tokenize, "-m", gguf_path, "-f", path, "--ids", "--log-disable", "--no-escape"]
        if not parse_special:
            args.append("--no-parse-special")
        out.append(json.loads(run(args).strip().splitlines()[-1]))
    return out

with tempfile.TemporaryDirectory() as tmp:
    ids = tokenize_all(model, tmp)
    cases = [{"text": t, "parse_special": p, "ids": i} for (t, p), i in zip(corpus, ids)]
    by_pre = {}
    for pre in variants:
        variant = os.path.join(tmp, "variant.gguf")
        write_variant(variant, pre)
        by_pre[pre] = tokenize_all(variant, tmp)
    spm_path = os.path.join(tmp, "spm.gguf")
    write_spm(spm_path)
    spm_ids = tokenize_all(spm_path, tmp, spm_corpus)

cli = os.path.join(os.path.dirname(tokenize), "llama-cli")
version = "unknown"
if os.path.exists(cli):
    p = subprocess.run([cli, "--version"], capture_output=True, text=True)
    version = " ".join((p.stdout + p.stderr).split())
info = os.path.join(os.path.dirname(tokenize), "..", "..", "FATHOM_BUILD_INFO")
source = open(info).read().strip().splitlines() if os.path.exists(info) else []
with open(model, "rb") as f:
    sha = hashlib.sha256(f.read()).hexdigest()

doc = {
    "model": os.path.basename(model),
    "model_sha256": sha,
    "llama_cpp_version": version,
    "llama_cpp_build": source,
    "command": "llama-tokenize -m MODEL -f TEXT_FILE --ids --log-disable --no-escape"
               " [--no-parse-special when parse_special is false]",
    "bos": "added as the model asks (tokenizer.ggml.add_bos_token); compare with encode(text, add_bos(), parse_special)",
    "cases": cases,
    "pre_tokenizers": by_pre,
}
spm = {
    "tokens": spm_tokens, "scores": spm_scores, "token_types": spm_types,
    "cases": [{"text": t, "parse_special": p, "ids": i} for (t, p), i in zip(spm_corpus, spm_ids)],
}
# One case per line keeps the file readable and its diffs small.
header = json.dumps({k: v for k, v in doc.items() if k not in ("cases", "pre_tokenizers")},
                    ensure_ascii=False, indent=1)
lines = ",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in cases)
pres = ",\n".join(
    f"  {json.dumps(pre)}: [\n" + ",\n".join("   " + json.dumps(i) for i in lists) + "\n  ]"
    for pre, lists in by_pre.items())
with open(out, "w", encoding="utf-8") as f:
    f.write(header[:-2] + ',\n "cases": [\n' + lines + '\n ],\n "pre_tokenizers": {\n' + pres + "\n },\n")
    f.write(' "sentencepiece": {\n' + ",\n".join(
        f"  {json.dumps(k)}: {json.dumps(spm[k], ensure_ascii=False)}" for k in ("tokens", "scores", "token_types")))
    f.write(',\n  "cases": [\n' + ",\n".join("   " + json.dumps(c, ensure_ascii=False) for c in spm["cases"]))
    f.write("\n  ]\n }\n}\n")
print(f"wrote {len(cases)} cases, also under {len(by_pre)} other pre-tokenizers, "
      f"and {len(spm_corpus)} SentencePiece cases to {out}")
PY
