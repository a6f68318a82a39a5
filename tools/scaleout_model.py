#!/usr/bin/env python3
"""scaleout_model.py — spill on N hosts x G GPUs, on paper: a model, not a measurement.

For a 405B dense model (Llama-3.1-405B shapes) and a DeepSeek-V3-sized MoE (671B total, 37B active, 61 layers,
256 routed experts + 1 shared, 8 per token; MLA's latent KV cache), with bf16 / fp8 / q4 weights, it prices:
host RAM needed (one pinned copy of the streamed weights per host, shared by its GPUs), the link, disk and host
memory rates a pass needs, rows per pass (the KV cache that the HBM left over holds), tokens/s per GPU, per host
and in total, the time of a whole job, and which limit binds where adding GPUs or hosts stops helping.

The pass model is the one docs/performance.md states and the H200 runs confirmed:
    pass  = max(streamed bytes / PCIe link, bytes from disk / disk, G x streamed bytes / host memory bandwidth,
                FLOPs of the batch / GEMM rate)
    tok/s = rows per pass / pass            (decode at the full batch: every row emits one token a pass)
Each GPU streams the whole pass itself and takes its share of rows (data parallel: hosts and GPUs exchange only
rows, kilobytes, over MPI), or, when the weights fit one host's HBM, the host splits the layers across its GPUs
and keeps them resident (pipeline of G stages with G micro-batches); the better of the two is taken per host.

Inputs are marked with their source: "measured" (shared/docs/performance.md and the README's H200 runs) or
"assumed" (no measurement here; every one is a command-line parameter).  The script checks itself first against
the one 80-layer 70B run it can reproduce (1,536 rows of 256 tokens a pass, 2.48 s, 619 tok/s measured).

    tools/scaleout_model.py                          the tables, as text
    tools/scaleout_model.py --markdown               the README section
    tools/scaleout_model.py --update-readme README.md  rewrites the section between its two markers
No dependencies beyond the Python standard library.
"""
import argparse
import math
import sys

GB = 1e9

# ---------------------------------------------------------------- model shapes


def llama405b():
    L, d, H, K, S, F, V = 126, 16384, 128, 8, 128, 53248, 128256
    attn = d * H * S + 2 * d * K * S + H * S * d
    ffn = 3 * d * F
    layer = attn + ffn + 2 * d
    total = L * layer + 2 * V * d + d
    return dict(name="405B dense (Llama-3.1-405B shape)", layers=L, params=total, active=total - V * d,
                layer_params=layer,
                kv_elems_per_token=L * 2 * K * S,  # K and V, every layer
                moe=False)


def deepseek_v3():
    L, d, V = 61, 7168, 129280
    dense_layers, moe_layers = 3, 58
    q_lora, kv_lora, rope, nope, vdim, H = 1536, 512, 64, 128, 128, 128
    attn = d * q_lora + q_lora * H * (nope + rope) + d * (kv_lora + rope) + kv_lora * H * (nope + vdim) + H * vdim * d
    expert = 3 * d * 2048
    routed, shared, top = 256, 1, 8
    dense_ffn = 3 * d * 18432
    total = L * attn + dense_layers * dense_ffn + moe_layers * (routed + shared) * expert + moe_layers * d * routed \
        + 2 * V * d
    active = L * attn + dense_layers * dense_ffn + moe_layers * (top + shared) * expert + V * d
    return dict(name="DeepSeek-V3-sized MoE (671B, 37B active)", layers=L, params=total, active=active,
                layer_params=(total - 2 * V * d) / L,
                kv_elems_per_token=L * (kv_lora + rope),  # MLA caches one latent + rope key per token and layer
                moe=True, experts=routed, top=top)


# bytes per weight: bf16; fp8 e4m3 (block scales: 4 bytes per 128x128); q4 as GGUF Q4_0 / spill q4 (18 bytes / 32)
DTYPES = {"bf16": 2.0, "fp8": 1.0 + 4 / 16384, "q4": 18 / 32}
# bytes per KV element: bf16; int8 pages with their scales (measured ratio: 2,944 int8 rows vs 1,536 bf16 rows
# in the same 128-129 GB of HBM on the 80-layer 70B run: 2 / (2944/1536 x 128.9/127.3) = 1.06)
KV_DTYPES = {"bf16": 2.0, "int8": 1.06}

