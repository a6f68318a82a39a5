#!/usr/bin/env python3
"""make_bad_models.py — fixtures for tests/test_gguf.c and tests/test_safetensors.c.

Writes (run from anywhere; paths are relative to the repo root):
  tests/data/gguf/expected.json       what the reference reader (gguf-py GGUFReader) sees in the two real
                                      models and in good_writer.gguf: counts, alignment, data offset, every
                                      scalar KV, every array (length + sha256 of its elements), every tensor
  tests/data/gguf/good_writer.gguf    a small file written by the reference writer (gguf-py GGUFWriter)
  tests/data/gguf/good_min.gguf       a small hand-laid file (every value type) used as the base of the
                                      malformed corpus, with truncations.tsv: the error expected when the
                                      file is cut at every byte
  tests/data/safetensors/good/...     single, sharded and exotic-dtype models written by the reference
                                      writer (safetensors + numpy), expected.json from the reference reader
                                      (safetensors.deserialize), truncations.tsv for every cut of single/
  tests/data/bad/                     the malformed corpus (one rule broken per file, the CVE classes of
                                      docs/reliability.md §1) and expected.tsv: "<name>\\t<exact error>"
  fuzz/seeds/fuzz_gguf/, fuzz/seeds/fuzz_safetensors/   seeds: the small good files and a few bad ones

The expected error sentences are composed here from the byte positions this script lays out, not
copied from the C parser's output; the sentence templates mirror src/model/gguf.c and src/model/safetensors.c.
Only the JSON-syntax cases quote jansson 2.14's own wording and position.
"""
import ctypes
import hashlib
import json
import os
import shutil
import struct
import sys

import numpy as np

import gguf
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from safetensors import TensorSpec, deserialize, serialize_file
from safetensors.numpy import save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.chdir(ROOT)
SPILL_HOME = os.environ.get("SPILL_HOME") or os.path.join(os.path.expanduser("~"), ".streamweights")
REAL_MODELS = ["models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf", "models/gemma3-270m/gemma-3-270m-q4_k_m.gguf"]

GG_DIR = "tests/data/gguf"
ST_DIR = "tests/data/safetensors"
BAD = "tests/data/bad"

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
VT_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<B", U64: "<Q",
          I64: "<q", F64: "<d"}
VT_NAME = ["u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"]


def sha(b):
    return hashlib.sha256(b).hexdigest()


# ---------------------------------------------------------------- reference reader -> expected.json

def describe_gguf(path, rel):
    """Everything gguf-py's GGUFReader reports about one file, in a form the C test can compare."""
    r = gguf.GGUFReader(path)
    out = {"path": rel, "version": int(r.fields["GGUF.version"].parts[-1][0]),
           "n_tensors": len(r.tensors), "n_kv": int(r.fields["GGUF.kv_count"].parts[-1][0]),
           "alignment": int(r.alignment), "data_offset": int(r.data_offset), "kvs": [], "tensors": []}
    for key, f in r.fields.items():
        if key.startswith("GGUF."):
            continue
        t = int(f.types[0])
        kv = {"key": key, "type": t}
        if t == STRING:
            raw = bytes(f.parts[f.data[0]])
            kv["len"], kv["sha256"] = len(raw), sha(raw)
            if len(raw) <= 200:
                kv["str"] = raw.decode("utf-8")
        elif t == ARRAY:
            et = int(f.types[1])
            kv["arr_type"], kv["arr_n"] = et, len(f.data)
            if et == STRING:
                # sha256 over (u64 LE length + bytes) of every element, in order
                h = hashlib.sha256()
                for i in f.data:
                    raw = bytes(f.parts[i])
                    h.update(struct.pack("<Q", len(raw)) + raw)
                kv["sha256"] = h.hexdigest()
                kv["first"] = bytes(f.parts[f.data[0]]).decode("utf-8", "replace") if f.data else None
            else:
                vals = np.array([f.parts[i][0] for i in f.data], dtype=np.float64)
                kv["sha256"] = sha(vals.astype("<f8").tobytes())  # sha256 over each element as f64 LE
        else:
            v = f.parts[f.data[0]][0]
            # u64 as a decimal string: JSON readers (jansson) stop at INT64_MAX
            kv["value"] = bool(v) if t == BOOL else float(v) if t in (F32, F64) else str(int(v)) if t == U64 \
                else int(v)
        out["kvs"].append(kv)
    for t in r.tensors:
        out["tensors"].append({"name": t.name, "type": int(t.tensor_type), "ne": [int(x) for x in t.shape],
                               "offset": int(t.data_offset), "size": int(t.n_bytes)})
    return out


