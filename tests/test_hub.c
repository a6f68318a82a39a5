/*
 * test_hub.c — hub downloads (model/hub.c) through the real binary against tests/hub_server.py, a local
 * stand-in for the Hugging Face Hub started on a free port (its request log says what the binary asked for),
 * and the size estimate (model/size.c) against real files.
 *
 *   - plain download of test/tiny: exactly the files a run needs (not the repo's expected.json), each
 *     byte-identical to the fixture, no .partial or in-progress marker left; `spill run` answers a row on it;
 *   - a second run asks the server nothing; `@rev` gets its own directory and asks for that revision;
 *   - the curated tag qwen2.5:0.5b downloads its repo into the repo's directory; `spill models` lists it;
 *   - org/name:QUANT picks the one GGUF file; a quant the repo lacks is named with the ones it has;
 *   - gated: 401 without a token (66, the sentence names HF_TOKEN), then success with HF_TOKEN and with the token
 *     file under HF_HOME;
 *   - 404 repo and 404 revision sentences (66);
 *   - a checksum that never matches: fetched twice, removed, exit 74; one that fails once: fetched again, good;
 *   - a connection dropped halfway: resumed with a Range request, the file identical; a .partial left by an
 *     earlier run (Ctrl-C) is resumed the same way;
 *   - a 302 to an LFS path is followed;
 *   - an unsupported architecture and a download larger than the free disk (SPILL_TEST_FREE_BYTES) are refused
 *     before any weight file is requested (65, 73);
 *   - nothing listening: exit 69 and the offline form of the command; HF_HUB_OFFLINE=1: the not-downloaded
 *     sentence naming the directory, no request;
 *   - `spill models show` of a repo not here reads only its config.json;
 *   - model_param_count from each reference model's config.json equals the element count of its safetensors.
 */
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/util.h"
#include "cli.h"
#include "model/model.h"
#include "model/size.h"
#include "test.h"

#define HF_FIXTURE "tests/data/prompt/hf-nobos"
#define GGUF_FIXTURE "tests/data/tiny/tiny-smollm2.gguf"

static char tmp[256], logpath[512], home[512], env[2048];
static int port;
static pid_t server;
static int server_out = -1;

static int start_server(void)
{
    int fds[2];
    if (pipe(fds) != 0)
        return -1;
    server = fork();
    if (server == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        execlp("python3", "python3", "tests/hub_server.py", logpath, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    char buf[32] = "";
    ssize_t n = read(fds[0], buf, sizeof buf - 1);
    server_out = fds[0]; /* kept open until the server is stopped: it may still be flushing its line */
    port = n > 0 ? atoi(buf) : 0;
    return port > 0 ? 0 : -1;
}

/* A TCP port nothing listens on (bound, then closed). */
static int dead_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    int p = 0;
    if (s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(s, (struct sockaddr *)&a, &l) == 0)
        p = ntohs(a.sin_port);
    close(s);
    return p;
}

/* Lines of the server's log containing needle (all lines when NULL). */
static int requests(const char *needle)
{
    FILE *f = fopen(logpath, "r");
    char line[4096];
    int n = 0;
    while (f && fgets(line, sizeof line, f))
        n += !needle || strstr(line, needle) != NULL;
    if (f)
        fclose(f);
    return n;
}

static void clear_log(void)
{
    FILE *f = fopen(logpath, "w");
    if (f)
        fclose(f);
}

/* Runs `spill ARGS` with the test's environment plus extra; stderr into tmp/err.txt; the exit code. */
static int spill(const char *extra, const char *args)
{
    return sh("%s %s %s %s >%s/out.txt 2>%s/err.txt", env, extra, bin(), args, tmp, tmp);
}

static bool err_has(const char *needle)
{
    char p[512], *buf = NULL;
    size_t len;
    snprintf(p, sizeof p, "%s/err.txt", tmp);
    if (util_read_file(p, 1 << 20, &buf, &len, NULL, 0) != 0)
        return false;
    bool hit = strstr(buf, needle) != NULL;
    if (!hit)
        fprintf(stderr, "  (stderr was: %s)\n", buf);
    free(buf);
    return hit;
}

static bool same_file(const char *a, const char *b)
{
    return sh("cmp -s '%s' '%s'", a, b) == 0;
}

/* The repo directory of org--name[@rev] under the test's SPILL_HOME. */
static const char *repo_dir(const char *name)
{
    static char d[1024];
    snprintf(d, sizeof d, "%s/models/hf/%s", home, name);
    return d;
}

static bool exists(const char *dir, const char *name)
{
    char p[1536];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat st;
    return stat(p, &st) == 0;
}

static void check_hf_copy(const char *what, const char *dir)
{
    static const char *const files[] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char a[1536], b[512];
        snprintf(a, sizeof a, "%s/%s", dir, files[i]);
        snprintf(b, sizeof b, HF_FIXTURE "/%s", files[i]);
        CHECK(same_file(a, b), "%s: %s is not byte-identical to the fixture", what, files[i]);
    }
    CHECK(!exists(dir, "expected.json"), "%s: downloaded expected.json, which no run reads", what);
    CHECK(!exists(dir, "model.safetensors.partial"), "%s: a .partial is left", what);
    CHECK(!exists(dir, ".spill-download"), "%s: the in-progress marker is left", what);
    CHECK(exists(dir, ".spill-hub.json"), "%s: no .spill-hub.json record", what);
}

