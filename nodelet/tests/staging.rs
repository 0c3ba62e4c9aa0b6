//! Model staging over real sockets with the real model (SmolLM2, from scripts/fetch-model.sh):
//! a nodelet without the file fetches just its shard's header and tensors from a holder's probe
//! server, the engine loads the sparse copy, a corrupted byte is found and only that tensor is
//! fetched again, and a second run fetches nothing.

use std::io::{Seek, SeekFrom, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use tb_engine::gguf::GgufIndex;
use tb_engine::shard::{LoadOptions, Shard};
use tb_nodelet::probe::server::ProbeServer;
use tb_nodelet::staging::fetch::{Job, Progress, stage};
use tb_nodelet::staging::{StagingError, sha256};

const HOLDER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));

fn model() -> std::path::PathBuf {
    let p = tb_engine::test_model_path();
    assert!(
        p.is_file(),
        "{} is missing: run scripts/fetch-model.sh",
        p.display()
    );
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_is_staged_verified_repaired_and_resumed() {
    let server = ProbeServer::new(0);
    server.serve_on(&[HOLDER]).await;
    let source = SocketAddr::new(HOLDER, server.port());
    let cache = tempfile::tempdir().expect("tempdir");
    let job = Job {
        sources: vec![source],
        path: model().display().to_string(),
        first: 10,
        count: Some(10),
        cache_root: cache.path().to_path_buf(),
        timeout: Duration::from_secs(60),
        whole: false,
    };
    let run = |job: Job| async move {
        tokio::task::spawn_blocking(move || {
            let seen = std::sync::Mutex::new(Vec::new());
            let r = stage(&job, &|p: Progress| seen.lock().expect("lock").push(p));
            (r, seen.into_inner().expect("lock"))
        })
        .await
        .expect("join")
    };

    // First run: header + blocks 10..20 only.
    let (staged, seen) = run(job.clone()).await;
    let staged = staged.expect("staged");
    let original = GgufIndex::open(&model()).expect("index");
    let share: u64 = original.header_len()
        + original
            .shard_tensors(10, 10)
            .expect("tensors")
            .iter()
            .map(|t| t.len)
            .sum::<u64>();
    assert_eq!(staged.needed, share);
    assert_eq!(
        staged.fetched, share,
        "exactly the shard's bytes cross the wire"
    );
    assert!(
        staged.fetched * 3 < staged.file_len,
        "a third of the blocks, no embedding: {} of {}",
        staged.fetched,
        staged.file_len
    );
    assert_eq!(
        seen.last(),
        Some(&Progress {
            have: share,
            need: share
        })
    );
    // The engine loads the sparse copy like the whole file.
    let a = Shard::load(&staged.path, 10, 10, &LoadOptions::default()).expect("staged shard");
    let b = Shard::load(&model(), 10, 10, &LoadOptions::default()).expect("original shard");
    assert_eq!(a.weight_bytes(), b.weight_bytes());

    // A corrupted byte in one tensor: found, and only that tensor is fetched again.
    let victim = original.shard_tensors(10, 10).expect("tensors")[3].clone();
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&staged.path)
            .expect("open");
        f.seek(SeekFrom::Start(victim.offset + 7)).expect("seek");
        f.write_all(&[0x5a ^ 0xff]).expect("write");
    }
    let (again, _) = run(job.clone()).await;
    let again = again.expect("repaired");
    assert_eq!(again.fetched, victim.len, "only {} again", victim.name);
    let bytes = std::fs::read(&again.path).expect("read");
    let original_bytes = std::fs::read(model()).expect("read");
    let range = victim.offset as usize..(victim.offset + victim.len) as usize;
    assert_eq!(
        sha256(&bytes[range.clone()]),
        sha256(&original_bytes[range])
    );

    // Everything cached and intact: nothing crosses the wire.
    let (third, _) = run(job.clone()).await;
    assert_eq!(third.expect("cached").fetched, 0);

    // A whole copy: every tensor fetched and the copy recorded; another shard is then staged
    // from it with no holder to ask.
    let mut whole = job.clone();
    whole.whole = true;
    let (copied, _) = run(whole).await;
    let copied = copied.expect("whole copy");
    assert_eq!(
        copied.fetched,
        copied.needed - share,
        "the rest of the file"
    );
    assert_eq!(
        tb_nodelet::staging::copies::held(cache.path()),
        std::slice::from_ref(&job.path)
    );
    assert_eq!(
        std::fs::read(&copied.path).expect("copy"),
        std::fs::read(model()).expect("original"),
        "the copy is the file"
    );
    let mut alone = job.clone();
    alone.sources = Vec::new();
    alone.first = 0;
    let (local, _) = run(alone).await;
    assert_eq!(local.expect("from the local copy").fetched, 0);

    // A holder asked for a file that is not a GGUF model refuses, naming it.
    let mut bad = job.clone();
    bad.path = "/etc/hostname".into();
    let (err, _) = run(bad).await;
    let err = err.expect_err("not a model");
    assert!(matches!(err, StagingError::Refused { .. }), "{err}");
    assert!(err.to_string().contains("/etc/hostname"), "{err}");
}
