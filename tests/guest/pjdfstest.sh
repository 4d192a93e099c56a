#!/bin/sh
# Runs pjdfstest (POSIX conformance, Rust rewrite) on a directory of the filesystem under test
# and prints per-group counts and a final "N passed, M failed" line. Guest side (busybox sh),
# works on the host too.
#
# Usage: pjdfstest.sh [--setup-users] [--config FILE] [--bin FILE] [--verbose] [DIR [PATTERN...]]
#   DIR            work directory (created; pjdfstest makes its temp dirs inside); default
#                  /mnt/pjd, so the script can be the guest's /test.sh as it is
#   PATTERN        only the test cases whose names contain it (e.g. "chmod", "rename::")
#   --setup-users  add the users/groups the config names to /etc/passwd and /etc/group when they
#                  are missing (for the throwaway test guest; never use it on a real host)
#   --config FILE  default: pjdfstest.toml next to this script, else next to the binary, else
#                  /opt/pjdfstest.toml
#   --bin FILE     default: pjdfstest next to this script, else /opt/bin/pjdfstest, else on PATH
# A static `sleep` in pjd-bin/ next to the script or the binary is put first on PATH (pjd-sleep.c).
#   --verbose      print every case, not just the failures
# Exit status: 0 if nothing failed, 1 if a case failed, 2 on a setup error.
set -u

here=$(cd "$(dirname "$0")" && pwd)
conf=
bin=
setup_users=0
verbose=0
while [ $# -gt 0 ]; do
    case $1 in
        --setup-users) setup_users=1; shift ;;
        --config) conf=$2; shift 2 ;;
        --bin) bin=$2; shift 2 ;;
        --verbose) verbose=1; shift ;;
        -*) echo "pjdfstest.sh: unknown option $1" >&2; exit 2 ;;
        *) break ;;
    esac