static void test_plain_and_again(void)
{
    clear_log();
    int rc = spill("", "tokenize test/tiny hello");
    CHECK(rc == 0, "first download of test/tiny: exit %d", rc);
    check_hf_copy("test/tiny", repo_dir("test--tiny"));
    CHECK(requests("/resolve/main/model.safetensors") == 1, "model.safetensors asked %d times",
          requests("/resolve/main/model.safetensors"));
    CHECK(err_has("llama (supported)") && err_has("bf16"), "the pre-download line names the state and sizes");

    /* a row runs on the downloaded directory */
    char in[512], out[512], res[600];
    snprintf(in, sizeof in, "%s/in.jsonl", tmp);
    snprintf(out, sizeof out, "%s/job", tmp);
    FILE *f = fopen(in, "w");
    if (f) {
        fputs("{\"custom_id\":\"r1\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"m\","
              "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":4}}\n",
              f);
        fclose(f);
    }
    clear_log();
    char args[1200];
    snprintf(args, sizeof args, "run test/tiny %s -o %s --quiet", in, out);
    rc = spill("", args);
    snprintf(res, sizeof res, "%s/results.jsonl", out);
    json_t *lines = read_lines(res);
    CHECK(rc == 0 && json_array_size(lines) == 1, "spill run on the download: exit %d, %zu result lines", rc,
          json_array_size(lines));
    json_decref(lines);
    CHECK(requests(NULL) == 0, "a second run asked the hub %d times, want 0", requests(NULL));

    clear_log();
    rc = spill("", "tokenize test/tiny@v1 hello");
    CHECK(rc == 0, "test/tiny@v1: exit %d", rc);
    check_hf_copy("test/tiny@v1", repo_dir("test--tiny@v1"));
    CHECK(requests("/api/models/test/tiny/revision/v1") == 1 && requests("/resolve/v1/model.safetensors") == 1,
          "@v1 asked for revision v1");
}

