/*
 * output.h — builders of the exact lines of results.jsonl and errors.jsonl
 * (OpenAI BatchRequestOutput, formats.md §1.2 and §1.6).  Inputs are plain C
 * structs filled by the runner; nothing here knows the engine.  Every builder
 * returns one compact JSON object without a trailing newline, ready for
 * job_append_result / job_append_error (caller frees *line with free()).
 *
 * Line shapes:
 *   success    {"id":"batch_req_…","custom_id",
 *               "response":{"status_code":200,"request_id":"req_…","body":<chat.completion | text_completion |
 *                                                                          embedding list>},
 *               "error":null, "spill":{…}}
 *   HTTP error {"id","custom_id","response":{"status_code":4xx/5xx,"request_id",
 *               "body":{"error":{"message","type","param","code"}}},"error":null, "spill":{…}}
 *   non-HTTP   {"id","custom_id","response":null,"error":{"code","message"}, "spill":{…}}
 * "spill":{"run_id","model_fingerprint","quant","adapter"} is present when a
 * stamp is given (see output.c for why it sits at the top level).
 */
#ifndef SPILL_OUTPUT_H
#define SPILL_OUTPUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* OpenAI's finish_reason values spill produces (chat: all four; completions: stop/length/content_filter). */
typedef enum out_finish {
    OUT_FINISH_STOP = 0, /* end-of-turn token or a stop sequence */
    OUT_FINISH_LENGTH,   /* max_tokens or the context was reached */
    OUT_FINISH_TOOL_CALLS,
    OUT_FINISH_CONTENT_FILTER,
} out_finish;

/* One top-k candidate at a position. */
typedef struct out_alt {
    const char *bytes; /* raw token bytes (may be an incomplete UTF-8 sequence; NULL when len is 0) */
    size_t len;
    float logprob; /* -inf is written as OpenAI's -9999.0 sentinel; NaN is an error */
} out_alt;

/* One generated token. */
typedef struct out_token {
    const char *bytes; /* raw token bytes (NULL when len is 0) */
    size_t len;
    float logprob;
    size_t n_top;
    const out_alt *top; /* (n_top) candidates, best first; may include the chosen token */
} out_token;

/* One function call of a chat answer (message.tool_calls[i]). */
typedef struct out_tool_call {
    const char *id;        /* "call_…" */
    const char *name;      /* the function's name */
    const char *arguments; /* its arguments as JSON text */
} out_tool_call;

typedef struct out_choice {
    const char *text; /* generated text, stop sequence excluded; invalid UTF-8 -> U+FFFD per maximal subpart */
    size_t len;
    out_finish finish;
    bool logprobs; /* false → "logprobs":null */
    size_t n_tokens;
    const out_token *tokens; /* (n_tokens) when logprobs */
    /* completions echo: the prompt's text goes before text, and with logprobs its tokens before tokens (the
     * first prompt token has no log-prob: written null, whatever echo_tokens[0].logprob holds) */
    const char *echo;
    size_t echo_len;
    size_t n_echo;
    const out_token *echo_tokens; /* (n_echo) */
    /* chat: the calls the answer made; text is then the content around them, and "content" is null when it
     * is empty */
    size_t n_tool_calls;
    const out_tool_call *tool_calls; /* (n_tool_calls) */
} out_choice;

/* Chat logprobs hold at most this many top_logprobs per token (OpenAI's limit); a distillation row's further
 * alternatives follow in the entry's "more_top_logprobs" (same shape), so the object stays OpenAI's. */
#define OUT_OPENAI_MAX_TOP 20

/* spill's provenance stamp; NULL strings become null. */
typedef struct out_stamp {
    const char *run_id;
    const char *model_fingerprint;
    const char *quant;
    const char *adapter; /* full hash of the LoRA adapter, NULL without one */
    double latency_s;    /* the row's admission to its finish (its first admission when preempted) */
    int passes;          /* weight passes the row took part in; 0 = neither key is written */
    const char *requested_model; /* the request's body.model when it is not the model that ran; NULL = omitted */
} out_stamp;

/* One successful row. */
typedef struct out_result {
    const char *custom_id;
    const char *model;              /* "model" of the body: the model the user asked for */
    const char *system_fingerprint; /* NULL → null */
    int64_t created;                /* unix seconds */
    size_t n_choices;
    const out_choice *choices; /* (n_choices), index = position */
    uint64_t prompt_tokens;
    uint64_t completion_tokens; /* all choices together */
    const out_stamp *stamp;     /* NULL → no "spill" key */
    uint64_t cached_tokens;     /* of prompt_tokens, those mapped from the prefix cache (usage.prompt_tokens_details) */
} out_result;

