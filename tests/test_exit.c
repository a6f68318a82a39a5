/*
 * test_exit.c — exit codes (base/exit.h) through the real binary
 * (build/asan/spill, or $SPILL_BIN).
 *
 * Expectations, fixed before running:
 *   - bad arguments are 2 for every command, with a usage line or a sentence
 *     on stderr and nothing on stdout's first line that looks like success;
 *   - an unknown command is 2, a command not built yet 69;
 *   - set-up errors exit before a job exists (no job directory is created)
 *     with a non-75 code: --gpu on a build without CUDA (2), --kv-dtype on
 *     the CPU engine (2), a model whose architecture is not wired into the
 *     engine (65: the tiny model relabelled mamba), a
 *     --mem-budget too small for the longest row (2);
 *   - `spill resume` of a directory that is no job is 66, never 75;
 *   - 75 is left to interruptions and GPU faults (test_run checks SIGINT);
 *   - `spill run --help` and `spill resume --help` exit 0 and list every
 *     option, each of which the parser takes (issue 16, item 5).
 */
#include <errno.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/util.h"
#include "test.h"

#define MODEL "tests/data/tiny/tiny-smollm2.gguf"
#define INPUT "examples/sample-20.jsonl"

static char root[] = "/tmp/spill-test-exit-XXXXXX";

static const char *bin(void)
{
    const char *b = getenv("SPILL_BIN");
    return b && *b ? b : "build/asan/spill";
}

/* Runs bin() with argv (NULL-terminated, argv[0] ignored); returns the exit code (-1 when it died by a
 * signal) and leaves its stderr in root/stderr.txt. */
static int run(const char *const *argv)
{
    char errp[PATH_MAX];
    snprintf(errp, sizeof errp, "%s/stderr.txt", root);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stdout) || !freopen(errp, "w", stderr))
            _exit(127);
        execv(bin(), (char *const *)argv);
        _exit(127);
    }
    int st;
    if (pid < 0 || waitpid(pid, &st, 0) != pid)
        return -2;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static bool stderr_has(const char *needle)
{
    char path[PATH_MAX], *text = NULL, err[SPILL_ERRLEN];
    size_t n = 0;
    snprintf(path, sizeof path, "%s/stderr.txt", root);
    if (util_read_file(path, 1 << 20, &text, &n, err, sizeof err))
        return false;
    bool ok = strstr(text, needle) != NULL;
    free(text);
    return ok;
}

static bool exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

#define RUN(...) run((const char *const[]){"spill", __VA_ARGS__, NULL})