# Machines: host RAM by GPUs per host, as the lent H200 machines have it (measured: shared/docs, device notes).
HOST_RAM_GIB = {1: 128, 2: 256, 4: 512, 8: 560}


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a = p.add_argument
    a("--link-gbs", type=float, default=55.0, help="pinned host->GPU per GPU, GB/s (measured: 55.4)")
    a("--disk-gbs", type=float, default=1.7, help="O_DIRECT disk per host, GB/s (measured: 1.3-1.8, 1.92 in B2)")
    a("--hbm-gib", type=float, default=135.0, help="HBM a job can use per GPU, GiB (measured peak: 135.0)")
    a("--workspace-gb", type=float, default=10.0,
      help="HBM besides KV and the stream ring (pass buffers, logits), GB (derived from the 80-layer run: 135 GiB "
           "peak - 128.9 GB KV - 3 slots x 1.76 GB)")
    a("--stream-slots", type=int, default=3, help="layers in flight in HBM when streaming (spill's default)")
    a("--dense-tflops", type=float, default=700.0,
      help="GEMM rate, dense layers, TFLOP/s (measured: 788 at 8192^3, ~700 in the B5 prompt passes)")
    a("--moe-tflops", type=float, default=86.0,
      help="expert GEMM rate, TFLOP/s (derived from the Mixtral-8x7B-shape q8 run: 4,096 rows in 1.226 s; "
           "DeepSeek's 256 small experts likely do worse)")
    a("--hbm-tbs", type=float, default=4.8, help="HBM bandwidth per GPU, TB/s (assumed: H200 data sheet)")
    a("--host-mem-gbs", type=float, default=400.0,
      help="host DRAM bandwidth the GPUs' copies share, GB/s (assumed: a 2-socket DDR5 server)")
    a("--net-gbs", type=float, default=25.0, help="network per host, GB/s (assumed: 200 Gb/s)")
    a("--shared-fs-gbs", type=float, default=20.0,
      help="aggregate read rate of the shared file system all hosts load the weights from, GB/s (assumed)")
    a("--host-reserve-gb", type=float, default=32.0,
      help="host RAM for the OS, the rows and each GPU's buffers besides the pinned weights, GB (assumed)")
    a("--kv-dtype", choices=KV_DTYPES, default="int8", help="KV pages (bf16 or int8)")
    a("--prompt", type=int, default=128, help="prompt tokens per row")
    a("--gen", type=int, default=128, help="new tokens per row")
    a("--rows", type=int, default=100000, help="rows of the job (for the job time)")
    a("--markdown", action="store_true", help="print the README section")
    a("--update-readme", metavar="README", help="rewrite the section between the markers in README")
    return p.parse_args()


# ---------------------------------------------------------------- one host

