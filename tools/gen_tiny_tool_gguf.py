#!/usr/bin/env python3
"""Writes a tiny GGUF that teaches a tool-call convention: tests/data/tiny/tiny-smollm2.gguf's weights and
vocabulary with a real template from tests/data/toolcall/fixtures.json and the convention's marker tokens,
so forced tool_choice (tests/test_toolcall.c) runs end to end on a tokenizer where a marker is one token —
special (Mistral's [TOOL_CALLS], a control token) or not (Qwen's <tool_call>, a user-defined added token).

    python3 tools/gen_tiny_tool_gguf.py STYLE OUT.gguf      STYLE: hermes | llama3 | mistral

The markers replace SmolLM2 control tokens that no merge produces (ids 7-15: <gh_stars>, <issue_start>, …),
so the merges and the tensors stay as they are (token_embd keeps its V rows).  Deterministic; the test
writes the files into its own temporary directory.
"""
import json
import sys

import gguf

STYLES = {
    # template fixture, tokens by id: (text, GGUF token type: 3 control / special, 4 user-defined / not special)
    "hermes": ("Qwen-Qwen2.5-Instruct.recreated", {8: ("<tool_call>", 4), 9: ("</tool_call>", 4)}),
    "llama3": ("meta-llama-Llama-3.2-3B-Instruct",
               {10: ("<|start_header_id|>", 3), 11: ("<|end_header_id|>", 3), 12: ("<|eot_id|>", 3),
                13: ("<|python_tag|>", 3), 14: ("<|begin_of_text|>", 3)}),
    "mistral": ("mistralai-Mistral-Nemo-Instruct-2407",
                {7: ("[TOOL_CALLS]", 3), 10: ("[INST]", 3), 11: ("[/INST]", 3), 12: ("[AVAILABLE_TOOLS]", 3),
                 13: ("[/AVAILABLE_TOOLS]", 3), 14: ("[TOOL_RESULTS]", 3), 15: ("[/TOOL_RESULTS]", 3)}),
}

style, out = sys.argv[1], sys.argv[2]
src_path = sys.argv[3] if len(sys.argv) > 3 else "tests/data/tiny/tiny-smollm2.gguf"
tname, repl = STYLES[style]
fx = json.load(open("tests/data/toolcall/fixtures.json"))
template = next(t["template"] for t in fx["templates"] if t["name"] == tname)

src = gguf.GGUFReader(src_path)
w = gguf.GGUFWriter(out, "llama")
for name, field in src.fields.items():
    if name.startswith("GGUF.") or name == "general.architecture":
        continue
    vtype = field.types[0]
    if name == "tokenizer.chat_template":
        w.add_string(name, template)
    elif vtype == gguf.GGUFValueType.ARRAY:
        sub = field.types[1]
        if sub == gguf.GGUFValueType.STRING:
            vals = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
        else:
            vals = [field.parts[i].tolist()[0] for i in field.data]
        if name == "tokenizer.ggml.tokens":
            for i, (text, _) in repl.items():
                vals[i] = text
        if name == "tokenizer.ggml.token_type":
            for i, (_, ty) in repl.items():
                vals[i] = ty
        w.add_array(name, vals)
    elif vtype == gguf.GGUFValueType.STRING:
        w.add_string(name, bytes(field.parts[field.data[0]]).decode("utf-8"))
    else:
        val = field.parts[field.data[0]].tolist()[0]
        {gguf.GGUFValueType.UINT32: w.add_uint32, gguf.GGUFValueType.INT32: w.add_int32,
         gguf.GGUFValueType.BOOL: w.add_bool, gguf.GGUFValueType.FLOAT32: w.add_float32,
         gguf.GGUFValueType.UINT64: w.add_uint64}[vtype](name, val)
for t in src.tensors:
    w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print(out)
