/*
 * tokenizer.c — Hugging Face `tokenizers` in C: construction from
 * tokenizer.json, the encode pipeline, decode, incremental decode, lookups.
 *
 * Files: tokenizer.c (this: building, encode/decode), tok_pipeline.c (what
 * normalizers, pre-tokenizers and decoders do; regexes), bpe.c (the BPE
 * model), tok_gguf.c (GGUF vocabularies), tok_config.c (the bos/eos text
 * in tokenizer_config.json beside a tokenizer.json), tok_internal.h (shared
 * types).  Does not own: chat templates, the special ids tokenizer_config.json
 * names (the caller may set them), Unigram/WordPiece models (rejected with a
 * sentence).
 *
 * Encode pipeline (tokenizers' Tokenizer::encode, mirrored step for step so
 * that ids agree on every input):
 *   1. invalid UTF-8 -> U+FFFD per maximal invalid subpart;
 *   2. split out added tokens with normalized=false (leftmost-longest, a byte
 *      trie; single_word / lstrip / rstrip as added_vocabulary.rs);
 *   3. normalize each remaining piece, then split out normalized=true tokens;
 *   4. pre-tokenize each piece (a tree of nodes: Sequence, Split, ByteLevel…);
 *   5. BPE each pre-token;  6. post-process when add_special is asked.
 * A piece is (bytes, at_start): at_start is tokenizers' "original offset is 0",
 * which Metaspace's prepend_scheme "first" looks at.  No offsets are kept:
 * nothing downstream of spill needs them.
 *
 * Decode: ids -> token strings (added tokens first; a normalized added token
 * decodes as its normalized form, as tokenizers does) -> decoder -> join.
 * BPE dropout is ignored (inference never wants it).
 */
#include <jansson.h>
#include <stdio.h>

#include "tok_internal.h"

/* ---- loading: shared helpers ------------------------------------------ */

int tk_alloc(tokenizer **out, const char *name)
{
    tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return -1;
    snprintf(t->name, sizeof t->name, "%s", name ? name : "tokenizer");
    t->model.unk_id = -1;
    for (int i = 0; i < 256; i++)
        t->model.byte_id[i] = -1;
    for (int i = 0; i < TOK_SPECIAL_COUNT; i++)
        t->special[i] = -1;
    if (tk_strmap_init(&t->added_map, 16) != 0 || tk_trie_init(&t->trie_raw) != 0 || tk_trie_init(&t->trie_norm) != 0) {
        *out = t;
        return -1;
    }
    tk_byte_table_init();
    *out = t;
    return 0;
}

void tokenizer_free(tokenizer *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->model.vocab.cap; i++)
        free((char *)t->model.vocab.slots[i].s);
    bpe_free(&t->model);
    for (size_t i = 0; i < t->n_ids; i++) {
        free(t->id_str ? t->id_str[i] : NULL);
        free(t->id_bytes ? t->id_bytes[i] : NULL);
    }
    free(t->id_str);
    free(t->id_len);
    free(t->id_bytes);
    free(t->id_bytes_len);
    free(t->id_special);
    for (size_t i = 0; i < t->n_added; i++) {
        free(t->added[i].content);
        free(t->added[i].norm);
    }
    free(t->added);
    tk_strmap_free(&t->added_map);
    tk_trie_free(&t->trie_raw);
    tk_trie_free(&t->trie_norm);
    tk_node_free(t->normalizer);
    free(t->normalizer);
    tk_node_free(t->pretok);
    free(t->pretok);
    tk_node_free(t->decoder);
    free(t->decoder);
    free(t->post_pre);
    free(t->post_post);
    for (int i = 0; i < TOK_SPECIAL_COUNT; i++)
        free(t->special_text[i]);
    free(t);
}

/* Sizes the id tables for n ids (zeroed). */
int tk_ids_alloc(tokenizer *t, size_t n)
{
    t->n_ids = n;
    t->id_str = calloc(n ? n : 1, sizeof *t->id_str);
    t->id_len = calloc(n ? n : 1, sizeof *t->id_len);
    t->id_bytes = calloc(n ? n : 1, sizeof *t->id_bytes);
    t->id_bytes_len = calloc(n ? n : 1, sizeof *t->id_bytes_len);
    t->id_special = calloc(n ? n : 1, 1);
    return t->id_str && t->id_len && t->id_bytes && t->id_bytes_len && t->id_special ? 0 : -1;
}

static int ids_grow(tokenizer *t, size_t n)
{
    if (n <= t->n_ids)
        return 0;
    char **s = realloc(t->id_str, n * sizeof *s);
    if (s)
        t->id_str = s;
    uint32_t *l = realloc(t->id_len, n * sizeof *l);
    if (l)
        t->id_len = l;
    uint8_t **b = realloc(t->id_bytes, n * sizeof *b);
    if (b)
        t->id_bytes = b;
    uint32_t *bl = realloc(t->id_bytes_len, n * sizeof *bl);
    if (bl)
        t->id_bytes_len = bl;
    uint8_t *sp = realloc(t->id_special, n);
    if (sp)
        t->id_special = sp;
    if (!s || !l || !b || !bl || !sp)
        return -1;
    for (size_t i = t->n_ids; i < n; i++) {
        t->id_str[i] = NULL;
        t->id_len[i] = 0;
        t->id_bytes[i] = NULL;
        t->id_bytes_len[i] = 0;
        t->id_special[i] = 0;
    }
    t->n_ids = n;
    return 0;
}

