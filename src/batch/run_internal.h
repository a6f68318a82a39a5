/*
 * run_internal.h — what the runner's files share (run.c: the job's top;
 * run_rows.c: input lines into rows; run_opts.c: the settings).  Not an
 * interface: nothing outside src/batch/run*.c includes it.  The rows, the
 * scheduler and the memory plan have their own headers (sched.h, plan.h).
 */
#ifndef SPILL_RUN_INTERNAL_H
#define SPILL_RUN_INTERNAL_H

#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "calib.h"
#include "draft.h"
#include "../base/exit.h"
#include "../base/pool.h"
#include "../base/settings.h"
#include "../engine/engine.h"
#include "job.h"
#include "../engine/kv.h"
#include "../model/arch.h"
#include "../model/lora.h"
#include "../model/model.h"
#include "output.h"
#include "plan.h"
#include "request.h"
#include "sample.h"
#include "sched.h"
#include "token_mask.h"
#include "stop.h"
#include "../text/template.h"
#include "../text/tokenizer.h"

#define SPILL_VERSION "spill 0.1"
#define TAIL_SLOTS 8
/* Batch from memory: the new tokens a row without max_tokens is planned at (its limit is the context room,
 * which would plan a chat row at 8k+ tokens and hold the batch to a handful; a row that runs longer grows into
 * free pages, and preempts the newest row only when none are left). */
#define RUN_EXPECT_NEW 1024
/* Batch from memory: at most this many rows in flight (the pass buffers are sized for it). */
#define RUN_MAX_BATCH 4096

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
    const char *quant;   /* --quant bf16|q8|q4|fp8|auto, NULL = the file's own types (run_quant.c); the resolved
                            name once the job is open (what it stores for a resume) */
    const char *pass_log; /* CSV of every pass (benchmarks): pass, rows, decode tokens, prefill tokens, seconds */
    int status_port;     /* --status-port: the job's status page on 127.0.0.1 (progress.h); 0 none */
    int prefix_cache;    /* --prefix-cache: 0 unset (on), 1 on, 2 off (sched_cfg.prefix) */
    int speculate;       /* --speculate: 0 unset (off), 1 lookup (spec.h's proposer), 2 off, 3 draft:MODEL (draft.h) */
    const char *draft_spec; /* speculate 3: the draft model as the user named it (a tag or a path) */
    int spec_k;          /* --spec-k: most tokens proposed per row per pass (0 unset: 4) */
    bool prefill_auto;   /* no --prefill-chunk: prefill_chunk is the default cap, and when the layers stream the
                            prompt tokens per pass adapt to the passes' times (chunk.h) */
    bool quiet, exact, q8; /* q8: quantized weights multiply 8-bit activations (faster for small batches, not exact) */
    spill_settings settings; /* the environment's diagnostic switches, read with the options */
    /* spill distill (cmd 1): every row's answer carries distill_k top log-probs per token (-1: the rows' own);
     * full_logits: each row's answer-token logits as float16 DIR/logits/<id>.npy, refused up front above the
     * free disk or max_logits_bytes; score: teacher-forced log-probs of each row's final assistant turn, no
     * generation (DIR/results.jsonl holds score lines) */
    int cmd;
    int distill_k;
    bool full_logits, score;
    uint64_t max_logits_bytes;
    /* /v1/embeddings rows (embed.c): --pooling last|mean|cls overrides what the model says (NULL = the model's),
     * --matryoshka lets body.dimensions truncate */
    const char *pooling;
    bool matryoshka;
} run_opts;

