use super::*;
use crate::base::limits::MAX_TXN_DEPTH;

/// Put `k` = `v` (no lease); the new revision. Shared by the submodules' tests.
pub(super) fn put(s: &mut MvccStore, k: &str, v: &str) -> Revision {
    let req = PutRequest { key: k.into(), value: v.into(), ..Default::default() };
    s.put(req, &()).unwrap().0.revision
}

fn get_at(s: &MvccStore, k: &str, rev: Revision) -> Result<Option<KeyValue>, MvccError> {
    let req = RangeRequest { key: k.into(), revision: rev, ..Default::default() };
    s.range(&req).map(|r| r.kvs.into_iter().next())
}

fn range(s: &MvccStore, req: RangeRequest) -> RangeResult {
    s.range(&req).unwrap()
}

fn keys(r: &RangeResult) -> Vec<String> {
    r.kvs.iter().map(|kv| String::from_utf8(kv.key.clone()).unwrap()).collect()
}

#[test]
fn revisions_versions_and_generations() {
    let mut s = MvccStore::default();
    assert_eq!(s.revision(), 1);
    assert_eq!(put(&mut s, "a", "1"), 2);
    assert_eq!(put(&mut s, "a", "2"), 3);
    let kv = get_at(&s, "a", 0).unwrap().unwrap();
    assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (2, 3, 2));
    let (del, changes) = s.delete_range(&DeleteRangeRequest { key: "a".into(), ..Default::default() });
    assert_eq!((del.deleted, del.revision, changes.len()), (1, 4, 1));
    // Deleting nothing does not move the revision.
    let (del, changes) = s.delete_range(&DeleteRangeRequest { key: "a".into(), ..Default::default() });
    assert_eq!((del.deleted, del.revision, changes.len(), s.revision()), (0, 4, 0, 4));
    assert_eq!(put(&mut s, "a", "3"), 5);
    let kv = get_at(&s, "a", 0).unwrap().unwrap();
    assert_eq!((kv.create_revision, kv.version), (5, 1), "a tombstone starts a new generation");
    // History.
    assert_eq!(get_at(&s, "a", 2).unwrap().unwrap().value, b"1");
    assert_eq!(get_at(&s, "a", 4).unwrap(), None);
    assert_eq!(get_at(&s, "a", 6), Err(MvccError::FutureRevision));
}

#[test]
fn ranges_limits_counts_and_sorting() {
    let mut s = MvccStore::default();
    for (k, v) in [("b", "3"), ("a", "2"), ("c", "1"), ("d", "0")] {
        put(&mut s, k, v);
    }
    let all = RangeRequest { key: vec![0], range_end: vec![0], ..Default::default() };
    assert_eq!(keys(&range(&s, all.clone())), ["a", "b", "c", "d"]);
    let r = range(&s, RangeRequest { limit: 2, ..all.clone() });
    assert_eq!((keys(&r), r.more, r.count), (vec!["a".to_string(), "b".into()], true, 4));
    let r = range(&s, RangeRequest { key: "b".into(), range_end: "d".into(), ..Default::default() });
    assert_eq!(keys(&r), ["b", "c"]);
    let r = range(&s, RangeRequest { key: "d".into(), range_end: "b".into(), ..Default::default() });
    assert_eq!((r.kvs.len(), r.count), (0, 0), "an inverted interval is empty");
    let r = range(&s, RangeRequest { sort_target: SortTarget::Value, ..all.clone() });
    assert_eq!(keys(&r), ["d", "c", "a", "b"], "a non-key target sorts ascending by default");
    let r = range(&s, RangeRequest { sort_order: SortOrder::Descend, limit: 1, ..all.clone() });
    assert_eq!((keys(&r), r.more), (vec!["d".to_string()], true));
    let r = range(&s, RangeRequest { count_only: true, ..all.clone() });
    assert_eq!((r.kvs.len(), r.count), (0, 4));
    let r = range(&s, RangeRequest { keys_only: true, ..all.clone() });
    assert!(r.kvs.iter().all(|kv| kv.value.is_empty()));
    let r = range(&s, RangeRequest { min_mod_revision: 3, max_mod_revision: 4, ..all.clone() });
    assert_eq!((keys(&r), r.count), (vec!["a".to_string(), "c".into()], 4));
}