char *tk_dupn(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

/* Records a model vocabulary entry (piece -> id).  The map owns a copy of
 * the key; a duplicated piece keeps its last id, as a Python dict / serde map
 * does, and tk_vocab_drop_shadowed later forgets the pieces of the losing ids
 * (tokenizers' reverse map has no entry for them, so decode skips them). */
int tk_vocab_set(tokenizer *t, const char *s, size_t len, int32_t id)
{
    if (id < 0 || (size_t)id >= t->n_ids)
        return -1;
    free(t->id_str[id]);
    t->id_str[id] = tk_dupn(s, len);
    if (!t->id_str[id])
        return -1;
    t->id_len[id] = (uint32_t)len;
    if (tk_strmap_get(&t->model.vocab, s, len) >= 0)
        return tk_strmap_put(&t->model.vocab, s, len, id); /* existing key kept */
    char *key = tk_dupn(s, len);
    if (!key || tk_strmap_put(&t->model.vocab, key, len, id) != 0) {
        free(key);
        return -1;
    }
    return 0;
}

void tk_vocab_drop_shadowed(tokenizer *t)
{
    for (size_t i = 0; i < t->n_ids; i++) {
        if (!t->id_str[i])
            continue;
        int32_t j = tk_strmap_get(&t->model.vocab, t->id_str[i], t->id_len[i]);
        if (j != (int32_t)i) {
            free(t->id_str[i]);
            t->id_str[i] = NULL;
            t->id_len[i] = 0;
        }
    }
}

static void find_byte_tokens(tokenizer *t)
{
    for (int b = 0; b < 256; b++) {
        char tmp[8];
        snprintf(tmp, sizeof tmp, "<0x%02X>", b);
        t->model.byte_id[b] = tk_strmap_get(&t->model.vocab, tmp, 6);
    }
}

/* Adds (or updates) an added token.  Its id is the vocabulary id when the
 * content is already a piece, else the next free id. */
int tk_added_add(tokenizer *t, const char *s, size_t len, int32_t id, bool special, bool lstrip, bool rstrip,
                     bool single_word, bool normalized)
{
    if (id < 0) {
        id = tk_strmap_get(&t->added_map, s, len);
        if (id < 0)
            id = tk_strmap_get(&t->model.vocab, s, len);
        if (id < 0)
            id = (int32_t)t->n_ids;
    }
    if ((size_t)id >= t->n_ids && ids_grow(t, (size_t)id + 1) != 0)
        return -1;
    added_token *a = realloc(t->added, (t->n_added + 1) * sizeof *a);
    if (!a)
        return -1;
    t->added = a;
    added_token *x = &t->added[t->n_added];
    memset(x, 0, sizeof *x);
    x->content = tk_dupn(s, len);
    if (!x->content)
        return -1;
    t->n_added++;
    x->len = len;
    x->id = id;
    x->special = special;
    x->lstrip = lstrip;
    x->rstrip = rstrip;
    x->single_word = single_word;
    x->normalized = normalized;
    if (!t->id_str[id] || t->id_len[id] != len || memcmp(t->id_str[id], s, len) != 0) {
        /* decoding looks added tokens up first (simple_id_to_token) */
        char *c = tk_dupn(s, len);
        if (!c)
            return -1;
        free(t->id_str[id]);
        t->id_str[id] = c;
        t->id_len[id] = (uint32_t)len;
    }
    t->id_special[id] = special;
    return tk_strmap_put(&t->added_map, x->content, len, id);
}

/* Builds the tries once the normalizer is known. */
static int added_build(tokenizer *t, char *err, size_t errlen)
{
    rx_ctx rc;
    int r = -1;
    tk_rx_ctx_init(&rc);
    for (size_t i = 0; i < t->n_added; i++) {
        added_token *a = &t->added[i];
        if (a->normalized && t->normalizer) {
            sbuf s = {0};
            if (sb_add(&s, a->content, a->len) != 0 || tk_nz_apply(t->normalizer, &rc, &s, err, errlen) != 0) {
                free(s.p);
                goto out;
            }
            a->norm = s.p ? s.p : tk_dupn("", 0);
            a->norm_len = s.n;
            /* tokenizers stores (and so decodes) a normalized token's normalized form */
            char *c = a->norm ? tk_dupn(a->norm, a->norm_len) : NULL;
            if (!c) {
                util_errf(err, errlen, "%s: out of memory.", t->name);
                goto out;
            }
            free(t->id_str[a->id]);
            t->id_str[a->id] = c;
            t->id_len[a->id] = (uint32_t)a->norm_len;
        }
        const char *key = a->norm ? a->norm : a->content;
        size_t klen = a->norm ? a->norm_len : a->len;
        if (klen == 0)
            continue;
        if (tk_trie_add(a->normalized ? &t->trie_norm : &t->trie_raw, key, klen, (int32_t)i) != 0) {
            util_errf(err, errlen, "%s: out of memory.", t->name);
            goto out;
        }
    }
    r = 0;
out:
    tk_rx_ctx_free(&rc);
    return r;
}

/* Precomputes each id's raw bytes through the decoder in raw mode. */
static int build_token_bytes(tokenizer *t, char *err, size_t errlen)
{
    rx_ctx rc;
    tk_rx_ctx_init(&rc);
    int r = 0;
    for (size_t i = 0; i < t->n_ids && r == 0; i++) {
        if (!t->id_str[i])
            continue;
        slist l = {0};
        if (tk_sl_push(&l, t->id_str[i], t->id_len[i]) != 0) {
            r = util_errf(err, errlen, "%s: out of memory.", t->name);
            break;
        }
        if (t->decoder && !t->id_special[i])
            r = tk_dc_apply(t->decoder, &rc, &l, true, err, errlen);
        if (r == 0) {
            sbuf all = {0};
            for (size_t k = 0; k < l.n; k++)
                if (sb_add(&all, l.v[k].p ? l.v[k].p : "", l.v[k].n) != 0)
                    r = -1;
            if (sb_add(&all, "", 0) != 0)
                r = -1;
            t->id_bytes[i] = (uint8_t *)all.p;
            t->id_bytes_len[i] = (uint32_t)all.n;
            if (r != 0)
                util_errf(err, errlen, "%s: out of memory.", t->name);
        }
        tk_sl_free(&l);
    }
    tk_rx_ctx_free(&rc);
    return r;
}

static void set_default_specials(tokenizer *t)
{
    static const char *eot[] = {"<|eot_id|>", "<|im_end|>", "<end_of_turn>", "<|end|>", "<|endoftext|>"};
    if (t->special[TOK_EOT] < 0)
        for (size_t i = 0; i < sizeof eot / sizeof *eot && t->special[TOK_EOT] < 0; i++)
            t->special[TOK_EOT] = tokenizer_token_id(t, eot[i], strlen(eot[i]));
    if (t->special[TOK_EOM] < 0)
        t->special[TOK_EOM] = tokenizer_token_id(t, "<|eom_id|>", 10);
    if (t->special[TOK_UNK] < 0)
        t->special[TOK_UNK] = t->model.unk_id;
    if (t->special[TOK_BOS] < 0 && t->n_post_pre > 0)
        t->special[TOK_BOS] = t->post_pre[0];
}

int tk_finish_load(tokenizer *t, char *err, size_t errlen)
{
    find_byte_tokens(t);
    if (added_build(t, err, errlen) != 0)
        return -1;
    if (build_token_bytes(t, err, errlen) != 0)
        return -1;
    set_default_specials(t);
    return 0;
}

int tk_node_set_regex(node *n, const char *rx, const char *where, char *err, size_t errlen)
{
    n->has_pat = true;
    return tk_pattern_compile(&n->pat, rx, strlen(rx), true, where, err, errlen);
}


/* ---- loading: tokenizer.json ------------------------------------------ */

/* Context for error messages: "<name>: <path>: what." */
typedef struct {
    tokenizer *t;
    char *err;
    size_t errlen;
} jctx;

static const char *jstr(json_t *o, const char *key, size_t *len)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v))
        return NULL;
    if (len)
        *len = json_string_length(v);
    return json_string_value(v);
}