typedef struct runner {
    run_opts o;
    int argc;            /* the command line after `spill` (the manifest keeps it whole) */
    char **argv;
    bool started;        /* the passes began: from here a failure leaves the job resumable (exit 75) */
    model_desc *m;
    arch_layout al;      /* m resolved for the engine that runs it (adapters are checked against it) */
    /* LoRA (run_adapters.c): the command line's MODEL split into its base and adapter, the adapters the job's
     * rows run with (index 0 = the bare base), the index of the command line's */
    char base_spec[4096], adapter_spec[4096];
    lora_set lora;
    int default_adapter;
    uint64_t n_renamed;        /* rows whose body.model is not the model that ran (one warning per job) */
    char renamed_example[128];
    bool renamed_many;         /* more than one such name */
    tokenizer *tok;
    tmpl_t *tmpl;        /* the chat template, compiled once */
    spill_backend be;    /* be.impl NULL until opened */
    draft dr;            /* --speculate draft: the draft model and its engine (draft.h); dr.m NULL otherwise */
    job *j;
    char run_id[JOB_ID_MAX]; /* the job's id, which every row's stamp carries (several ranks: rank 0's job's) */
    /* several ranks (mpi_run.c): this process's rank and the job's ranks; n_ranks 0 = one process, mpi NULL */
    int rank, n_ranks;
    int host_rank;       /* rank among the ranks on this host: 0 saves the host's calibration (one writer a file) */
    struct mpi_run *mpi;
    char fingerprint[65];
    char quant_name[32]; /* the weights the job runs: "q8", "bf16", or the file's own main type ("Q4_1") */
    char sys_fp[16];     /* OpenAI system_fingerprint: "fp_" + the model fingerprint's first 10 hex digits */
    out_stamp stamp;
    uint64_t job_seed;

    row *rows;           /* (n_rows) every row of the input, in any state (run_rows.c fills it) */
    size_t n_rows;
    sched s;             /* queue, batch and pass over rows (sched.h) */
    int batch;           /* rows in flight at most: --batch, or from memory what the plan's KV pages hold */
    int first_batch;     /* from memory: how many of the queue's first rows the pages hold (the pre-run line) */
    int max_seqs;        /* sequences one pass may carry: batch + the largest n */

    sample_scratch sc;   /* sequential sampling (n > 1 choices sharing a prompt) */
    spill_pool *spool;     /* sampling threads: rows of a pass are sampled in parallel */
    sample_scratch *scs; /* (threads) one scratch per sampling thread */
    sample_result *sres; /* (max_seqs) this pass's draws */
    int *sidx;           /* (max_logit_rows) sequence index of each logits row */
    int *src;            /* (max_logit_rows) per-draw status */
    int32_t *want;       /* (max_logit_rows) per logits row: -2 sampled here, else picked by the backend */
    int32_t *lpos;       /* (max_logit_rows) the position whose logits each row is */
    int32_t *tgt;        /* (max_logit_rows) teacher forcing: the prompt token a row scores, -1 for a draw */
    int max_logit_rows;  /* logits rows one pass may return: max_seqs, plus scored prompt chunks' rows */
    char logits_dir[4096]; /* --full-logits: DIR/logits */
    int *cidx;           /* (max_seqs) logits rows sampled here */
    float *logits;       /* (max_seqs, V) */
    /* structured output: the job's grammars (one per distinct schema), the vocabulary's masks (opened when a
     * row has a grammar), one mask per sampling thread */
    grammar_set grams;
    token_mask *tm;
    struct embed_set *emb; /* /v1/embeddings rows (embed.h), NULL when the input has none */
    uint64_t *gmask;     /* (threads, token_mask_words) */

    /* calibration: the stored fit for this model|backend|machine, and this run's passes */
    calib cal_stored, cal_run;
    char cal_path[4096];
    double eta_prerun;   /* seconds, < 0 when uncalibrated */
    double eta_val, eta_at; /* the live estimate and when (job clock) it was made */

    mem_job mem;         /* the memory plan, its observations, the stored fit (plan.h) */

    /* progress */
    uint64_t rows_total, rows_done, rows_failed, tokens_generated, tokens_scored, prompt_tokens;
    uint64_t dec_steps, dec_tokens; /* decode steps (a choice's one per pass) and the tokens they kept */
    uint64_t spec_accepted;  /* speculative passes: proposed tokens kept */
    uint64_t spec_hist[SPEC_K_MAX + 2]; /* speculative passes: decode steps by the tokens they kept (1 .. k + 1) */
    uint64_t shared_expect;  /* prefix cache: prompt tokens the queue order expects rows to map (share_hints) */
    double t_start;
    bool tty;
    double last_log;
    int drawn_lines;
    FILE *pass_log;
    /* --status-port: the page's server, the pre-run line it shows, its pass log when the user named none */
    struct status_server *status;
    char ready_line[2048];
    char status_csv[4200];
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

/* run.c: creates the job (run), or reopens it and checks it was started with this model (resume: stored not
 * NULL); sets r->j and r->run_id.  0 or -1 with a sentence. */
int run_open_job(runner *r, const job_stored *stored, char *err, size_t errlen);
/* run.c: row i (pending) must be able to finish alone in the backend's KV cache (prompt and every token it may
 * generate); when it cannot, its line (a prompt list's whole line, once) goes to errors.jsonl and its rows are
 * done.  0 when it fits, 1 when it was failed, -1 with a sentence when errors.jsonl cannot be written. */
int run_fail_unfit(runner *r, size_t i, char *err, size_t errlen);
/* run.c: opens the model file at path and applies --quant (run_quant_apply); 0 or -1 with a sentence. */
int run_open_weights(runner *r, const char *path, char *err, size_t errlen);

/* run_adapters.c (the rule is in its opening comment): the command line's MODEL into its base (base, cap) and
 * adapter parts; 0, or -1 with a sentence (an adapter part that resolves to nothing). */
int run_adapters_open(runner *r, char *base, size_t cap, char *err, size_t errlen);
/* Loads the command line's adapter (needs r->m, r->al); 0, or -1 with the loader's sentence. */
int run_adapters_default(runner *r, char *err, size_t errlen);
/* The adapter index of a row whose body.model is model (NULL: none); 0, or 1 with a per-row message. */
int run_adapter_for_row(runner *r, const char *model, int *index, char *msg, size_t msglen);
/* DIR/adapters.json: the job's adapters; 0 (nothing when there are none), or -1 with a sentence. */
int run_adapters_write(runner *r, char *err, size_t errlen);
/* The full hash of adapter index (NULL for the bare base). */
const char *run_adapter_hash(const runner *r, int index);
void run_adapters_free(runner *r);

/* run_opts.c: the command line of `spill run` (resume: `spill resume DIR`) into o; 0 or -1 (usage). */
int run_parse_opts(int argc, char **argv, run_opts *o, bool resume);
/* run_opts.c: the options a resumed job must keep (model included), as stored in the manifest. */
json_t *run_opts_json(const run_opts *o);
/* run_opts.c: `spill resume`: resolves o->out_dir (a bare id names $SPILL_HOME/jobs/<id>) into dir (dircap),
 * reads the job's stored model, input and options (job_read_stored) into st, and fills what the command line
 * left unset from them; o then points into st and dir, which must outlive the job (job_stored_free after).
 * 0, or job_read_stored's -1 / -2 with a sentence. */
int run_resume_opts(run_opts *o, char *dir, size_t dircap, job_stored *st, char *err, size_t errlen);
/* run_opts.c: defaults for what the command line left 0. */
void run_defaults(run_opts *o);

/* run_embed.c (/v1/embeddings rows; its opening comment has the rules): the model's pooling, read once before
 * the rows (embed.h; --pooling and --matryoshka applied).  0, or -1 with a sentence. */
int run_embed_open(runner *r, const char *path, char *err, size_t errlen);
/* Takes row i's inputs (q: its parsed embeddings request; r->rows[i] holds its custom_id and model) into the
 * embedding phase: tokenized, checked against the context and the model's pooling.  0; 1 with a per-row
 * message (msg, *code) when the row cannot run; -1 (out of memory) with a sentence in msg. */
int run_embed_add(runner *r, size_t i, const request *q, char *msg, size_t msglen, const char **code);
/* The longest input of the pending embedding rows, in tokens (0 when none): the memory plan must hold it alone;
 * *inputs (may be NULL) gets how many inputs they hold. */
int32_t run_embed_longest(const runner *r, size_t *inputs);
/* KV pages of pages_tokens positions that the n longest pending embedding inputs hold together (what the
 * embedding phase keeps in flight when its sequences are those inputs): the plan's wish for the phase. */
int32_t run_embed_want_pages(const runner *r, int32_t page_tokens, int n);
/* The embedding phase (before the generation passes): every pending embedding row's inputs prefilled in
 * chunks through the backend's forward_hidden, pooled, and written through the job store (committed each
 * pass).  Stops early on a signal (flag), the rows not written stay pending for a resume.  0, or -1 with a
 * sentence (the job store failed). */
int run_embed_phase(runner *r, volatile sig_atomic_t *flag, char *err, size_t errlen);
void run_embed_free(runner *r);

/* run_quant.c: --quant.  Names r->quant_name; when the chosen quant differs from r->m's file (opened from path),
 * writes (once) or finds the requantized copy under $SPILL_HOME/cache/quant and reopens r->m from it.  0, or -1
 * with a sentence. */
int run_quant_apply(runner *r, const char *path, char *err, size_t errlen);
/* True for the names --quant takes. */
bool run_quant_valid(const char *name);

/* run_answer.c: a drawn token applied to choice c of row w (0, 1 when the choice finished, -1 with a sentence);
 * a prompt position's score and a kept logits row; a finished row (batch slot ai) written through the job store
 * and retired. */
int run_accept_token(runner *r, row *w, choice *c, const sample_result *sr, char *err, size_t errlen);
int run_record_score(runner *r, row *w, int32_t at, const sample_result *sr, const float *lg, char *err,
                     size_t errlen);
int run_keep_logits(runner *r, row *w, int32_t index, const float *lg, char *err, size_t errlen);
int run_finish_row(runner *r, size_t ai, char *err, size_t errlen);

/* run_report.c: what a job prints (the progress line, the pre-run line, the end summary) and its number formats;
 * run.c keeps the loop.  run_now_s: monotonic seconds; run_current_fit: the stored pass-time fit merged with this
 * run's passes (run.c). */
double run_now_s(void);
calib run_current_fit(const runner *r);
/* run.c: the most rows whose planned pages fit `pages` at once (shortest first, or longest first); the prompt
 * tokens the prefix cache mapped instead of computing. */
int run_fit_rows(const runner *r, int64_t pages, bool longest_first);
uint64_t run_cached_tokens(const runner *r);
void run_fmt_count(uint64_t v, char *out, size_t cap);
void run_fmt_eta(double s, char *out, size_t cap);
void run_fmt_bytes(uint64_t b, char *out, size_t cap);
void run_fmt_memory(const runner *r, char *mem, size_t cap);
void run_fmt_chunk(const runner *r, bool done, char *out, size_t cap);
/* The progress line after a pass (final: the last one, kept on screen). */
void run_show_progress(runner *r, int pass, double pass_s, bool final);
/* The pre-run line: what opened, the plan, the ETA (resuming: rows already done before this attempt). */
void run_print_ready(runner *r, bool resuming, double t_open, uint64_t already);
/* The end summary of the job in dir, el seconds after it started. */
void run_print_done(runner *r, const char *dir, double el);

#endif
