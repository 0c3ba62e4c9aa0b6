//! Build script of tb-transport. Its only job: with feature `rdma` on a macOS target, compile the
//! small C shim (`src/rdma/apple_shim.c`) that makes the verbs calls whose structs come
//! from Apple's `<infiniband/verbs.h>` (ibv_post_send/post_recv/poll_cq are header inlines
//! through `ctx->ops`), and set `cfg(tb_apple_shim)`. Without the SDK header (older SDK, or a
//! cross `cargo check` from Linux) nothing is compiled and the Apple provider reports
//! Unsupported at run time.
//!
//! The header is looked for in `$TB_APPLE_VERBS_INCLUDE`, `$SDKROOT/usr/include`, then
//! `xcrun --sdk macosx --show-sdk-path`/usr/include.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(tb_apple_shim)");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=src/rdma/apple_shim.c");
    println!("cargo::rerun-if-env-changed=TB_APPLE_VERBS_INCLUDE");
    println!("cargo::rerun-if-env-changed=SDKROOT");
    #[cfg(feature = "rdma")]
    apple_shim();
}

#[cfg(feature = "rdma")]
fn apple_shim() {
    use std::path::PathBuf;

    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("macos") {
        return;
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Ok(d) = std::env::var("TB_APPLE_VERBS_INCLUDE") {
        dirs.push(PathBuf::from(d));
    }
    if let Ok(sdk) = std::env::var("SDKROOT") {
        dirs.push(PathBuf::from(sdk).join("usr/include"));
    }
    if let Ok(out) = std::process::Command::new("xcrun")
        .args(["--sdk", "macosx", "--show-sdk-path"])
        .output()
        && out.status.success()
    {
        let sdk = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !sdk.is_empty() {
            dirs.push(PathBuf::from(sdk).join("usr/include"));
        }
    }
    let Some(include) = dirs
        .into_iter()
        .find(|d| d.join("infiniband/verbs.h").is_file())
    else {
        // Only worth saying on a Mac: a cross `cargo check` from Linux never has the SDK.
        if std::env::var("HOST").is_ok_and(|h| h.contains("apple-darwin")) {
            println!(
                "cargo::warning=infiniband/verbs.h not found (macOS SDK 26.2+ needed): the Apple \
             RDMA provider is built without its shim and will report Unsupported"
            );
        }
        return;
    };
    cc::Build::new()
        .file("src/rdma/apple_shim.c")
        .include(&include)
        .warnings(true)
        .compile("tb_apple_rdma_shim");
    println!("cargo::rustc-cfg=tb_apple_shim");
}