static bool jbool(json_t *o, const char *key, bool dflt)
{
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

/* {"String": s} | {"Regex": r} */
static int jpattern(jctx *c, json_t *pat, pattern *out, const char *path)
{
    size_t len;
    const char *s;
    char where[256];
    snprintf(where, sizeof where, "%s: %s.pattern", c->t->name, path);
    if ((s = jstr(pat, "String", &len)))
        return tk_pattern_compile(out, s, len, false, where, c->err, c->errlen);
    if ((s = jstr(pat, "Regex", &len)))
        return tk_pattern_compile(out, s, len, true, where, c->err, c->errlen);
    return util_errf(c->err, c->errlen, "%s: %s.pattern must be {\"String\": …} or {\"Regex\": …}.", c->t->name,
                     path);
}

static int jbehavior(jctx *c, json_t *o, int dflt, int *out, const char *path)
{
    const char *b = jstr(o, "behavior", NULL);
    static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    *out = dflt;
    if (!b)
        return 0;
    for (int i = 0; i < 5; i++)
        if (strcmp(b, names[i]) == 0) {
            *out = i;
            return 0;
        }
    return util_errf(c->err, c->errlen,
                     "%s: %s.behavior \"%s\" is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, "
                     "Contiguous.",
                     c->t->name, path, b);
}

static int jscheme(jctx *c, json_t *o, int *out, const char *path)
{
    const char *s = jstr(o, "prepend_scheme", NULL);
    if (!s) {
        *out = jbool(o, "add_prefix_space", true) ? PS_ALWAYS : PS_NEVER;
        return 0;
    }
    if (strcmp(s, "always") == 0)
        *out = PS_ALWAYS;
    else if (strcmp(s, "first") == 0)
        *out = PS_FIRST;
    else if (strcmp(s, "never") == 0)
        *out = PS_NEVER;
    else
        return util_errf(c->err, c->errlen, "%s: %s.prepend_scheme \"%s\" is not always, first or never.",
                         c->t->name, path, s);
    return 0;
}

static int jchar(jctx *c, json_t *o, const char *key, uint32_t dflt, uint32_t *out, const char *path)
{
    size_t len;
    const char *s = jstr(o, key, &len);
    *out = dflt;
    if (!s)
        return 0;
    if (len == 0 || len > 4 || !util_utf8_valid(s, len) || u8dec(s, len, out) != len)
        return util_errf(c->err, c->errlen, "%s: %s.%s must be exactly one character.", c->t->name, path, key);
    return 0;
}

enum { STAGE_NZ, STAGE_PT, STAGE_DC };

static int jnode(jctx *c, json_t *j, node *n, int stage, int depth, const char *path);

static int jkids(jctx *c, json_t *arr, node *n, int stage, int depth, const char *path, const char *key)
{
    if (!json_is_array(arr))
        return util_errf(c->err, c->errlen, "%s: %s.%s must be an array.", c->t->name, path, key);
    n->n_kids = json_array_size(arr);
    n->kids = calloc(n->n_kids ? n->n_kids : 1, sizeof *n->kids);
    if (!n->kids)
        return util_errf(c->err, c->errlen, "%s: out of memory.", c->t->name);
    for (size_t i = 0; i < n->n_kids; i++) {
        char sub[512];
        snprintf(sub, sizeof sub, "%s.%s[%zu]", path, key, i);
        if (jnode(c, json_array_get(arr, i), &n->kids[i], stage, depth + 1, sub) != 0)
            return -1;
    }
    return 0;
}

static int jnode(jctx *c, json_t *j, node *n, int stage, int depth, const char *path)
{
    memset(n, 0, sizeof *n);
    if (depth > MAX_NODE_DEPTH)
        return util_errf(c->err, c->errlen, "%s: %s nests Sequences more than %d deep.", c->t->name, path,
                         MAX_NODE_DEPTH);
    const char *type = jstr(j, "type", NULL);
    if (!json_is_object(j) || !type)
        return util_errf(c->err, c->errlen, "%s: %s must be an object with a \"type\" string.", c->t->name, path);
    size_t len;
    const char *s;
    if (stage == STAGE_NZ) {
        if (!strcmp(type, "Sequence")) {
            n->kind = NZ_SEQ;
            return jkids(c, json_object_get(j, "normalizers"), n, stage, depth, path, "normalizers");
        }
        if (!strcmp(type, "NFC") || !strcmp(type, "NFD") || !strcmp(type, "NFKC") || !strcmp(type, "NFKD")) {
            n->kind = !strcmp(type, "NFC") ? NZ_NFC : !strcmp(type, "NFD") ? NZ_NFD : !strcmp(type, "NFKC") ? NZ_NFKC : NZ_NFKD;
            return 0;
        }
        if (!strcmp(type, "Lowercase")) {
            n->kind = NZ_LOWER;
            return 0;
        }
        if (!strcmp(type, "Strip")) {
            n->kind = NZ_STRIP;
            n->flag_a = jbool(j, "strip_left", true);
            n->flag_b = jbool(j, "strip_right", true);
            return 0;
        }
        if (!strcmp(type, "Prepend")) {
            n->kind = NZ_PREPEND;
            if (!(s = jstr(j, "prepend", &len)))
                return util_errf(c->err, c->errlen, "%s: %s.prepend must be a string.", c->t->name, path);
            n->str = tk_dupn(s, len);
            n->str_len = len;
            return n->str ? 0 : util_errf(c->err, c->errlen, "%s: out of memory.", c->t->name);
        }
        if (!strcmp(type, "Replace")) {
            n->kind = NZ_REPLACE;
            goto replace;
        }
    } else if (stage == STAGE_PT) {
        if (!strcmp(type, "Sequence")) {
            n->kind = PT_SEQ;
            return jkids(c, json_object_get(j, "pretokenizers"), n, stage, depth, path, "pretokenizers");
        }
        if (!strcmp(type, "ByteLevel")) {
            n->kind = PT_BYTELEVEL;
            n->flag_a = jbool(j, "add_prefix_space", true);
            n->flag_b = jbool(j, "use_regex", true);
            char where[256];
            snprintf(where, sizeof where, "%s: %s", c->t->name, path);
            return n->flag_b ? tk_node_set_regex(n, TK_GPT2_SPLIT, where, c->err, c->errlen) : 0;
        }
        if (!strcmp(type, "Split")) {
            n->kind = PT_SPLIT;
            n->invert = jbool(j, "invert", false);
            if (jbehavior(c, j, B_ISOLATED, &n->behavior, path) != 0)
                return -1;
            n->has_pat = true;
            return jpattern(c, json_object_get(j, "pattern"), &n->pat, path);
        }
        if (!strcmp(type, "Digits")) {
            n->kind = PT_DIGITS;
            n->flag_a = jbool(j, "individual_digits", false);
            return 0;
        }
        if (!strcmp(type, "Metaspace")) {
            n->kind = PT_METASPACE;
            n->flag_a = jbool(j, "split", true);
            if (jchar(c, j, "replacement", 0x2581, &n->cp, path) != 0 || jscheme(c, j, &n->scheme, path) != 0)
                return -1;
            char rep[4];
            size_t rl = (size_t)utf8proc_encode_char((utf8proc_int32_t)n->cp, (utf8proc_uint8_t *)rep);
            n->has_pat = true;
            return tk_pattern_compile(&n->pat, rep, rl, false, path, c->err, c->errlen);
        }
        if (!strcmp(type, "Whitespace")) {
            n->kind = PT_WHITESPACE;
            n->behavior = B_REMOVED;
            n->invert = true;
            return tk_node_set_regex(n, TK_WHITESPACE_SPLIT, path, c->err, c->errlen);
        }
        if (!strcmp(type, "WhitespaceSplit")) {
            n->kind = PT_WSSPLIT;
            n->behavior = B_REMOVED;
            return tk_node_set_regex(n, TK_WS_CLASS, path, c->err, c->errlen);
        }
        if (!strcmp(type, "Punctuation")) {
            n->kind = PT_PUNCT;
            if (jbehavior(c, j, B_ISOLATED, &n->behavior, path) != 0)
                return -1;
            return tk_node_set_regex(n, TK_PUNCT_CLASS, path, c->err, c->errlen);
        }
    } else {
        if (!strcmp(type, "Sequence")) {
            n->kind = DC_SEQ;
            return jkids(c, json_object_get(j, "decoders"), n, stage, depth, path, "decoders");
        }
        if (!strcmp(type, "ByteLevel")) {
            n->kind = DC_BYTELEVEL;
            return 0;
        }
        if (!strcmp(type, "ByteFallback")) {
            n->kind = DC_BYTEFALLBACK;
            return 0;
        }
        if (!strcmp(type, "Fuse")) {
            n->kind = DC_FUSE;
            return 0;
        }
        if (!strcmp(type, "Strip")) {
            n->kind = DC_STRIP;
            json_t *st = json_object_get(j, "start"), *sp = json_object_get(j, "stop");
            n->start = json_is_integer(st) && json_integer_value(st) > 0 ? (size_t)json_integer_value(st) : 0;
            n->stop = json_is_integer(sp) && json_integer_value(sp) > 0 ? (size_t)json_integer_value(sp) : 0;
            return jchar(c, j, "content", ' ', &n->cp, path);
        }
        if (!strcmp(type, "Replace")) {
            n->kind = DC_REPLACE;
            goto replace;
        }
        if (!strcmp(type, "Metaspace")) {
            n->kind = DC_METASPACE;
            if (jchar(c, j, "replacement", 0x2581, &n->cp, path) != 0)
                return -1;
            return jscheme(c, j, &n->scheme, path);
        }
        if (!strcmp(type, "BPEDecoder")) {
            n->kind = DC_BPE;
            s = jstr(j, "suffix", &len);
            if (!s) {
                s = "</w>";
                len = 4;
            }
            n->str = tk_dupn(s, len);
            n->str_len = len;
            return n->str ? 0 : util_errf(c->err, c->errlen, "%s: out of memory.", c->t->name);
        }
    }
    return util_errf(c->err, c->errlen, "%s: %s.type \"%s\" is not supported by spill's tokenizer.", c->t->name,
                     path, type);
replace:
    if (!(s = jstr(j, "content", &len)))
        return util_errf(c->err, c->errlen, "%s: %s.content must be a string.", c->t->name, path);
    n->str = tk_dupn(s, len);
    n->str_len = len;
    if (!n->str)
        return util_errf(c->err, c->errlen, "%s: out of memory.", c->t->name);
    n->has_pat = true;
    return jpattern(c, json_object_get(j, "pattern"), &n->pat, path);
}

static int jstage(jctx *c, json_t *root, const char *key, int stage, node **out)
{
    json_t *j = json_object_get(root, key);
    *out = NULL;
    if (!j || json_is_null(j))
        return 0;
    *out = calloc(1, sizeof **out);
    if (!*out)
        return util_errf(c->err, c->errlen, "%s: out of memory.", c->t->name);
    return jnode(c, j, *out, stage, 0, key);
}


static int jmodel(jctx *c, json_t *root, json_t *added)
{
    tokenizer *t = c->t;
    json_t *m = json_object_get(root, "model");
    if (!json_is_object(m))
        return util_errf(c->err, c->errlen, "%s: field \"model\" is missing or not an object.", t->name);
    const char *type = jstr(m, "type", NULL);
    json_t *vocab = json_object_get(m, "vocab"), *merges = json_object_get(m, "merges");
    if (type && strcmp(type, "BPE") != 0)
        return util_errf(c->err, c->errlen,
                         "%s: model.type \"%s\" is not supported (spill implements BPE tokenizers only).", t->name,
                         type);
    if (!json_is_object(vocab))
        return util_errf(c->err, c->errlen, "%s: model.vocab must be an object of piece -> id.", t->name);
    if (merges && !json_is_array(merges))
        return util_errf(c->err, c->errlen, "%s: model.merges must be an array.", t->name);
    int64_t max_id = -1;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= MAX_IDS)
            return util_errf(c->err, c->errlen, "%s: model.vocab[\"%.60s\"] must be an integer id in [0, %lld).",
                             t->name, key, (long long)MAX_IDS);
        if (json_integer_value(val) > max_id)
            max_id = json_integer_value(val);
    }
    size_t i;
    json_t *a;
    json_array_foreach(added, i, a) {
        json_t *id = json_object_get(a, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= MAX_IDS)
            return util_errf(c->err, c->errlen, "%s: added_tokens[%zu].id must be an integer in [0, %lld).", t->name,
                             i, (long long)MAX_IDS);
        if (json_integer_value(id) > max_id)
            max_id = json_integer_value(id);
    }
    /* Real vocabularies are dense; refusing sparse ids keeps a 20-byte file
     * from asking for tables sized by one huge id. */
    size_t n_entries = json_object_size(vocab) + json_array_size(added);
    if ((uint64_t)max_id >= 2 * (uint64_t)n_entries + 1024)
        return util_errf(c->err, c->errlen,
                         "%s: the largest id (%lld) is far beyond the %zu vocabulary entries; ids must be dense.",
                         t->name, (long long)max_id, n_entries);
    if (tk_ids_alloc(t, (size_t)(max_id + 1)) != 0 || tk_strmap_init(&t->model.vocab, json_object_size(vocab)) != 0)
        return util_errf(c->err, c->errlen, "%s: out of memory for %lld ids.", t->name, (long long)(max_id + 1));
    void *it;
    for (it = json_object_iter(vocab); it; it = json_object_iter_next(vocab, it)) {
        size_t klen = json_object_iter_key_len(it);
        if (tk_vocab_set(t, json_object_iter_key(it), klen, (int32_t)json_integer_value(json_object_iter_value(it))) != 0)
            return util_errf(c->err, c->errlen, "%s: out of memory.", t->name);
    }
    tk_vocab_drop_shadowed(t);

    size_t len;
    const char *s;
    t->model.fuse_unk = jbool(m, "fuse_unk", false);
    t->model.byte_fallback = jbool(m, "byte_fallback", false);
    t->model.ignore_merges = jbool(m, "ignore_merges", false);
    if ((s = jstr(m, "unk_token", &len)))
        t->model.unk_id = tk_strmap_get(&t->model.vocab, s, len);
    if ((s = jstr(m, "continuing_subword_prefix", &len)) && len > 0 && !(t->model.prefix = tk_dupn(s, len)))
        return util_errf(c->err, c->errlen, "%s: out of memory.", t->name);
    if ((s = jstr(m, "end_of_word_suffix", &len)) && len > 0 && !(t->model.suffix = tk_dupn(s, len)))
        return util_errf(c->err, c->errlen, "%s: out of memory.", t->name);
    size_t plen = t->model.prefix ? strlen(t->model.prefix) : 0;

    size_t nm = merges ? json_array_size(merges) : 0;
    if (tk_pairmap_init(&t->model.merges, nm) != 0)
        return util_errf(c->err, c->errlen, "%s: out of memory for %zu merges.", t->name, nm);
    sbuf joined = {0};
    int rc = -1;
    for (size_t r = 0; r < nm; r++) {
        json_t *e = json_array_get(merges, r);
        const char *l = NULL, *rt = NULL;
        size_t ll = 0, rl = 0;
        if (json_is_string(e)) {
            const char *str = json_string_value(e);
            size_t sl = json_string_length(e);
            if (sl >= 8 && memcmp(str, "#version", 8) == 0)
                continue;
            const char *sp = memchr(str, ' ', sl);
            if (!sp || memchr(sp + 1, ' ', sl - (size_t)(sp - str) - 1)) {
                util_errf(c->err, c->errlen, "%s: model.merges[%zu] must be two pieces separated by one space.",
                          t->name, r);
                goto out;
            }
            l = str;
            ll = (size_t)(sp - str);
            rt = sp + 1;
            rl = sl - ll - 1;
        } else if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
                   json_is_string(json_array_get(e, 1))) {
            l = json_string_value(json_array_get(e, 0));
            ll = json_string_length(json_array_get(e, 0));
            rt = json_string_value(json_array_get(e, 1));
            rl = json_string_length(json_array_get(e, 1));
        } else {
            util_errf(c->err, c->errlen, "%s: model.merges[%zu] must be \"a b\" or [\"a\", \"b\"].", t->name, r);
            goto out;
        }
        int32_t ia = tk_strmap_get(&t->model.vocab, l, ll), ib = tk_strmap_get(&t->model.vocab, rt, rl);
        if (ia < 0 || ib < 0 || rl < plen) {
            util_errf(c->err, c->errlen, "%s: model.merges[%zu] names a piece that is not in model.vocab.", t->name,
                      r);
            goto out;
        }
        joined.n = 0;
        if (sb_add(&joined, l, ll) != 0 || sb_add(&joined, rt + plen, rl - plen) != 0) {
            util_errf(c->err, c->errlen, "%s: out of memory.", t->name);
            goto out;
        }
        int32_t inew = tk_strmap_get(&t->model.vocab, joined.p, joined.n);
        if (inew < 0) {
            util_errf(c->err, c->errlen, "%s: model.merges[%zu] makes a piece that is not in model.vocab.", t->name,
                      r);
            goto out;
        }
        if (tk_pairmap_put(&t->model.merges, ia, ib, (uint32_t)r, inew) != 0) {
            util_errf(c->err, c->errlen, "%s: out of memory.", t->name);
            goto out;
        }
    }
    rc = 0;
