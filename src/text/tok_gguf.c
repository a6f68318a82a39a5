/*
 * tok_gguf.c — tokenizers from GGUF vocabularies (tokenizer.ggml.* keys),
 * rebuilt the way transformers' GGUF converter rebuilds them
 * (integrations/gguf/gguf_tokenizer_mapping.py), so ids match what
 * `AutoTokenizer.from_pretrained(dir, gguf_file=…)` produces.
 *
 * gpt2: the tokens are byte-level strings (a token outside the byte alphabet
 *   is re-spelled from its UTF-8 bytes), merges given; tokenizer.ggml.pre
 *   picks the Split regex.  Two deliberate differences from transformers,
 *   following llama.cpp and the models' own tokenizer.json: "smollm" =
 *   Digits(individual) + ByteLevel (transformers keeps plain ByteLevel), and
 *   the Llama-3 family sets ignore_merges.  Unknown/missing pre: GPT-2 split.
 * llama: a SentencePiece vocabulary as BPE with byte fallback; merges are
 *   derived from the scores (generate_merges), Gemma's from token order, and
 *   Gemma's all-blank tokens are re-spelled with U+2581 first.
 * Control tokens (type 3) become special added tokens, user-defined ones (4)
 * plain added tokens; add_bos/add_eos become the post-processor.
 */
#include <stdio.h>

#include "tok_internal.h"

/* Numeric element types only: gguf_arr_num gives NaN for the others. */
static bool numeric_array(const gguf_kv *kv)
{
    return kv->arr_type != GGUF_V_STRING && kv->arr_type != GGUF_V_ARRAY && kv->arr_type != GGUF_V_BOOL;
}

