/*
 * request.h — one input row: the streaming JSONL line reader and the parser
 * that turns one line into a validated `request` (see request.c for the line
 * grammar and every rule).
 *
 * What a caller gets: a line reader that never holds more than one line
 * (files of 200 MB / 50,000 rows stream through a buffer capped at
 * `max_line` bytes), and `request_parse_line`, which validates one line the
 * way OpenAI's Batch API does and fills a `request` the engine uses directly:
 * messages or prompt, sampling parameters with OpenAI's defaults applied, the
 * expected answer of an eval row.  Cross-line rules (duplicate custom_id, one
 * endpoint, one model, one line format per file) live in check.c.
 *
 * Errors follow the project convention (one sentence in err/errlen: file,
 * line, JSON path of the field, what is wrong, what to do) and, in addition,
 * leave an OpenAI error code, the JSON path and a file-level flag in the
 * request, for the job's errors.jsonl and the gateway's batch.errors.
 */
#ifndef SPILL_REQUEST_H
#define SPILL_REQUEST_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "toolcall.h"

#define REQ_MAX_LINE_BYTES (16u << 20) /* one request line; longer lines are an error naming the line */
#define REQ_MAX_STOP 4                 /* OpenAI: stop is a string or up to 4 strings */

/* The format of a line.  A file uses one throughout (check.c enforces it). */
typedef enum req_kind {
    REQ_KIND_UNKNOWN = 0,   /* not determined (the line failed before its format was known) */
    REQ_KIND_BATCH,         /* {"custom_id","method","url","body"} */
    REQ_KIND_FINETUNE,      /* {"messages":[…], "tools"?, "parallel_tool_calls"?, "functions"?} */
    REQ_KIND_EVAL_BATCH,    /* a batch line plus "expected" */
    REQ_KIND_EVAL_FINETUNE, /* a fine-tuning line plus "expected" */
} req_kind;

typedef enum req_endpoint {
    REQ_EP_UNKNOWN = 0,
    REQ_EP_CHAT,        /* /v1/chat/completions (fine-tuning lines are chat requests too) */
    REQ_EP_COMPLETIONS, /* /v1/completions */
    REQ_EP_EMBEDDINGS,  /* /v1/embeddings */
} req_endpoint;

/*
 * Sampling parameters after OpenAI's defaults are applied.  A field the line
 * does not set (or sets to null) holds the default shown.
 */
typedef struct req_sampling {
    int64_t max_tokens;             /* -1 = unset: chat generates until an end token or the context is full;
                                       completions default 16.  From max_tokens or max_completion_tokens. */
    double temperature;             /* 1, in [0, 2] */
    double top_p;                   /* 1, in [0, 1] */
    int n;                          /* 1, in [1, 128]: choices per row */
    int n_stop;                     /* 0..REQ_MAX_STOP */
    const char *stop[REQ_MAX_STOP]; /* borrowed from request.root, NUL-terminated, never empty */
    size_t stop_len[REQ_MAX_STOP];  /* bytes (the strings cannot hold NUL: \u0000 is rejected) */
    bool has_seed;                  /* false */
    int64_t seed;
    bool logprobs;            /* false; chat "logprobs":true, or completions "logprobs":k (any k ≥ 0) */
    int top_logprobs;         /* 0; chat 0..20 (needs logprobs), completions' logprobs k in 0..5 */
    double frequency_penalty; /* 0, in [-2, 2] */
    double presence_penalty;  /* 0, in [-2, 2] */
    size_t n_logit_bias;      /* 0 */
    int32_t *logit_bias_id;   /* (n_logit_bias) token ids, owned, in the order the line writes them */
    float *logit_bias;        /* (n_logit_bias) whole-number bias in [-100, 100], owned */
    bool echo;                /* false; completions only */
    int top_k;                /* 0 = off; vLLM's top_k (-1 or 0 = off, else keep the k most likely) */
    double min_p;             /* 0 = off; vLLM's min_p in [0, 1] */
    double repetition_penalty; /* 1 = off; vLLM's repetition_penalty in (0, 100] */
} req_sampling;

/*
 * One parsed row.  `root` owns the parsed JSON; every json_t* and const char*
 * below is BORROWED from it and lives exactly as long as the request (until
 * request_free).  custom_id and the logit_bias arrays are owned.
 */
