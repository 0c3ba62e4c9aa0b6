//! Every failure is the right `EngineError`, naming the file or value involved.

mod common;

use std::io::Write;

use tb_engine::{Activation, EngineError, LoadOptions, Shard, StageInput};

#[test]
fn missing_file_is_io() {
    let path = std::path::Path::new("/nonexistent/dir/model.gguf");
    let e = Shard::load(path, 0, 1, &LoadOptions::default()).expect_err("must fail");
    assert!(matches!(e, EngineError::Io { .. }), "{e:?}");
    assert!(e.to_string().contains("/nonexistent/dir/model.gguf"), "{e}");
}

#[test]
fn random_bytes_are_not_gguf() {
    let mut f = tempfile::NamedTempFile::new().expect("tmp");
    let junk: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    f.write_all(&junk).expect("write");
    let e = Shard::load(f.path(), 0, 1, &LoadOptions::default()).expect_err("must fail");
    assert!(matches!(e, EngineError::NotGguf { .. }), "{e:?}");
    assert!(
        e.to_string().contains(&f.path().display().to_string()),
        "{e}"
    );
    let e = tb_engine::Tokenizer::from_file(f.path()).expect_err("must fail");
    assert!(matches!(e, EngineError::NotGguf { .. }), "{e:?}");
}

#[test]
fn truncated_model_is_not_gguf() {
    let src = std::fs::read(common::model_path()).expect("read model");
    let mut f = tempfile::NamedTempFile::new().expect("tmp");
    f.write_all(&src[..src.len() / 2]).expect("write");
    // The header parses; the data of the later blocks is cut off.
    let index = tb_engine::GgufIndex::open(f.path()).expect("header is intact");
    assert_eq!(index.config().n_layers, 30);
    let e = Shard::load(f.path(), 0, 30, &LoadOptions::default()).expect_err("must fail");
    assert!(matches!(e, EngineError::NotGguf { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains(&f.path().display().to_string()) && msg.contains("truncated"),
        "{msg}"
    );
    // A shard whose tensors are all inside the cut still loads.
    Shard::load(f.path(), 0, 2, &LoadOptions::default()).expect("early blocks are intact");
    // A header cut short is not GGUF either.
    let mut g = tempfile::NamedTempFile::new().expect("tmp");
    g.write_all(&src[..10_000]).expect("write");
    let e = Shard::load(g.path(), 0, 1, &LoadOptions::default()).expect_err("must fail");
    assert!(matches!(e, EngineError::NotGguf { .. }), "{e:?}");
}

#[test]
fn bad_range() {
    let path = common::model_path();
    for (first, count) in [(0, 0), (25, 6), (30, 1), (usize::MAX, 2)] {
        let e = Shard::load(&path, first, count, &LoadOptions::default()).expect_err("must fail");
        assert!(
            matches!(e, EngineError::BadRange { layers: 30, .. }),
            "[{first}, +{count}): {e:?}"
        );
    }
}

#[test]
fn context_position_and_input_errors() {
    let path = common::model_path();
    let opts = LoadOptions {
        max_context: Some(16),
        ..Default::default()
    };
    let mut first = Shard::load(&path, 0, 2, &opts).expect("load");
    assert_eq!(first.context(), 16);
    let e = first
        .forward(1, StageInput::Tokens(vec![42; 17]), 0)
        .expect_err("too long");
    assert!(
        matches!(
            e,
            EngineError::ContextExceeded {
                tokens: 17,
                context: 16
            }
        ),
        "{e:?}"
    );

    first
        .forward(1, StageInput::Tokens(vec![42; 10]), 0)
        .expect("prefill");
    let e = first
        .forward(1, StageInput::Tokens(vec![42]), 9)
        .expect_err("wrong pos");
    assert!(
        matches!(
            e,
            EngineError::Position {
                seq: 1,
                expected: 10,
                got: 9
            }
        ),
        "{e:?}"
    );
    let e = first
        .forward(2, StageInput::Tokens(vec![42]), 3)
        .expect_err("new seq at pos 3");
    assert!(
        matches!(
            e,
            EngineError::Position {
                seq: 2,
                expected: 0,
                got: 3
            }
        ),
        "{e:?}"
    );
    // Running past the cap during decode.
    first
        .forward(3, StageInput::Tokens(vec![42; 16]), 0)
        .expect("fills the context");
    let e = first
        .forward(3, StageInput::Tokens(vec![42]), 16)
        .expect_err("full");
    assert!(
        matches!(
            e,
            EngineError::ContextExceeded {
                tokens: 17,
                context: 16
            }
        ),
        "{e:?}"
    );

    let e = first
        .forward(4, StageInput::Tokens(vec![49152]), 0)
        .expect_err("bad id");
    assert!(
        matches!(e, EngineError::BadToken { id: 49152, .. }),
        "{e:?}"
    );

    let mut middle = Shard::load(&path, 2, 2, &opts).expect("load");
    let e = middle
        .forward(1, StageInput::Tokens(vec![1]), 0)
        .expect_err("tokens to a middle shard");
    assert!(matches!(e, EngineError::BadInput { .. }), "{e:?}");
    let bad = Activation {
        tokens: 2,
        hidden: 100,
        data: vec![0.0; 200],
    };
    let e = middle
        .forward(1, StageInput::Hidden(bad), 0)
        .expect_err("wrong hidden");
    assert!(
        matches!(
            e,
            EngineError::BadActivation {
                expected_hidden: 576,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn engine_prompt_too_long() {
    let mut e = tb_engine::Engine::load(
        &common::model_path(),
        &LoadOptions {
            max_context: Some(8),
            ..Default::default()
        },
    )
    .expect("load");
    let err = e
        .generate(&[42; 9], &tb_engine::SamplingParams::default())
        .expect_err("too long");
    assert!(
        matches!(
            err,
            EngineError::ContextExceeded {
                tokens: 9,
                context: 8
            }
        ),
        "{err:?}"
    );
    // Reaching the context during decode ends generation with Length.
    let g = e
        .generate(
            &[42; 6],
            &tb_engine::SamplingParams {
                max_tokens: 10,
                ..Default::default()
            },
        )
        .expect("generate");
    assert!(g.tokens.len() <= 3, "{:?}", g.tokens);
}