out:
    free(joined.p);
    return rc;
}

static int jadded(jctx *c, json_t *added)
{
    size_t i;
    json_t *a;
    json_array_foreach(added, i, a) {
        size_t len;
        const char *s = jstr(a, "content", &len);
        if (!s)
            return util_errf(c->err, c->errlen, "%s: added_tokens[%zu].content must be a string.", c->t->name, i);
        if (tk_added_add(c->t, s, len, (int32_t)json_integer_value(json_object_get(a, "id")), jbool(a, "special", false),
                      jbool(a, "lstrip", false), jbool(a, "rstrip", false), jbool(a, "single_word", false),
                      jbool(a, "normalized", !jbool(a, "special", false))) != 0)
            return util_errf(c->err, c->errlen, "%s: out of memory.", c->t->name);
    }
    return 0;
}

int tk_post_push(int32_t **v, size_t *n, int32_t id)
{
    int32_t *p = realloc(*v, (*n + 1) * sizeof *p);
    if (!p)
        return -1;
    p[(*n)++] = id;
    *v = p;
    return 0;
}

static int jpost(jctx *c, json_t *p, int depth)
{
    tokenizer *t = c->t;
    if (!p || json_is_null(p))
        return 0;
    const char *type = jstr(p, "type", NULL);
    if (!type || depth > MAX_NODE_DEPTH)
        return util_errf(c->err, c->errlen, "%s: post_processor must be an object with a \"type\" string.", t->name);
    if (!strcmp(type, "Sequence")) {
        json_t *ps = json_object_get(p, "processors"), *e;
        size_t i;
        json_array_foreach(ps, i, e) if (jpost(c, e, depth + 1) != 0) return -1;
        return 0;
    }
    if (!strcmp(type, "ByteLevel"))
        return 0;
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        json_t *cls = json_object_get(p, "cls"), *sep = json_object_get(p, "sep");
        if (!json_is_integer(json_array_get(cls, 1)) || !json_is_integer(json_array_get(sep, 1)))
            return util_errf(c->err, c->errlen, "%s: post_processor.cls/sep must be [token, id].", t->name);
        if (tk_post_push(&t->post_pre, &t->n_post_pre, (int32_t)json_integer_value(json_array_get(cls, 1))) != 0 ||
            tk_post_push(&t->post_post, &t->n_post_post, (int32_t)json_integer_value(json_array_get(sep, 1))) != 0)
            return util_errf(c->err, c->errlen, "%s: out of memory.", t->name);
        return 0;
    }
    if (strcmp(type, "TemplateProcessing") != 0)
        return util_errf(c->err, c->errlen, "%s: post_processor.type \"%s\" is not supported.", t->name, type);
    json_t *single = json_object_get(p, "single"), *specials = json_object_get(p, "special_tokens"), *e;
    bool seen_seq = false;
    size_t i;
    json_array_foreach(single, i, e) {
        if (json_object_get(e, "Sequence")) {
            seen_seq = true;
            continue;
        }
        const char *sid = jstr(json_object_get(e, "SpecialToken"), "id", NULL);
        json_t *ids = json_object_get(json_object_get(specials, sid ? sid : ""), "ids"), *x;
        if (!sid || !json_is_array(ids))
            return util_errf(c->err, c->errlen,
                             "%s: post_processor.single[%zu] names a special token missing from special_tokens.",
                             t->name, i);
        size_t k;
        json_array_foreach(ids, k, x) {
            if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= MAX_IDS)
                return util_errf(c->err, c->errlen, "%s: post_processor.special_tokens[\"%s\"].ids must be ids.",
                                 t->name, sid);
            if (tk_post_push(seen_seq ? &t->post_post : &t->post_pre, seen_seq ? &t->n_post_post : &t->n_post_pre,
                          (int32_t)json_integer_value(x)) != 0)
                return util_errf(c->err, c->errlen, "%s: out of memory.", t->name);
        }
    }
    return 0;
}

