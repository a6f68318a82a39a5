/*
 * run_internal.h — what the runner's files share (run.c: the scheduler and
 * the job; run_rows.c: input lines into rows; run_opts.c: the command line).
 * Not an interface: nothing outside src/run*.c and tests/test_sched.c
 * includes it.
 */
#ifndef SPILL_RUN_INTERNAL_H
#define SPILL_RUN_INTERNAL_H

#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "calib.h"
#include "../base/pool.h"
#include "../engine/engine.h"
#include "job.h"
#include "../engine/kv.h"
#include "../model/model.h"
#include "output.h"
#include "plan.h"
#include "request.h"
#include "sample.h"
#include "stop.h"
#include "../text/template.h"
#include "../text/tokenizer.h"

#define SPILL_VERSION "spill 0.1"
#define EX_OK 0
#define EX_USAGE_ 2
#define EX_DATAERR_ 65
#define EX_NOINPUT_ 66
#define EX_SOFTWARE_ 70
#define EX_TEMPFAIL_ 75
#define TAIL_SLOTS 8

typedef struct run_opts {
    const char *model_spec, *input, *out_dir;
    int threads, batch, prefill_chunk, page_tokens, stream_slots;
    int mode;            /* 0 auto, 1 --stream, 2 --resident */
    uint64_t kv_bytes, mem_budget;
    int device;          /* 0 auto (GPU when built in), 1 --cpu, 2 --gpu */
    int resident_layers; /* GPU: layers kept in HBM when streaming (-1 = planner) */
    uint64_t gpu_mem;    /* GPU: HBM to plan with (0 = all free) */
    bool from_disk;      /* GPU: streamed layers read from storage every pass (no pinned host cache) */
    int kv_dtype;        /* GPU: KV_I8 (--kv-dtype int8) or 0 (the backend's default: bf16 on the GPU) */
    const char *pass_log; /* CSV of every pass (benchmarks): pass, rows, decode tokens, prefill tokens, seconds */
    bool quiet, exact, q8; /* q8: quantized weights multiply 8-bit activations (faster for small batches, not exact) */
} run_opts;

enum row_state { ROW_PENDING, ROW_ACTIVE, ROW_DONE };

typedef struct choice {
    kv_row kv;
    sample_state ss;
    tok_stream *ts;
    stop_matcher sm;
    int32_t fed;         /* positions in the KV cache (prompt progress, then generated tokens fed back) */
    int32_t next;        /* sampled token waiting to be fed, -1 when none */
    int32_t n_gen;       /* generated tokens kept (stop tokens excluded) */
    char *text;          /* emitted text so far */
    size_t text_len, text_cap;
    out_token *lp;       /* (n_gen) when logprobs */
    out_alt *alts;       /* (n_gen * top) */
    bool done;
    out_finish finish;
} choice;

typedef struct row {
    char *custom_id, *model;
    req_endpoint endpoint;
    size_t line;
    int32_t *prompt;
    int32_t n_prompt;
    int64_t max_new;
    int n_choices;
    sample_params sp;
    bool has_seed;
    int64_t seed;
    int n_stop;
    char *stop[REQ_MAX_STOP];
    size_t stop_len[REQ_MAX_STOP];
    int32_t *bias_id;
    float *bias;
    enum row_state state;
    choice *ch;          /* (n_choices) while active */
    uint64_t admitted;   /* admission serial, for picking preemption victims */
    int preempted;
} row;

typedef struct runner {
    run_opts o;
    model_desc *m;
    tokenizer *tok;
    tmpl_t *tmpl;        /* the chat template, compiled once */
    spill_backend be;    /* be.impl NULL until opened */
    job *j;
    char fingerprint[65];
    char sys_fp[16];     /* OpenAI system_fingerprint: "fp_" + the model fingerprint's first 10 hex digits */
    out_stamp stamp;
    uint64_t job_seed;

    row *rows;
    size_t n_rows;
    size_t *queue;       /* pending row indices, longest first; head at q_head */
    size_t q_head, q_len;
    size_t *active;      /* admitted rows in admission order */
    size_t n_active;
    uint64_t admit_serial;

    sample_scratch sc;   /* sequential sampling (n > 1 choices sharing a prompt) */
    spill_pool *spool;     /* sampling threads: rows of a pass are sampled in parallel */
    sample_scratch *scs; /* (threads) one scratch per sampling thread */
    sample_result *sres; /* (max seqs) this pass's draws */
    int *sidx;           /* (max seqs) sequence index of each logits row */
    int *src;            /* (max seqs) per-draw status */
    int32_t *want;       /* (max seqs) per logits row: -2 sampled here, else picked by the backend (forward_pick) */
    int *cidx;           /* (max seqs) logits rows sampled here */
    int max_seqs;        /* sequences one pass may carry: batch + the largest n */
    float *logits;       /* (max seqs, V) */
    fwd_seq *seqs;
    int *seq_row, *seq_choice;

    /* calibration: the stored fit for this model|backend|machine, and this run's passes */
    calib cal_stored, cal_run;
    char cal_path[4096];
    double eta_prerun;   /* seconds, < 0 when uncalibrated */
    double eta_val, eta_at; /* the live estimate and when (job clock) it was made */

    /* memory: the plan, this run's observations of it, the stored fit of the excess */
    mem_plan plan;
    uint64_t page_bytes, kv_fixed_model; /* KV page, and what the plan priced besides KV and slack */
    int32_t kv_peak_used;                /* pages ever touched (the free list is a stack) */
    mem_fit mem_run, mem_stored;
    char mem_path[4096];
    uint64_t guard_pauses;
    uint64_t stall_preemptions;          /* preemptions that broke a prefill deadlock */
    uint64_t plan_ring;                  /* stream ring bytes (+ global tensors) when streamed */

    /* progress */
    uint64_t rows_total, rows_done, rows_failed, tokens_generated, prompt_tokens, preemptions;
    double t_start;
    size_t tail[TAIL_SLOTS];
    int n_tail;
    bool tty;
    double last_log;
    int drawn_lines;
    FILE *pass_log;
} runner;


/* run_rows.c: one errors.jsonl line (an HTTP 400 with the request's custom_id) for a row refused up front;
 * 0 or -1 with a sentence. */
int run_append_error_line(runner *r, const char *custom_id, const char *message, const char *param,
                          const char *code, char *err, size_t errlen);
/* The same with another HTTP status (5xx lines are typed "server_error"). */
int run_append_status_line(runner *r, const char *custom_id, int status, const char *message, const char *param,
                           const char *code, char *err, size_t errlen);
/* run_rows.c: the input's rows (non-blank lines), so the job knows its total before it starts. */
int run_count_rows(const char *path, uint64_t *n, char *err, size_t errlen);
/* run_rows.c: reads the input file into r->rows (parse, template, tokenize; rows the job already answered are
 * skipped, bad lines become error lines); 0 or -1 with a sentence. */
int run_load_rows(runner *r, char *err, size_t errlen);

/* run_opts.c: the command line of `spill run` (resume: `spill resume DIR`) into o; 0 or -1 (usage). */
int run_parse_opts(int argc, char **argv, run_opts *o, bool resume);
/* run_opts.c: the options a resumed job must keep, as stored in the manifest. */
json_t *run_opts_json(const run_opts *o);
/* run_opts.c: defaults for what the command line left 0. */
void run_defaults(run_opts *o);

#endif