#[test]
fn compaction_keeps_what_later_reads_see() {
    let mut s = MvccStore::default();
    put(&mut s, "a", "1"); // 2
    put(&mut s, "b", "1"); // 3
    put(&mut s, "a", "2"); // 4
    s.delete_range(&DeleteRangeRequest { key: "b".into(), ..Default::default() }); // 5
    put(&mut s, "c", "1"); // 6
    let hash_before = s.hash_kv(0).unwrap().0;
    s.compact(5).unwrap();
    // What is exported and hashed is the same before and after the sweep.
    let exported: Vec<_> = s.versions().collect();
    assert_eq!(s.hash_kv(0).unwrap().0, {
        let mut swept = MvccStore::restore(exported.clone(), s.revision(), s.compact_revision());
        swept.sweep(usize::MAX);
        swept.hash_kv(0).unwrap().0
    });
    assert_ne!(s.hash_kv(0).unwrap().0, hash_before);
    // a@2 is superseded; b@3 and its tombstone at 5 are both gone.
    assert_eq!(exported.len(), 5 - 3);
    assert!(s.sweep_pending());
    assert!(!s.sweep(usize::MAX));
    assert!(!s.sweep_pending());
    assert_eq!(s.versions().count(), 2);
    assert_eq!(get_at(&s, "a", 5).unwrap().unwrap().value, b"2");
    assert_eq!(get_at(&s, "a", 4), Err(MvccError::Compacted));
    assert_eq!(get_at(&s, "b", 5).unwrap(), None);
    assert_eq!(s.compact(5), Err(MvccError::Compacted));
    assert_eq!(s.compact(7), Err(MvccError::FutureRevision));
    let restored = MvccStore::restore(s.versions().collect::<Vec<_>>(), s.revision(), s.compact_revision());
    assert_eq!(get_at(&restored, "c", 0).unwrap(), get_at(&s, "c", 0).unwrap());
    assert_eq!(restored.live_keys(), 2);
}

/// The size the quota counts follows every version in and out: writes add,
/// compaction takes away what it drops, and a restored store counts the same.
#[test]
fn the_counted_size_follows_the_history() {
    let mut s = MvccStore::default();
    assert_eq!(s.size_bytes(), 0);
    put(&mut s, "a", "12345"); // 2
    put(&mut s, "a", "123"); // 3
    s.delete_range(&DeleteRangeRequest { key: "a".into(), ..Default::default() }); // 4
    put(&mut s, "bb", ""); // 5
    let o = VERSION_OVERHEAD;
    assert_eq!(s.size_bytes(), (1 + 5 + o) + (1 + 3 + o) + (1 + o) + (2 + o));
    s.compact(4).unwrap();
    assert_eq!(s.size_bytes(), (1 + 5 + o) + (1 + 3 + o) + (1 + o) + (2 + o), "nothing swept yet");
    s.sweep(usize::MAX);
    assert_eq!(s.size_bytes(), 2 + o, "only bb's version is left");
    let restored = MvccStore::restore(s.versions().collect::<Vec<_>>(), s.revision(), s.compact_revision());
    assert_eq!(restored.size_bytes(), s.size_bytes());
}

