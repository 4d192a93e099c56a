/*
 * features: the small tools the guest tests of newer FUSE features run in the busybox guest
 * (tests/guest_features.rs), which has no mmap tool, no setfacl/getfacl and no idmapped
 * bind mount. One line of output per command, for the host to parse; exit 0 on success.
 *
 *   features mmap-write FILE TEXT       write TEXT at offset 0 through a MAP_SHARED mapping
 *                                       (file grown to hold it), msync, munmap:
 *                                       "MMAP ok" or "MMAP err=<errno>"
 *   features setacl PATH access|default SPEC
 *                                       SPEC: u::rw-,u:1234:---,g::r--,m::r--,o::r--
 *                                       (in that order: owner, named users, group, named
 *                                       groups, mask, other), written as the
 *                                       system.posix_acl_* xattr: "SETACL ok|err=<errno>"
 *   features getacl PATH access|default "GETACL PATH SPEC" or "GETACL PATH err=<errno>"
 *   features stat PATH                  "STAT PATH mode=<octal> uid=<n> gid=<n>"
 *   features as UID GID open PATH r|w   open as UID:GID (no supplementary groups):
 *                                       "OPEN UID PATH ok|err=<errno>"
 *   features as UID GID create PATH     create PATH 0644 as UID:GID: "CREATE UID PATH ok|err=..."
 *   features idmap-mount SRC DST FROM TO COUNT
 *                                       an idmapped bind mount of SRC on DST (open_tree,
 *                                       mount_setattr with a user namespace mapping guest ids
 *                                       FROM.. of SRC to TO.. on DST): "IDMAP ok|err=<errno> step"
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/mount.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#define ACL_VERSION 2
#define T_USER_OBJ 0x01
#define T_USER 0x02
#define T_GROUP_OBJ 0x04
#define T_GROUP 0x08
#define T_MASK 0x10
#define T_OTHER 0x20
#define UNDEF 0xffffffffu

struct acl_entry {
    uint16_t tag;
    uint16_t perm;
    uint32_t id;
};

static const char *acl_name(const char *which)
{
    return strcmp(which, "default") == 0 ? "system.posix_acl_default" : "system.posix_acl_access";
}

static int perm_of(const char *p)
{
    if (strlen(p) != 3)
        return -1;
    return (p[0] == 'r') * 4 + (p[1] == 'w') * 2 + (p[2] == 'x');
}

static int cmd_setacl(const char *path, const char *which, const char *spec)
{
    unsigned char buf[4 + 64 * 8];
    size_t len = 4;
    uint32_t v = ACL_VERSION;
    memcpy(buf, &v, 4);
    char *copy = strdup(spec);
    for (char *tok = strtok(copy, ","); tok; tok = strtok(NULL, ",")) {
        char kind[8], id[32], perm[8];
        if (sscanf(tok, "%7[^:]:%31[^:]:%7s", kind, id, perm) != 3 &&
            !(sscanf(tok, "%7[^:]::%7s", kind, perm) == 2 && (id[0] = 0, 1))) {
            printf("SETACL bad entry %s\n", tok);
            return 2;
        }
        struct acl_entry e;
        int named = id[0] != 0;
        switch (kind[0]) {
        case 'u': e.tag = named ? T_USER : T_USER_OBJ; break;
        case 'g': e.tag = named ? T_GROUP : T_GROUP_OBJ; break;
        case 'm': e.tag = T_MASK; break;
        case 'o': e.tag = T_OTHER; break;
        default: printf("SETACL bad entry %s\n", tok); return 2;
        }
        int p = perm_of(perm);
        if (p < 0 || len + 8 > sizeof(buf)) {
            printf("SETACL bad entry %s\n", tok);
            return 2;
        }
        e.perm = (uint16_t)p;
        e.id = named ? (uint32_t)strtoul(id, NULL, 10) : UNDEF;
        memcpy(buf + len, &e, 8);
        len += 8;
    }
    if (setxattr(path, acl_name(which), buf, len, 0) != 0) {
        printf("SETACL err=%d\n", errno);
        return 1;
    }
    printf("SETACL ok\n");
    return 0;
}

static int cmd_getacl(const char *path, const char *which)
{
    unsigned char buf[4 + 64 * 8];
    ssize_t n = getxattr(path, acl_name(which), buf, sizeof(buf));
    if (n < 0) {
        printf("GETACL %s err=%d\n", path, errno);
        return 1;
    }
    printf("GETACL %s ", path);
    for (ssize_t at = 4; at + 8 <= n; at += 8) {
        struct acl_entry e;
        memcpy(&e, buf + at, 8);
        const char *k = e.tag & (T_USER_OBJ | T_USER) ? "u"
                        : e.tag & (T_GROUP_OBJ | T_GROUP) ? "g"
                        : e.tag == T_MASK ? "m" : "o";
        char id[16] = "";
        if (e.tag == T_USER || e.tag == T_GROUP)
            snprintf(id, sizeof(id), "%u", e.id);
        printf("%s%s:%s:%c%c%c", at == 4 ? "" : ",", k, id, e.perm & 4 ? 'r' : '-',
               e.perm & 2 ? 'w' : '-', e.perm & 1 ? 'x' : '-');
    }
    printf("\n");
    return 0;
}

static int become(uid_t uid, gid_t gid)
{
    if (setgroups(0, NULL) != 0 || setresgid(gid, gid, gid) != 0 || setresuid(uid, uid, uid) != 0) {
        printf("AS err=%d\n", errno);
        return -1;
    }
    return 0;
}

static int cmd_mmap(const char *path, const char *text)
{
    size_t len = strlen(text);
    int fd = open(path, O_RDWR | O_CREAT, 0644);
    if (fd < 0 || ftruncate(fd, (off_t)len) != 0) {
        printf("MMAP err=%d open\n", errno);
        return 1;
    }
    char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        printf("MMAP err=%d\n", errno);
        return 1;
    }
    memcpy(m, text, len);
    if (msync(m, len, MS_SYNC) != 0 || munmap(m, len) != 0) {
        printf("MMAP err=%d msync\n", errno);
        return 1;
    }
    close(fd);
    printf("MMAP ok\n");
    return 0;
}

/* A user namespace mapping FROM..FROM+COUNT to TO..: a child unshares, we write its maps. */
static int userns_fd(unsigned from, unsigned to, unsigned count)
{
    int pipefd[2];
    if (pipe(pipefd) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        char c;
        if (unshare(CLONE_NEWUSER) != 0)
            _exit(1);
        close(pipefd[1]);
        /* Wait for the parent to open our namespace, then go. */
        ssize_t r = read(pipefd[0], &c, 1);
        (void)r;
        _exit(0);
    }
    close(pipefd[0]);
    /* Give the child time to unshare; its uid_map is empty until written. */
    char path[64], map[64];
    int fd = -1;
    for (int i = 0; i < 200; i++) {
        snprintf(path, sizeof(path), "/proc/%d/ns/user", pid);
        char self[64], child[64];
        ssize_t a = readlink("/proc/self/ns/user", self, sizeof(self) - 1);
        ssize_t b = readlink(path, child, sizeof(child) - 1);
        if (a > 0 && b > 0 && (a != b || memcmp(self, child, (size_t)a) != 0))
            break;
        usleep(10000);
    }
    /* Inside the namespace id FROM is the outside id TO: on the idmapped mount, a file
     * stored with FROM shows as TO, and a caller TO creates files stored as FROM. */
    snprintf(map, sizeof(map), "%u %u %u\n", from, to, count);
    const char *files[2] = {"uid_map", "gid_map"};
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof(path), "/proc/%d/%s", pid, files[k]);
        int m = open(path, O_WRONLY);
        if (m < 0 || write(m, map, strlen(map)) < 0) {
            kill(pid, SIGKILL);
            return -1;
        }
        close(m);
    }
    snprintf(path, sizeof(path), "/proc/%d/ns/user", pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    close(pipefd[1]);
    waitpid(pid, NULL, 0);
    return fd;
}