def make_writer_gguf(path):
    """A small file from the reference writer: scalars of every type, arrays, F32/F16/Q8_0/Q4_K tensors."""
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_block_count(2)
    w.add_context_length(128)
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -5)
    w.add_uint16("test.u16", 65000)
    w.add_int16("test.i16", -30000)
    w.add_int32("test.i32", -123456)
    w.add_float32("test.f32", 0.1)
    w.add_float64("test.f64", -2.5e-300)
    w.add_uint64("test.u64", 2**63 + 5)
    w.add_int64("test.i64", -(2**40))
    w.add_bool("test.bool", True)
    w.add_string("test.str", "héllo\nworld")
    w.add_array("test.tokens", ["a", "", "Ġthe", "<0x0A>", "日本"])
    w.add_array("test.scores", [0.5, -1.25, 3.0])
    w.add_array("test.types", [1, 2, 3, 6])
    w.add_key_value("test.u8arr", [0, 7, 255], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.UINT8)
    w.add_key_value("test.boolarr", [True, False], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.BOOL)
    w.add_int64("test.i64pos", 42)
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", rng.standard_normal((3, 8)).astype(np.float32))
    w.add_tensor("output_norm.weight", rng.standard_normal(8).astype(np.float16))
    w.add_tensor("blk.0.attn_q.weight", rng.integers(0, 255, (2, 34), dtype=np.uint8),
                 raw_dtype=GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.ffn_down.weight", rng.integers(0, 255, (1, 144), dtype=np.uint8),
                 raw_dtype=GGMLQuantizationType.Q4_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ---------------------------------------------------------------- hand-laid GGUF builder

def show(b, limit=40):
    """Mirror of src/model/gguf.c show(): how an untrusted key or name is quoted in an error."""
    out = ""
    for i, c in enumerate(b):
        if i == limit:
            return out + "..."
        out += chr(c) if 0x20 <= c < 0x7F and c not in (0x22, 0x5C) else "\\x%02x" % c
    return out


class GG:
    """Lays out a GGUF file byte by byte, recording what each span is called in error messages."""

    def __init__(self):
        self.b = bytearray()
        self.spans = []  # (start, length, label): one need() check in the C reader each
        self.arr_checks = []  # (pos after count, bytes needed, message) for array counts

    def put(self, data, label):
        self.spans.append((len(self.b), len(data), label))
        self.b += data

    def num(self, fmt, v, label):
        self.put(struct.pack(fmt, v), label)

    def string(self, s, label):
        s = s.encode() if isinstance(s, str) else s
        self.num("<Q", len(s), label)
        self.put(s, label)

    def value(self, t, v, what):
        if t == STRING:
            self.string(v, what)
        elif t == ARRAY:
            et, items = v
            self.num("<I", et, what)
            cstart = len(self.b)
            self.num("<Q", len(items), what)
            esz = 8 if et == STRING else struct.calcsize(VT_FMT[et])
            self.arr_checks.append((len(self.b), len(items) * esz,
                                    (cstart, f'{what}: array of {len(items)} {VT_NAME[et]} elements cannot fit in '
                                             f'the {{R}} remaining bytes; the file is truncated or corrupt.')))
            for i, x in enumerate(items):
                self.value(et, x, f"{what} element {i}" if et == STRING else what)
        else:
            self.num(VT_FMT[t], v, what)


def type_size(t, ne):
    be, bb = GGML_QUANT_SIZES[GGMLQuantizationType(t)]
    n = 1
    for x in ne[1:]:
        n *= x
    return ne[0] // be * bb * n


def pad(n, a):
    return (n + a - 1) // a * a


def build_gguf(kvs, tensors, version=3, alignment=32, n_kv=None, n_t=None, magic=b"GGUF", data=True):
    """kvs: [(key, type, value)]; tensors: [(name, ne, type, offset or None)].  Returns the GG layout."""
    g = GG()
    g.b += magic + struct.pack("<IQQ", version, len(tensors) if n_t is None else n_t,
                               len(kvs) if n_kv is None else n_kv)
    for key, t, v in kvs:
        kb = key.encode() if isinstance(key, str) else key
        g.string(kb, "metadata key")
        g.num("<I", t, f'type of key "{show(kb)}"')
        g.value(t, v, f'key "{show(kb)}"')
    running, g.tensors = 0, []
    for name, ne, t, off in tensors:
        nb = name.encode()
        g.string(nb, "tensor name")
        what = f'tensor "{show(nb)}"'
        g.num("<I", len(ne), what)
        for x in ne:
            g.num("<Q", x, what)
        g.num("<I", t, what)
        size = type_size(t, ne)
        g.num("<Q", running if off is None else off, what)
        g.tensors.append((name, running if off is None else off, size))
        running = pad(running + size, alignment)
    g.data_offset = pad(len(g.b), alignment)
    if data and running <= 1 << 20:  # huge claimed sizes get no data: those files fail before it matters
        g.b += bytes(g.data_offset - len(g.b))
        for i, (name, off, size) in enumerate(g.tensors):
            g.b += bytes((i * 37 + j) & 0xFF for j in range(size))
            if i + 1 < len(g.tensors):
                g.b += bytes(pad(len(g.b), alignment) - len(g.b))
    return g


BASE_KVS = [
    ("general.architecture", STRING, "llama"),
    ("general.alignment", U32, 32),
    ("llama.block_count", U32, 1),
    ("test.i8", I8, -3),
    ("test.f64", F64, 0.25),
    ("test.flag", BOOL, 1),
    ("tokenizer.ggml.tokens", ARRAY, (STRING, ["<s>", "a", "bc"])),
    ("tokenizer.ggml.scores", ARRAY, (F32, [0.0, -1.5, 2.0])),
]
BASE_TENSORS = [("token_embd.weight", [4, 3], 0, None), ("blk.0.attn_q.weight", [32, 2], 8, None)]


def gguf_msg(name, off, text):
    return f"{name}: byte {off}: {text}"


def gguf_truncation_msg(g, name, cut):
    """The error gguf_parse must give for the first `cut` bytes of layout g (mirrors the C check order)."""
    if cut < 24:
        return gguf_msg(name, 0, f"the file is {cut} bytes, shorter than the 24-byte GGUF header; the file is "
                                 f"truncated or not a GGUF file.")
    n_t, n_kv = struct.unpack_from("<QQ", g.b, 8)
    rem = cut - 24
    if n_t * 33 > rem:
        return gguf_msg(name, 8, f"tensor count {n_t} cannot fit in the {rem} remaining bytes; the file is truncated "
                                 f"or corrupt.")
    if n_kv * 14 > rem:
        return gguf_msg(name, 16, f"metadata count {n_kv} cannot fit in the {rem} remaining bytes; the file is "
                                  f"truncated or corrupt.")
    checks = sorted([(s, "span", (n, lab)) for s, n, lab in g.spans] +
                    [(p, "arr", (need, m)) for p, need, m in g.arr_checks], key=lambda c: (c[0], c[1] == "span"))
    for pos, kind, info in checks:
        if kind == "arr":
            need, (cstart, m) = info
            if pos <= cut and need > cut - pos:
                return gguf_msg(name, cstart, m.replace("{R}", str(cut - pos)))
            continue
        n, label = info
        if pos + n > cut:
            return gguf_msg(name, pos, f"{label} needs {n} bytes but only {cut - pos} remain; the file is truncated "
                                       f"or corrupt.")
    for tname, off, size in g.tensors:
        a = g.data_offset + off
        if a + size > cut:
            return gguf_msg(name, a, f'tensor "{tname}": data [{a}, {a + size}) runs past the end of the {cut}-byte '
                                     f'file; the file is truncated or corrupt.')
    return None


# ---------------------------------------------------------------- safetensors helpers

def st_image(header, data=b"", n=None, pad_to8=True):
    """header: dict/str/bytes; returns u64 N + header + data (N padded with spaces like the writer)."""
    if isinstance(header, dict):
        header = json.dumps(header, separators=(",", ":"))
    if isinstance(header, str):
        header = header.encode()
    if pad_to8:
        header += b" " * ((8 - len(header) % 8) % 8)
    return struct.pack("<Q", len(header) if n is None else n) + header + data, header


def st_key_off(header, tname):
    i = header.find(b'"' + tname.encode() + b'"')
    return 8 + i if i >= 0 else 8


def write_raw_st(path, tensors, metadata=None):
    """tensors: {name: (dtype, shape, bytes)} through the reference writer's raw TensorSpec path."""
    keep, specs = [], {}
    for name, (dt, shape, data) in tensors.items():
        buf = ctypes.create_string_buffer(data, len(data))
        keep.append(buf)
        specs[name] = TensorSpec(dtype=dt, shape=shape, data_ptr=ctypes.addressof(buf), data_len=len(data))
    serialize_file(specs, path, metadata=metadata)


def describe_st(files):
    """Reference reader's view: for each tensor, dtype, shape, nbytes and sha256 of its bytes."""
    out = {}
    for f in files:
        with open(f, "rb") as fh:
            blob = fh.read()
        for name, info in deserialize(blob):
            out[name] = {"dtype": info["dtype"], "shape": list(info["shape"]), "size": len(bytes(info["data"])),
                         "sha256": sha(bytes(info["data"])), "file": os.path.basename(f)}
    return out


# ---------------------------------------------------------------- main

def reset_dir(d):
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)


def moe_models(golden):
    """MoE checkpoints (HF directories) that parse but disagree with their config: engine_open must refuse each
    with one sentence (tests/test_arch.c).  A one-layer Mixtral of D=16, two experts of F=8, tied embeddings;
    each case breaks one rule in the experts or the router.  Sentences mirror src/model/arch.c."""
    D, F, E, V = 16, 8, 2, 8
    cfg = {"model_type": "mixtral", "num_hidden_layers": 1, "hidden_size": D, "num_attention_heads": 2,
           "num_key_value_heads": 1, "head_dim": 8, "intermediate_size": F, "num_local_experts": E,
           "num_experts_per_tok": 1, "vocab_size": V, "max_position_embeddings": 32, "rms_norm_eps": 1e-5,
           "tie_word_embeddings": True}
    z = lambda *shape: np.zeros(shape, dtype=np.float32)

    def base(fused):
        t = {"model.embed_tokens.weight": z(V, D), "model.norm.weight": z(D),
             "model.layers.0.input_layernorm.weight": z(D), "model.layers.0.post_attention_layernorm.weight": z(D),
             "model.layers.0.self_attn.q_proj.weight": z(16, D), "model.layers.0.self_attn.k_proj.weight": z(8, D),
             "model.layers.0.self_attn.v_proj.weight": z(8, D), "model.layers.0.self_attn.o_proj.weight": z(D, 16)}
        if fused:  # transformers 5's in-memory layout
            t["model.layers.0.mlp.gate.weight"] = z(E, D)
            t["model.layers.0.mlp.experts.gate_up_proj"] = z(E, 2 * F, D)
            t["model.layers.0.mlp.experts.down_proj"] = z(E, D, F)
        else:
            t["model.layers.0.block_sparse_moe.gate.weight"] = z(E, D)
            for e in range(E):
                for w, shape in (("w1", (F, D)), ("w3", (F, D)), ("w2", (D, F))):
                    t[f"model.layers.0.block_sparse_moe.experts.{e}.{w}.weight"] = z(*shape)
        return t

    def case(name, fused, edit, msg):
        d = f"{BAD}/{name}"
        os.makedirs(d)
        with open(f"{d}/config.json", "w") as fh:
            json.dump(cfg, fh)
        t = base(fused)
        edit(t)
        save_file(t, f"{d}/model.safetensors")
        golden.append((name, f"{d}: {msg}"))

    pre = "model.layers.0.block_sparse_moe"
    case("moe_expert_missing", False, lambda t: t.pop(f"{pre}.experts.1.w3.weight"),
         f"expert 1 of layer 0 has no up matrix (neither tensor blk.0.ffn_up.1.weight nor a stacked "
         f"blk.0.ffn_up_exps.weight), but the config declares {E} experts.")
    case("moe_expert_index", False, lambda t: t.update({f"{pre}.experts.2.w1.weight": z(F, D)}),
         f"tensor {pre}.experts.2.w1.weight is expert 2 of layer 0, but the config declares {E} experts "
         f"(0 to {E - 1}).")
    case("moe_router_shape", False, lambda t: t.update({f"{pre}.gate.weight": z(E + 1, D)}),
         f"router blk.0.ffn_gate_inp.weight scores {E + 1} experts from {D} inputs, but the config declares {E} "
         f"experts and a model dimension of {D}.")
    case("moe_stacked_shape", True, lambda t: t.update({"model.layers.0.mlp.experts.gate_up_proj": z(E, F, D)}),
         f"tensor blk.0.ffn_gate_up_exps.weight has shape [{E}, {F}, {D}] but the config implies "
         f"[{E}, {2 * F}, {D}].")
    case("moe_stacked_count", True, lambda t: t.update({"model.layers.0.mlp.experts.down_proj": z(E + 1, D, F)}),
         f"tensor blk.0.ffn_down_exps.weight has shape [{E + 1}, {D}, {F}] but the config implies "
         f"[{E}, {D}, {F}].")