/// The live-key count is kept as versions come and go, and always equals a
/// walk over the index: puts, deletes of one key and of ranges, txns that
/// put and delete, a compaction swept, a replay and a restore.
#[test]
fn the_live_key_count_follows_every_write() {
    let mut s = MvccStore::default();
    let check = |s: &MvccStore| assert_eq!(s.live_keys(), s.count_live_keys());
    let mut seed = 7u64;
    let mut next = move |n: u64| {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    for step in 0..400 {
        let key = format!("k{}", next(40));
        match next(5) {
            0 | 1 => {
                put(&mut s, &key, "v");
            }
            2 => {
                s.delete_range(&DeleteRangeRequest { key: key.into(), ..Default::default() });
            }
            3 => {
                let end = format!("k{}", next(40));
                s.delete_range(&DeleteRangeRequest { key: key.into(), range_end: end.into(), ..Default::default() });
            }
            _ => {
                let other = format!("k{}", next(40));
                let txn = TxnRequest {
                    success: vec![
                        RequestOp::DeleteRange(DeleteRangeRequest { key: key.clone().into(), ..Default::default() }),
                        RequestOp::Put(PutRequest { key: other.into(), ..Default::default() }),
                        RequestOp::Put(PutRequest { key: key.into(), ..Default::default() }),
                    ],
                    ..Default::default()
                };
                s.txn(&txn, &()).unwrap();
            }
        }
        check(&s);
        if step == 200 {
            s.compact(s.revision()).unwrap();
            s.sweep(usize::MAX);
            check(&s);
        }
    }
    assert!(s.live_keys() > 0 && s.live_keys() < 40, "both live keys and deleted ones: {}", s.live_keys());
    let restored = MvccStore::restore(s.versions().collect::<Vec<_>>(), s.revision(), s.compact_revision());
    assert_eq!(restored.live_keys(), s.live_keys());
    let mut replayed = MvccStore::default();
    let mut versions: Vec<_> = s.versions().collect();
    versions.sort_by_key(|v| (v.revision, v.sub));
    for v in versions {
        replayed.replay(v);
    }
    assert_eq!(replayed.live_keys(), s.live_keys());
    check(&replayed);
}

fn cmp(key: &str, target: CompareTarget, result: CompareResult, number: i64, value: &str) -> Compare {
    Compare { result, target, key: key.into(), range_end: vec![], number, value: value.into() }
}

#[test]
fn txn_is_one_revision_and_sees_its_own_writes() {
    let mut s = MvccStore::default();
    put(&mut s, "a", "1");
    let txn = TxnRequest {
        compare: vec![cmp("a", CompareTarget::Value, CompareResult::Equal, 0, "1")],
        success: vec![
            RequestOp::Put(PutRequest { key: "b".into(), value: "x".into(), ..Default::default() }),
            RequestOp::Put(PutRequest { key: "c".into(), value: "y".into(), ..Default::default() }),
            RequestOp::Range(RangeRequest { key: "b".into(), ..Default::default() }),
        ],
        failure: vec![],
    };
    let (r, changes) = s.txn(&txn, &()).unwrap();
    assert!(r.succeeded);
    assert_eq!((r.revision, changes.len()), (3, 2));
    assert_eq!(changes.iter().map(|c| c.sub).collect::<Vec<_>>(), [0, 1]);
    match &r.responses[2] {
        ResponseOp::Range(rr) => assert_eq!((rr.kvs[0].mod_revision, rr.revision), (3, 3)),
        other => panic!("{other:?}"),
    }
    // A read-only txn does not move the revision.
    let (r, changes) = s.txn(&TxnRequest { success: vec![txn.success[2].clone()], ..Default::default() }, &()).unwrap();
    assert_eq!((r.revision, changes.len()), (3, 0));
}

#[test]
fn compares_on_missing_keys_and_failing_checks() {
    let mut s = MvccStore::default();
    // Missing key: version/create/mod/lease compare as 0, value never matches.
    let missing_version = cmp("zz", CompareTarget::Version, CompareResult::Equal, 0, "");
    let missing_value = cmp("zz", CompareTarget::Value, CompareResult::Equal, 0, "");
    assert!(s.choose_path(&TxnRequest { compare: vec![missing_version], ..Default::default() }).succeeded);
    assert!(!s.choose_path(&TxnRequest { compare: vec![missing_value], ..Default::default() }).succeeded);
    // A failing check (unknown lease) leaves the store untouched.
    let txn = TxnRequest {
        success: vec![
            RequestOp::Put(PutRequest { key: "a".into(), ..Default::default() }),
            RequestOp::Put(PutRequest { key: "b".into(), lease: 7, ..Default::default() }),
        ],
        ..Default::default()
    };
    assert_eq!(s.txn(&txn, &()).unwrap_err(), MvccError::LeaseNotFound);
    assert_eq!((s.revision(), s.live_keys()), (1, 0));
    let ignore = PutRequest { key: "a".into(), ignore_value: true, ..Default::default() };
    assert_eq!(s.put(ignore, &()).unwrap_err(), MvccError::KeyNotFound);
}

#[test]
fn key_ranges_overlap() {
    let single = KeyRange::new(b"b", b"");
    assert!(single.overlaps(&KeyRange::new(b"a", b"c")));
    assert!(!single.overlaps(&KeyRange::new(b"c", b"d")));
    assert!(!single.overlaps(&KeyRange::new(b"a", b"b")));
    assert!(single.overlaps(&KeyRange::new(b"a", &[0])));
    assert!(!KeyRange::new(b"b", b"").overlaps(&KeyRange::new(b"ba", b"")));
}

/// A range is a prefix exactly when it holds the keys that start with its
/// start: ends of 0xff bytes carried over, and never an end of "\0".
#[test]
fn a_range_is_a_prefix_only_when_it_holds_exactly_the_keys_with_it() {
    let prefix_of = |start: &[u8], end: &[u8]| KeyRange::new(start, end).prefix().map(<[u8]>::to_vec);
    assert_eq!(prefix_of(b"el/", b"el0"), Some(b"el/".to_vec()));
    assert_eq!(KeyRange::with_prefix(b"el/").prefix(), Some(&b"el/"[..]));
    assert_eq!(prefix_of(b"a\xff", b"b"), Some(b"a\xff".to_vec()));
    assert_eq!(prefix_of(b"el/", b"el/b"), None);
    assert_eq!(prefix_of(b"el/", b""), None);
    assert_eq!(prefix_of(b"\xff", &[0]), None);
    assert_eq!(KeyRange::Interval(vec![0xff], vec![0]).prefix(), None);
    assert_eq!(KeyRange::Interval(vec![], vec![0]).prefix(), None);
}

#[test]
fn a_long_history_reads_right_at_every_revision() {
    let mut s = MvccStore::default();
    // "k" alternates between a value and a tombstone, as a lock key does;
    // "other" moves the revision past k's newest version.
    let mut expected = vec![None; 2]; // revisions 0 and 1: nothing
    for i in 0..50 {
        put(&mut s, "k", &i.to_string());
        expected.push(Some(i.to_string()));
        s.delete_range(&DeleteRangeRequest { key: "k".into(), ..Default::default() });
        expected.push(None);
    }
    put(&mut s, "k", "last");
    expected.push(Some("last".into()));
    put(&mut s, "other", "x");
    expected.push(Some("last".into()));
    assert_eq!(s.revision() as usize, expected.len() - 1);
    for (rev, want) in expected.iter().enumerate().skip(1) {
        let got = get_at(&s, "k", rev as Revision).unwrap().map(|kv| String::from_utf8(kv.value).unwrap());
        assert_eq!(&got, want, "k at revision {rev}");
    }
    assert_eq!(get_at(&s, "k", 0).unwrap().unwrap().value, b"last", "revision 0 reads the newest");
    // A sorted, limited range returns whole key-values, the lowest first.
    let r = range(
        &s,
        RangeRequest { key: vec![0], range_end: vec![0], sort_target: SortTarget::Mod, limit: 1, ..Default::default() },
    );
    assert_eq!((keys(&r), r.more, r.count), (vec!["k".to_string()], true, 2));
    assert_eq!(r.kvs[0].value, b"last");
}

/// A txn `depth` levels deep, each level holding only the next.
fn nested(depth: usize) -> TxnRequest {
    let mut txn = TxnRequest::default();
    for _ in 1..depth {
        txn = TxnRequest { success: vec![RequestOp::Txn(txn)], ..Default::default() };
    }
    txn
}

#[test]
fn decoding_stops_at_the_txn_depth_limit() {
    use crate::model::command::Command;
    let at_limit = crate::base::codec::encode(&Command::Txn(nested(MAX_TXN_DEPTH + 1)));
    assert!(
        crate::base::codec::decode::<Command>(&at_limit).is_ok(),
        "the outer txn plus MAX_TXN_DEPTH nested ones decode"
    );
    let deeper = crate::base::codec::encode(&Command::Txn(nested(MAX_TXN_DEPTH + 2)));
    let err = crate::base::codec::decode::<Command>(&deeper).unwrap_err().to_string();
    assert!(err.contains("nested deeper"), "{err}");
    // The depth count is reset after a failure: the next decode is unaffected.
    assert!(crate::base::codec::decode::<Command>(&at_limit).is_ok());
    // Far deeper than any stack could take recursively (built by hand: its
    // value could not even be dropped recursively): refused, not a crash.
    // Command::Txn, then per level: no compares, one success op, a Txn op.
    let mut hostile = vec![crate::base::codec::FORMAT_V1];
    hostile.extend(2u32.to_le_bytes());
    for _ in 0..200_000 {
        hostile.extend(0u64.to_le_bytes());
        hostile.extend(1u64.to_le_bytes());
        hostile.extend(3u32.to_le_bytes());
    }
    assert!(crate::base::codec::decode::<Command>(&hostile).is_err());
}

#[test]
fn decoding_refuses_lengths_beyond_the_input() {
    use crate::model::command::Command;
    let mut bytes = crate::base::codec::encode(&Command::Put(PutRequest { key: b"k".to_vec(), ..Default::default() }));
    // The key's length prefix (after the format byte and the variant index)
    // claims far more bytes than follow.
    bytes[5..13].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    assert!(crate::base::codec::decode::<Command>(&bytes).is_err());
}

/// A sweep in small steps removes what one whole sweep does, and a new
/// compaction in the middle of one starts it over.
#[test]
fn compaction_sweeps_in_steps() {
    let mut s = MvccStore::default();
    for round in 0..3 {
        for k in 0..10 {
            put(&mut s, &format!("k{k}"), &format!("v{round}"));
        }
    }
    s.compact(12).unwrap(); // k0..k9 at round 0, then k0 of round 1
    assert!(s.sweep(3), "3 of 10 keys swept");
    s.compact(31).unwrap(); // everything but round 2
    let mut steps = 0;
    while s.sweep(3) {
        steps += 1;
    }
    assert_eq!(steps, 3, "10 keys in steps of 3, from the first key again");
    let mut whole = MvccStore::restore(s.versions().collect::<Vec<_>>(), s.revision(), s.compact_revision());
    whole.sweep(usize::MAX);
    assert_eq!(s.size_bytes(), whole.size_bytes());
    assert_eq!(s.versions().count(), 10, "one version per key left");
}

/// A history scan in steps of a few keys finds what one read of all of it
/// does; with a small budget it returns whole revisions up to where the
/// budget ran out, and the next scan from there finds the rest.
#[test]
fn history_scans_in_steps_and_within_a_budget() {
    let mut s = MvccStore::default();
    for round in 0..4 {
        for k in 0..8 {
            put(&mut s, &format!("k{k}"), &format!("v{round}"));
        }
    }
    let all = KeyRange::new(b"k", b"l");
    let whole = s.changes_between(&all, 2, s.revision()).unwrap();
    assert_eq!(whole.len(), 32);
    let mut stepped = HistoryScan::new(all.clone(), 2, s.revision(), usize::MAX);
    let mut steps = 0;
    while !stepped.finished() {
        s.scan_history(&mut stepped, 3).unwrap();
        steps += 1;
    }
    assert_eq!(steps, 3);
    assert_eq!(stepped.into_changes(), (whole.clone(), s.revision()));

    let mut from = 2;
    let mut pieces = Vec::new();
    while from <= s.revision() {
        let mut scan = HistoryScan::new(all.clone(), from, s.revision(), 300);
        while !scan.finished() {
            s.scan_history(&mut scan, 2).unwrap();
        }
        let (changes, to) = scan.into_changes();
        assert!(!changes.is_empty() && to >= from);
        assert!(changes.iter().all(|c| (from..=to).contains(&c.revision)));
        pieces.push(changes.len());
        from = to + 1;
    }
    assert!(pieces.len() > 2, "the budget cut the scan: {pieces:?}");
    assert_eq!(pieces.iter().sum::<usize>(), 32);

    // A compaction past the scan's start between two steps fails the next.
    let mut scan = HistoryScan::new(all, 2, s.revision(), usize::MAX);
    s.scan_history(&mut scan, 1).unwrap();
    s.compact(10).unwrap();
    assert_eq!(s.scan_history(&mut scan, 1), Err(MvccError::Compacted));
}

/// A range whose key-values weigh more than the response limit fails, alone
/// or in a txn; with a limit, or keys only, it is served.
#[test]
fn a_range_too_large_is_refused() {
    let mut s = MvccStore::default().with_response_limit(1000);
    for k in 0..10 {
        put(&mut s, &format!("k{k}"), &"v".repeat(100));
    }
    let all = RangeRequest { key: "k".into(), range_end: "l".into(), ..Default::default() };
    assert_eq!(s.range(&all).unwrap_err(), MvccError::ResponseTooLarge);
    let r = s.range(&RangeRequest { limit: 5, ..all.clone() }).unwrap();
    assert_eq!((r.kvs.len(), r.more, r.count), (5, true, 10));
    assert_eq!(s.range(&RangeRequest { keys_only: true, ..all.clone() }).unwrap().kvs.len(), 10);
    assert_eq!(s.range(&RangeRequest { count_only: true, ..all.clone() }).unwrap().count, 10);
    let txn = TxnRequest { compare: vec![], success: vec![RequestOp::Range(all)], failure: vec![] };
    assert!(matches!(s.txn(&txn, &()), Err(MvccError::ResponseTooLarge)));
}

/// A store whose superseded values are spilled answers every read, history
/// scan, hash and export exactly as one that keeps them in memory, through
/// segment rotations, compaction and sweeps; a segment is freed once
/// nothing refers to it; the newest values never leave memory.
#[test]
fn a_spilled_store_answers_as_one_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let mut memory = MvccStore::default();
    let mut spilled = MvccStore::default();
    // Small segments, so that the run rotates through many of them.
    spilled.spill_into(Spill::open(dir.path()).unwrap().with_segment_bytes(4096));
    let all = RangeRequest { key: vec![0], range_end: vec![0], ..Default::default() };
    let mut compacted = 1;
    for round in 0..6 {
        for i in 0..200 {
            let (k, v) = (format!("k{}", i % 37), format!("v{round}-{i}-{}", "x".repeat(i % 50)));
            put(&mut memory, &k, &v);
            put(&mut spilled, &k, &v);
            if i % 11 == 0 {
                let del = DeleteRangeRequest { key: format!("k{}", i % 5).into(), ..Default::default() };
                memory.delete_range(&del);
                spilled.delete_range(&del);
            }
        }
        assert_eq!(memory.revision(), spilled.revision());
        assert_eq!(memory.size_bytes(), spilled.size_bytes(), "the quota counts spilled values too");
        for rev in compacted..=memory.revision() {
            let at = RangeRequest { revision: rev, ..all.clone() };
            assert_eq!(memory.range(&at).unwrap().kvs, spilled.range(&at).unwrap().kvs, "range at {rev}");
        }
        let everything = KeyRange::From(vec![0]);
        let (a, b) = (
            memory.changes_between(&everything, compacted, memory.revision()).unwrap(),
            spilled.changes_between(&everything, compacted, memory.revision()).unwrap(),
        );
        let flat = |c: &[Change]| {
            c.iter().map(|c| (c.revision, c.sub, c.key.clone(), c.kv.clone(), c.prev.clone())).collect::<Vec<_>>()
        };
        assert_eq!(flat(&a), flat(&b), "changes from {compacted}");
        assert_eq!(memory.hash_kv(0).unwrap(), spilled.hash_kv(0).unwrap());
        assert_eq!(memory.versions().collect::<Vec<_>>(), spilled.versions().collect::<Vec<_>>());
        // A capture encodes as the versions it stands for, whether a
        // record is on file or still in the write buffer.
        let captured = bincode::serialize(&spilled.shared_versions().collect::<Vec<_>>()).unwrap();
        assert_eq!(captured, bincode::serialize(&memory.versions().collect::<Vec<_>>()).unwrap());
        // Only superseded values are spilled: every newest version is in memory.
        for versions in spilled.index.values() {
            assert!(!matches!(versions.last().unwrap().held, Held::Spilled(_)));
            assert!(versions[..versions.len() - 1].iter().all(|v| !matches!(v.held, Held::Memory(_))));
        }

        compacted = memory.revision() - 20;
        memory.compact(compacted).unwrap();
        spilled.compact(compacted).unwrap();
        while spilled.sweep(7) {}
        memory.sweep(usize::MAX);
    }
    let spill = spilled.spill().unwrap();
    assert!(spill.segments_held() < 12, "compacted segments are freed: {} held", spill.segments_held());
    assert!(spill.held_bytes() < 12 * 4096);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "segments are unlinked at once");
    compacted = spilled.revision();
    memory.compact(compacted).unwrap();
    spilled.compact(compacted).unwrap();
    spilled.sweep(usize::MAX);
    assert_eq!(spilled.spill().unwrap().segments_held(), 1, "only the segment being written is left");
}