static void test_bad_arguments(void)
{
    struct {
        const char *const argv[6];
    } cases[] = {
        {{"run", MODEL, INPUT, "--no-such-option"}},
        {{"run", MODEL}},
        {{"run", MODEL, INPUT, "--batch", "zero"}},
        {{"resume", "--no-such-option"}},
        {{"resume"}},
        {{"check", "--no-such-option"}},
        {{"check"}},
        {{"models", "--no-such-option"}},
        {{"models", "show"}},
        {{"probe", "--no-such-option"}},
        {{"pack", MODEL, "--no-such-option"}},
        {{"pack", MODEL, "--quant", "q3", "-o", "/tmp/x.gguf"}},
        {{"synth", "--no-such-option"}},
        {{"tokenize", MODEL}},
        {{"tokenize", MODEL, "hi", "--no-such-option"}},
        {{"template", MODEL}},
        {{"template", MODEL, "examples/messages.json", "--no-such-option"}},
        {{"no-such-command"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *argv[8] = {"spill"};
        char shown[256] = "";
        for (int a = 0; a < 6 && cases[i].argv[a]; a++) {
            argv[a + 1] = cases[i].argv[a];
            snprintf(shown + strlen(shown), sizeof shown - strlen(shown), " %s", cases[i].argv[a]);
        }
        int rc = run(argv);
        CHECK(rc == 2, "spill%s: exit %d, want 2 (bad arguments)", shown, rc);
        CHECK(stderr_has("usage") || stderr_has("spill"), "spill%s: nothing on stderr says why", shown);
    }
    CHECK(RUN("serve") == 2, "spill serve without --model: want 2 (usage)");
    CHECK(RUN("serve", "--model", "m", "--bogus") == 2, "spill serve --bogus: want 2 (usage)");
    { /* the worker's commands are tab-separated paths under the store: a store path with a tab is refused */
        const char *home = getenv("SPILL_HOME");
        char *saved = home ? strdup(home) : NULL;
        setenv("SPILL_HOME", "/tmp/spill-test-exit\twith-tab", 1);
        CHECK(RUN("serve", "--model", MODEL, "--port", "18765") == 2 && stderr_has("tab or line break"),
              "spill serve under a SPILL_HOME with a tab: want 2 and a sentence");
        if (saved)
            setenv("SPILL_HOME", saved, 1);
        else
            unsetenv("SPILL_HOME");
        free(saved);
    }
    CHECK(RUN("distill") == 2, "spill distill without MODEL INPUT: want 2 (usage)");
}

/* A set-up refusal: the code, a sentence, and no job directory left behind. */
static void expect_setup_refusal(const char *what, int want, const char *needle, const char *const *argv,
                                 const char *dir)
{
    int rc = run(argv);
    CHECK(rc == want, "%s: exit %d, want %d", what, rc, want);
    CHECK(!needle || stderr_has(needle), "%s: stderr lacks \"%s\"", what, needle);
    CHECK(!stderr_has("resumable"), "%s: a set-up error was called resumable", what);
    char m[PATH_MAX];
    snprintf(m, sizeof m, "%s/manifest.json", dir);
    CHECK(!exists(m), "%s: a job was created at %s", what, dir);
}

/* Writes MODEL with its architecture renamed mamba: the value of general.architecture and the prefix of its
 * nine llama.* keys are the only "llama" bytes in the file, and "mamba" has the same length, so every offset
 * stays valid.  The vocabulary and template stay, so the refusal comes from the architecture alone. */
static bool write_mamba(const char *path)
{
    char err[SPILL_ERRLEN];
    char *d = NULL;
    size_t n = 0, hits = 0;
    if (util_read_file(MODEL, 1u << 26, &d, &n, err, sizeof err)) {
        CHECK(0, "%s", err);
        return false;
    }
    for (size_t i = 0; i + 5 <= n; i++)
        if (!memcmp(d + i, "llama", 5)) {
            memcpy(d + i, "mamba", 5);
            hits++;
        }
    FILE *f = fopen(path, "wb");
    bool ok = hits == 10 && f && fwrite(d, 1, n, f) == n;
    if (f)
        ok &= fclose(f) == 0;
    free(d);
    CHECK(ok, "%s: %zu \"llama\" strings (want 10) or cannot write %s", MODEL, hits, path);
    return ok;
}

static void test_setup_errors(void)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/job-gpu", root);
    expect_setup_refusal("--gpu on a CPU build", 2, "without CUDA",
                         (const char *const[]){"spill", "run", MODEL, INPUT, "-o", dir, "--gpu", "--quiet", NULL}, dir);
    snprintf(dir, sizeof dir, "%s/job-kv", root);
    expect_setup_refusal("--kv-dtype on the CPU", 2, "--kv-dtype",
                         (const char *const[]){"spill", "run", MODEL, INPUT, "-o", dir, "--kv-dtype", "int8", "--quiet",
                                               NULL},
                         dir);
    snprintf(dir, sizeof dir, "%s/job-budget", root);
    expect_setup_refusal("a budget below the fixed costs", 2, "--mem-budget",
                         (const char *const[]){"spill", "run", MODEL, INPUT, "-o", dir, "--mem-budget", "20M", "--quiet",
                                               NULL},
                         dir);
    /* An architecture the engine does not run: the tiny model relabelled mamba, a family spill will never run. */
    char mamba[PATH_MAX];
    snprintf(mamba, sizeof mamba, "%s/tiny-mamba.gguf", root);
    snprintf(dir, sizeof dir, "%s/job-arch", root);
    if (write_mamba(mamba))
        expect_setup_refusal("an architecture the engine does not run", 65, "architecture mamba is not supported",
                             (const char *const[]){"spill", "run", mamba, INPUT, "-o", dir, "--quiet", NULL}, dir);

    snprintf(dir, sizeof dir, "%s/not-a-job", root);
    mkdir(dir, 0755);
    int rc = RUN("resume", dir);
    CHECK(rc == 66, "resume of a directory that holds no job: exit %d, want 66", rc);
}

/* spill run --help, spill resume --help and spill distill --help list every option, one line each, and the
 * parser takes every option listed (the list and the parser read one table: this checks it from the outside);
 * distill's own options are not run's. */
static void test_help(void)
{
    static const char *const cmds[] = {"run", "resume", "distill"};
    for (int ci = 0; ci < 3; ci++) {
        const char *cn = cmds[ci];
        bool resume = ci == 1;
        char cmd[PATH_MAX + 64], line[512];
        snprintf(cmd, sizeof cmd, "%s %s --help", bin(), cn);
        FILE *f = popen(cmd, "r");
        CHECK(f != NULL, "popen %s", cmd);
        if (!f)
            continue;
        int listed = 0, taken = 0;
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "  -", 3))
                continue;
            char opt[64] = "", arg[64] = "";
            if (sscanf(line, " %63[^ ,] %63s", opt, arg) < 1 || !strcmp(opt, "--help"))
                continue;
            listed++;
            const char *val = !strcmp(arg, "N") || !strcmp(arg, "K") ? "1"
                              : !strcmp(arg, "BYTES") ? "1M"
                              : !strcmp(arg, "bf16|int8") ? "int8"
                              : !strcmp(arg, "bf16|q8|q4|fp8|auto") ? "q8"
                              : !strcmp(arg, "on|off") || !strcmp(arg, "lookup|off") || !strcmp(arg, "lookup|off|draft:MODEL") ? "off"
                              : !strcmp(arg, "last|mean|cls") ? "mean"
                              : (!strcmp(arg, "DIR") || !strcmp(arg, "FILE")) ? "/tmp/spill-test-exit-none"
                                                                                : NULL;
            int rc = resume ? (val ? RUN("resume", "/no/such/job", opt, val) : RUN("resume", "/no/such/job", opt))
                            : (val ? RUN(cn, "/no/such/model.gguf", "/no/such/in.jsonl", opt, val)
                                   : RUN(cn, "/no/such/model.gguf", "/no/such/in.jsonl", opt));
            bool ok = rc >= 0 && !stderr_has("is not an option") && !stderr_has("needs a value");
            CHECK(ok, "spill %s --help lists %s, but the parser refuses it", cn, opt);
            taken += ok;
        }
        int st = pclose(f);
        CHECK(st == 0, "spill %s --help exits %d", cn, st);
        int want = resume ? 18 : ci == 2 ? 23 : 19;
        CHECK(listed >= want, "spill %s --help lists only %d options", cn, listed);
        fprintf(stderr, "spill %s --help: %d options listed, %d taken by the parser\n", cn, listed, taken);
    }
    /* distill's options are its own */
    int rc = RUN("run", "/no/such/model.gguf", "/no/such/in.jsonl", "--score");
    CHECK(rc == 2 && stderr_has("is not an option of spill run"), "spill run --score: exit %d, want 2 with a sentence",
          rc);
}

