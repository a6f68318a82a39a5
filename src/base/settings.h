/*
 * settings.h — the diagnostic switches spill takes from the environment,
 * read once by main() (settings_from_env) and handed down as values: no
 * library code calls getenv.  Each has a command-line or options-struct
 * equivalent in the stage it changes; the environment is kept because the
 * benchmarks and the GPU tests sweep them without new flags.
 *
 *   SPILL_NO_SIMD=1     scalar CPU dequantizers and dot products (the same bits; quant_simd_force)
 *   SPILL_NO_VNNI=1     AVX2 instead of AVX-512 VNNI for 8-bit activations (the same bits; cpu_q8_vnni_force)
 *   SPILL_CUDA_PROF=1   per-layer GPU segment times printed when the engine closes
 *   SPILL_CUDA_ATT=fp32|tf32   prompt attention on CUDA cores (fp32) or TF32 tensor cores (the default)
 *   SPILL_CUDA_PIN=shared|register|alloc   streamed layers' host arena: read by several threads into the
 *                       host's one shared copy (engine/host_share.h: every process streaming the same bytes maps
 *                       it) and cudaHostRegister'd after (shared: the default for MPI ranks and spill worker); the
 *                       same in this process's own anonymous memory (register: the default otherwise); or
 *                       cudaHostAlloc first (alloc)
 *   SPILL_SHM_DIR=DIR   where the shared copy lives (default /dev/shm)
 *   SPILL_KV_CHECK=1    after every pass, every KV page's count is checked against the rows mapping it (slow;
 *                       the prefix-cache tests run with it)
 *
 * SPILL_HOME (where models, jobs and calibration live) is read by util_spill_home().
 */
#ifndef SPILL_SETTINGS_H
#define SPILL_SETTINGS_H

#include <stdbool.h>
#include <stddef.h>

typedef struct spill_settings {
    bool no_simd, no_vnni;
    bool cuda_prof;
    bool cuda_att_fp32;  /* prompt attention tiles on CUDA cores */
    bool cuda_pin_alloc; /* cudaHostAlloc the streamed layers' arena */
    bool cuda_pin_private; /* SPILL_CUDA_PIN=register: the arena in this process's own memory */
    bool cuda_pin_shared;  /* SPILL_CUDA_PIN=shared: the host's shared copy even for a lone process */
    char shm_dir[1024];    /* SPILL_SHM_DIR ("" the default) */
    bool kv_check;       /* the KV pages' counts checked after every pass (sched_check) */
} spill_settings;

/* Reads the variables above.  Returns 0, or -1 with a sentence naming the variable and its allowed values
 * (an unknown value is refused rather than ignored). */
int settings_from_env(spill_settings *s, char *err, size_t errlen);

#endif