/// Keys and values are encoded as byte strings (`serde_bytes`), which bincode
/// writes as one slice; earlier versions wrote them as sequences of `u8`.
/// Both are the same bytes, so journals, checkpoints and log entries written
/// before still read back: this checks it for the records that carry values.
#[test]
fn byte_strings_encode_as_the_sequences_of_u8_written_before() {
    #[derive(serde::Serialize)]
    struct KeyValueAsSequences {
        key: Vec<u8>,
        create_revision: Revision,
        mod_revision: Revision,
        version: i64,
        value: Vec<u8>,
        lease: i64,
    }
    #[derive(serde::Serialize)]
    struct StoredVersionAsSequences {
        revision: Revision,
        sub: i64,
        key: Vec<u8>,
        kv: Option<KeyValueAsSequences>,
    }
    /// The same version, in the types that encoded it before.
    fn as_sequences(v: &StoredVersion) -> StoredVersionAsSequences {
        StoredVersionAsSequences {
            revision: v.revision,
            sub: v.sub,
            key: v.key.clone(),
            kv: v.kv.as_ref().map(|kv| KeyValueAsSequences {
                key: kv.key.clone(),
                create_revision: kv.create_revision,
                mod_revision: kv.mod_revision,
                version: kv.version,
                value: kv.value.clone(),
                lease: kv.lease,
            }),
        }
    }
    let value: Vec<u8> = (0..1500u32).map(|i| (i % 251) as u8).collect();
    let kv = KeyValue { key: b"k/1".to_vec(), create_revision: 2, mod_revision: 9, version: 3, value, lease: 7 };
    let version = StoredVersion { revision: 9, sub: 1, key: b"k/1".to_vec(), kv: Some(kv) };
    let old_bytes = bincode::serialize(&as_sequences(&version)).unwrap();
    assert_eq!(bincode::serialize(&version).unwrap(), old_bytes);
    assert_eq!(bincode::deserialize::<StoredVersion>(&old_bytes).unwrap(), version);

    // The store's own encoding of its versions (what checkpoints write) too.
    let mut s = MvccStore::default();
    let value = version.kv.as_ref().unwrap().value.clone();
    s.put(PutRequest { key: b"k/1".to_vec(), value, ..Default::default() }, &()).unwrap();
    let captured = bincode::serialize(&s.shared_versions().collect::<Vec<_>>()).unwrap();
    let stored: Vec<StoredVersion> = bincode::deserialize(&captured).unwrap();
    assert_eq!(captured, bincode::serialize(&stored.iter().map(as_sequences).collect::<Vec<_>>()).unwrap());
}