int tokenizer_from_json(const char *buf, size_t len, const char *name, tokenizer **out, char *err, size_t errlen)
{
    *out = NULL;
    tokenizer *t = NULL;
    json_error_t je;
    json_t *root = json_loadb(buf, len, JSON_ALLOW_NUL, &je);
    if (!root)
        return util_errf(err, errlen, "%s: not valid JSON at line %d, column %d: %s.", name ? name : "tokenizer.json",
                         je.line, je.column, je.text);
    if (tk_alloc(&t, name ? name : "tokenizer.json") != 0) {
        util_errf(err, errlen, "%s: out of memory.", name ? name : "tokenizer.json");
        goto fail;
    }
    jctx c = {t, err, errlen};
    json_t *added = json_object_get(root, "added_tokens");
    if (!json_is_object(root)) {
        util_errf(err, errlen, "%s: the top level must be an object.", t->name);
        goto fail;
    }
    if (added && !json_is_array(added) && !json_is_null(added)) {
        util_errf(err, errlen, "%s: added_tokens must be an array.", t->name);
        goto fail;
    }
    if (jmodel(&c, root, added) != 0 || jstage(&c, root, "normalizer", STAGE_NZ, &t->normalizer) != 0 ||
        jstage(&c, root, "pre_tokenizer", STAGE_PT, &t->pretok) != 0 ||
        jstage(&c, root, "decoder", STAGE_DC, &t->decoder) != 0 ||
        jpost(&c, json_object_get(root, "post_processor"), 0) != 0 || jadded(&c, added) != 0 ||
        tk_finish_load(t, err, errlen) != 0)
        goto fail;
    json_decref(root);
    *out = t;
    return 0;
fail:
    json_decref(root);
    tokenizer_free(t);
    return -1;
}

