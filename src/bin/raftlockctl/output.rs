//! How `raftlockctl` prints: human text by default, one JSON document per
//! result with `-w json` (keys and values as UTF-8 text, lossily).

use serde_json::{json, Value};

use raftlock::proto::mvccpb;
use raftlock::proto::raftlock::v1 as locks;

pub(crate) fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

pub(crate) fn kv_json(kv: &mvccpb::KeyValue) -> Value {
    json!({
        "key": text(&kv.key), "value": text(&kv.value), "create_revision": kv.create_revision,
        "mod_revision": kv.mod_revision, "version": kv.version, "lease": format!("{:x}", kv.lease),
    })
}

pub(crate) fn owner_json(o: &locks::Owner) -> Value {
    json!({
        "key": text(&o.key), "token": o.token, "lease": format!("{:x}", o.lease), "ttl": o.ttl,
        "granted_ttl": o.granted_ttl, "metadata": text(&o.metadata), "mode": mode_name(o.mode), "holds": o.holds,
        "lock_delay_ms": o.lock_delay_ms,
    })
}

/// `read` or `write`, as `raftlockctl lock --read` names the modes.
pub(crate) fn mode_name(mode: i32) -> &'static str {
    match locks::Mode::try_from(mode) {
        Ok(locks::Mode::Read) => "read",
        Ok(locks::Mode::Write) => "write",
        Err(_) => "unknown",
    }
}

pub(crate) fn owner_line(o: &locks::Owner) -> String {
    let mut line = format!("{}  token={}  lease={:x}", text(&o.key), o.token, o.lease);
    if o.mode == locks::Mode::Read as i32 {
        line += "  read";
    }
    if o.holds > 1 {
        line += &format!("  holds={}", o.holds);
    }
    if o.lock_delay_ms > 0 {
        line += &format!("  lock-delay={}ms", o.lock_delay_ms);
    }
    if o.ttl >= 0 || o.granted_ttl > 0 {
        line += &format!("  ttl={}s/{}s", o.ttl, o.granted_ttl);
    }
    if !o.metadata.is_empty() {
        line += &format!("  {}", text(&o.metadata));
    }
    line
}