def arch_models(golden):
    """Dense-family checkpoints (HF directories) whose config or tensors break a family rule: model_open or
    engine_open must refuse each with one sentence (tests/test_arch.c).  A two-layer Gemma 2 of D=16; sentences
    mirror src/model/model.c and src/model/arch.c."""
    D, F, V = 16, 8, 8
    cfg = {"model_type": "gemma2", "num_hidden_layers": 2, "hidden_size": D, "num_attention_heads": 2,
           "num_key_value_heads": 1, "head_dim": 8, "intermediate_size": F, "vocab_size": V,
           "max_position_embeddings": 32, "rms_norm_eps": 1e-6, "sliding_window": 4, "query_pre_attn_scalar": 8,
           "tie_word_embeddings": True, "layer_types": ["sliding_attention", "full_attention"]}
    z = lambda *shape: np.zeros(shape, dtype=np.float32)
    t0 = {"model.embed_tokens.weight": z(V, D), "model.norm.weight": z(D)}
    for l in range(2):
        p = f"model.layers.{l}."
        t0.update({p + "input_layernorm.weight": z(D), p + "post_attention_layernorm.weight": z(D),
                   p + "pre_feedforward_layernorm.weight": z(D), p + "post_feedforward_layernorm.weight": z(D),
                   p + "self_attn.q_proj.weight": z(16, D), p + "self_attn.k_proj.weight": z(8, D),
                   p + "self_attn.v_proj.weight": z(8, D), p + "self_attn.o_proj.weight": z(D, 16),
                   p + "mlp.gate_proj.weight": z(F, D), p + "mlp.up_proj.weight": z(F, D),
                   p + "mlp.down_proj.weight": z(D, F)})

    def case(name, cfg_edit, t_edit, msg):
        d = f"{BAD}/{name}"
        os.makedirs(d)
        c = json.loads(json.dumps(cfg))
        cfg_edit(c)
        with open(f"{d}/config.json", "w") as fh:
            json.dump(c, fh)
        t = dict(t0)
        t_edit(t)
        save_file(t, f"{d}/model.safetensors")
        golden.append((name, msg.format(d=d)))

    keep = lambda t: None
    case("arch_layer_types_short", lambda c: c.update({"layer_types": ["sliding_attention"]}), keep,
         "{d}/config.json: layer_types must list one attention kind for each of the 2 layers; it has 1.")
    case("arch_layer_types_kind", lambda c: c.update({"layer_types": ["sliding_attention", "linear_attention"]}), keep,
         "{d}/config.json: layer_types[1] is linear_attention; spill runs sliding_attention and full_attention "
         "layers.")
    case("arch_post_norm_missing", lambda c: None,
         lambda t: t.pop("model.layers.1.post_feedforward_layernorm.weight"),
         "{d}: tensor blk.1.post_ffw_norm.weight is missing.")