int tokenizer_from_json_file(const char *path, tokenizer **out, char *err, size_t errlen)
{
    char *buf;
    size_t len;
    *out = NULL;
    if (util_read_file(path, TOKENIZER_JSON_MAX, &buf, &len, err, errlen) != 0)
        return -1;
    int r = tokenizer_from_json(buf, len, path, out, err, errlen);
    free(buf);
    if (r == 0 && tk_config_load(*out, path, err, errlen) != 0) {
        tokenizer_free(*out);
        *out = NULL;
        r = -1;
    }
    return r;
}

/* ---- encode ----------------------------------------------------------- */

/* tokenizers' AddedVocabulary::find_matches + split_with_indices over one
 * piece: matched tokens become token pieces, the rest text pieces. */
static int split_added(const tokenizer *t, const trie *tr, const char *s, size_t len, bool at_start, plist *out)
{
    size_t start_offset = 0, pos = 0;
    while (pos < len) {
        size_t mend = 0, mstart = pos;
        int32_t idx = -1;
        for (; mstart < len; mstart++) {
            idx = tk_trie_longest(tr, s, len, mstart, &mend);
            if (idx >= 0)
                break;
        }
        if (idx < 0)
            break;
        pos = mend;
        const added_token *a = &t->added[idx];
        size_t start = mstart, stop = mend;
        if (a->single_word) {
            bool word_before = false, word_after = false;
            if (mstart > 0) {
                size_t k = mstart - 1;
                while (k > 0 && ((uint8_t)s[k] & 0xC0) == 0x80)
                    k--;
                uint32_t cp;
                u8dec(s + k, mstart - k, &cp);
                word_before = tk_is_word(cp);
            }
            if (mend < len) {
                uint32_t cp;
                u8dec(s + mend, len - mend, &cp);
                word_after = tk_is_word(cp);
            }
            if (word_before || word_after)
                continue;
        }
        if (a->lstrip) {
            size_t ns = mstart;
            while (ns > 0) {
                size_t k = ns - 1;
                while (k > 0 && ((uint8_t)s[k] & 0xC0) == 0x80)
                    k--;
                uint32_t cp;
                u8dec(s + k, ns - k, &cp);
                if (!tk_is_ws(cp))
                    break;
                ns = k;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip) {
            while (stop < len) {
                uint32_t cp;
                size_t k = u8dec(s + stop, len - stop, &cp);
                if (!tk_is_ws(cp))
                    break;
                stop += k;
            }
        }
        if (start_offset < start && tk_pl_add(out, s + start_offset, start - start_offset, -1, at_start && start_offset == 0) != 0)
            return -1;
        if (tk_pl_add(out, s + start, stop - start, a->id, at_start && start == 0) != 0)
            return -1;
        start_offset = stop;
    }
    if (start_offset < len && tk_pl_add(out, s + start_offset, len - start_offset, -1, at_start && start_offset == 0) != 0)
        return -1;
    return 0;
}

int tokenizer_encode(const tokenizer *t, const char *text, size_t len, bool add_special, int32_t **ids, size_t *n,
                     char *err, size_t errlen)
{
    *ids = NULL;
    *n = 0;
    sbuf clean = {0}, norm = {0};
    plist a = {0}, b = {0};
    ivec out = {0};
    rx_ctx rc;
    int r = -1;
    if (!text)
        len = 0;
    tk_rx_ctx_init(&rc);
    if (tk_sb_add_lossy(&clean, text ? text : "", len) != 0)
        goto oom;
    if (split_added(t, &t->trie_raw, clean.p, clean.n, true, &a) != 0)
        goto oom;
    for (size_t i = 0; i < a.n; i++) {
        if (a.v[i].token >= 0) {
            if (tk_pl_add(&b, PSTR(&a, i), a.v[i].len, a.v[i].token, a.v[i].at_start) != 0)
                goto oom;
            continue;
        }
        norm.n = 0;
        if (sb_add(&norm, PSTR(&a, i), a.v[i].len) != 0)
            goto oom;
        if (t->normalizer && tk_nz_apply(t->normalizer, &rc, &norm, err, errlen) != 0)
            goto out;
        if (norm.n == 0)
            continue;
        if (split_added(t, &t->trie_norm, norm.p, norm.n, a.v[i].at_start, &b) != 0)
            goto oom;
    }
    if (t->pretok && tk_pt_apply(t->pretok, &rc, &b, &a, err, errlen) != 0)
        goto out;
    if (add_special)
        for (size_t i = 0; i < t->n_post_pre; i++)
            if (tk_ivec_push(&out, t->post_pre[i]) != 0)
                goto oom;
    for (size_t i = 0; i < b.n; i++) {
        int rr = b.v[i].token >= 0 ? tk_ivec_push(&out, b.v[i].token) : bpe_encode(&t->model, PSTR(&b, i), b.v[i].len, &out);
        if (rr != 0)
            goto oom;
    }
    if (add_special)
        for (size_t i = 0; i < t->n_post_post; i++)
            if (tk_ivec_push(&out, t->post_post[i]) != 0)
                goto oom;
    if (!out.v && !(out.v = malloc(sizeof *out.v)))
        goto oom;
    *ids = out.v;
    *n = out.n;
    out.v = NULL;
    r = 0;
    goto out;
oom:
    util_errf(err, errlen, "%s: out of memory while encoding %zu bytes.", t->name, len);
out:
    tk_rx_ctx_free(&rc);
    free(clean.p);
    free(norm.p);
    tk_pl_free(&a);
    tk_pl_free(&b);
    free(out.v);
    return r;
}

/* ---- decode ----------------------------------------------------------- */

int tokenizer_decode(const tokenizer *t, const int32_t *ids, size_t n, bool skip_special, char **out,
                     size_t *out_len, char *err, size_t errlen)
{
    *out = NULL;
    if (out_len)
        *out_len = 0;
    slist l = {0};
    sbuf all = {0};
    rx_ctx rc;
    int r = -1;
    tk_rx_ctx_init(&rc);
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || (size_t)id >= t->n_ids || !t->id_str[id] || (skip_special && t->id_special[id]))
            continue;
        if (tk_sl_push(&l, t->id_str[id], t->id_len[id]) != 0)
            goto oom;
    }
    if (t->decoder) {
        if (tk_dc_apply(t->decoder, &rc, &l, false, err, errlen) != 0)
            goto out;
        for (size_t i = 0; i < l.n; i++)
            if (sb_add(&all, l.v[i].p ? l.v[i].p : "", l.v[i].n) != 0)
                goto oom;
    } else {
        for (size_t i = 0; i < l.n; i++)
            if ((i && sb_add(&all, " ", 1) != 0) || sb_add(&all, l.v[i].p ? l.v[i].p : "", l.v[i].n) != 0)
                goto oom;
    }
    if (sb_add(&all, "", 0) != 0)
        goto oom;
    *out = all.p;
    if (out_len)
        *out_len = all.n;
    all.p = NULL;
    r = 0;
    goto out;
