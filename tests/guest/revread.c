/* revread FILE: reads FILE 4 KiB at a time from its last block to its first (a reverse-stride
 * scan, as GNU tac does), then from first to last, and prints "REVREAD fnv=<hex> bytes=<n>"
 * and "FWDREAD fnv=<hex> bytes=<n>": FNV-1a 64 of the blocks in file order, so both lines
 * carry the same hash when both scans read the same bytes (tests/guest_features.rs). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define BS 4096

static uint64_t fnv(const unsigned char *p, size_t n, uint64_t h) {
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

static int scan(int fd, off_t size, int reverse, const char *tag) {
    off_t blocks = (size + BS - 1) / BS;
    unsigned char *all = malloc(size ? size : 1);
    if (!all) return 1;
    for (off_t k = 0; k < blocks; k++) {
        off_t b = reverse ? blocks - 1 - k : k;
        size_t want = (size_t)((b + 1) * BS > size ? size - b * BS : BS);
        ssize_t n = pread(fd, all + b * BS, want, b * BS);
        if (n != (ssize_t)want) {
            printf("%s short read at block %lld: %zd\n", tag, (long long)b, n);
            return 1;
        }
    }
    printf("%s fnv=%016" PRIx64 " bytes=%lld\n", tag, fnv(all, size, 0xcbf29ce484222325ULL),
           (long long)size);
    free(all);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    int fd = open(argv[1], O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        perror(argv[1]);
        return 1;
    }
    return scan(fd, st.st_size, 1, "REVREAD") | scan(fd, st.st_size, 0, "FWDREAD");
}