def main():
    for d in (BAD, "fuzz/seeds/fuzz_gguf", "fuzz/seeds/fuzz_safetensors"):  # wholly this script's
        reset_dir(d)
    shutil.rmtree(f"{ST_DIR}/good", ignore_errors=True)  # in shared areas, only what this script writes
    os.makedirs(GG_DIR, exist_ok=True)
    os.makedirs(ST_DIR, exist_ok=True)
    golden = []  # (name, message)

    # --- GGUF good files and the reference reader's view of them
    make_writer_gguf(f"{GG_DIR}/good_writer.gguf")
    base = build_gguf(BASE_KVS, BASE_TENSORS)
    with open(f"{GG_DIR}/good_min.gguf", "wb") as fh:
        fh.write(base.b)
    # a vocab-only file (like llama.cpp's ggml-vocab-*.gguf): no tensors, no padding after the KVs
    with open(f"{GG_DIR}/good_vocab_only.gguf", "wb") as fh:
        fh.write(build_gguf(BASE_KVS, [], data=False).b)
    models = [describe_gguf(f"{GG_DIR}/{f}", f"{GG_DIR}/{f}")
              for f in ("good_writer.gguf", "good_min.gguf", "good_vocab_only.gguf")]
    for rel in REAL_MODELS:
        p = os.path.join(SPILL_HOME, rel)
        if os.path.exists(p):
            models.append(describe_gguf(p, "$SPILL_HOME/" + rel))
        else:
            print(f"warning: {p} not found; its expectations are not written", file=sys.stderr)
    with open(f"{GG_DIR}/expected.json", "w") as fh:
        types = [[int(t), t.name, *GGML_QUANT_SIZES[t]] for t in GGMLQuantizationType if t in GGML_QUANT_SIZES]
        json.dump({"format": "spill-gguf-expected", "version": 1, "types": types, "models": models}, fh, indent=0)
    name = f"{GG_DIR}/good_min.gguf"
    with open(f"{GG_DIR}/truncations.tsv", "w") as fh:
        for cut in range(len(base.b)):
            fh.write(f"{cut}\t{gguf_truncation_msg(base, name, cut)}\n")
    assert gguf_truncation_msg(base, name, len(base.b)) is None

    # --- GGUF malformed corpus
    def bad_gguf(fname, blob, msg_off, text):
        path = f"{BAD}/{fname}"
        with open(path, "wb") as fh:
            fh.write(blob)
        golden.append((fname, gguf_msg(path, msg_off, text)))

    def kvs_with(extra):
        return BASE_KVS + extra

    def key_start(g, key):
        """Offset of the key's length field."""
        kb = key.encode() if isinstance(key, str) else key
        for i, (s, n, lab) in enumerate(g.spans):
            if lab == "metadata key" and n == len(kb) and bytes(g.b[s:s + n]) == kb:
                return g.spans[i - 1][0]
        raise KeyError(key)

    trunc = "the file is truncated or corrupt."
    bad_gguf("gguf_empty.gguf", b"", 0, "the file is 0 bytes, shorter than the 24-byte GGUF header; the file is "
                                        "truncated or not a GGUF file.")
    bad_gguf("gguf_short_header.gguf", base.b[:23], 0, "the file is 23 bytes, shorter than the 24-byte GGUF header; "
                                                       "the file is truncated or not a GGUF file.")
    bad_gguf("gguf_bad_magic.gguf", b"GGML" + base.b[4:], 0, 'magic bytes 47 47 4d 4c are not "GGUF"; this is not '
                                                             'a GGUF file.')
    st_blob, _ = st_image({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, b"\x01")
    bad_gguf("gguf_is_safetensors.gguf", st_blob, 0, "magic bytes %02x %02x %02x %02x are not \"GGUF\"; this is not "
             "a GGUF file." % tuple(st_blob[:4]))
    for v in (0, 1, 4, 0xFFFFFFFF):
        bad_gguf(f"gguf_version_{v}.gguf", base.b[:4] + struct.pack("<I", v) + base.b[8:], 4,
                 f"GGUF version {v} is not supported (only 2 and 3 are); re-convert the model with a current "
                 f"llama.cpp.")
    bad_gguf("gguf_version_bigendian.gguf", base.b[:4] + struct.pack(">I", 3) + base.b[8:], 4,
             "version 0x03000000 looks byte-swapped; big-endian GGUF files are not supported, convert the model "
             "on a little-endian machine.")
    rem = len(base.b) - 24
    # CVE-2024-25666 / Talos n_tensors: count × sizeof wraps
    for tag, n in (("max", 2**64 - 1), ("wrap", 2**59 + 1), ("big", 1000)):
        bad_gguf(f"gguf_cve_n_tensors_{tag}.gguf", base.b[:8] + struct.pack("<Q", n) + base.b[16:], 8,
                 f"tensor count {n} cannot fit in the {rem} remaining bytes; {trunc}")
    # CVE-2024-25664 / Talos n_kv
    for tag, n in (("max", 2**64 - 1), ("wrap", 0x0AAAAAAAAAAAAAAB), ("big", 100)):
        bad_gguf(f"gguf_cve_n_kv_{tag}.gguf", base.b[:16] + struct.pack("<Q", n) + base.b[24:], 16,
                 f"metadata count {n} cannot fit in the {rem} remaining bytes; {trunc}")
    # key length field attacks (CVE-2024-25665: len+1 wraps)
    def raw_kv_file(fname, raw, msg_off_fn, text):
        g = build_gguf(BASE_KVS[:2], [], n_kv=3, data=False)
        pos = len(g.b)
        blob = bytes(g.b) + raw
        bad_gguf(fname, blob, msg_off_fn(pos), text(len(blob) - pos))

    raw_kv_file("gguf_cve_key_len_max.gguf", struct.pack("<Q", 2**64 - 1) + b"x" * 16, lambda p: p,
                lambda r: "metadata key: length 18446744073709551615 exceeds the 65535-byte limit; the file is "
                          "corrupt.")
    raw_kv_file("gguf_key_len_65536.gguf", struct.pack("<Q", 65536) + b"x" * 16, lambda p: p,
                lambda r: "metadata key: length 65536 exceeds the 65535-byte limit; the file is corrupt.")
    raw_kv_file("gguf_key_len_past_eof.gguf", struct.pack("<Q", 1000) + b"x" * 16, lambda p: p + 8,
                lambda r: f"metadata key needs 1000 bytes but only {r - 8} remain; {trunc}")
    raw_kv_file("gguf_key_empty.gguf", struct.pack("<Q", 0) + struct.pack("<IB", U8, 1) + b"\0" * 8,
                lambda p: p, lambda r: "metadata key 2 is empty; the file is corrupt.")
    raw_kv_file("gguf_key_nul.gguf", struct.pack("<Q", 3) + b"a\0b" + struct.pack("<IB", U8, 1) + b"\0" * 4,
                lambda p: p, lambda r: 'metadata key "a\\x00b" contains a NUL byte; the file is corrupt.')
    raw_kv_file("gguf_key_not_ascii.gguf", struct.pack("<Q", 4) + "ké".encode() + b"y" + struct.pack("<IB", U8, 1)
                + b"\0" * 4, lambda p: p, lambda r: 'metadata key "k\\xc3\\xa9y" is not printable ASCII; the file is '
                                                    'corrupt.')
    g = build_gguf(kvs_with([("llama.block_count", U32, 2)]), BASE_TENSORS)
    bad_gguf("gguf_duplicate_key.gguf", g.b, [s for s, n, lab in g.spans if lab == "metadata key"][2 * len(BASE_KVS)],
             'duplicate metadata key "llama.block_count"; the file is corrupt.')
    # value types
    for tag, t in (("13", 13), ("neg", 0xFFFFFFFF)):
        g = build_gguf(kvs_with([("x.bad", U8, 0)]), BASE_TENSORS)
        p = g.spans[[lab for s, n, lab in g.spans].index('type of key "x.bad"')][0]
        b = bytearray(g.b)
        struct.pack_into("<I", b, p, t)
        bad_gguf(f"gguf_kv_type_{tag}.gguf", b, p, f'key "x.bad" has unknown value type {t}; the file is corrupt or '
                                                  f'from a newer GGUF version.')

    def str_len_case(fname, newlen, expect):
        g = build_gguf(kvs_with([("x.s", STRING, "abcdefgh")]), BASE_TENSORS)
        p = g.spans[[lab for s, n, lab in g.spans].index('key "x.s"')][0]
        b = bytearray(g.b)
        struct.pack_into("<Q", b, p, newlen)
        bad_gguf(fname, b, *expect(p, len(b)))

    str_len_case("gguf_cve_str_len_max.gguf", 2**64 - 1, lambda p, n: (p, 'key "x.s": length 18446744073709551615 '
                                                                         'exceeds the 67108864-byte limit; the file is '
                                                                         'corrupt.'))
    str_len_case("gguf_str_len_64mib_plus1.gguf", 64 * 2**20 + 1,
                 lambda p, n: (p, 'key "x.s": length 67108865 exceeds the 67108864-byte limit; the file is corrupt.'))
    str_len_case("gguf_str_len_past_eof.gguf", 1 << 20,
                 lambda p, n: (p + 8, f'key "x.s" needs 1048576 bytes but only {n - p - 8} remain; {trunc}'))
    g = build_gguf(kvs_with([("x.b", BOOL, 2)]), BASE_TENSORS)
    p = g.spans[[lab for s, n, lab in g.spans].index('key "x.b"')][0]
    bad_gguf("gguf_bool_2.gguf", g.b, p, 'key "x.b": boolean value 2 is not 0 or 1; the file is corrupt.')

    def arr_case(fname, items_t, items, patch, expect):
        g = build_gguf(kvs_with([("x.arr", ARRAY, (items_t, items))]), BASE_TENSORS)
        p = g.spans[[lab for s, n, lab in g.spans].index('key "x.arr"')][0]  # element type field
        b = bytearray(g.b)
        patch(b, p)
        bad_gguf(fname, b, *expect(p, len(b)))

    arr_case("gguf_cve_arr_type_13.gguf", U8, [1, 2], lambda b, p: struct.pack_into("<I", b, p, 13),
             lambda p, n: (p, 'key "x.arr": array element type 13 is not a valid GGUF type; the file is corrupt.'))
    arr_case("gguf_cve_arr_type_neg.gguf", U8, [1, 2], lambda b, p: struct.pack_into("<I", b, p, 0xFFFFFFF0),
             lambda p, n: (p, 'key "x.arr": array element type 4294967280 is not a valid GGUF type; the file is '
                              'corrupt.'))
    arr_case("gguf_arr_nested.gguf", U8, [1, 2], lambda b, p: struct.pack_into("<I", b, p, ARRAY),
             lambda p, n: (p, 'key "x.arr": arrays of arrays are not supported; the file is corrupt or not a model '
                              'file.'))
    # CVE-2024-25667: count × 4 wraps to 0
    arr_case("gguf_cve_arr_count_wrap.gguf", U32, [1, 2], lambda b, p: struct.pack_into("<Q", b, p + 4, 2**62),
             lambda p, n: (p + 4, f'key "x.arr": array of {2**62} elements exceeds the limit of 16777216; the file '
                                  f'is corrupt.'))
    arr_case("gguf_arr_count_cap.gguf", U8, [1, 2], lambda b, p: struct.pack_into("<Q", b, p + 4, 16 * 2**20 + 1),
             lambda p, n: (p + 4, 'key "x.arr": array of 16777217 elements exceeds the limit of 16777216; the file '
                                  'is corrupt.'))
    arr_case("gguf_arr_count_past_eof.gguf", F64, [1.0], lambda b, p: struct.pack_into("<Q", b, p + 4, 10**6),
             lambda p, n: (p + 4, f'key "x.arr": array of 1000000 f64 elements cannot fit in the {n - p - 12} '
                                  f'remaining bytes; {trunc}'))
    # CVE-2024-25668: string array count
    arr_case("gguf_cve_str_arr_count.gguf", STRING, ["a"], lambda b, p: struct.pack_into("<Q", b, p + 4, 2**23),
             lambda p, n: (p + 4, f'key "x.arr": array of 8388608 string elements cannot fit in the {n - p - 12} '
                                  f'remaining bytes; {trunc}'))
    arr_case("gguf_cve_str_arr_elem_len.gguf", STRING, ["ab", "cd"],
             lambda b, p: struct.pack_into("<Q", b, p + 12 + 10, 2**64 - 1),
             lambda p, n: (p + 22, 'key "x.arr" element 1: length 18446744073709551615 exceeds the 67108864-byte '
                                   'limit; the file is corrupt.'))
    arr_case("gguf_bool_arr_7.gguf", BOOL, [0, 1, 7], lambda b, p: None,
             lambda p, n: (p + 14, 'key "x.arr": boolean element 2 is 7, not 0 or 1; the file is corrupt.'))
    # alignment
    for tag, t, a, text in (
            ("0", U32, 0, 'key "general.alignment" is 0, not a power of two between 1 and 1048576; the file is '
                          'corrupt.'),
            ("3", U32, 3, 'key "general.alignment" is 3, not a power of two between 1 and 1048576; the file is '
                          'corrupt.'),
            ("huge", U32, 2**31, 'key "general.alignment" is 2147483648, not a power of two between 1 and 1048576; '
                                 'the file is corrupt.'),
            ("u64", U64, 32, 'key "general.alignment" must be a u32 but is a u64; the file is corrupt.')):
        kvs = [(k, t, a) if k == "general.alignment" else (k, tt, v) for k, tt, v in BASE_KVS]
        g = build_gguf(kvs, BASE_TENSORS)
        bad_gguf(f"gguf_alignment_{tag}.gguf", g.b, key_start(g, "general.alignment"), text)

    # tensor infos
    def tensor_case(fname, tensors, expect, kvs=BASE_KVS, **kw):
        g = build_gguf(kvs, tensors, **kw)
        off, text = expect(g)
        bad_gguf(fname, g.b, off, text)

    def tfield(g, tname, k):
        """k-th span labelled tensor "tname" (0 = n_dims, 1.. = ne, then type, offset)."""
        return [s for s, n, lab in g.spans if lab == f'tensor "{tname}"'][k]

    def name_start(g, i):
        return [s for s, n, lab in g.spans if lab == "tensor name"][2 * i]

    tensor_case("gguf_tensor_name_64.gguf", [("n" * 64, [4], 0, None)],
                lambda g: (name_start(g, 0), "tensor name: length 64 exceeds the 63-byte limit; the file is corrupt."))
    tensor_case("gguf_tensor_name_empty.gguf", [("", [4], 0, None)],
                lambda g: (name_start(g, 0), "tensor 0 has an empty name; the file is corrupt."))
    tensor_case("gguf_tensor_name_nul.gguf", [("a\0b", [4], 0, None)],
                lambda g: (name_start(g, 0), 'tensor name "a\\x00b" contains a NUL byte; the file is corrupt.'))
    tensor_case("gguf_tensor_duplicate.gguf", [("w", [4], 0, None), ("w", [4], 0, None)],
                lambda g: (name_start(g, 1), 'duplicate tensor name "w"; the file is corrupt.'))
    for tag, nd in (("0", 0), ("5", 5), ("max", 0xFFFFFFFF)):
        g = build_gguf(BASE_KVS, [("w", [4], 0, None)])
        p = tfield(g, "w", 0)
        b = bytearray(g.b)
        struct.pack_into("<I", b, p, nd)
        bad_gguf(f"gguf_cve_n_dims_{tag}.gguf", b, p, f'tensor "w": n_dims {nd} is not between 1 and 4; the file is '
                                                     f'corrupt.')
    tensor_case("gguf_tensor_ne_0.gguf", [("w", [4, 0], 0, None)],
                lambda g: (tfield(g, "w", 2), 'tensor "w": ne[1] = 0 is not between 1 and 2^63-1; the file is '
                                              'corrupt.'))
    tensor_case("gguf_tensor_ne_negative.gguf", [("w", [2**63], 0, 0)],
                lambda g: (tfield(g, "w", 1), f'tensor "w": ne[0] = {2**63} is not between 1 and 2^63-1; the file '
                                              f'is corrupt.'))
    # CVE-2026-33298: the dim product wraps (2^42+1 stride example, and 2^32 × 2^32)
    tensor_case("gguf_cve_dim_product.gguf", [("w", [2**32, 2**32], 0, 0)],
                lambda g: (tfield(g, "w", 2), f'tensor "w": the element count overflows at ne[1] = {2**32}; the file '
                                              f'is corrupt.'))
    tensor_case("gguf_cve_dim_product_4d.gguf", [("w", [2**42 + 1, 2**10, 2**10, 2**2], 0, 0)],
                lambda g: (tfield(g, "w", 4), 'tensor "w": the element count overflows at ne[3] = 4; the file is '
                                              'corrupt.'))
    tensor_case("gguf_tensor_size_overflow.gguf", [("w", [2**62], 0, 0)],
                lambda g: (tfield(g, "w", 2), 'tensor "w": its byte size overflows 64 bits; the file is corrupt.'))
    for tag, t, what in (("removed_4", 4, "removed from ggml"), ("removed_36", 36, "removed from ggml"),
                         ("q2_0", 42, "not supported"), ("43", 43, "unknown"), ("neg", 0xFFFFFFFF, "unknown")):
        g = build_gguf(BASE_KVS, [("w", [32], 0, None)])
        p = tfield(g, "w", 2)
        b = bytearray(g.b)
        struct.pack_into("<I", b, p, t)
        bad_gguf(f"gguf_cve_type_{tag}.gguf", b, p, f'tensor "w": ggml type {t} is {what}; re-convert the model with '
                                                   f'a current llama.cpp.')
    g = build_gguf(BASE_KVS, [("w", [32, 2], 2, None)])  # Q4_0 with ne[0] patched to 33
    p = tfield(g, "w", 1)
    b = bytearray(g.b)
    struct.pack_into("<Q", b, p, 33)
    bad_gguf("gguf_tensor_block_misaligned.gguf", b, tfield(g, "w", 3),
             'tensor "w": ne[0] = 33 is not a multiple of the Q4_0 block size 32; the file is corrupt.')
    tensor_case("gguf_offset_unaligned.gguf", [("a", [4], 0, None), ("b", [4], 0, 16)],
                lambda g: (tfield(g, "b", 3), 'tensor "b": data offset 16 is not a multiple of the alignment 32; the '
                                              'file is corrupt.'))
    tensor_case("gguf_offset_gap.gguf", [("a", [4], 0, None), ("b", [4], 0, 64)],
                lambda g: (tfield(g, "b", 3), 'tensor "b": data offset 64 should be 32 (tensors are stored in order, '
                                              'each padded to the alignment); the file is corrupt.'))
    tensor_case("gguf_offset_overlap.gguf", [("a", [4], 0, None), ("b", [4], 0, 0)],
                lambda g: (tfield(g, "b", 3), 'tensor "b": data offset 0 should be 32 (tensors are stored in order, '
                                              'each padded to the alignment); the file is corrupt.'))
    tensor_case("gguf_offset_first_nonzero.gguf", [("a", [4], 0, 32)],
                lambda g: (tfield(g, "a", 3), 'tensor "a": data offset 32 should be 0 (tensors are stored in order, '
                                              'each padded to the alignment); the file is corrupt.'))
    # CVE-2025-53630 / CVE-2026-27940: the cumulative size wraps
    tensor_case("gguf_cve_cumulative_size.gguf", [("a", [2**61], 0, None), ("b", [2**61], 0, None)],
                lambda g: (tfield(g, "b", 3), 'tensor "b": data offset plus size overflows 64 bits; the file is '
                                              'corrupt.'), data=False)
    # CVE-2026-7482 "Bleeding Llama": offset + size past EOF (sizes fine, data missing)
    g = build_gguf(BASE_KVS, [("a", [4], 0, None), ("b", [1024, 1024], 0, None)], data=False)
    blob = bytes(g.b) + bytes(g.data_offset - len(g.b)) + bytes(16)
    a = g.data_offset + 32
    bad_gguf("gguf_cve_offset_past_eof.gguf", blob, a, f'tensor "b": data [{a}, {a + 4 * 2**20}) runs past the end of '
                                                       f'the {len(blob)}-byte file; the file is truncated or corrupt.')
    # physical truncations at a few representative points (every cut is covered by truncations.tsv)
    cuts = sorted({30, base.spans[3][0] + 2, base.spans[12][0] + 1, base.data_offset - 1,
                   len(base.b) - 1, base.spans[-1][0] + 3, base.spans[-6][0]})
    for cut in cuts:
        fname = f"gguf_truncated_{cut}.gguf"
        path = f"{BAD}/{fname}"
        with open(path, "wb") as fh:
            fh.write(base.b[:cut])
        golden.append((fname, gguf_truncation_msg(base, path, cut)))
    long_key = b"general." + b"k" * 40 + b"\0" + b"x"
    raw_kv_file("gguf_key_long_nul.gguf", struct.pack("<Q", len(long_key)) + long_key + struct.pack("<IB", U8, 1)
                + b"\0" * 4, lambda p: p, lambda r: f'metadata key "{show(long_key)}" contains a NUL byte; the file '
                                                    f'is corrupt.')
    # polyglot: a GGUF header whose "key" is a ZIP local header; the binary key is refused
    raw_kv_file("gguf_polyglot_zip_key.gguf", struct.pack("<Q", 4) + b"PK\x03\x04" + struct.pack("<IB", U8, 1)
                + b"\0" * 4, lambda p: p, lambda r: 'metadata key "PK\\x03\\x04" is not printable ASCII; the file is '
                                                    'corrupt.')

    # --- safetensors good files
    rng = np.random.default_rng(1)
    single = {"a": rng.standard_normal((2, 3)).astype(np.float32), "b": rng.standard_normal(4).astype(np.float16),
              "scalar": np.array(7, dtype=np.int64), "empty": np.zeros((0, 3), dtype=np.float32),
              "u8": np.arange(5, dtype=np.uint8), "flag": np.array([True, False, True]),
              "f64": rng.standard_normal((1, 2, 1, 2)).astype(np.float64)}
    os.makedirs(f"{ST_DIR}/good/single")
    save_file(single, f"{ST_DIR}/good/single/model.safetensors", metadata={"format": "np", "note": "spill test"})
    os.makedirs(f"{ST_DIR}/good/sharded")
    shard_a = {"model.embed_tokens.weight": rng.standard_normal((5, 4)).astype(np.float32),
               "model.norm.weight": rng.standard_normal(4).astype(np.float32)}
    shard_b = {"model.layers.0.mlp.up_proj.weight": rng.standard_normal((8, 4)).astype(np.float16),
               "lm_head.weight": rng.standard_normal((5, 4)).astype(np.float32)}
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    for nm, sh in zip(names, (shard_a, shard_b)):
        save_file(sh, f"{ST_DIR}/good/sharded/{nm}", metadata={"format": "pt"})
    wm = {k: names[0] for k in shard_a} | {k: names[1] for k in shard_b}
    total = sum(v.nbytes for v in list(shard_a.values()) + list(shard_b.values()))
    with open(f"{ST_DIR}/good/sharded/model.safetensors.index.json", "w") as fh:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(wm.items()))}, fh, indent=2)
    os.makedirs(f"{ST_DIR}/good/dtypes")
    write_raw_st(f"{ST_DIR}/good/dtypes/model.safetensors",
                 {"bf16": ("bfloat16", [2, 2], bytes(range(8))), "f4": ("float4_e2m1fn_x2", [3], b"\x12\x34\x56"),
                  "e4m3": ("float8_e4m3fn", [3], b"abc"), "e5m2": ("float8_e5m2", [1], b"z"),
                  "e8m0": ("float8_e8m0fnu", [2], b"\x7f\x80"), "c64": ("complex64", [1], bytes(range(8)))},
                 metadata={"k": "v"})
    os.makedirs(f"{ST_DIR}/good/escaped")
    esc = {"é.weight": b"\1\2", "emoji😀": b"\3", 'quote"back\\slash/': b"\4\5\6", "tab\tname": b"",
           "中.bias": b"\7", "x_ascii": b"\10"}
    hdr, pos = {"__metadata__": {"ключ": "значение"} | {f"k{i}": f"v{i}" for i in range(12)}}, 0
    for k, v in esc.items():
        hdr[k] = {"dtype": "U8", "shape": [len(v)], "data_offsets": [pos, pos + len(v)]}
        pos += len(v)
    # ensure_ascii escapes every non-ASCII character; escape one ASCII letter by hand too
    blob, _ = st_image(json.dumps(hdr, ensure_ascii=True).replace('"x_ascii"', '"\\u0078_ascii"'),
                       b"".join(esc.values()))
    with open(f"{ST_DIR}/good/escaped/model.safetensors", "wb") as fh:
        fh.write(blob)
    expect = {"format": "spill-safetensors-expected", "version": 1, "models": {}}
    for d, files in (("single", ["model.safetensors"]), ("sharded", names), ("dtypes", ["model.safetensors"]),
                     ("escaped", ["model.safetensors"])):
        expect["models"][d] = describe_st([f"{ST_DIR}/good/{d}/{f}" for f in files])
    with open(f"{ST_DIR}/expected.json", "w") as fh:
        json.dump(expect, fh, indent=1, sort_keys=True)

    st_single = open(f"{ST_DIR}/good/single/model.safetensors", "rb").read()
    n_single = struct.unpack_from("<Q", st_single)[0]
    spath = f"{ST_DIR}/good/single/model.safetensors"
    with open(f"{ST_DIR}/truncations.tsv", "w") as fh:
        for cut in range(len(st_single)):
            if cut < 8:
                m = (f"{spath}: byte 0: the file is {cut} bytes, shorter than the 8-byte header length; the file is "
                     f"truncated or not a safetensors file.")
            elif 8 + n_single > cut:
                m = (f"{spath}: byte 0: header length {n_single} does not fit in the {cut}-byte file; the file is "
                     f"truncated or corrupt.")
            else:
                m = (f"{spath}: byte {8 + n_single}: the tensors cover {len(st_single) - 8 - n_single} bytes but the "
                     f"data buffer holds {cut - 8 - n_single}; the file is truncated.")
            fh.write(f"{cut}\t{m}\n")

    # --- safetensors malformed corpus
    def bad_st(fname, blob, off, text):
        path = f"{BAD}/{fname}"
        with open(path, "wb") as fh:
            fh.write(blob)
        golden.append((fname, f"{path}: byte {off}: {text}"))

    def t(dtype="F32", shape=(1,), offs=(0, 4)):
        return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offs)}

    corrupt = "the file is corrupt."
    bad_st("st_empty.safetensors", b"", 0, "the file is 0 bytes, shorter than the 8-byte header length; the file is "
                                           "truncated or not a safetensors file.")
    bad_st("st_short.safetensors", b"\x10\0\0\0\0\0\0", 0, "the file is 7 bytes, shorter than the 8-byte header "
                                                           "length; the file is truncated or not a safetensors file.")
    # header 100 MB + 1 (claimed, not actual): refused before any allocation
    bad_st("st_cve_header_100mb_plus1.safetensors", struct.pack("<Q", 100_000_001) + b"{}", 0,
           "header length 100000001 exceeds the 100000000-byte limit; the file is corrupt or not a safetensors file.")
    bad_st("st_header_len_max.safetensors", struct.pack("<Q", 2**64 - 1) + b"{}", 0,
           "header length 18446744073709551615 exceeds the 100000000-byte limit; the file is corrupt or not a "
           "safetensors file.")
    bad_st("st_header_past_eof.safetensors", struct.pack("<Q", 1000) + b"{}" + b" " * 6, 0,
           "header length 1000 does not fit in the 16-byte file; the file is truncated or corrupt.")
    bad_st("st_is_gguf.safetensors", bytes(base.b), 0, f"header length {struct.unpack_from('<Q', base.b)[0]} exceeds "
                                                       f"the 100000000-byte limit; the file is corrupt or not a "
                                                       f"safetensors file.")
    blob, _ = st_image(b'[{"a":1}]')
    bad_st("st_not_brace.safetensors", blob, 8, "the header does not start with '{'; this is not a safetensors file.")
    blob, _ = st_image(b' {"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}')
    bad_st("st_leading_space.safetensors", blob, 8, "the header does not start with '{'; this is not a safetensors "
                                                    "file.")
    bad_st("st_header_empty.safetensors", struct.pack("<Q", 0), 8, "the header does not start with '{'; this is not a "
                                                                   "safetensors file.")
    blob, _ = st_image(b'{"\xff":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}')
    bad_st("st_utf8_invalid.safetensors", blob, 8, "the header is not valid UTF-8; the file is corrupt.")
    blob, _ = st_image(b'{"\xed\xa0\x80":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}')
    bad_st("st_utf8_surrogate.safetensors", blob, 8, "the header is not valid UTF-8; the file is corrupt.")
    blob, _ = st_image(b'{"\xc0\xaf":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}')
    bad_st("st_utf8_overlong.safetensors", blob, 8, "the header is not valid UTF-8; the file is corrupt.")
    # JSON syntax: jansson 2.14's wording; position = bytes consumed when the error was found
    hdr = b'{"a":{"dtype":"F32"'
    blob, _ = st_image(hdr, pad_to8=False)
    bad_st("st_json_truncated.safetensors", blob, 8 + len(hdr), "the header is not valid JSON (expected ',' or '}' "
                                                                "after a tensor field but the header ends); the file "
                                                                "is corrupt.")
    hdr = b'{"a":' + json.dumps(t("U8", [0], [0, 0])).encode() + b',"a":' + json.dumps(t("U8", [0], [0, 0])).encode() \
        + b'}'
    blob, _ = st_image(hdr, pad_to8=False)
    bad_st("st_duplicate_key.safetensors", blob, 8 + hdr.rindex(b'"a"'),
           'tensor "a" appears twice in the header; the file is corrupt.')
    hdr = b'{"a\\u0000b":' + json.dumps(t("U8", [0], [0, 0])).encode() + b'}'
    blob, _ = st_image(hdr, pad_to8=False)
    bad_st("st_key_nul.safetensors", blob, 8 + hdr.index(b"\\u0000"),
           "the header is not valid JSON (\\u0000 escape in a string); the file is corrupt.")
    hdr = json.dumps({"a": t("U8", [0], [0, 0])}).encode() + b"\0\0\0"
    blob, _ = st_image(hdr, pad_to8=False)
    bad_st("st_nul_padding.safetensors", blob, 8 + len(hdr) - 3, "the header is not valid JSON (expected only spaces "
                                                                 "after the closing '}' but found byte 0x00); the file "
                                                                 "is corrupt.")
    hdr = b'{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,18446744073709551616]}}'
    blob, _ = st_image(hdr, pad_to8=False)
    bad_st("st_offset_too_big_int.safetensors", blob, st_key_off(hdr, "a"),
           'tensor "a": "data_offsets" is not [BEGIN, END] with non-negative integers; the file is corrupt.')

    def st_case(fname, header, data, expect, n=None):
        blob, hdr = st_image(header, data, n=n)
        off, text = expect(hdr, len(hdr))
        bad_st(fname, blob, off, text)

    st_case("st_metadata_not_object.safetensors", {"__metadata__": ["x"], "a": t("U8", [1], [0, 1])}, b"\1",
            lambda h, n: (st_key_off(h, "__metadata__"), f'"__metadata__" is not an object of strings; {corrupt}'))
    st_case("st_metadata_value_int.safetensors", {"__metadata__": {"k": 5}, "a": t("U8", [1], [0, 1])}, b"\1",
            lambda h, n: (st_key_off(h, "__metadata__"), f'"__metadata__" value of "k" is not a string; {corrupt}'))
    st_case("st_tensor_not_object.safetensors", {"a": [1, 2]}, b"",
            lambda h, n: (st_key_off(h, "a"), f'tensor "a" is not an object; {corrupt}'))
    st_case("st_unknown_field.safetensors", {"a": dict(t("U8", [1], [0, 1]), strides=[1])}, b"\1",
            lambda h, n: (st_key_off(h, "a"), f'tensor "a" has unknown field "strides"; {corrupt}'))
    st_case("st_dtype_missing.safetensors", {"a": {"shape": [1], "data_offsets": [0, 1]}}, b"\1",
            lambda h, n: (st_key_off(h, "a"), f'tensor "a": "dtype" is missing or not a string; {corrupt}'))
    st_case("st_dtype_unknown.safetensors", {"a": t("F17", [1], [0, 1])}, b"\1",
            lambda h, n: (st_key_off(h, "a"), f'tensor "a": dtype "F17" is unknown; the file is corrupt or needs a '
                                              f'newer spill.'))
    st_case("st_dtype_int.safetensors", {"a": t(5, [1], [0, 1])}, b"\1",
            lambda h, n: (st_key_off(h, "a"), f'tensor "a": "dtype" is missing or not a string; {corrupt}'))
    st_case("st_shape_missing.safetensors", {"a": {"dtype": "U8", "data_offsets": [0, 1]}}, b"\1",
            lambda h, n: (st_key_off(h, "a"), f'tensor "a": "shape" is missing; {corrupt}'))
    st_case("st_shape_9_dims.safetensors", {"a": t("U8", [1] * 9, [0, 1])}, b"\1",
            lambda h, n: (st_key_off(h, "a"), f'tensor "a": shape has more than 8 dimensions; {corrupt}'))
    st_case("st_shape_negative.safetensors", {"a": t("U8", [1, -1], [0, 1])}, b"\1",
            lambda h, n: (st_key_off(h, "a"), f'tensor "a": "shape" is not an array of non-negative integers; {corrupt}'))
    st_case("st_shape_float.safetensors", {"a": t("U8", [1.0], [0, 1])}, b"\1",
            lambda h, n: (st_key_off(h, "a"), f'tensor "a": "shape" is not an array of non-negative integers; {corrupt}'))
    offs_msg = f'"data_offsets" is not [BEGIN, END] with non-negative integers; {corrupt}'
    st_case("st_offsets_missing.safetensors", {"a": {"dtype": "U8", "shape": [1]}}, b"\1",
            lambda h, n: (st_key_off(h, "a"), f'tensor "a": "data_offsets" is missing; {corrupt}'))
    st_case("st_offsets_three.safetensors", {"a": t("U8", [1], [0, 1, 2])}, b"\1",
            lambda h, n: (st_key_off(h, "a"), f'tensor "a": {offs_msg}'))
    st_case("st_offsets_negative.safetensors", {"a": t("U8", [1], [-1, 0])}, b"\1",
            lambda h, n: (st_key_off(h, "a"), f'tensor "a": {offs_msg}'))
    st_case("st_offsets_reversed.safetensors", {"a": t("U8", [1], [1, 0])}, b"\1",
            lambda h, n: (st_key_off(h, "a"), f'tensor "a": data_offsets [1, 0] end before they begin; {corrupt}'))
    st_case("st_cve_shape_overflow.safetensors", {"a": t("F32", [2**32, 2**32, 2**8], [0, 4])}, b"\1" * 4,
            lambda h, n: (st_key_off(h, "a"), f'tensor "a": the F32 byte size of its shape overflows 64 bits; '
                                              f'{corrupt}'))
    st_case("st_f4_odd.safetensors", {"a": t("F4", [3], [0, 2])}, b"\1\2",
            lambda h, n: (st_key_off(h, "a"), f'tensor "a": its F4 elements do not fill a whole number of bytes; '
                                              f'{corrupt}'))
    st_case("st_size_mismatch.safetensors", {"a": t("F32", [2], [0, 4])}, b"\1" * 4,
            lambda h, n: (st_key_off(h, "a"), f'tensor "a": data_offsets [0, 4] hold 4 bytes but its F32 shape needs '
                                              f'8; {corrupt}'))
    # mlx PR #3364 class: offsets far past the buffer with a consistent size
    st_case("st_offsets_past_eof.safetensors", {"a": t("U8", [4], [2**40, 2**40 + 4])}, b"\1" * 4,
            lambda h, n: (st_key_off(h, "a"), f'tensor "a": data begins at buffer offset {2**40}, which leaves a gap '
                                              f'at the start of the data buffer; {corrupt}'))
    st_case("st_gap_at_start.safetensors", {"a": t("U8", [4], [4, 8])}, b"\1" * 8,
            lambda h, n: (st_key_off(h, "a"), f'tensor "a": data begins at buffer offset 4, which leaves a gap at the '
                                              f'start of the data buffer; {corrupt}'))
    st_case("st_gap_between.safetensors", {"a": t("U8", [4], [0, 4]), "b": t("U8", [4], [8, 12])}, b"\1" * 12,
            lambda h, n: (st_key_off(h, "b"), f'tensor "b": data begins at buffer offset 8 but the previous tensor '
                                              f'"a" ends at 4, leaving a gap; {corrupt}'))
    st_case("st_overlap.safetensors", {"a": t("U8", [4], [0, 4]), "b": t("U8", [4], [2, 6])}, b"\1" * 6,
            lambda h, n: (st_key_off(h, "b"), f'tensor "b": data begins at buffer offset 2 but the previous tensor '
                                              f'"a" ends at 4, so they overlap; {corrupt}'))
    st_case("st_same_range.safetensors", {"a": t("U8", [4], [0, 4]), "b": t("U8", [4], [0, 4])}, b"\1" * 4,
            lambda h, n: (st_key_off(h, "b"), f'tensor "b": data begins at buffer offset 0 but the previous tensor '
                                              f'"a" ends at 4, so they overlap; {corrupt}'))
    st_case("st_truncated_data.safetensors", {"a": t("U8", [8], [0, 8])}, b"\1" * 5,
            lambda h, n: (8 + n, "the tensors cover 8 bytes but the data buffer holds 5; the file is truncated."))
    # polyglot: a valid safetensors file with a ZIP appended after the last tensor
    st_case("st_polyglot_trailing_zip.safetensors", {"a": t("U8", [4], [0, 4])}, b"\1" * 4 + b"PK\x05\x06" + bytes(18),
            lambda h, n: (8 + n, "the tensors cover 4 bytes but the data buffer holds 26; the file is corrupt "
                                 "(trailing bytes after the last tensor)."))
    st_case("st_no_tensors_trailing.safetensors", {"__metadata__": {"a": "b"}}, b"x",
            lambda h, n: (8 + n, "the tensors cover 0 bytes but the data buffer holds 1; the file is corrupt "
                                 "(trailing bytes after the last tensor)."))

    long_name = "model.layers.0." + "x" * 60
    st_case("st_name_long.safetensors", {long_name: t("F17", [1], [0, 1])}, b"\1",
            lambda h, n: (st_key_off(h, long_name), f'tensor "{long_name[:60]}...": dtype "F17" is unknown; the file '
                                                    f'is corrupt or needs a newer spill.'))
    # a control character in a name: quoted as \xNN in the message
    st_case("st_name_control.safetensors", {"a\nb": t("F17", [1], [0, 1])}, b"\1",
            lambda h, n: (8 + h.index(b'"a\\nb"'), 'tensor "a\\x0ab": dtype "F17" is unknown; the file is corrupt or needs a newer spill.'))

    # JSON syntax, as the header parser words it: the byte is the offending character
    def st_syntax(fname, hdr, at, text):
        blob, _ = st_image(hdr)
        bad_st(fname, blob, 8 + at, f"the header is not valid JSON ({text}); the file is corrupt.")

    ok_t = b'{"dtype":"U8","shape":[0],"data_offsets":[0,0]}'
    st_syntax("st_json_unterminated_string.safetensors", b'{"abc', 1, "a string is never closed")
    st_syntax("st_json_bad_escape.safetensors", b'{"a\\qb":' + ok_t + b'}', 3, "invalid escape in a string")
    st_syntax("st_json_short_u_escape.safetensors", b'{"a\\u12":' + ok_t + b'}', 3, "invalid escape in a string")
    st_syntax("st_json_lone_high_surrogate.safetensors", b'{"a\\ud800b":' + ok_t + b'}', 3,
              "unpaired UTF-16 surrogate escape in a string")
    st_syntax("st_json_lone_low_surrogate.safetensors", b'{"a\\udc00":' + ok_t + b'}', 3,
              "unpaired UTF-16 surrogate escape in a string")
    st_syntax("st_json_control_in_string.safetensors", b'{"a\x01b":' + ok_t + b'}', 3,
              "raw control byte 0x01 inside a string")
    st_syntax("st_json_trailing_comma.safetensors", b'{"a":' + ok_t + b',}', 6 + len(ok_t),
              "expected a string key but found '}'")
    st_syntax("st_json_missing_colon.safetensors", b'{"a" ' + ok_t + b'}', 5, "expected ':' after a key but found '{'")
    st_syntax("st_json_number_key.safetensors", b'{5:' + ok_t + b'}', 1, "expected a string key but found '5'")
    st_syntax("st_json_missing_comma.safetensors", b'{"a":' + ok_t + b' "b":' + ok_t + b'}', 6 + len(ok_t),
              "expected ',' or '}' after an entry but found '\"'")
    st_syntax("st_json_trailing_garbage.safetensors", b'{"a":' + ok_t + b'} x', 7 + len(ok_t),
              "expected only spaces after the closing '}' but found 'x'")
    st_syntax("st_json_bad_hex_escape.safetensors", b'{"a\\u12G4":' + ok_t + b'}', 3, "invalid escape in a string")
    st_syntax("st_json_metadata_missing_comma.safetensors", b'{"__metadata__":{"a":"b" "c":"d"}}', 25,
              "expected ',' or '}' in \"__metadata__\" but found '\"'")
    st_syntax("st_json_metadata_number_key.safetensors", b'{"__metadata__":{5:"d"}}', 17,
              "expected a string key in \"__metadata__\" but found '5'")
    st_syntax("st_json_metadata_missing_colon.safetensors", b'{"__metadata__":{"a" "b"}}', 21,
              "expected ':' after a key but found '\"'")
    st_syntax("st_json_field_missing_colon.safetensors", b'{"a":{"dtype" "U8"}}', 14,
              "expected ':' after a field name but found '\"'")
    st_syntax("st_json_fields_missing_comma.safetensors", b'{"a":{"dtype":"U8" "shape":[0]}}', 19,
              "expected ',' or '}' after a tensor field but found '\"'")
    st_syntax("st_json_field_not_string.safetensors", b'{"a":{dtype:"U8"}}', 6, "expected a field name but found 'd'")
    st_case("st_field_twice.safetensors", b'{"a":{"dtype":"U8","dtype":"U8","shape":[0],"data_offsets":[0,0]}}', b"",
            lambda h, n: (st_key_off(h, "a"), f'tensor "a" has field "dtype" twice; {corrupt}'))
    st_case("st_metadata_dup_key.safetensors", b'{"__metadata__":{"k":"v","k":"w"}}', b"",
            lambda h, n: (st_key_off(h, "__metadata__"), f'"__metadata__" has key "k" twice; {corrupt}'))
    st_case("st_metadata_twice.safetensors", b'{"__metadata__":{},"__metadata__":{}}', b"",
            lambda h, n: (8 + h.rindex(b'"__metadata__"'), f'"__metadata__" appears twice in the header; {corrupt}'))
    st_case("st_shape_leading_zero.safetensors", b'{"a":{"dtype":"U8","shape":[01],"data_offsets":[0,1]}}', b"\1",
            lambda h, n: (st_key_off(h, "a"), f'tensor "a": "shape" is not an array of non-negative integers; '
                                              f'{corrupt}'))
    st_case("st_shape_exponent.safetensors", b'{"a":{"dtype":"U8","shape":[1e0],"data_offsets":[0,1]}}', b"\1",
            lambda h, n: (st_key_off(h, "a"), f'tensor "a": "shape" is not an array of non-negative integers; '
                                              f'{corrupt}'))

    # --- sharded models (directories)
    def shard_dir(dname, shards, index, expect):
        d = f"{BAD}/{dname}"
        os.makedirs(d)
        for fname, tensors in shards.items():
            save_file(tensors, f"{d}/{fname}")
        if index is not None:
            with open(f"{d}/model.safetensors.index.json", "w") as fh:
                fh.write(index if isinstance(index, str) else json.dumps(index))
        golden.append((dname, expect(d, f"{d}/model.safetensors.index.json")))

    x = np.zeros(2, dtype=np.float32)
    sA, sB = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    shard_dir("st_shard_dotdot", {sA: {"a": x}}, {"weight_map": {"a": "../" + sA}},
              lambda d, i: f"{i}: weight_map entry \"a\" must name a plain file in the model directory (no '/', '\\' "
                           f"or \"..\"); the index is corrupt or malicious.")
    shard_dir("st_shard_subdir", {sA: {"a": x}}, {"weight_map": {"a": "sub/" + sA}},
              lambda d, i: f"{i}: weight_map entry \"a\" must name a plain file in the model directory (no '/', '\\' "
                           f"or \"..\"); the index is corrupt or malicious.")
    shard_dir("st_shard_dotdot_bare", {sA: {"a": x}}, {"weight_map": {"a": ".."}},
              lambda d, i: f"{i}: weight_map entry \"a\" must name a plain file in the model directory (no '/', '\\' "
                           f"or \"..\"); the index is corrupt or malicious.")
    shard_dir("st_shard_missing_file", {sA: {"a": x}}, {"weight_map": {"a": sA, "b": sB}},
              lambda d, i: f"{d}/{sB}: cannot open: No such file or directory.")
    shard_dir("st_shard_not_held", {sA: {"a": x}, sB: {"b": x}}, {"weight_map": {"a": sB, "b": sB}},
              lambda d, i: f'{i}: tensor "a" is mapped to {sB} but that shard does not hold it; the index and the '
                           f'shards disagree.')
    shard_dir("st_shard_unindexed", {sA: {"a": x, "c": x}, sB: {"b": x}}, {"weight_map": {"a": sA, "b": sB}},
              lambda d, i: f'{i}: tensor "c" in {d}/{sA} is missing from weight_map; the index and the shards '
                           f'disagree.')
    shard_dir("st_shard_duplicate", {sA: {"a": x}, sB: {"a": x, "b": x}}, {"weight_map": {"a": sA, "b": sB}},
              lambda d, i: f'{d}: tensor "a" appears in both {d}/{sA} and {d}/{sB}; the shards are inconsistent.')
    shard_dir("st_shard_no_weight_map", {sA: {"a": x}}, {"metadata": {}},
              lambda d, i: f'{i}: "weight_map" is missing or not an object; the index is corrupt.')
    dup_index = '{"weight_map": {"a": "%s", "a": "%s"}}' % (sA, sA)
    dup_col = dup_index.rindex('"a"') + 3  # jansson: column just past the repeated key
    shard_dir("st_shard_index_dup_key", {sA: {"a": x}}, dup_index,
              lambda d, i: f"{i}: line 1 column {dup_col}: "
                           f"not valid JSON (duplicate object key near '\"a\"'); the index is corrupt.")
    shard_dir("st_shard_bad_shard", {}, {"weight_map": {"a": sA}},
              lambda d, i: f"{d}/{sA}: byte 0: the file is 3 bytes, shorter than the 8-byte header length; the file "
                           f"is truncated or not a safetensors file.")
    with open(f"{BAD}/st_shard_bad_shard/{sA}", "wb") as fh:
        fh.write(b"abc")
    shard_dir("st_single_bad", {}, None, lambda d, i: f"{d}/model.safetensors: byte 0: header length 1000 does not "
                                                      f"fit in the 16-byte file; the file is truncated or corrupt.")
    shutil.copy(f"{BAD}/st_header_past_eof.safetensors", f"{BAD}/st_single_bad/model.safetensors")
    shard_dir("st_no_model", {"other.safetensors": {"a": x}}, None,
              lambda d, i: f"{d}: holds neither model.safetensors nor model.safetensors.index.json; pass the "
                           f"directory of a safetensors model.")

    moe_models(golden)
    arch_models(golden)

    with open(f"{BAD}/expected.tsv", "w") as fh:
        for fname, msg in golden:
            assert "\n" not in msg and "\t" not in msg
            fh.write(f"{fname}\t{msg}\n")

    # --- fuzz seeds
    for src in (f"{GG_DIR}/good_min.gguf", f"{GG_DIR}/good_writer.gguf", f"{BAD}/gguf_cve_str_arr_elem_len.gguf",
                f"{BAD}/gguf_bool_arr_7.gguf", f"{BAD}/gguf_offset_gap.gguf", f"{BAD}/gguf_cve_dim_product.gguf"):
        shutil.copy(src, "fuzz/seeds/fuzz_gguf/")
    for src in (f"{ST_DIR}/good/single/model.safetensors", f"{ST_DIR}/good/dtypes/model.safetensors",
                f"{ST_DIR}/good/sharded/{names[0]}", f"{BAD}/st_overlap.safetensors",
                f"{BAD}/st_metadata_value_int.safetensors", f"{BAD}/st_f4_odd.safetensors"):
        dst = src.replace("/", "_").replace("tests_data_", "")
        shutil.copy(src, f"fuzz/seeds/fuzz_safetensors/{dst}")
    n_bad = len(golden)
    n_g = sum(1 for f, _ in golden if f.startswith("gguf_"))
    print(f"wrote {n_bad} malformed cases ({n_g} GGUF, {n_bad - n_g} safetensors), {len(base.b)} GGUF and "
          f"{len(st_single)} safetensors truncation cuts, {len(models)} GGUF expectations")


if __name__ == "__main__":
    main()
