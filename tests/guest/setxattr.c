/* Extended attributes set in the guest, for tests/guest_features.rs: usage `setxattr FILE`.
 * On a kernel that negotiates FUSE_SETXATTR_EXT (6.x on), every SETXATTR carries the longer
 * fuse_setxattr_in. Prints "ok NAME" / "not ok NAME: what", then SETXATTR PASSED or FAILED;
 * leaves FILE with user.a = "value two" and user.big = 4000 bytes of 'b' for the host. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/xattr.h>

#include "check.h"

int main(int argc, char **argv)
{
    char buf[8192];
    static char big[4000];
    if (argc != 2) {
        fprintf(stderr, "usage: %s FILE\n", argv[0]);
        return 2;
    }
    const char *f = argv[1];
    memset(big, 'b', sizeof big);
    check(setxattr(f, "user.a", "v1", 2, XATTR_CREATE) == 0, "create", "setxattr CREATE");
    check(setxattr(f, "user.a", "v1", 2, XATTR_CREATE) == -1 && errno == EEXIST,
          "create_existing_eexist", "second XATTR_CREATE is not EEXIST");
    check(setxattr(f, "user.b", "v", 1, XATTR_REPLACE) == -1 && errno == ENODATA,
          "replace_missing_enodata", "XATTR_REPLACE of a missing name is not ENODATA");
    check(setxattr(f, "user.a", "value two", 9, XATTR_REPLACE) == 0, "replace",
          "setxattr REPLACE");
    ssize_t n = getxattr(f, "user.a", buf, sizeof buf);
    check(n == 9 && memcmp(buf, "value two", 9) == 0, "read_back", "getxattr user.a");
    check(setxattr(f, "user.big", big, sizeof big, 0) == 0, "big_value", "setxattr 4000 bytes");
    check(setxattr(f, "user.empty", "", 0, 0) == 0, "empty_value", "setxattr of an empty value");
    check(getxattr(f, "user.empty", buf, sizeof buf) == 0, "empty_read_back", "getxattr empty");
    check(removexattr(f, "user.empty") == 0, "remove", "removexattr");
    printf("%s\n", failed ? "SETXATTR FAILED" : "SETXATTR PASSED");
    return failed;
}
