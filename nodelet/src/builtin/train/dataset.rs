//! The examples of one rank: read from the dataset file on this Mac, or — when the job names a
//! `datasetNode` other than this rank's — fetched from that Node's nodelet, only those the rank
//! trains and evaluates on ([`records_of_rank`]); the other entries stay empty. Either way
//! example i is record i of the file, so batches are the same on every rank and on any number
//! of ranks.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::anyhow;
use tb_api::specs::FineTuneSpec;
use tb_engine::chat::ChatTemplate;
use tb_engine::tokenizer::Tokenizer;
use tb_engine::train::Example;
use tb_engine::train::data::{Batches, load_jsonl, parse_record, split_eval};

use super::{StartError, TrainOptions, fail};
use crate::staging::StagingError;
use crate::staging::dataset::{fetch_index, fetch_records};

/// How long a fetch waits on the holder.
const FETCH_TIMEOUT: Duration = Duration::from_secs(120);

/// Steps of the run: `steps`, else `epochs` passes over the `train` examples.
pub fn total_steps(f: &FineTuneSpec, train: usize) -> u64 {
    f.fixed_steps().unwrap_or_else(|| {
        (u64::from(f.epochs.unwrap_or(1)) * train as u64).div_ceil(u64::from(f.batch_size))
    })
}

/// The records (example numbers) of a dataset of `n` that rank `rank` of `world` uses over
/// the whole run: its share of every step's global batch and of the held-out split.
pub fn records_of_rank(n: usize, f: &FineTuneSpec, rank: usize, world: usize) -> BTreeSet<usize> {
    let (train, eval) = split_eval(n, f.eval_fraction, f.seed);
    let batches = Batches::new(train.len(), f.batch_size as usize, f.seed);
    let mut mine: BTreeSet<usize> = eval.iter().copied().skip(rank).step_by(world).collect();
    let steps = total_steps(f, train.len());
    // Past an epoch or so every record is someone's; stop once this rank has them all.
    let mut step = 0;
    while step < steps && mine.len() < n {
        mine.extend(
            batches
                .rank_batch(step, rank, world)
                .into_iter()
                .map(|i| train[i]),
        );
        step += 1;
    }
    mine
}

/// This rank's examples, indexed by record: all of them from a local file, or its own from the
/// holder.
pub fn read(
    opts: &TrainOptions,
    tokenizer: &Tokenizer,
    template: &ChatTemplate,
) -> Result<Vec<Option<Example>>, StartError> {
    let f = &opts.finetune;
    let max_len = f.sequence_length as usize;
    let Some(source) = opts.dataset_source else {
        return load_jsonl(&opts.dataset, tokenizer, template, max_len)
            .map(|all| all.into_iter().map(Some).collect())
            .map_err(|e| anyhow!("{e}"))
            .map_err(fail("DatasetInvalid"));
    };
    let path = opts.dataset.display().to_string();
    let index = fetch_index(source, &path, FETCH_TIMEOUT).map_err(fetch_failed(source))?;
    let n = usize::try_from(index.records).unwrap_or(usize::MAX);
    if n == 0 {
        return Err(StartError {
            reason: "DatasetInvalid",
            error: anyhow!(
                "{path}: no examples (the file is empty); expected one JSON object per line"
            ),
        });
    }
    let world = opts.hosts.len();
    let wanted = records_of_rank(n, f, opts.rank, world);
    let records = fetch_records(source, &path, &index, &wanted, FETCH_TIMEOUT)
        .map_err(fetch_failed(source))?;
    let mut examples: Vec<Option<Example>> = vec![None; n];
    for r in &records {
        let line = usize::try_from(r.line).unwrap_or(usize::MAX);
        let ex = parse_record(&opts.dataset, line, &r.text, tokenizer, template, max_len)
            .map_err(|e| anyhow!("{e}"))
            .map_err(fail("DatasetInvalid"))?;
        examples[r.index] = Some(ex);
    }
    tracing::info!(
        rank = opts.rank,
        world,
        %source,
        dataset = %path,
        fetched = records.len(),
        records = n,
        bytes = records.iter().map(|r| r.text.len()).sum::<usize>(),
        file_bytes = index.bytes,
        "dataset staged: this rank's examples fetched from the holder"
    );
    Ok(examples)
}

/// A holder that refuses (a bad line, a private or changed file) makes the dataset invalid;
/// one that cannot be reached is a staging failure.
fn fetch_failed(source: SocketAddr) -> impl Fn(StagingError) -> StartError {
    move |e| StartError {
        reason: match e {
            StagingError::Refused { .. } => "DatasetInvalid",
            _ => "StagingFailed",
        },
        error: anyhow!("fetching the dataset from {source}: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> FineTuneSpec {
        serde_json::from_value(json).expect("finetune")
    }

    #[test]
    fn ranks_fetch_their_shares_which_cover_what_one_rank_uses() {
        // One epoch of 40 train examples in batches of 4 on 2 ranks, 8 held out.
        let f =
            spec(serde_json::json!({"steps": 10, "batchSize": 4, "evalFraction": 0.2, "seed": 7}));
        let n = 50;
        let one = records_of_rank(n, &f, 0, 1);
        let (r0, r1) = (records_of_rank(n, &f, 0, 2), records_of_rank(n, &f, 1, 2));
        assert_eq!(one.len(), n, "one rank uses every record");
        assert!(r0.is_disjoint(&r1), "{r0:?} {r1:?}");
        assert_eq!(r0.union(&r1).copied().collect::<BTreeSet<_>>(), one);
        assert_eq!((r0.len(), r1.len()), (n / 2, n / 2));
        // A short run uses less.
        let f =
            spec(serde_json::json!({"steps": 2, "batchSize": 4, "evalFraction": 0.2, "seed": 7}));
        let r1 = records_of_rank(n, &f, 1, 2);
        assert_eq!(
            r1.len(),
            4 + 5,
            "2 steps of 2 plus half of the 10 held out: {r1:?}"
        );
    }
}
