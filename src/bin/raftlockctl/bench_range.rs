//! The range and count workloads' requests (`bench range`, `bench count`),
//! for either driver: a range of `--range-limit` consecutive keys from a
//! random one of the key space, or a count-only range over every key under
//! `--key-prefix`; and the check that each answered what it asked for, so
//! that a run over a key space that was not written fails instead of
//! measuring empty answers.

use crate::bench::{key, BenchArgs, Workload};

/// range: the first key of request `n`'s range, one from which
/// `--range-limit` keys follow inside the key space.
fn range_start(args: &BenchArgs, n: u64) -> Vec<u8> {
    key(args, n % args.key_space.saturating_sub(args.range_limit).max(1))
}

/// range and count: a range request's end (every key under the prefix).
fn range_end(args: &BenchArgs) -> Vec<u8> {
    raftlock::prefix_end(args.key_prefix.as_bytes())
}

/// What a range or count request asks for, as (key, range end, limit,
/// count only), for either driver.
pub(crate) fn range_request(args: &BenchArgs, n: u64) -> (Vec<u8>, Vec<u8>, i64, bool) {
    match args.workload {
        Workload::Range => (range_start(args, n), range_end(args), args.range_limit as i64, false),
        _ => (args.key_prefix.as_bytes().to_vec(), range_end(args), 0, true),
    }
}

/// A range answered fewer keys than it asked for (the key space was not
/// written, or keys were lost), or a count-only range answered keys: the
/// run's figures would not measure what they say.
pub(crate) fn check_range(args: &BenchArgs, answered: u64) -> Result<(), String> {
    let expected = match args.workload {
        Workload::Range => args.range_limit.min(args.key_space),
        _ => 0,
    };
    match answered == expected {
        true => Ok(()),
        false => Err(format!("a range answered {answered} keys, not {expected} (write the key space first)")),
    }
}
