//! Unique puts: every acknowledged one must be found after the run.
//!
//! Each client writes `ack/<client>/<n>` = n, one after another, through one
//! member at a time; a put that was acknowledged is recorded. After the run,
//! every recorded key must be present with its value.

use etcd_client::{Client, GetOptions};

use super::{bounded, Context, Rng, Roaming};

pub const PREFIX: &str = "ack/";

pub async fn client(ctx: Context, id: usize, seed: u64) -> Vec<(String, u64)> {
    let mut rng = Rng::new(seed);
    let mut acked = Vec::new();
    let mut conn = Roaming::new(id % ctx.endpoints.len());
    let mut n = 0u64;
    while !ctx.stopping() {
        let Some(c) = conn.client(&ctx, &mut rng).await else { continue };
        n += 1;
        let key = format!("{PREFIX}{id}/{n:08}");
        match bounded(c.put(key.as_str(), n.to_string(), None)).await {
            Ok(_) => acked.push((key, n)),
            Err(_) => conn.failed(&ctx, &mut rng).await,
        }
    }
    acked
}

/// Every `ack/` key and its value, read through `client` a page at a time
/// (a run's worth would not fit in one response).
pub async fn present(client: &mut Client) -> anyhow::Result<std::collections::BTreeMap<String, u64>> {
    const PAGE: i64 = 5000;
    let mut out = std::collections::BTreeMap::new();
    let mut from = PREFIX.as_bytes().to_vec();
    let prefix_end = {
        let mut e = PREFIX.as_bytes().to_vec();
        *e.last_mut().expect("a non-empty prefix") += 1;
        e
    };
    loop {
        let options = GetOptions::new().with_range(prefix_end.clone()).with_limit(PAGE);
        let resp = client.get(from.clone(), Some(options)).await?;
        for kv in resp.kvs() {
            if let (Ok(k), Ok(v)) = (kv.key_str(), kv.value_str()) {
                out.insert(k.to_string(), v.parse()?);
            }
        }
        match resp.kvs().last() {
            Some(last) if resp.more() => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => return Ok(out),
        }
    }
}
