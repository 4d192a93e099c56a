# shellcheck shell=bash
# Shared helpers of the guest harness scripts (sourced, not executed).
# Callers set `prog` before sourcing.
# shellcheck disable=SC2154 # prog comes from the caller

die() { echo "$prog: error: $*" >&2; exit 1; }
log() { echo "$prog: $*" >&2; }

# resolve_kernel_dir DIR: DIR may be the CACHE_DIR given to fetch-kernel (the suite is then taken
# from GUEST_KERNEL_SUITE, default bookworm) or one suite folder inside it.
resolve_kernel_dir() {
  local dir=$1 suite=${GUEST_KERNEL_SUITE:-bookworm}
  if [ -f "$dir/.complete" ]; then
    (cd "$dir" && pwd)
  elif [ -f "$dir/$suite/.complete" ]; then
    (cd "$dir/$suite" && pwd)
  else
    die "no fetched kernel in '$dir' (suite $suite): run tests/lab/guest/fetch-kernel '$dir' first"
  fi
}

# need_arg OPTION NARGS: fail unless the option has a value.
need_arg() {
  [ "$2" -ge 2 ] || die "option $1 needs a value"
}
