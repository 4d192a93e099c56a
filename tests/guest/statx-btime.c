/* statx-btime PATH...: for each path, one line "STATX <path> mask=0x<hex> btime=<sec>.<nsec>
 * ino=<ino>" from statx(2) asking for the birth time (tests/guest_features.rs). Exit 1 when a
 * statx fails. Static, for the guest: gcc -static -O1 -o statx-btime statx-btime.c */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>

int main(int argc, char **argv) {
    int rc = 0;
    for (int i = 1; i < argc; i++) {
        struct statx stx;
        if (statx(AT_FDCWD, argv[i], AT_STATX_SYNC_AS_STAT, STATX_BASIC_STATS | STATX_BTIME, &stx) != 0) {
            perror(argv[i]);
            rc = 1;
            continue;
        }
        printf("STATX %s mask=0x%x btime=%lld.%09u ino=%llu\n", argv[i], stx.stx_mask,
               (long long)stx.stx_btime.tv_sec, stx.stx_btime.tv_nsec,
               (unsigned long long)stx.stx_ino);
    }
    return rc;
}