/* Python's str.isspace(), which transformers' Gemma respelling relies on. */
static bool py_isspace(uint32_t c)
{
    return (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static size_t cp_count(const char *s, size_t len)
{
    size_t n = 0;
    for (size_t i = 0; i < len; i++)
        n += ((uint8_t)s[i] & 0xC0) != 0x80;
    return n;
}

static bool all_in_byte_alphabet(const char *s, size_t len)
{
    if (!util_utf8_valid(s, len))
        return false;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        i += u8dec(s + i, len - i, &cp);
        if (cp >= 0x144 || tk_cp_to_byte[cp] < 0)
            return false;
    }
    return true;
}

typedef struct {
    int32_t l, r;       /* ids of the two halves */
    int32_t merged;     /* id of the whole token */
    double score;
    uint32_t ll, rl;    /* code-point lengths */
    uint32_t seq;       /* emission order, for a stable sort */
} gen_merge;

static int gen_merge_cmp(const void *pa, const void *pb)
{
    const gen_merge *a = pa, *b = pb;
    if (a->score != b->score)
        return a->score > b->score ? -1 : 1;
    if (a->ll != b->ll)
        return a->ll > b->ll ? -1 : 1;
    if (a->rl != b->rl)
        return a->rl > b->rl ? -1 : 1;
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

static int local_cmp(const void *pa, const void *pb)
{
    const gen_merge *a = pa, *b = pb;
    if (a->l != b->l)
        return a->l < b->l ? -1 : 1;
    return a->r < b->r ? -1 : a->r > b->r;
}

/* transformers' generate_merges(vocab, vocab_scores): every split of every
 * token into two pieces that are both tokens, best score first (ties: longer
 * left piece, then longer right piece, then emission order).  score[i] is the
 * score of the token whose last occurrence is id i. */
static int generate_merges(tokenizer *t, const double *score, char *err, size_t errlen)
{
    gen_merge *all = NULL;
    size_t n = 0, cap = 0;
    uint32_t seq = 0;
    int rc = -1;
    /* Python visits each distinct piece once, in first-occurrence order; we
     * visit surviving ids in id order, which differs only for duplicated
     * pieces with tied scores. */
    for (size_t i = 0; i < t->n_ids; i++) {
        if (!t->id_str[i])
            continue;
        const char *s = t->id_str[i];
        size_t len = t->id_len[i];
        size_t base = n;
        for (size_t k = 1; k < len; k++) {
            if (((uint8_t)s[k] & 0xC0) == 0x80)
                continue;
            int32_t l = tk_strmap_get(&t->model.vocab, s, k), r = tk_strmap_get(&t->model.vocab, s + k, len - k);
            if (l < 0 || r < 0)
                continue;
            if (n == cap) {
                cap = cap ? cap * 2 : 1 << 16;
                gen_merge *p = realloc(all, cap * sizeof *p);
                if (!p)
                    goto oom;
                all = p;
            }
            all[n++] = (gen_merge){l, r, (int32_t)i, score[i], (uint32_t)cp_count(s, k), (uint32_t)cp_count(s + k, len - k), 0};
        }
        if (n > base + 1)
            qsort(all + base, n - base, sizeof *all, local_cmp);
        for (size_t k = base; k < n; k++)
            all[k].seq = seq++;
    }
    if (n)
        qsort(all, n, sizeof *all, gen_merge_cmp);
    if (tk_pairmap_init(&t->model.merges, n) != 0)
        goto oom;
    for (size_t k = 0; k < n; k++)
        if (tk_pairmap_put(&t->model.merges, all[k].l, all[k].r, (uint32_t)k, all[k].merged) != 0)
            goto oom;
    rc = 0;
    goto out;
oom:
    util_errf(err, errlen, "%s: out of memory deriving merges.", t->name);
out:
    free(all);
    return rc;
}

static node *mk(int kind)
{
    node *n = calloc(1, sizeof *n);
    if (n)
        n->kind = kind;
    return n;
}

static int mk_kids(node *n, size_t k)
{
    n->kids = calloc(k, sizeof *n->kids);
    n->n_kids = n->kids ? k : 0;
    return n->kids ? 0 : -1;
}

static int mk_literal(node *n, int kind, const char *pat, const char *content)
{
    n->kind = kind;
    n->has_pat = true;
    n->pat.literal = tk_dupn(pat, strlen(pat));
    n->pat.literal_len = strlen(pat);
    if (content) {
        n->str = tk_dupn(content, strlen(content));
        n->str_len = strlen(content);
    }
    return n->pat.literal && (!content || n->str) ? 0 : -1;
}

/* Pre-tokenizer for a byte-level GGUF vocabulary from tokenizer.ggml.pre. */
static int gguf_pretok(tokenizer *t, const char *pre, size_t pre_len, char *err, size_t errlen)
{
    static const struct {
        const char *name;
        const char *rx;
    } splits[] = {
        {"llama3", TK_LLAMA3_SPLIT},    {"llama-v3", TK_LLAMA3_SPLIT}, {"llama-bpe", TK_LLAMA3_SPLIT},
        {"falcon3", TK_LLAMA3_SPLIT},   {"falcon-h1", TK_LLAMA3_SPLIT}, {"pixtral", TK_LLAMA3_SPLIT},
        {"midm-2.0", TK_LLAMA3_SPLIT},  {"lfm2", TK_LLAMA3_SPLIT},      {"dbrx", TK_LLAMA3_SPLIT},
        {"smaug-bpe", TK_LLAMA3_SPLIT}, {"tekken", TK_TEKKEN_SPLIT},    {"qwen2", TK_QWEN2_SPLIT},
        {"deepseek-r1-qwen", TK_QWEN2_SPLIT}, {"megrez", TK_QWEN2_SPLIT}, {"gpt-4o", TK_GPT4O_SPLIT},
        {"llama4", TK_GPT4O_SPLIT},     {"minimax-m2", TK_GPT4O_SPLIT},
    };
    char where[256];
    snprintf(where, sizeof where, "%s: tokenizer.ggml.pre", t->name);
    const char *rx = NULL;
    for (size_t i = 0; i < sizeof splits / sizeof *splits && pre; i++)
        if (strlen(splits[i].name) == pre_len && memcmp(splits[i].name, pre, pre_len) == 0)
            rx = splits[i].rx;
    bool smollm = pre && pre_len == 6 && memcmp(pre, "smollm", 6) == 0;
    t->pretok = mk(PT_SEQ);
    if (!t->pretok || mk_kids(t->pretok, 2) != 0)
        return util_errf(err, errlen, "%s: out of memory.", t->name);
    node *a = &t->pretok->kids[0], *b = &t->pretok->kids[1];
    b->kind = PT_BYTELEVEL;
    if (rx) {
        /* Split(rx, Isolated) + ByteLevel(add_prefix_space=false, use_regex=false) */
        a->kind = PT_SPLIT;
        a->behavior = B_ISOLATED;
        if (tk_node_set_regex(a, rx, where, err, errlen) != 0)
            return -1;
        t->model.ignore_merges = rx == TK_LLAMA3_SPLIT;
        return 0;
    }
    /* smollm: Digits(individual) first; everything else: the GPT-2 ByteLevel split alone */
    if (smollm) {
        a->kind = PT_DIGITS;
        a->flag_a = true;
    } else {
        a->kind = PT_SEQ;
    }
    b->flag_b = true;
    return tk_node_set_regex(b, TK_GPT2_SPLIT, where, err, errlen);
}

int tokenizer_from_gguf(const gguf_file *f, tokenizer **out, char *err, size_t errlen)
{
    *out = NULL;
    const char *fname = f && f->path ? f->path : "gguf";
    tokenizer *t = NULL;
    double *score = NULL;
    sbuf key = {0};
    const char *model, *pre = NULL, *arch = NULL;
    size_t model_len, pre_len = 0, arch_len = 0;
    const char *tj;
    size_t tjl;
    /* spill pack embeds an HF checkpoint's tokenizer.json verbatim rather than re-deriving a GGUF vocabulary */
    if (f && !gguf_get(f, "tokenizer.ggml.model") && gguf_get_str(f, "spill.tokenizer.json", &tj, &tjl))
        return tokenizer_from_json(tj, tjl, fname, out, err, errlen);
    if (!f || !gguf_get_str(f, "tokenizer.ggml.model", &model, &model_len))
        return util_errf(err, errlen, "%s: key tokenizer.ggml.model is missing; this GGUF has no tokenizer.", fname);
    gguf_get_str(f, "tokenizer.ggml.pre", &pre, &pre_len);
    gguf_get_str(f, "general.architecture", &arch, &arch_len);
    bool gpt2 = model_len == 4 && !memcmp(model, "gpt2", 4);
    bool spm = model_len == 5 && !memcmp(model, "llama", 5);
    if (!gpt2 && !spm)
        return util_errf(err, errlen,
                         "%s: tokenizer.ggml.model \"%.*s\" is not supported (spill reads gpt2 and llama "
                         "vocabularies).",
                         fname, (int)(model_len > 40 ? 40 : model_len), model);
    const gguf_kv *tokens = gguf_get(f, "tokenizer.ggml.tokens");
    const gguf_kv *types = gguf_get(f, "tokenizer.ggml.token_type");
    const gguf_kv *scores = gguf_get(f, "tokenizer.ggml.scores");
    const gguf_kv *merges = gguf_get(f, "tokenizer.ggml.merges");
    if (!tokens || tokens->type != GGUF_V_ARRAY || tokens->arr_type != GGUF_V_STRING || tokens->arr_n == 0 ||
        tokens->arr_n >= (uint64_t)MAX_IDS)
        return util_errf(err, errlen, "%s: tokenizer.ggml.tokens must be a non-empty string array of fewer than %lld.",
                         fname, (long long)MAX_IDS);
    size_t n = (size_t)tokens->arr_n;
    if (types && (types->type != GGUF_V_ARRAY || types->arr_n != n || !numeric_array(types)))
        return util_errf(err, errlen, "%s: tokenizer.ggml.token_type must have one entry per token (%zu).", fname, n);
    if (scores && (scores->type != GGUF_V_ARRAY || scores->arr_n != n || !numeric_array(scores)))
        return util_errf(err, errlen, "%s: tokenizer.ggml.scores must have one entry per token (%zu).", fname, n);
    if (merges && (merges->type != GGUF_V_ARRAY || merges->arr_type != GGUF_V_STRING))
        return util_errf(err, errlen, "%s: tokenizer.ggml.merges must be a string array.", fname);
    bool gemma = spm && arch && ((arch_len == 5 && !memcmp(arch, "gemma", 5)) || (arch_len == 6 && !memcmp(arch, "gemma2", 6)) ||
                                 (arch_len == 6 && !memcmp(arch, "gemma3", 6)));
    bool phi3 = spm && arch && arch_len == 4 && !memcmp(arch, "phi3", 4);

    if (tk_alloc(&t, fname) != 0 || tk_ids_alloc(t, n) != 0 || tk_strmap_init(&t->model.vocab, n) != 0)
        goto oom;
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const char *s = gguf_arr_str(f, tokens, i, &len);
        if (!s) {
            util_errf(err, errlen, "%s: tokenizer.ggml.tokens[%zu] cannot be read.", fname, i);
            goto fail;
        }
        key.n = 0;
        if (gpt2 && !all_in_byte_alphabet(s, len)) {
            for (size_t k = 0; k < len; k++)
                if (sb_cp(&key, tk_byte_to_cp[(uint8_t)s[k]]) != 0)
                    goto oom;
        } else if (gemma && memchr(s, ' ', len) && util_utf8_valid(s, len)) {
            bool blank = true;
            for (size_t k = 0; k < len && blank;) {
                uint32_t cp;
                k += u8dec(s + k, len - k, &cp);
                blank = py_isspace(cp);
            }
            size_t ncp = cp_count(s, len);
            for (size_t k = 0; blank && k < ncp; k++)
                if (sb_add(&key, "\xE2\x96\x81", 3) != 0)
                    goto oom;
            if (!blank && sb_add(&key, s, len) != 0)
                goto oom;
        } else if (sb_add(&key, s, len) != 0)
            goto oom;
        if (tk_vocab_set(t, key.p ? key.p : "", key.n, (int32_t)i) != 0)
            goto oom;
    }
    tk_vocab_drop_shadowed(t);

    if (gpt2) {
        size_t nm = merges ? (size_t)merges->arr_n : 0;
        if (tk_pairmap_init(&t->model.merges, nm) != 0)
            goto oom;
        for (size_t r = 0; r < nm; r++) {
            size_t len;
            const char *s = gguf_arr_str(f, merges, r, &len);
            const char *sp = s ? memchr(s, ' ', len) : NULL;
            if (!sp || memchr(sp + 1, ' ', len - (size_t)(sp - s) - 1)) {
                util_errf(err, errlen, "%s: tokenizer.ggml.merges[%zu] must be two pieces separated by one space.",
                          fname, r);
                goto fail;
            }
            size_t ll = (size_t)(sp - s);
            int32_t a = tk_strmap_get(&t->model.vocab, s, ll), b = tk_strmap_get(&t->model.vocab, sp + 1, len - ll - 1);
            key.n = 0;
            if (sb_add(&key, s, ll) != 0 || sb_add(&key, sp + 1, len - ll - 1) != 0)
                goto oom;
            int32_t m = tk_strmap_get(&t->model.vocab, key.p, key.n);
            if (a < 0 || b < 0 || m < 0) {
                util_errf(err, errlen, "%s: tokenizer.ggml.merges[%zu] names a piece that is not a token.", fname, r);
                goto fail;
            }
            if (tk_pairmap_put(&t->model.merges, a, b, (uint32_t)r, m) != 0)
                goto oom;
        }
        if (gguf_pretok(t, pre, pre_len, err, errlen) != 0)
            goto fail;
        if (!(t->decoder = mk(DC_BYTELEVEL)))
            goto oom;
    } else {
        /* SentencePiece vocabulary as BPE with byte fallback; merges derived from
         * scores (Gemma: from token order, its scores do not follow merge order). */
        if (!gemma && !scores) {
            util_errf(err, errlen, "%s: tokenizer.ggml.scores is missing; a llama vocabulary needs it.", fname);
            goto fail;
        }
        score = malloc(n * sizeof *score);
        if (!score)
            goto oom;
        for (size_t i = 0; i < n; i++) {
            if (!t->id_str[i]) {
                score[i] = 0;
                continue;
            }
            /* dict(zip(tokens, scores)) keeps the last score of a duplicated piece,
             * which is this surviving (last) id's own */
            score[i] = gemma ? -(double)i : gguf_arr_num(scores, i);
            if (score[i] != score[i]) {
                util_errf(err, errlen, "%s: tokenizer.ggml.scores[%zu] is NaN.", fname, i);
                goto fail;
            }
        }
        if (generate_merges(t, score, err, errlen) != 0)
            goto fail;
        t->model.fuse_unk = true;
        t->model.byte_fallback = true;
        bool add_prefix = true;
        gguf_get_bool(f, "tokenizer.ggml.add_space_prefix", &add_prefix);
        if (gemma) {
            t->model.unk_id = tk_strmap_get(&t->model.vocab, "<unk>", 5);
            if (!(t->normalizer = mk(0)) || mk_literal(t->normalizer, NZ_REPLACE, " ", "\xE2\x96\x81") != 0)
                goto oom;
            if (!(t->pretok = mk(0)) || mk_literal(t->pretok, PT_SPLIT, " ", NULL) != 0)
                goto oom;
            t->pretok->behavior = B_MERGED_PREV;
        } else if (phi3) {
            if (!(t->normalizer = mk(NZ_SEQ)) || mk_kids(t->normalizer, 2) != 0)
                goto oom;
            t->normalizer->kids[0].kind = NZ_PREPEND;
            if (!(t->normalizer->kids[0].str = tk_dupn("\xE2\x96\x81", 3)))
                goto oom;
            t->normalizer->kids[0].str_len = 3;
            if (mk_literal(&t->normalizer->kids[1], NZ_REPLACE, " ", "\xE2\x96\x81") != 0)
                goto oom;
        } else {
            if (!(t->pretok = mk(0)) || mk_literal(t->pretok, PT_METASPACE, "\xE2\x96\x81", NULL) != 0)
                goto oom;
            t->pretok->cp = 0x2581;
            t->pretok->scheme = add_prefix ? PS_FIRST : PS_NEVER;
            t->pretok->flag_a = false;
        }
        bool strip = !gemma && add_prefix;
        if (!(t->decoder = mk(DC_SEQ)) || mk_kids(t->decoder, strip ? 4 : 3) != 0)
            goto oom;
        if (mk_literal(&t->decoder->kids[0], DC_REPLACE, "\xE2\x96\x81", " ") != 0)
            goto oom;
        t->decoder->kids[1].kind = DC_BYTEFALLBACK;
        t->decoder->kids[2].kind = DC_FUSE;
        if (strip) {
            t->decoder->kids[3].kind = DC_STRIP;
            t->decoder->kids[3].cp = ' ';
            t->decoder->kids[3].start = 1;
        }
    }

    /* Special ids, then control (3) tokens as special added tokens and
     * user-defined (4) ones as plain added tokens, as transformers does. */
    static const struct {
        const char *key;
        tok_special which;
    } sk[] = {{"tokenizer.ggml.bos_token_id", TOK_BOS},     {"tokenizer.ggml.eos_token_id", TOK_EOS},
              {"tokenizer.ggml.eot_token_id", TOK_EOT},     {"tokenizer.ggml.eom_token_id", TOK_EOM},
              {"tokenizer.ggml.unknown_token_id", TOK_UNK}, {"tokenizer.ggml.padding_token_id", TOK_PAD}};
    for (size_t i = 0; i < sizeof sk / sizeof *sk; i++) {
        uint64_t v;
        if (gguf_get_u64(f, sk[i].key, &v) && v < n)
            t->special[sk[i].which] = (int32_t)v;
    }
    for (size_t i = 0; types && i < n; i++) {
        double tyd = gguf_arr_num(types, i);
        int ty = tyd >= 0 && tyd <= 16 ? (int)tyd : 0;
        size_t len;
        const char *s = gguf_arr_str(f, tokens, i, &len);
        if (ty == 3 && (!gpt2 || all_in_byte_alphabet(s, len))) {
            if (tk_added_add(t, s, len, -1, true, false, false, false, false) != 0)
                goto oom;
        } else if (ty == 4 && tk_strmap_get(&t->model.vocab, s, len) >= 0) {
            if (tk_added_add(t, s, len, -1, false, false, false, false, false) != 0)
                goto oom;
        }
    }
    /* transformers also registers bos/eos/unk/pad as special tokens */
    for (int w = 0; w < TOK_SPECIAL_COUNT; w++) {
        int32_t id = t->special[w];
        if ((w == TOK_BOS || w == TOK_EOS || w == TOK_UNK || w == TOK_PAD) && id >= 0 && t->id_str[id] &&
            tk_strmap_get(&t->added_map, t->id_str[id], t->id_len[id]) < 0 &&
            (!gpt2 || all_in_byte_alphabet(t->id_str[id], t->id_len[id])))
            if (tk_added_add(t, t->id_str[id], t->id_len[id], -1, true, false, false, false, false) != 0)
                goto oom;
    }
    bool add_bos = spm, add_eos = false;
    gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &add_bos);
    gguf_get_bool(f, "tokenizer.ggml.add_eos_token", &add_eos);
    if (add_bos && t->special[TOK_BOS] >= 0 && tk_post_push(&t->post_pre, &t->n_post_pre, t->special[TOK_BOS]) != 0)
        goto oom;
    if (add_eos && t->special[TOK_EOS] >= 0 && tk_post_push(&t->post_post, &t->n_post_post, t->special[TOK_EOS]) != 0)
        goto oom;
    if (tk_finish_load(t, err, errlen) != 0)
        goto fail;
    free(score);
    free(key.p);
    *out = t;
    return 0;
oom:
    util_errf(err, errlen, "%s: out of memory building the tokenizer.", fname);
fail:
    free(score);
    free(key.p);
    tokenizer_free(t);
    return -1;
}