/// The lock-delay rule: a lease's end or someone else's deletion of an
/// owner key with a delay setting puts the lock's marker in the same
/// revision; deleting the key and its setting together (a release) does not.
#[test]
fn involuntary_ends_of_delayed_grants_put_the_lock_marker() {
    let marker = |s: &MvccStore| get_at(s, "db/.lock-delay", 0).unwrap();
    let delete = |key: &str| DeleteRangeRequest { key: key.into(), ..Default::default() };
    let mut s = MvccStore::default();
    put(&mut s, "db/1f", "");
    put(&mut s, "db/1f.delay", "1500");
    // A lease's end deletes both: the marker comes in the same revision.
    let (revision, changes) = s.delete_keys(&[b"db/1f".to_vec(), b"db/1f.delay".to_vec()]);
    let m = marker(&s).expect("a marker");
    assert_eq!((m.value.as_slice(), m.mod_revision, m.lease), (&b"1500"[..], revision, 0));
    assert_eq!(changes.len(), 3, "two deletions and the marker");
    // A second involuntary end keeps the longer delay.
    put(&mut s, "db/2a", "");
    put(&mut s, "db/2a.delay", "900");
    let (revision, _) = s.delete_keys(&[b"db/2a".to_vec(), b"db/2a.delay".to_vec()]);
    let m = marker(&s).unwrap();
    assert_eq!((m.value.as_slice(), m.mod_revision, m.version), (&b"1500"[..], revision, 2));
    s.delete_range(&delete("db/.lock-delay"));
    // A release deletes the key and its setting together: no marker.
    put(&mut s, "db/3b", "");
    put(&mut s, "db/3b.delay", "700");
    let release = TxnRequest {
        success: vec![RequestOp::DeleteRange(delete("db/3b.delay")), RequestOp::DeleteRange(delete("db/3b"))],
        ..Default::default()
    };
    s.txn(&release, &()).unwrap();
    assert!(marker(&s).is_none());
    // Someone else deletes the owner key alone: marker, and the orphaned setting goes.
    put(&mut s, "db/4c", "");
    put(&mut s, "db/4c.delay", "60000");
    let (deleted, _) = s.delete_range(&delete("db/4c"));
    assert_eq!(marker(&s).unwrap().value, b"60000");
    assert_eq!(marker(&s).unwrap().mod_revision, deleted.revision);
    assert!(get_at(&s, "db/4c.delay", 0).unwrap().is_none());
    s.delete_range(&delete("db/.lock-delay"));
    // A lease's end that deletes the key but not a setting (another lease's) is no end of a delayed grant.
    put(&mut s, "db/5d", "");
    put(&mut s, "db/5d.delay", "100");
    s.delete_keys(&[b"db/5d".to_vec()]);
    assert!(marker(&s).is_none());
    // A setting that is not a delay (out of range, not decimal) starts nothing.
    for bad in ["0", "60001", "abc"] {
        put(&mut s, "q/1", "");
        put(&mut s, "q/1.delay", bad);
        s.delete_keys(&[b"q/1".to_vec(), b"q/1.delay".to_vec()]);
        assert!(get_at(&s, "q/.lock-delay", 0).unwrap().is_none(), "{bad}");
    }
}