static void test_tag_and_gguf(void)
{
    clear_log();
    int rc = spill("", "tokenize qwen2.5:0.5b hello");
    CHECK(rc == 0, "curated tag qwen2.5:0.5b: exit %d", rc);
    check_hf_copy("qwen2.5:0.5b", repo_dir("Qwen--Qwen2.5-0.5B-Instruct"));
    CHECK(requests("/api/models/Qwen/Qwen2.5-0.5B-Instruct/revision/main") == 1, "the tag asked for its repo");
    rc = spill("", "models");
    char p[512], *buf = NULL;
    size_t len;
    snprintf(p, sizeof p, "%s/out.txt", tmp);
    CHECK(rc == 0 && util_read_file(p, 1 << 20, &buf, &len, NULL, 0) == 0, "spill models: exit %d", rc);
    CHECK(buf && strstr(buf, "qwen2.5:0.5b") && strstr(buf, "downloaded") && strstr(buf, "test/tiny@v1") &&
              strstr(buf, "qwen2.5:32b") && strstr(buf, "65.5 GB"),
          "spill models lists the tags with sizes and the local models:\n%s", buf ? buf : "");
    free(buf);

    clear_log();
    rc = spill("", "tokenize test/gguf:Q8_0 hello");
    char g[1536];
    snprintf(g, sizeof g, "%s/tiny-smollm2.Q8_0.gguf", repo_dir("test--gguf"));
    CHECK(rc == 0 && same_file(g, GGUF_FIXTURE), "test/gguf:Q8_0: exit %d, file identical", rc);
    CHECK(!exists(repo_dir("test--gguf"), "README.md"), "the GGUF form downloaded the README");
    clear_log();
    rc = spill("", "tokenize test/gguf:Q8_0 hello");
    CHECK(rc == 0 && requests(NULL) == 0, "a second run of test/gguf:Q8_0: exit %d, %d requests", rc, requests(NULL));
    rc = spill("", "tokenize test/gguf:Q5_K hello");
    CHECK(rc == 66 && err_has("no .gguf file for Q5_K") && err_has("tiny-smollm2.Q8_0.gguf"),
          "a quant the repo lacks: exit %d", rc);
}

static void test_gated(void)
{
    clear_log();
    int rc = spill("", "tokenize test/gated hello");
    CHECK(rc == 66 && err_has("gated") && err_has("HF_TOKEN"), "gated without a token: exit %d", rc);
    CHECK(requests("/resolve/") == 0, "gated: a file was requested without access");
    rc = spill("HF_TOKEN=hf_test_token", "tokenize test/gated hello");
    CHECK(rc == 0, "gated with HF_TOKEN: exit %d", rc);
    check_hf_copy("test/gated", repo_dir("test--gated"));
    CHECK(requests("Bearer hf_test_token") >= 5, "the token went with every request");

    /* the token file huggingface_hub's login writes, under HF_HOME */
    sh("rm -rf '%s'", repo_dir("test--gated"));
    char hfh[512], extra[700];
    snprintf(hfh, sizeof hfh, "%s/hf-with-token", tmp);
    sh("mkdir -p '%s' && printf 'hf_test_token\\n' > '%s/token'", hfh, hfh);
    snprintf(extra, sizeof extra, "HF_HOME='%s'", hfh);
    rc = spill(extra, "tokenize test/gated hello");
    CHECK(rc == 0, "gated with the token file: exit %d", rc);
}

static void test_not_found(void)
{
    int rc = spill("", "tokenize test/nope hello");
    CHECK(rc == 66 && err_has("no such model repository"), "404 repo: exit %d", rc);
    rc = spill("", "tokenize test/tiny@nope hello");
    CHECK(rc == 66 && err_has("has no revision 'nope'"), "404 revision: exit %d", rc);
}