oom:
    util_errf(err, errlen, "%s: out of memory while decoding %zu ids.", t->name, n);
out:
    tk_rx_ctx_free(&rc);
    tk_sl_free(&l);
    free(all.p);
    return r;
}

/* ---- incremental decode ----------------------------------------------- */

/* tokenizers' DecodeStream: keep the ids since the last emitted boundary;
 * decode them with one token of left context (prefix) and emit the new tail
 * once it no longer ends in U+FFFD.  One deliberate difference: where the
 * reference would fail (InvalidPrefix: a ByteFallback run that was valid
 * UTF-8 becomes U+FFFDs once an invalid byte joins it), we emit the new ids
 * decoded on their own, so generation output never stops on bad bytes. */
struct tok_stream {
    const tokenizer *tok;
    bool skip_special;
    ivec ids;
    size_t prefix_index;
    char *prefix;
    size_t prefix_len;
};

int tok_stream_init(const tokenizer *tok, bool skip_special, tok_stream **out, char *err, size_t errlen)
{
    tok_stream *s = calloc(1, sizeof *s);
    if (!s || !(s->prefix = calloc(1, 1))) {
        free(s);
        *out = NULL;
        return util_errf(err, errlen, "out of memory creating a decode stream.");
    }
    s->tok = tok;
    s->skip_special = skip_special;
    *out = s;
    return 0;
}