/* Every other command: --help exits 0 and lists options one a line (at least --help itself), and an option the
 * command does not have is named in one sentence with exit 2 (issue 16 item 5). */
static void test_help_all(void)
{
    static const char *const cmds[] = {"check", "runs", "models", "adapters", "probe", "synth", "pack",
                                       "tokenize", "template", "eval", "bench", "serve"};
    for (size_t ci = 0; ci < sizeof cmds / sizeof cmds[0]; ci++) {
        char cmd[PATH_MAX + 64], line[512];
        snprintf(cmd, sizeof cmd, "%s %s --help", bin(), cmds[ci]);
        FILE *f = popen(cmd, "r");
        CHECK(f != NULL, "popen %s", cmd);
        if (!f)
            continue;
        int listed = 0;
        while (fgets(line, sizeof line, f))
            listed += !strncmp(line, "  -", 3);
        int st = pclose(f);
        CHECK(st == 0 && listed >= 1, "spill %s --help: exit %d, %d option lines", cmds[ci], st, listed);
        int rc = RUN(cmds[ci], "--no-such-option");
        CHECK(rc == 2 && stderr_has("--no-such-option"), "spill %s --no-such-option: exit %d, want 2 naming it",
              cmds[ci], rc);
    }
    int rc = RUN("check", "--endpoint", "/v1/responses", "in.jsonl");
    CHECK(rc == 2 && stderr_has("--endpoint"), "spill check --endpoint /v1/responses: exit %d, want 2", rc);
}

int main(void)
{
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    test_bad_arguments();
    test_help();
    test_help_all();
    test_setup_errors();
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", root);
    return test_finish("test_exit");
}
