/*
 * test_serve.c — `spill serve` end to end: starts nothing itself but tests/serve_client.py, which runs the
 * binary (build/asan/spill, or $SPILL_BIN) on the tiny model with its own SPILL_HOME under a fresh temporary
 * directory and a free port, and drives it with the official `openai` client: upload, create, poll, download
 * output and error files, list with pagination, validation errors with line numbers, cancel mid-run, delete;
 * abuse (no key, wrong key, a world-readable keys file, 413 by Content-Length and through the client,
 * malformed and non-multipart uploads, ids with ../ and %00, a slow client holding a connection while a batch
 * runs); kill -9 of the server mid-batch and a restart giving the same answers, no row lost or twice.
 * The Python is $SPILL_PYTHON, else .venv/bin/python (tools/setup.sh installs openai there); without an
 * importable openai the test says so and passes, as the hub tests do without their helper.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cli.h"

static int free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t n = sizeof a;
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) || getsockname(s, (struct sockaddr *)&a, &n))
        return -1;
    close(s);
    return ntohs(a.sin_port);
}

int main(void)
{
    const char *py = getenv("SPILL_PYTHON");
    if (!py || !*py)
        py = ".venv/bin/python";
    if (sh("%s -c 'import openai' >/dev/null 2>&1", py)) {
        printf("SKIP: %s cannot import openai (tools/setup.sh installs it in .venv)\n", py);
        return 0;
    }
    char dir[] = "/tmp/spill-test-serve-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    int port = free_port();
    if (port <= 0) {
        fprintf(stderr, "no free port\n");
        return 1;
    }
    int rc = sh("%s tests/serve_client.py %s tests/data/tiny/tiny-smollm2.gguf %d %s", py, bin(), port, dir);
    if (rc) {
        fprintf(stderr, "serve_client.py exited %d; the server's log:\n", rc);
        sh("tail -n 30 %s/serve.log >&2", dir);
        return 1;
    }
    sh("rm -rf %s", dir);
    printf("serve: the openai client's checks passed\n");
    return 0;
}