def host_plans(m, wdtype, G, o):
    """The plans for one host of G GPUs ("stream", and "split" where the weights fit the host's HBM), each a
    dict with pass_at(b) (the pass, in seconds, with b rows on every GPU: its binding limit too), its rows per GPU
    at the full batch and tok/s per GPU there; the best first."""
    wb = DTYPES[wdtype]
    W = m["params"] * wb                          # bytes of the whole model
    layer = m["layer_params"] * wb
    kv_row = (o.prompt + o.gen) * m["kv_elems_per_token"] * KV_DTYPES[o.kv_dtype]
    hbm = o.hbm_gib * 2**30
    ram = HOST_RAM_GIB.get(G, 128 * G) * 2**30
    flops_tok = 2 * m["active"]
    rate = (o.moe_tflops if m["moe"] else o.dense_tflops) * 1e12
    plans = []

    # each GPU streams every layer; one pinned copy per host serves them all
    rows = max(0, int((hbm - o.stream_slots * layer - o.workspace_gb * GB) // kv_row))
    in_ram = min(W, max(0.0, ram - o.host_reserve_gb * GB))
    from_disk = W - in_ram

    def stream_at(b):
        link = W / (o.link_gbs * GB)
        if m["moe"]:  # experts no token of the pass picked are not read (~2% of the weights are not experts')
            link *= 0.02 + 0.98 * (1 - (1 - m["top"] / m["experts"]) ** b)
        terms = {"PCIe link": link, "disk (weights over host RAM)": from_disk / (o.disk_gbs * GB),
                 "host memory bandwidth": G * in_ram / (o.host_mem_gbs * GB), "GEMMs": b * flops_tok / rate}
        k = max(terms, key=terms.get)
        return terms[k], k
    plans.append(dict(mode="stream", pass_at=stream_at, rows=rows, ram_need=W + o.host_reserve_gb * GB, ram=ram,
                      from_disk=from_disk, W=W, G=G))

    # split: the layers resident across the host's G GPUs, G micro-batches in flight (no bubble counted)
    kv_total = G * (hbm - o.workspace_gb * GB) - W
    if G > 1 and kv_total > kv_row * G:
        def split_at(b):  # each stage reads its weights once a micro-batch; the batch's GEMMs split G ways
            terms = {"HBM": W / (o.hbm_tbs * 1e12), "GEMMs": G * b * flops_tok / (G * rate)}
            k = max(terms, key=terms.get)
            return sum(terms.values()), k
        plans.append(dict(mode="split", pass_at=split_at, rows=int(kv_total // kv_row) / G,
                          ram_need=o.host_reserve_gb * GB, ram=ram, from_disk=0, W=W, G=G))
    for p in plans:
        p["pass_s"], p["bind"] = p["pass_at"](p["rows"])
        p["tok_gpu"] = p["rows"] / p["pass_s"] if p["rows"] else 0
    return sorted(plans, key=lambda p: -p["tok_gpu"])


def job(p, N, o):
    """A whole job of o.rows rows on N such hosts: the weights loaded, then waves of rows, each max_tokens passes
    long; when the rows do not fill every GPU's batch, each GPU runs the rows it gets (a shorter pass where the
    GEMMs bound it)."""
    G = p["G"]
    b = min(p["rows"], math.ceil(o.rows / (N * G)))
    waves = math.ceil(o.rows / (N * G * b)) if b else math.inf
    pass_s, bind = p["pass_at"](b)
    load_local = (p["W"] - p["from_disk"]) / (o.disk_gbs * GB)  # every host reads its own copy
    load_shared = (p["W"] - p["from_disk"]) / (min(o.net_gbs, o.shared_fs_gbs / N) * GB)
    load = min(load_local, load_shared)
    run = waves * o.gen * pass_s
    return dict(b=b, waves=waves, pass_s=pass_s, bind=bind, load_local=load_local, load_shared=load_shared,
                run=run, total=load + run, tok_s=o.rows * o.gen / (load + run) if run < math.inf else 0,
                peak=N * G * p["tok_gpu"], short=b < p["rows"])


# ---------------------------------------------------------------- output

def fmt_s(s):
    if s == math.inf:
        return "never"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def check_70b(o):
    """The model against the one run it can reproduce: 70B bf16, 80 layers, pinned RAM, bf16 KV, 128+128."""
    L, d, K, S = 80, 8192, 8, 128
    kv_row = 256 * L * 2 * K * S * 2
    kv = 128.9 * GB  # the run's KV (its HBM left after the ring and buffers)
    rows = int(kv // kv_row)
    pass_s = 136.9 * GB / (o.link_gbs * GB)  # the 80 layers' bytes that run streamed
    return rows, pass_s, rows / pass_s


def tables(o):
    out = []
    rows, pass_s, tps = check_70b(o)
    out.append(f"Check against the H200 (70B bf16, 80 layers from pinned RAM, bf16 KV, 128+128 tokens): model "
               f"{rows:,} rows a pass, {pass_s:.2f} s, {tps:,.0f} tok/s; measured 1,536 rows, 2.48 s, 619 tok/s.")
    out.append("")
    models = [llama405b(), deepseek_v3()]
    out.append(f"#### One host (rows of {o.prompt}+{o.gen} tokens, {o.kv_dtype} KV pages; decode at the full batch)")
    out.append("")
    out.append("| model | weights | GPUs | host RAM needed / has | plan | pass | binding | rows per GPU | tok/s per GPU "
               "(the other plan) | tok/s per host |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    best = {}
    for m in models:
        for wd in ("bf16", "fp8", "q4"):
            for G in (1, 2, 4, 8):
                plans = host_plans(m, wd, G, o)
                p = plans[0]
                best[(m["name"], wd, G)] = plans
                need = f"{p['ram_need'] / GB:,.0f} / {p['ram'] / GB:,.0f} GB"
                if p["from_disk"] > 0:
                    need += f" ({p['from_disk'] / GB:,.0f} GB from disk a pass)"
                alt = "".join(f" ({q['mode']}: {q['tok_gpu']:,.0f}, {q['bind']})" for q in plans[1:])
                out.append(f"| {m['name']} | {wd} ({p['W'] / GB:,.0f} GB) | {G} | {need} | {p['mode']} | "
                           f"{fmt_s(p['pass_s'])} | {p['bind']} | {p['rows']:,.0f} | {p['tok_gpu']:,.0f}{alt} | "
                           f"{p['tok_gpu'] * G:,.0f} |")
    out.append("")
    out.append(f"#### N hosts x G GPUs, a job of {o.rows:,} rows ({o.prompt}+{o.gen} tokens)")
    out.append("")
    out.append("| model | weights, plan | hosts x GPUs | GPUs | tok/s at the full batch | load: local disk / shared FS | rows a "
               "GPU runs | job time | tok/s over the job | what bounds it |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for m in models:
        for wd, G in (("fp8", 8), ("q4", 8), ("q4", 2)):
            plans = best[(m["name"], wd, G)]
            for N in (1, 4, 16, 64):
                # the plan that finishes this job first (with few rows a GPU, another plan may win)
                j, p = min(((job(q, N, o), q) for q in plans), key=lambda jq: jq[0]["total"])
                if j["short"]:
                    why = (f"rows run out ({o.rows:,} rows < {N * G * p['rows']:,.0f} a pass could hold): one wave "
                           f"of {o.gen} passes of {fmt_s(j['pass_s'])} ({j['bind']})")
                else:
                    why = f"{j['waves']} waves of {o.gen} passes; each GPU bound by {j['bind']}"
                if min(j["load_shared"], j["load_local"]) > j["run"]:
                    why += "; loading the weights outlasts the passes"
                if p["from_disk"] > 0:
                    why += f"; host RAM: {p['from_disk'] / GB:,.0f} GB of every pass from disk"
                out.append(f"| {m['name']} | {wd}, {p['mode']} | {N} x {G} | {G * N} | {j['peak']:,.0f} | "
                           f"{fmt_s(j['load_local'])} / {fmt_s(j['load_shared'])} | {j['b']:,.0f} | "
                           f"{fmt_s(j['total'])} | {j['tok_s']:,.0f} | {why} |")
    return out


SECTION_HEAD = "### Beyond one host: the scale-out model (on paper)"
BEGIN, END = "<!-- scaleout_model.py: begin -->", "<!-- scaleout_model.py: end -->"


def markdown(o):
    lines = [BEGIN, SECTION_HEAD, "",
             "**A model, not a measurement**: `tools/scaleout_model.py` prices N hosts x G H200s from the rates "
             "measured on one H200 (pinned link 55 GB/s, disk 1.7 GB/s, GEMMs ~700 TFLOP/s, expert GEMMs 86 TFLOP/s "
             "as the Mixtral run gave them, 135 GiB of HBM) and from assumed ones that no machine here could "
             f"measure (host memory {o.host_mem_gbs:.0f} GB/s, network {o.net_gbs:.0f} GB/s per host, shared FS "
             f"{o.shared_fs_gbs:.0f} GB/s in all, HBM {o.hbm_tbs} TB/s); each is a parameter.  pass = the largest of "
             "bytes / link, bytes from disk / disk, G x bytes / host memory, batch FLOPs / GEMM rate; tok/s = rows "
             "per pass / pass, rows per pass = the KV that the HBM left holds.  Each GPU streams the whole pass "
             "from one pinned copy per host (or, where the weights fit a host's HBM, its GPUs split the layers and "
             "keep them resident: \"split\"); hosts share rows over MPI (kilobytes), never weights.  The "
             "DeepSeek-V3 rows assume MLA's latent KV (576 values a token and layer), which spill does not run "
             "yet (MLA families get a sentence); its expert GEMM rate is the least certain input.", ""]
    lines += tables(o)
    lines += ["", "Read: a host must hold one copy of the streamed weights in RAM, or every pass reads the rest from "
              "disk at 1.7 GB/s and takes minutes — the first wall (bf16 405B, 812 GB, fits no host here, and a DeepSeek-V3 "
              "size fits only as q4 on the 512-560 GiB hosts). Once the copy fits, the link (55 GB/s a GPU) bounds a streamed "
              "pass and several GPUs multiply it until they together outrun the host's memory (8 x 55 GB/s > the "
              "assumed 400 GB/s); where the weights fit the host's HBM (4-8 H200s for a q4/fp8 405B) keeping them "
              "resident beats streaming, and then the GEMM rate binds, so the compute figures are the inputs to "
              "re-measure first. Across hosts, which exchange only rows, throughput grows with hosts until the job's "
              "rows no longer fill every GPU's batch; from there a job is one wave of max_tokens passes (shorter "
              "passes where GEMMs bound them) plus loading the weights, 2-7 minutes from each host's own disk, which "
              "no number of hosts shortens.", END]
    return "\n".join(lines)


def main():
    o = parse()
    if o.update_readme:
        text = open(o.update_readme).read()
        md = markdown(o)
        if BEGIN in text and END in text:
            text = text[:text.index(BEGIN)] + md + text[text.index(END) + len(END):]
        else:
            sys.exit(f"{o.update_readme}: no '{BEGIN}' ... '{END}' markers; add them where the section goes.")
        open(o.update_readme, "w").write(text)
        return
    print(markdown(o) if o.markdown else "\n".join(tables(o)))


if __name__ == "__main__":
    main()
