/*
 * peft_fixture.h — a random PEFT adapter for tests/data/tiny/tiny-smollm2.gguf (L=2 D=32 H=4 K=2 S=8 F=64),
 * written by hand: adapter_config.json (r, lora_alpha = 2r, the target modules) and adapter_model.safetensors
 * (F32 lora_A [r, in] and lora_B [out, r] of both layers, values uniform in ±0.75, B non-zero).
 */
#ifndef SPILL_TEST_PEFT_FIXTURE_H
#define SPILL_TEST_PEFT_FIXTURE_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static uint32_t rng = 12345;
static inline float frand(void)
{
    rng = rng * 1103515245u + 12345u;
    return ((float)((rng >> 8) & 0xFFFF) / 65535.0f - 0.5f);
}

/* A PEFT adapter of rank r over the named projections of both layers. */
static inline void write_peft(const char *dir, int r, const char *const *targets, int nt)
{
    mkdir(dir, 0755);
    static const struct {
        const char *name, *path;
        int in, out;
    } proj[] = {{"q_proj", "self_attn.q_proj", 32, 32}, {"k_proj", "self_attn.k_proj", 32, 16},
                {"v_proj", "self_attn.v_proj", 32, 16}, {"o_proj", "self_attn.o_proj", 32, 32},
                {"gate_proj", "mlp.gate_proj", 32, 64}, {"up_proj", "mlp.up_proj", 32, 64},
                {"down_proj", "mlp.down_proj", 64, 32}};
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "{\"peft_type\":\"LORA\",\"task_type\":\"CAUSAL_LM\",\"base_model_name_or_path\":\"tiny-smollm2\","
               "\"r\":%d,\"lora_alpha\":%d,\"lora_dropout\":0.0,\"bias\":\"none\",\"fan_in_fan_out\":false,"
               "\"use_rslora\":false,\"use_dora\":false,\"target_modules\":[",
            r, 2 * r);
    for (int i = 0; i < nt; i++)
        fprintf(f, "%s\"%s\"", i ? "," : "", targets[i]);
    fprintf(f, "]}\n");
    fclose(f);
    /* safetensors: header, then every tensor's F32 data in header order */
    char hdr[16384];
    size_t hl = 0, off = 0;
    hl += (size_t)snprintf(hdr + hl, sizeof hdr - hl, "{");
    int first = 1;
    for (int l = 0; l < 2; l++)
        for (size_t p = 0; p < sizeof proj / sizeof *proj; p++) {
            int hit = 0;
            for (int i = 0; i < nt; i++)
                hit |= !strcmp(targets[i], proj[p].name);
            if (!hit)
                continue;
            for (int ab = 0; ab < 2; ab++) {
                int rows = ab ? proj[p].out : r, cols = ab ? r : proj[p].in;
                size_t bytes = (size_t)rows * (size_t)cols * 4;
                hl += (size_t)snprintf(hdr + hl, sizeof hdr - hl,
                                       "%s\"base_model.model.model.layers.%d.%s.lora_%s.weight\":{\"dtype\":\"F32\","
                                       "\"shape\":[%d,%d],\"data_offsets\":[%zu,%zu]}",
                                       first ? "" : ",", l, proj[p].path, ab ? "B" : "A", rows, cols, off, off + bytes);
                first = 0;
                off += bytes;
            }
        }
    hl += (size_t)snprintf(hdr + hl, sizeof hdr - hl, "}");
    while (hl % 8)
        hdr[hl++] = ' ';
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    f = fopen(path, "wb");
    uint64_t n = hl;
    fwrite(&n, 8, 1, f);
    fwrite(hdr, 1, hl, f);
    for (size_t i = 0; i < off / 4; i++) {
        float v = 1.5f * frand();
        fwrite(&v, 4, 1, f);
    }
    fclose(f);
}

#endif
