/* O_TMPFILE on the virtiofs mount, for tests/guest_features.rs: usage `tmpfile DIR`.
 *
 * Prints one line per check, "ok NAME" or "not ok NAME: what", and exits 0 only if every
 * check passed. DIR must be empty. Leaves DIR/linked (the bytes "linked by AT_EMPTY_PATH\n")
 * and DIR/linked2 (the bytes "linked by /proc\n", when /proc is mounted) for the host to read
 * through another CephFS client; nothing else.
 *
 * The daemon keeps an open O_TMPFILE under a private name in DIR: the guest must never see it
 * (readdir), and DIR's entry count (the ceph.dir.entries virtual xattr, read through the
 * daemon) shows it only while the file is open. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "check.h"

/* Entries of dir as CephFS counts them (ceph.dir.entries), -1 on error. */
static long ceph_entries(const char *dir)
{
    char buf[32];
    ssize_t n = getxattr(dir, "ceph.dir.entries", buf, sizeof buf - 1);
    if (n < 0)
        return -1;
    buf[n] = 0;
    return strtol(buf, NULL, 10);
}

/* Entries the guest sees in dir (without "." and ".."). */
static long seen_entries(const char *dir)
{
    DIR *d = opendir(dir);
    long n = 0;
    struct dirent *e;
    if (!d)
        return -1;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

/* Wait (up to 20 s) for ceph.dir.entries of dir to be want: the guest's FORGET of a closed
 * O_TMPFILE travels after close() returned. */
static int entries_become(const char *dir, long want)
{
    for (int i = 0; i < 200; i++) {
        if (ceph_entries(dir) == want)
            return 1;
        usleep(100000);
    }
    return 0;
}

int main(int argc, char **argv)
{
    char path[4096], proc[64];
    struct stat st;
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];

    /* 1: a tmpfile, written, nlink 0, linked with AT_EMPTY_PATH. */
    int fd = open(dir, O_TMPFILE | O_RDWR, 0640);
    check(fd >= 0, "open_tmpfile", "open(O_TMPFILE|O_RDWR)");
    if (fd < 0)
        return 1;
    const char *one = "linked by AT_EMPTY_PATH\n";
    check(write(fd, one, strlen(one)) == (ssize_t)strlen(one), "write", "write");
    check(fstat(fd, &st) == 0 && st.st_nlink == 0 && S_ISREG(st.st_mode) &&
              (st.st_mode & 07777) == 0640,
          "fstat_nlink_0", "fstat: nlink not 0 or mode not 0640");
    check(seen_entries(dir) == 0, "readdir_hides_it", "readdir shows an entry");
    check(ceph_entries(dir) == 1, "cephfs_counts_it", "ceph.dir.entries is not 1");
    snprintf(path, sizeof path, "%s/linked", dir);
    check(linkat(fd, "", AT_FDCWD, path, AT_EMPTY_PATH) == 0, "linkat_empty_path", "linkat");
    check(fstat(fd, &st) == 0 && st.st_nlink == 1, "fstat_nlink_1", "nlink after linkat");
    check(linkat(fd, "", AT_FDCWD, path, AT_EMPTY_PATH) == -1 && errno == EEXIST,
          "linkat_existing_name", "linkat over an existing name is not EEXIST");
    check(close(fd) == 0, "close_linked", "close");
    check(stat(path, &st) == 0 && st.st_nlink == 1 && st.st_size == (off_t)strlen(one),
          "linked_name", "stat of the linked name");
    check(entries_become(dir, 1), "private_name_gone", "ceph.dir.entries is not 1");

    /* 2: linked through /proc/self/fd (linkat with AT_SYMLINK_FOLLOW), when /proc is there. */
    fd = open(dir, O_TMPFILE | O_WRONLY, 0600);
    check(fd >= 0, "open_tmpfile_wronly", "open(O_TMPFILE|O_WRONLY)");
    const char *two = "linked by /proc\n";
    check(write(fd, two, strlen(two)) == (ssize_t)strlen(two), "write_2", "write");
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    snprintf(path, sizeof path, "%s/linked2", dir);
    if (access("/proc/self/fd", F_OK) == 0) {
        check(linkat(AT_FDCWD, proc, AT_FDCWD, path, AT_SYMLINK_FOLLOW) == 0,
              "linkat_proc_fd", "linkat /proc/self/fd");
    } else {
        check(linkat(fd, "", AT_FDCWD, path, AT_EMPTY_PATH) == 0, "linkat_proc_fd",
              "linkat (no /proc)");
    }
    check(close(fd) == 0, "close_linked2", "close");
    check(entries_become(dir, 2), "private_name_gone_2", "ceph.dir.entries is not 2");

    /* 3: O_EXCL: never linked (ENOENT, vfs_link); gone at close. */
    fd = open(dir, O_TMPFILE | O_EXCL | O_RDWR, 0600);
    check(fd >= 0, "open_tmpfile_excl", "open(O_TMPFILE|O_EXCL)");
    check(write(fd, "x", 1) == 1, "write_excl", "write");
    snprintf(path, sizeof path, "%s/excl", dir);
    check(linkat(fd, "", AT_FDCWD, path, AT_EMPTY_PATH) == -1 && errno == ENOENT,
          "linkat_excl_enoent", "linkat of an O_EXCL tmpfile is not ENOENT");
    check(ceph_entries(dir) == 3, "cephfs_counts_excl", "ceph.dir.entries is not 3");
    check(close(fd) == 0, "close_excl", "close");
    check(entries_become(dir, 2), "excl_gone_at_close", "ceph.dir.entries is not 2");

    /* 4: never linked: gone at close. */
    fd = open(dir, O_TMPFILE | O_RDWR, 0600);
    check(fd >= 0, "open_tmpfile_unlinked", "open(O_TMPFILE)");
    check(write(fd, "y", 1) == 1, "write_unlinked", "write");
    check(seen_entries(dir) == 2, "readdir_hides_it_2", "readdir shows more than 2");
    check(close(fd) == 0, "close_unlinked", "close");
    check(entries_become(dir, 2), "unlinked_gone_at_close", "ceph.dir.entries is not 2");

    /* 5: O_TMPFILE without write access is EINVAL (the kernel's answer). */
    fd = open(dir, O_TMPFILE | O_RDONLY, 0600);
    check(fd == -1 && errno == EINVAL, "tmpfile_rdonly_einval", "O_TMPFILE|O_RDONLY");

    printf("%s\n", failed ? "TMPFILE FAILED" : "TMPFILE PASSED");
    return failed;
}