/* An HTTP-style rejection of one row (status_code 400..599). */
typedef struct out_http_error {
    const char *custom_id;
    int status_code;
    const char *message; /* one sentence */
    const char *type;    /* NULL → "invalid_request_error" */
    const char *param;   /* JSON path of the field; NULL or "" → null */
    const char *code;    /* e.g. "context_length_exceeded", NULL → null */
    const out_stamp *stamp;
} out_http_error;

/*
 * Where ids come from: fill(ctx, buf, n) writes n random bytes and returns 0.
 * NULL source = getrandom(2).  Tests inject a fixed sequence.  Ids are the
 * prefix plus 24 characters of [A-Za-z0-9] (rejection-sampled, unbiased).
 */
typedef struct out_ids {
    int (*fill)(void *ctx, void *buf, size_t n);
    void *ctx;
} out_ids;

#define OUT_CODE_BATCH_EXPIRED "batch_expired"
#define OUT_MSG_BATCH_EXPIRED "This request could not be executed before the completion window expired."
#define OUT_CODE_BATCH_CANCELLED "batch_cancelled"
#define OUT_MSG_BATCH_CANCELLED "This request was not executed because the batch was cancelled."

/* /v1/chat/completions success line (body object "chat.completion", id "chatcmpl-…"). */
int output_chat_line(const out_result *r, const out_ids *ids, char **line, size_t *len, char *err, size_t errlen);

/* /v1/completions success line (body object "text_completion", id "cmpl-…", legacy logprobs). */
int output_completion_line(const out_result *r, const out_ids *ids, char **line, size_t *len, char *err, size_t errlen);

/*
 * One completions line for a prompt list: lines[k] is prompt k's success line (its own n choices); the result is
 * lines[0] with every member's choices in order, indexed k*n + c as OpenAI numbers them, usage summed, and the
 * spill stamp's latency_s and passes the largest of the members'.  *line is malloc'd.  0, or -1 with a sentence.
 */
int output_merge_lines(char *const *lines, const size_t *lens, size_t n, char **line, size_t *len, char *err,
                       size_t errlen);

/* One `spill distill --score` row: the teacher-forced log-probs of its answer. */
typedef struct out_score {
    const char *custom_id;
    const char *model;
    const int32_t *prompt_ids;
    size_t n_prompt;
    const int32_t *answer_ids;
    size_t n_answer;
    const out_token *answer; /* (n_answer): each token's bytes, log-prob and alternatives (n_top may be 0) */
    const out_stamp *stamp;
} out_score;

/* {"custom_id","model","score":{"prompt_ids","answer_ids","answer_tokens","logprobs","sum","mean"
 *  [,"top_logprobs":[[{token,logprob,bytes}…]…]]},"spill":{…}}: answer_tokens as text (invalid UTF-8 →
 * U+FFFD), sum and mean over the answer's log-probs in double. */
int output_score_line(const out_score *s, char **line, size_t *len, char *err, size_t errlen);

/* One /v1/embeddings row: n vectors of dim floats, answered as OpenAI's CreateEmbeddingResponse. */
typedef struct out_embedding {
    const char *custom_id;
    const char *model;
    size_t n, dim;
    const float *vecs;      /* (n, dim) */
    bool base64;            /* each embedding as base64 of its little-endian float32 bytes, else a float list */
    uint64_t prompt_tokens; /* all inputs together (usage.total_tokens is the same) */
    const out_stamp *stamp; /* NULL → no "spill" key */
} out_embedding;

/* /v1/embeddings success line: body {"object":"list","data":[{"object":"embedding","index":i,"embedding":…}],
 * "model","usage":{"prompt_tokens","total_tokens"}}.  A NaN or infinite value is an error (-1, a sentence). */
int output_embedding_line(const out_embedding *e, const out_ids *ids, char **line, size_t *len, char *err,
                          size_t errlen);

/* HTTP-style error line (for errors.jsonl). */
int output_http_error_line(const out_http_error *e, const out_ids *ids, char **line, size_t *len, char *err,
                           size_t errlen);

/* Non-HTTP error line: response null, error {code, message} (batch_expired, batch_cancelled, ...). */
int output_error_line(const char *custom_id, const char *code, const char *message, const out_stamp *stamp,
                      const out_ids *ids, char **line, size_t *len, char *err, size_t errlen);

/* Writes prefix + 24 id characters into out (cap must hold them and a NUL). */
int output_new_id(const out_ids *ids, const char *prefix, char *out, size_t cap, char *err, size_t errlen);

#endif