static void test_broken_copies(void)
{
    clear_log();
    int rc = spill("", "tokenize test/badsum hello");
    CHECK(rc == 74 && err_has("twice") && err_has("removed"), "a checksum that never matches: exit %d", rc);
    CHECK(requests("/test/badsum/resolve/main/model.safetensors") == 2, "fetched %d times, want 2",
          requests("/test/badsum/resolve/main/model.safetensors"));
    CHECK(!exists(repo_dir("test--badsum"), "model.safetensors") &&
              !exists(repo_dir("test--badsum"), "model.safetensors.partial"),
          "the broken file was kept");

    clear_log();
    rc = spill("", "tokenize test/flaky hello");
    CHECK(rc == 0 && err_has("fetching it again"), "a checksum that fails once: exit %d", rc);
    check_hf_copy("test/flaky", repo_dir("test--flaky"));
    CHECK(requests("/test/flaky/resolve/main/model.safetensors") == 2, "flaky fetched %d times, want 2",
          requests("/test/flaky/resolve/main/model.safetensors"));

    clear_log();
    rc = spill("", "tokenize test/drop hello");
    CHECK(rc == 0, "a connection dropped mid-file: exit %d", rc);
    check_hf_copy("test/drop", repo_dir("test--drop"));
    CHECK(requests("\"range\": \"bytes=194680-\"") == 1, "the retry asked for the rest with Range (%d)",
          requests("\"range\": \"bytes="));

    clear_log();
    rc = spill("", "tokenize test/redirect hello");
    CHECK(rc == 0 && requests("/lfs/") == 1, "a 302 to LFS storage: exit %d, %d LFS requests", rc, requests("/lfs/"));
    check_hf_copy("test/redirect", repo_dir("test--redirect"));

    /* what an interrupted run (Ctrl-C) left: half the file as .partial and the marker */
    sh("rm -rf '%s' && mkdir -p '%s' && head -c 100000 " HF_FIXTURE "/model.safetensors > "
       "'%s/model.safetensors.partial' && echo x > '%s/.spill-download'",
       repo_dir("test--tiny"), repo_dir("test--tiny"), repo_dir("test--tiny"), repo_dir("test--tiny"));
    clear_log();
    rc = spill("", "tokenize test/tiny hello");
    CHECK(rc == 0 && requests("\"range\": \"bytes=100000-\"") == 1, "a .partial is resumed: exit %d", rc);
    check_hf_copy("test/tiny resumed", repo_dir("test--tiny"));
}

static void test_refusals(void)
{
    clear_log();
    int rc = spill("", "tokenize test/mamba hello");
    CHECK(rc == 65 && err_has("'mamba' model") && err_has("Nothing was downloaded"), "unsupported: exit %d", rc);
    CHECK(requests(".safetensors") == 0, "an unsupported model's weights were requested");
    CHECK(!exists(repo_dir(""), "test--mamba"), "the refused download left its directory");

    clear_log();
    sh("rm -rf '%s'", repo_dir("test--tiny"));
    rc = spill("SPILL_TEST_FREE_BYTES=1000", "tokenize test/tiny hello");
    CHECK(rc == 73 && err_has("free") && err_has("SPILL_HOME"), "not enough disk: exit %d", rc);
    CHECK(requests(".safetensors") == 0, "weights were requested for a download that does not fit");

    char extra[128];
    snprintf(extra, sizeof extra, "HF_ENDPOINT=http://127.0.0.1:%d", dead_port());
    rc = spill(extra, "tokenize test/tiny hello");
    CHECK(rc == 69 && err_has("cannot reach the model hub") && err_has("HF_HUB_OFFLINE=1") &&
              err_has(repo_dir("test--tiny")),
          "network down: exit %d", rc);

    clear_log();
    rc = spill("HF_HUB_OFFLINE=1", "tokenize test/tiny hello");
    CHECK(rc == 66 && err_has("HF_HUB_OFFLINE") && err_has(repo_dir("test--tiny")) && requests(NULL) == 0,
          "offline: exit %d", rc);

    clear_log();
    rc = spill("", "models show test/tiny");
    CHECK(rc == 0 && requests(NULL) == 1 && requests("/resolve/main/config.json") == 1,
          "models show of a repo not here: exit %d, %d requests", rc, requests(NULL));
    char p[512], *buf = NULL;
    size_t len;
    snprintf(p, sizeof p, "%s/out.txt", tmp);
    CHECK(util_read_file(p, 1 << 20, &buf, &len, NULL, 0) == 0 && strstr(buf, "llama (supported") &&
              strstr(buf, "q8 "),
          "models show prints the state and sizes:\n%s", buf ? buf : "");
    free(buf);
    CHECK(!exists(repo_dir(""), "test--tiny"), "models show downloaded the repo");
}

