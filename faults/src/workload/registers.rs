//! Registers: linearizable reads, writes and compare-and-set on a few keys,
//! plus serializable reads, from clients spread over the members.
//!
//! Every written value is unique in the run, so a read names the write it
//! saw. Keys are `reg/<generation>/<i>`: every 30 s the clients move to a
//! fresh set, so that no key's history grows without bound. A CAS is a Txn comparing the value (or, for an absent key, version
//! 0) and putting a new one. Reads that fail have no effect and are dropped
//! by the checker; writes and CASes that fail in any way are `Unknown`.

use std::collections::BTreeMap;

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use raftlock_faults::check::{RegisterInput, RegisterOutput};
use raftlock_faults::history::{Op, Outcome, Time, NEVER};

use super::{bounded, Context, Rng, Roaming};

pub const PREFIX: &str = "reg/";
/// How long the clients use one generation of keys. Keys are independent
/// registers, so each is checked on its own; moving to fresh keys now and
/// then keeps every key's history (and the checker's search) bounded however
/// long the run is.
const GENERATION_NANOS: u64 = 30_000_000_000;

/// Register `i` of the generation in force at `now`.
pub fn key(i: usize, now: raftlock_faults::history::Time) -> String {
    format!("{PREFIX}{:04}/{i}", now / GENERATION_NANOS)
}

/// One serializable read: (client, invoke, complete, value).
pub type SerializableRead = (usize, Time, Time, Option<u64>);

#[derive(Default)]
pub struct RegisterHistory {
    pub ops: BTreeMap<String, Vec<Op<RegisterInput, RegisterOutput>>>,
    pub serializable: BTreeMap<String, Vec<SerializableRead>>,
}

impl RegisterHistory {
    pub fn merge(&mut self, other: RegisterHistory) {
        for (k, ops) in other.ops {
            self.ops.entry(k).or_default().extend(ops);
        }
        for (k, reads) in other.serializable {
            self.serializable.entry(k).or_default().extend(reads);
        }
    }

    pub fn len(&self) -> usize {
        self.ops.values().map(Vec::len).sum::<usize>() + self.serializable.values().map(Vec::len).sum::<usize>()
    }
}

fn value_of(resp: &etcd_client::GetResponse) -> Option<u64> {
    resp.kvs().first().and_then(|kv| kv.value_str().ok()?.parse().ok())
}

/// One client: `keys` registers, talking to one member at a time.
pub async fn client(ctx: Context, id: usize, keys: usize, seed: u64) -> RegisterHistory {
    let mut rng = Rng::new(seed);
    let mut history = RegisterHistory::default();
    let mut conn = Roaming::new(id % ctx.endpoints.len());
    // The last value this client saw per key: what its CASes expect.
    let mut seen: BTreeMap<String, Option<u64>> = BTreeMap::new();
    while !ctx.stopping() {
        let Some(c) = conn.client(&ctx, &mut rng).await else { continue };
        let invoke = ctx.clock.now();
        let key = key(rng.below(keys), invoke);
        let roll = rng.below(100);
        let failed = if roll < 10 {
            let read = bounded(c.get(key.as_str(), Some(GetOptions::new().with_serializable()))).await;
            match read {
                Ok(resp) => {
                    let v = value_of(&resp);
                    history.serializable.entry(key).or_default().push((id, invoke, ctx.clock.now(), v));
                    false
                }
                Err(_) => true,
            }
        } else {
            let (input, outcome) = if roll < 45 {
                let outcome = match bounded(c.get(key.as_str(), None)).await {
                    Ok(resp) => {
                        let v = value_of(&resp);
                        seen.insert(key.clone(), v);
                        Outcome::Ok(RegisterOutput::Read(v))
                    }
                    Err(e) => Outcome::Failed(e),
                };
                (RegisterInput::Read, outcome)
            } else if roll < 75 {
                let v = ctx.unique_value();
                let outcome = match bounded(c.put(key.as_str(), v.to_string(), None)).await {
                    Ok(_) => Outcome::Ok(RegisterOutput::Write),
                    Err(e) => Outcome::Unknown(e),
                };
                (RegisterInput::Write(v), outcome)
            } else {
                let expect = seen.get(&key).copied().flatten();
                let new = ctx.unique_value();
                let compare = match expect {
                    Some(v) => Compare::value(key.as_str(), CompareOp::Equal, v.to_string()),
                    None => Compare::version(key.as_str(), CompareOp::Equal, 0),
                };
                let txn = Txn::new().when([compare]).and_then([TxnOp::put(key.as_str(), new.to_string(), None)]);
                let outcome = match bounded(c.txn(txn)).await {
                    Ok(resp) => Outcome::Ok(RegisterOutput::Cas(resp.succeeded())),
                    Err(e) => Outcome::Unknown(e),
                };
                (RegisterInput::Cas { expect, new }, outcome)
            };
            let failed = !matches!(outcome, Outcome::Ok(_));
            let complete = if matches!(outcome, Outcome::Unknown(_)) { NEVER } else { ctx.clock.now() };
            history.ops.entry(key).or_default().push(Op { client: id, invoke, complete, input, outcome });
            failed
        };
        if failed {
            conn.failed(&ctx, &mut rng).await;
        }
    }
    history
}
