//! Links libcephfs and builds the C shim used only by the layout test.
//!
//! Debian's libcephfs-dev ships no pkg-config file: link `-lcephfs` by name (the header lives
//! in /usr/include/cephfs, the library in the default linker path).

fn main() {
    println!("cargo:rerun-if-changed=src/layout_shim.c");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-link-lib=cephfs");

    // The shim reports sizeof/offsetof of the structs `src/sys.rs` mirrors, as the C compiler
    // sees them through the real header. The header refuses to compile without 64-bit
    // file offsets.
    cc::Build::new()
        .file("src/layout_shim.c")
        .define("_FILE_OFFSET_BITS", "64")
        .warnings(true)
        .compile("ceph_client_layout_shim");
}
