/* test_util.c — util.h: checked arithmetic, UTF-8 validation, bounded file reads. */
#include <stdint.h>
#include <unistd.h>

#include "test.h"
#include "base/util.h"

int main(void)
{
    uint64_t r;
    CHECK(ck_add_u64(1, 2, &r) && r == 3, "1+2");
    CHECK(!ck_add_u64(UINT64_MAX, 1, &r), "add overflow not detected");
    CHECK(!ck_mul_u64(1ull << 32, 1ull << 32, &r), "mul overflow not detected");
    CHECK(ck_mul_u64(1ull << 31, 1ull << 32, &r) && r == 1ull << 63, "2^63");

    /* UTF-8: the validator must accept exactly the well-formed sequences. */
    CHECK(util_utf8_valid("abc", 3), "ascii");
    CHECK(util_utf8_valid("\xc3\xa9", 2), "é");
    CHECK(util_utf8_valid("\xf0\x9f\x98\x80", 4), "emoji");
    CHECK(!util_utf8_valid("\xc3", 1), "truncated 2-byte");
    CHECK(!util_utf8_valid("\xf0\x9f\x98", 3), "truncated 4-byte");
    CHECK(!util_utf8_valid("\xc0\xaf", 2), "overlong");
    CHECK(!util_utf8_valid("\xed\xa0\x80", 3), "surrogate");
    CHECK(!util_utf8_valid("\xf4\x90\x80\x80", 4), "above U+10FFFF");
    CHECK(!util_utf8_valid("\xff", 1), "0xff");

    char path[] = "/tmp/spill_test_util_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    CHECK(write(fd, "hello", 5) == 5, "write");
    close(fd);
    char *buf, err[SPILL_ERRLEN];
    size_t len;
    CHECK(util_read_file(path, 5, &buf, &len, err, sizeof err) == 0 && len == 5 && !strcmp(buf, "hello"), "read");
    free(buf);
    CHECK(util_read_file(path, 4, &buf, &len, err, sizeof err) != 0 && strstr(err, "limit"), "cap: %s", err);
    unlink(path);
    CHECK(util_read_file(path, 4, &buf, &len, err, sizeof err) != 0 && strstr(err, "cannot open"), "missing: %s", err);

    char hex[65];
    util_sha256_hex("abc", 3, hex);
    CHECK(!strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"), "sha256 %s", hex);
    return test_finish("test_util");
}