static int cmd_idmap(const char *src, const char *dst, unsigned from, unsigned to, unsigned count)
{
    int ns = userns_fd(from, to, count);
    if (ns < 0) {
        printf("IDMAP err=%d userns\n", errno);
        return 1;
    }
    int tree = (int)syscall(SYS_open_tree, AT_FDCWD, src, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
    if (tree < 0) {
        printf("IDMAP err=%d open_tree\n", errno);
        return 1;
    }
    struct mount_attr attr = {.attr_set = MOUNT_ATTR_IDMAP, .userns_fd = (uint64_t)ns};
    if (syscall(SYS_mount_setattr, tree, "", AT_EMPTY_PATH, &attr, sizeof(attr)) != 0) {
        printf("IDMAP err=%d mount_setattr\n", errno);
        return 1;
    }
    if (syscall(SYS_move_mount, tree, "", AT_FDCWD, dst, MOVE_MOUNT_F_EMPTY_PATH) != 0) {
        printf("IDMAP err=%d move_mount\n", errno);
        return 1;
    }
    printf("IDMAP ok\n");
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 4 && strcmp(argv[1], "mmap-write") == 0)
        return cmd_mmap(argv[2], argv[3]);
    if (argc >= 5 && strcmp(argv[1], "setacl") == 0)
        return cmd_setacl(argv[2], argv[3], argv[4]);
    if (argc >= 4 && strcmp(argv[1], "getacl") == 0)
        return cmd_getacl(argv[2], argv[3]);
    if (argc >= 3 && strcmp(argv[1], "stat") == 0) {
        struct stat st;
        if (stat(argv[2], &st) != 0) {
            printf("STAT %s err=%d\n", argv[2], errno);
            return 1;
        }
        printf("STAT %s mode=%o uid=%u gid=%u\n", argv[2], st.st_mode & 07777, st.st_uid,
               st.st_gid);
        return 0;
    }
    if (argc >= 6 && strcmp(argv[1], "as") == 0) {
        uid_t uid = (uid_t)strtoul(argv[2], NULL, 10);
        gid_t gid = (gid_t)strtoul(argv[3], NULL, 10);
        if (become(uid, gid) != 0)
            return 1;
        if (strcmp(argv[4], "open") == 0 && argc >= 7) {
            int fd = open(argv[5], argv[6][0] == 'w' ? O_WRONLY : O_RDONLY);
            if (fd < 0) {
                printf("OPEN %u %s err=%d\n", uid, argv[5], errno);
                return 1;
            }
            close(fd);
            printf("OPEN %u %s ok\n", uid, argv[5]);
            return 0;
        }
        if (strcmp(argv[4], "create") == 0) {
            int fd = open(argv[5], O_WRONLY | O_CREAT | O_EXCL, 0644);
            if (fd < 0) {
                printf("CREATE %u %s err=%d\n", uid, argv[5], errno);
                return 1;
            }
            close(fd);
            printf("CREATE %u %s ok\n", uid, argv[5]);
            return 0;
        }
    }
    if (argc >= 7 && strcmp(argv[1], "idmap-mount") == 0)
        return cmd_idmap(argv[2], argv[3], (unsigned)strtoul(argv[4], NULL, 10),
                         (unsigned)strtoul(argv[5], NULL, 10), (unsigned)strtoul(argv[6], NULL, 10));
    fprintf(stderr, "usage: see the head of features.c\n");
    return 2;
}