done
dir=/mnt/pjd
if [ $# -gt 0 ]; then
    dir=$1
    shift
fi
if [ -z "$bin" ]; then
    for b in "$here/pjdfstest" /opt/bin/pjdfstest "$(command -v pjdfstest 2>/dev/null)"; do
        [ -n "$b" ] && [ -x "$b" ] && { bin=$b; break; }
    done
fi
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
    echo "pjdfstest.sh: no pjdfstest binary (build it with tests/guest/build OUTDIR, or give --bin)" >&2
    exit 2
fi
bindir=$(cd "$(dirname "$bin")" && pwd)
if [ -z "$conf" ]; then
    for c in "$here/pjdfstest.toml" "$bindir/pjdfstest.toml" /opt/pjdfstest.toml; do
        [ -r "$c" ] && { conf=$c; break; }
    done
fi
if [ -z "$conf" ] || [ ! -r "$conf" ]; then
    echo "pjdfstest.sh: cannot find or read the config (pjdfstest.toml; give --config)" >&2
    exit 2
fi

# name:uid:gid for the users of the config's [dummy_auth] and their groups
add_user() { # NAME ID GROUP
    grep -q "^$3:" /etc/group || echo "$3:x:$2:" >>/etc/group || return 1
    gid=$(grep "^$3:" /etc/group | head -n 1 | cut -d: -f3)
    grep -q "^$1:" /etc/passwd || echo "$1:x:$2:$gid:$1:/:/bin/false" >>/etc/passwd || return 1
}
if [ "$setup_users" = 1 ]; then
    if ! { add_user nobody 65534 nogroup && add_user tester 1000 tester; }; then
        echo "pjdfstest.sh: --setup-users: cannot write /etc/passwd or /etc/group" >&2
        exit 2
    fi
fi

# A static pjdfstest crashes (SIGSEGV in NSS) looking up a user that /etc/passwd lacks: check first.
for pair in $(grep -o '\["[^"]*", *"[^"]*"\]' "$conf" | tr -d '[]" '); do
    u=${pair%%,*} g=${pair#*,}
    if ! grep -q "^$u:" /etc/passwd || ! grep -q "^$g:" /etc/group; then
        echo "pjdfstest.sh: user '$u' or group '$g' of $conf's [dummy_auth] is missing from" \
            "/etc/passwd or /etc/group (use --setup-users in a test guest, or another --config)" >&2
        exit 2
    fi
done

mkdir -p "$dir" || { echo "pjdfstest.sh: cannot create $dir (is the filesystem mounted and writable?)" >&2; exit 2; }
# ETXTBSY cases run a copy of `which sleep`: use our static sleep, not busybox's (pjd-sleep.c)
for d in "$here/pjd-bin" "$bindir/pjd-bin"; do
    if [ -x "$d/sleep" ]; then
        PATH=$d:$PATH
        export PATH
        break
    fi
done
log=${TMPDIR:-/tmp}/pjdfstest.$$.log
# no colours, no backtraces: the log is parsed below
NO_COLOR=1 RUST_BACKTRACE=0 RUST_LIB_BACKTRACE=0 "$bin" -c "$conf" -p "$dir" "$@" >"$log" 2>&1
rc=$?

# Result lines: "NAME<spaces>ok|skipped|FAILED|failed as expected|PASSED UNEXPECTEDLY";
# indented lines after them carry the reason. The group is the part of NAME before "::".
awk -v verbose="$verbose" -v rc="$rc" '
function group(n) { sub(/::.*/, "", n); return n }
function result(g, kind) { seen[g] = 1; cnt[g, kind]++; total[kind]++ }
/^[A-Za-z0-9_]+::[^ \t]*[ \t]+ok$/                  { result(group($1), "pass"); last = ""; if (verbose) print; next }
/^[A-Za-z0-9_]+::[^ \t]*[ \t]+skipped$/             { result(group($1), "skip"); last = "skip"; if (verbose) print; next }
/^[A-Za-z0-9_]+::[^ \t]*[ \t]+failed as expected$/  { result(group($1), "xfail"); last = ""; print "xfail " $1; next }
/^[A-Za-z0-9_]+::[^ \t]*[ \t]+PASSED UNEXPECTEDLY$/ { result(group($1), "xpass"); last = "";
    print "xpass " $1 " (passes now: remove it from expected_failures)"; next }
/^[A-Za-z0-9_]+::[^ \t]*[ \t]+FAILED$/              { result(group($1), "fail"); last = "fail"; print "FAIL  " $1; next }
/^\t/ { if (last == "fail" || (verbose && last == "skip")) print "      " substr($0, 2); next }
/^Summary:/ { summary = $0 }
/^error|^Error/ { if (!summary) errors = errors $0 "\n" }
END {
    print "# per group: passed / failed / skipped (xfail = expected failure)"
    n = 0
    for (g in seen) names[++n] = g
    for (i = 2; i <= n; i++) { v = names[i]; for (j = i - 1; j > 0 && names[j] > v; j--) names[j + 1] = names[j]; names[j + 1] = v }
    for (i = 1; i <= n; i++) {
        g = names[i]
        printf "%-20s %4d passed %4d failed %4d skipped", g, cnt[g, "pass"] + cnt[g, "xpass"], cnt[g, "fail"], cnt[g, "skip"]
        if (cnt[g, "xfail"]) printf " %d xfail", cnt[g, "xfail"]
        printf "\n"
    }
    if (summary) print "# pjdfstest: " summary
    if (!summary && rc != 0) { printf "pjdfstest did not finish (exit %d): %s", rc, errors; total["fail"]++ }
    printf "# %d skipped, %d expected failures\n", total["skip"], total["xfail"]
    printf "%d passed, %d failed\n", total["pass"] + total["xpass"] + total["xfail"], total["fail"]
    exit total["fail"] ? 1 : 0
}' "$log"
status=$?
if [ "$status" != 0 ] && [ "$verbose" = 0 ]; then
    echo "# full pjdfstest output: $log"
else
    rm -f "$log"
fi
exit "$status"
