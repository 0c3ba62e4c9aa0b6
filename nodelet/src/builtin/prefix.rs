//! Rank 0's prefix cache: the KV cache of recent prompts, kept as sequences of their own in
//! every stage, so that a request whose prompt starts like one of them (a shared system prompt,
//! a conversation's earlier turns) starts from those positions
//! ([`tb_engine::shard::Shard::fork_sequence`], [`super::messages::Op::Fork`]) and prefills only
//! the rest. A forked prefix gives the logits of running it (tested in tb-engine), so answers do
//! not change; only the prefill work does.
//!
//! This module decides which prompts to keep and which to use; the driver does the forking and
//! counts the kept positions against the stage's KV budget (the least recently used entry goes
//! first when a request needs the room).

/// Shorter shared prefixes save too little to be worth a fork.
pub const MIN_PREFIX: usize = 16;
/// Cache sequences take ids from here up; requests count up from 1.
const FIRST_ID: u64 = 1 << 63;

#[derive(Debug)]
struct Entry {
    seq: u64,
    tokens: Vec<u32>,
    used: u64,
}

/// The kept prompts (at most `capacity`).
#[derive(Debug)]
pub struct PrefixCache {
    capacity: usize,
    entries: Vec<Entry>,
    next_id: u64,
    clock: u64,
}

fn shared(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PrefixCache {
    /// A cache of `capacity` prompts (0: off).
    pub fn new(capacity: usize) -> Self {
        PrefixCache {
            capacity,
            entries: Vec::new(),
            next_id: FIRST_ID,
            clock: 0,
        }
    }

    /// The kept prompt sharing the longest prefix with `prompt`, and how many of `prompt`'s
    /// tokens to take from it: at least [`MIN_PREFIX`], and never the whole prompt (its last
    /// token must run to give the first logits).
    pub fn lookup(&mut self, prompt: &[u32]) -> Option<(u64, usize)> {
        let limit = prompt.len().saturating_sub(1);
        let (i, len) = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, shared(&e.tokens, prompt).min(limit)))
            .max_by_key(|&(_, len)| len)?;
        if len < MIN_PREFIX {
            return None;
        }
        self.clock += 1;
        self.entries[i].used = self.clock;
        Some((self.entries[i].seq, len))
    }

    /// Whether keeping `prompt` would let later prompts share more than what is kept already:
    /// no kept prompt covers half of it.
    pub fn worth_keeping(&self, prompt: &[u32]) -> bool {
        self.capacity > 0
            && prompt.len() >= MIN_PREFIX
            && self
                .entries
                .iter()
                .all(|e| shared(&e.tokens, prompt) * 2 < prompt.len())
    }

    /// Keeps `prompt`: returns the sequence id to fork it into and the entry it displaced
    /// (whose sequence the stages must drop), if the cache was full.
    pub fn insert(&mut self, prompt: Vec<u32>) -> (u64, Option<u64>) {
        let evicted = if self.entries.len() >= self.capacity {
            self.evict()
        } else {
            None
        };
        let seq = self.next_id;
        self.next_id += 1;
        self.clock += 1;
        self.entries.push(Entry {
            seq,
            tokens: prompt,
            used: self.clock,
        });
        (seq, evicted)
    }

    /// Drops the least recently used entry; its sequence id.
    pub fn evict(&mut self) -> Option<u64> {
        let (i, _) = self
            .entries
            .iter()
            .enumerate()
            .min_by_key(|(_, e)| e.used)?;
        Some(self.entries.remove(i).seq)
    }

    /// Forgets the entry kept as `seq` (its fork failed).
    pub fn remove(&mut self, seq: u64) {
        self.entries.retain(|e| e.seq != seq);
    }

    /// KV positions the kept prompts hold.
    pub fn positions(&self) -> usize {
        self.entries.iter().map(|e| e.tokens.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(system: u32, user: u32, len: usize) -> Vec<u32> {
        (0..len as u32)
            .map(|i| {
                if i < 20 {
                    system * 100 + i
                } else {
                    user * 100 + i
                }
            })
            .collect()
    }

    #[test]
    fn the_longest_shared_prefix_is_used_and_the_least_recent_goes_first() {
        let mut c = PrefixCache::new(2);
        let a = prompt(1, 1, 30);
        assert!(c.lookup(&a).is_none());
        assert!(c.worth_keeping(&a));
        let (sa, none) = c.insert(a.clone());
        assert_eq!(none, None);
        // Same system prompt, another question: 20 tokens shared; not worth another entry.
        let b = prompt(1, 2, 30);
        assert_eq!(c.lookup(&b), Some((sa, 20)));
        assert!(!c.worth_keeping(&b));
        // The very same prompt: all but its last token.
        assert_eq!(c.lookup(&a), Some((sa, 29)));
        // Too little in common.
        let mut d = prompt(2, 1, 30);
        d[..10].copy_from_slice(&a[..10]);
        assert!(c.lookup(&d).is_none());
        let (sd, _) = c.insert(d.clone());
        assert_eq!(c.positions(), 60);
        // a was last used before d was kept: a goes first.
        let (_, evicted) = c.insert(prompt(3, 1, 30));
        assert_eq!(evicted, Some(sa));
        assert!(c.lookup(&a).is_none());
        assert_eq!(c.lookup(&d).map(|x| x.0), Some(sd));
        // Off.
        assert!(!PrefixCache::new(0).worth_keeping(&a));
    }
}