static int stream_step(tok_stream *s, bool final, char **text, size_t *text_len, char *err, size_t errlen)
{
    char *str;
    size_t len;
    *text = NULL;
    *text_len = 0;
    if (tokenizer_decode(s->tok, s->ids.v, s->ids.n, s->skip_special, &str, &len, err, errlen) != 0)
        return -1;
    bool held = len >= 3 && memcmp(str + len - 3, "\xEF\xBF\xBD", 3) == 0 && !final;
    if (len > s->prefix_len && !held) {
        size_t from = s->prefix_len;
        if (memcmp(str, s->prefix, s->prefix_len) != 0) {
            /* The decoder regrouped text already emitted (ByteFallback turns
             * valid bytes followed by an invalid one into U+FFFDs, all of
             * them): emit the new ids decoded on their own instead. */
            free(str);
            if (tokenizer_decode(s->tok, s->ids.v + s->prefix_index, s->ids.n - s->prefix_index, s->skip_special,
                                 &str, &len, err, errlen) != 0)
                return -1;
            from = 0;
        }
        size_t nl = len - from;
        char *t = malloc(nl + 1);
        if (!t) {
            free(str);
            return util_errf(err, errlen, "out of memory while decoding.");
        }
        memcpy(t, str + from, nl);
        t[nl] = 0;
        free(str);
        /* keep the ids from prefix_index on as the new context */
        size_t new_prefix_index = s->ids.n - s->prefix_index;
        memmove(s->ids.v, s->ids.v + s->prefix_index, new_prefix_index * sizeof *s->ids.v);
        s->ids.n = new_prefix_index;
        free(s->prefix);
        s->prefix = NULL;
        if (tokenizer_decode(s->tok, s->ids.v, s->ids.n, s->skip_special, &s->prefix, &s->prefix_len, err,
                             errlen) != 0) {
            free(t);
            return -1;
        }
        s->prefix_index = new_prefix_index;
        *text = t;
        *text_len = nl;
        return 0;
    }
    free(str);
    *text = calloc(1, 1);
    return *text ? 0 : util_errf(err, errlen, "out of memory while decoding.");
}

int tok_stream_push(tok_stream *s, int32_t id, char **text, size_t *text_len, char *err, size_t errlen)
{
    if (tk_ivec_push(&s->ids, id) != 0)
        return util_errf(err, errlen, "out of memory while decoding.");
    return stream_step(s, false, text, text_len, err, errlen);
}

int tok_stream_flush(tok_stream *s, char **text, size_t *text_len, char *err, size_t errlen)
{
    int r = stream_step(s, true, text, text_len, err, errlen);
    if (r == 0) {
        s->ids.n = 0;
        s->prefix_index = 0;
        s->prefix[0] = 0;
        s->prefix_len = 0;
    }
    return r;
}

void tok_stream_free(tok_stream *s)
{
    if (!s)
        return;
    free(s->ids.v);
    free(s->prefix);
    free(s);
}

/* ---- accessors -------------------------------------------------------- */

size_t tokenizer_vocab_size(const tokenizer *t) { return t->n_ids; }

const char *tokenizer_piece(const tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || (size_t)id >= t->n_ids || !t->id_str[id])
        return NULL;
    if (len)
        *len = t->id_len[id];
    return t->id_str[id];
}

const uint8_t *tokenizer_token_bytes(const tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || (size_t)id >= t->n_ids || !t->id_bytes[id])
        return NULL;
    if (len)
        *len = t->id_bytes_len[id];
    return t->id_bytes[id];
}

int32_t tokenizer_token_id(const tokenizer *t, const char *s, size_t len)
{
    int32_t id = tk_strmap_get(&t->added_map, s, len);
    return id >= 0 ? id : tk_strmap_get(&t->model.vocab, s, len);
}

bool tokenizer_is_special(const tokenizer *t, int32_t id)
{
    return id >= 0 && (size_t)id < t->n_ids && t->id_special[id];
}

int32_t tokenizer_special(const tokenizer *t, tok_special which)
{
    return (unsigned)which < TOK_SPECIAL_COUNT ? t->special[which] : -1;
}

void tokenizer_set_special(tokenizer *t, tok_special which, int32_t id)
{
    if ((unsigned)which < TOK_SPECIAL_COUNT)
        t->special[which] = id;
}

