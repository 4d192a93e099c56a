//! Links libcephfs, builds the C shim used only by the layout test, and finds out at build
//! time what the installed libcephfs header offers beyond Pacific's.
//!
//! Debian's libcephfs-dev ships no pkg-config file: link `-lcephfs` by name (the header lives
//! in /usr/include/cephfs, the library in the default linker path).

use std::path::PathBuf;
use std::process::Command;

/// Whether a C file that uses `body` compiles against the installed header (compiled only:
/// no linking, so a probe never depends on the library's symbols).
fn header_has(name: &str, body: &str) -> bool {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let src = out.join(format!("probe_{name}.c"));
    let text = format!(
        "#define _FILE_OFFSET_BITS 64\n#include <cephfs/libcephfs.h>\nvoid probe(void);\nvoid probe(void) {{ {body} }}\n"
    );
    std::fs::write(&src, text).expect("write the probe into OUT_DIR");
    let compiler = cc::Build::new().get_compiler();
    let mut cmd: Command = compiler.to_command();
    cmd.arg("-c")
        .arg(&src)
        .arg("-o")
        .arg(out.join(format!("probe_{name}.o")));
    matches!(cmd.output(), Ok(o) if o.status.success())
}

fn main() {
    println!("cargo:rerun-if-changed=src/layout_shim.c");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=/usr/include/cephfs/libcephfs.h");
    println!("cargo:rustc-link-lib=cephfs");
    println!("cargo::rustc-check-cfg=cfg(libcephfs_nonblocking)");

    // `ceph_ll_nonblocking_readv_writev` and `struct ceph_ll_io_info`: libcephfs 20 (Tentacle)
    // has them; 16 and 18 do not.
    let nonblocking = header_has(
        "nonblocking",
        "struct ceph_ll_io_info io = {0}; (void)io; \
         int64_t (*f)(struct ceph_mount_info *, struct ceph_ll_io_info *) = \
         ceph_ll_nonblocking_readv_writev; (void)f;",
    );
    if nonblocking {
        println!("cargo:rustc-cfg=libcephfs_nonblocking");
    }
    // For the build scripts of crates that use `ceph_client::aio` (as DEP_CEPHFS_NONBLOCKING).
    println!("cargo:nonblocking={}", u8::from(nonblocking));

    // The shim reports sizeof/offsetof of the structs `src/sys.rs` mirrors, as the C compiler
    // sees them through the real header. The header refuses to compile without 64-bit
    // file offsets.
    let mut shim = cc::Build::new();
    shim.file("src/layout_shim.c")
        .define("_FILE_OFFSET_BITS", "64")
        .warnings(true);
    if nonblocking {
        shim.define("HAVE_LL_IO_INFO", None);
    }
    shim.compile("ceph_client_layout_shim");
}
