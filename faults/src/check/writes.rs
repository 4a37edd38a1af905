//! Acknowledged writes are never lost.
//!
//! The workload writes each key once, with a value of its own, and records the
//! writes the server acknowledged; after the run (and after every fault has
//! healed) the harness reads the keys back. Each acknowledged key must be
//! present with exactly its value.
//!
//! Caveat: writes with an unknown outcome are not passed in — they may or may
//! not have landed, so neither their presence nor their absence says anything.

use std::collections::BTreeMap;

use crate::history::Anomaly;

const CHECKER: &str = "acknowledged-writes";

/// Checks every acknowledged `(key, value)` against what the cluster holds at the end.
pub fn check_acknowledged(acked: &[(String, u64)], present: &BTreeMap<String, u64>) -> Vec<Anomaly> {
    acked
        .iter()
        .filter_map(|(key, value)| {
            let what = match present.get(key) {
                Some(found) if found == value => return None,
                Some(found) => format!("acknowledged write of {value} was replaced: the key holds {found} at the end"),
                None => format!("acknowledged write of {value} was lost: the key is absent at the end"),
            };
            Some(Anomaly::new(CHECKER, key, what))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn present(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
        pairs.iter().map(|&(key, value)| (key.to_string(), value)).collect()
    }

    #[test]
    fn every_acknowledged_write_present_passes() {
        let acked = [("w/1".to_string(), 1), ("w/2".to_string(), 2)];
        // Keys written with an unknown outcome may be present too.
        assert_eq!(check_acknowledged(&acked, &present(&[("w/1", 1), ("w/2", 2), ("w/3", 3)])), vec![]);
        assert_eq!(check_acknowledged(&[], &present(&[])), vec![]);
    }

    #[test]
    fn missing_and_altered_writes_are_reported() {
        let acked = [("w/1".to_string(), 1), ("w/2".to_string(), 2), ("w/3".to_string(), 3)];
        let anomalies = check_acknowledged(&acked, &present(&[("w/1", 1), ("w/3", 30)]));
        assert_eq!(anomalies.len(), 2, "{anomalies:#?}");
        assert_eq!(anomalies[0].checker, "acknowledged-writes");
        assert_eq!(anomalies[0].subject, "w/2");
        assert!(anomalies[0].what.contains("write of 2 was lost"), "{}", anomalies[0]);
        assert_eq!(anomalies[1].subject, "w/3");
        assert!(anomalies[1].what.contains("holds 30"), "{}", anomalies[1]);
    }
}