typedef struct request {
    json_t *root;    /* owned: the whole line */
    char *custom_id; /* owned; "row-<line>" for a line that has none (fine-tuning / eval lines) */
    size_t line;     /* 1-based line number in the file */
    req_kind kind;
    req_endpoint endpoint;
    const char *url;   /* batch lines: borrowed; "/v1/chat/completions" for fine-tuning lines */
    const char *model; /* body.model, borrowed; NULL where absent (allowed for fine-tuning and eval lines) */
    json_t *body;      /* batch lines: the body object; fine-tuning lines: root */
    json_t *messages;  /* chat: array (≥ 1) of validated messages */
    json_t *tools;     /* chat: array of function tools, or NULL */
    tc_choice tool_choice;        /* chat: body.tool_choice (toolcall.h); TC_CHOICE_AUTO when absent */
    const char *tool_choice_name; /* TC_CHOICE_NAMED: the function's name (one of tools), borrowed */
    bool parallel_tool_calls;     /* parallel_tool_calls, default true */
    json_t *prompt;    /* completions: string | [string] | [int] | [[int]]; embeddings: body.input (same shapes) */
    size_t n_prompts;  /* completions / embeddings: 1 for a string or one token list, else the array length */
    bool emb_base64;   /* embeddings: encoding_format "base64" (little-endian float32), else "float" */
    int64_t emb_dims;  /* embeddings: body.dimensions, 0 = the model's own */
    json_t *expected;  /* eval kinds: any non-null JSON value; NULL otherwise */
    req_sampling s;
    /* Structured output (response_format json_object / json_schema, vLLM's guided_json): the answer is
     * constrained to JSON (grammar.h).  json_schema is borrowed from root; NULL with json_out = any object. */
    bool json_out;
    json_t *json_schema;

    /* Set by request_parse_line on failure (static strings / fixed buffer). */
    const char *err_code; /* OpenAI error code: "invalid_json_line", "invalid_request", … */
    char err_param[160];  /* JSON path of the offending field ("body.messages[2].content"), "" if none */
    bool err_file_level;  /* true: OpenAI fails the whole batch for this (bad JSON, custom_id, method,
                             url, line format); false: only this row fails (HTTP 400 in errors.jsonl) */
} request;

/*
 * Parses and validates one line (without its '\n'; a trailing '\r' is the
 * caller's to strip — jsonl_next does).  `lineno` and `file` only shape the
 * error sentence.  Returns 0 with *out filled, or -1 with one sentence in err
 * ("FILE line N: FIELD …") and out->err_code / err_param / err_file_level set.
 * On failure *out keeps whatever was validated before the failing rule
 * (custom_id, kind, endpoint, url, model), so a job can still name the row in
 * its error file; either way the caller calls request_free(out).
 * Never reads past line[len-1]; the bytes need not be NUL-terminated.
 */
int request_parse_line(const char *line, size_t len, size_t lineno, const char *file, request *out, char *err,
                       size_t errlen);

/* Frees what the request owns and zeroes it.  Safe on a zeroed or half-filled request. */
void request_free(request *r);

/* "chat-completion batch", "completion batch", "fine-tuning chat", "eval (chat-completion batch)", … */
const char *request_kind_name(req_kind kind, req_endpoint ep);

/* ---- streaming line reader ---------------------------------------------------------------------------- */

typedef enum jsonl_status {
    JSONL_LINE = 1,      /* *line holds the next line (without '\n' and a trailing '\r') */
    JSONL_EOF = 0,       /* no more lines */
    JSONL_TOO_LONG = 2,  /* the line was longer than max_line; its bytes were skipped, lineno is valid */
    JSONL_IO_ERROR = -1, /* read failed; err holds a sentence */
} jsonl_status;

/*
 * Reads lines from a FILE* it does not own.  Lines are numbered from 1,
 * split on '\n'; one trailing '\r' is removed (CRLF files); a final line
 * without '\n' is still a line; a file that ends with '\n' has no extra empty
 * line after it.  Memory: one 64 KiB read chunk plus a line buffer that grows
 * to at most max_line + 1 bytes.
 */
typedef struct jsonl_reader {
    FILE *f;          /* borrowed */
    const char *name; /* for error sentences, borrowed */
    size_t max_line;  /* bytes, before '\r' stripping */
    char *buf;        /* (cap) the current line, NUL-terminated */
    size_t cap, len;
    char *chunk; /* (JSONL_CHUNK) read-ahead */
    size_t cpos, clen;
    size_t lineno;
    uint64_t offset;      /* byte offset of the next unread byte of the file */
    uint64_t line_offset; /* byte offset where the current line starts */
    bool eof;
} jsonl_reader;

/* max_line 0 means REQ_MAX_LINE_BYTES.  Returns 0, or -1 (out of memory) with a sentence. */
int jsonl_open(jsonl_reader *r, FILE *f, const char *name, size_t max_line, char *err, size_t errlen);

/* Next line; see jsonl_status.  *line is valid until the next call. */
jsonl_status jsonl_next(jsonl_reader *r, const char **line, size_t *len, char *err, size_t errlen);

/* Frees the buffers (not the FILE).  Safe on a zeroed or half-opened reader. */
void jsonl_close(jsonl_reader *r);

#endif