/* The estimate counts exactly the weights the reference models' files hold. */
static void test_param_counts(void)
{
    DIR *d = opendir("tests/data/ref");
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char dir[512], cfgp[600], err[SPILL_ERRLEN];
        snprintf(dir, sizeof dir, "tests/data/ref/%s", e->d_name);
        if (!util_is_dir(dir))
            continue;
        snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
        json_t *cfg = json_load_file(cfgp, 0, NULL);
        model_shape s;
        model_desc *m = NULL;
        if (!cfg || model_shape_from_config(cfg, cfgp, &s, err, sizeof err) || model_open(dir, &m, err, sizeof err)) {
            CHECK(0, "%s: %s", dir, err);
            json_decref(cfg);
            continue;
        }
        uint64_t elems = 0;
        for (size_t i = 0; i < m->n_tensors; i++) {
            uint64_t x = 1;
            for (uint32_t k = 0; k < m->tensors[i].n_dims; k++)
                x *= m->tensors[i].ne[k];
            elems += x;
        }
        CHECK(model_param_count(&s) == elems, "%s: estimated %llu weights, the file has %llu", dir,
              (unsigned long long)model_param_count(&s), (unsigned long long)elems);
        model_shape sd;
        model_shape_from_desc(m, &sd);
        CHECK(model_param_count(&sd) == elems, "%s: from the description %llu weights, the file has %llu", dir,
              (unsigned long long)model_param_count(&sd), (unsigned long long)elems);
        n++;
        model_close(m);
        json_decref(cfg);
    }
    if (d)
        closedir(d);
    CHECK(n >= 10, "only %d reference models", n);
    /* bytes per weight: 1,000 × 1,024-wide rows as the only matrix weights would be */
    model_shape s = {.arch = "llama", .n_layers = 0, .d_model = 1024, .vocab = 1000, .tied_embeddings = true};
    CHECK(model_size_estimate(&s, SIZE_BF16) == 2 * 1024000ull + 2 * 1024, "bf16 size");
    CHECK(model_size_estimate(&s, SIZE_Q8) == 1024000ull / 32 * 34 + 4 * 1024, "q8 size");
    CHECK(model_size_estimate(&s, SIZE_Q4) == 1024000ull / 32 * 20 + 4 * 1024, "q4 size");
}

int main(void)
{
    snprintf(tmp, sizeof tmp, "/tmp/spill_test_hub_%d", (int)getpid());
    snprintf(logpath, sizeof logpath, "%s/requests.log", tmp);
    snprintf(home, sizeof home, "%s/home", tmp);
    sh("rm -rf '%s' && mkdir -p '%s/hf-empty'", tmp, tmp);
    test_param_counts();
    if (start_server() != 0) {
        CHECK(0, "tests/hub_server.py did not start");
        return test_finish("test_hub");
    }
    /* every variable the hub reads is set or cleared, so the machine's own token or mirror never leaks in */
    snprintf(env, sizeof env,
             "env -u HF_TOKEN -u HF_TOKEN_PATH -u HF_HUB_OFFLINE -u XDG_CACHE_HOME HF_HOME='%s/hf-empty' "
             "HF_ENDPOINT=http://127.0.0.1:%d SPILL_HOME='%s'",
             tmp, port, home);
    test_plain_and_again();
    test_tag_and_gguf();
    test_gated();
    test_not_found();
    test_broken_copies();
    test_refusals();
    kill(server, SIGTERM);
    waitpid(server, NULL, 0);
    close(server_out);
    if (!test_failures)
        sh("rm -rf '%s'", tmp);
    return test_finish("test_hub");
}
