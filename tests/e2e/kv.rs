//! KV behaviour on a real 3-member cluster, driven by the `etcd-client` crate.

use crate::common::{grpc_error, Cluster};
use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
};
use tonic::Code;

fn keys(resp: &etcd_client::GetResponse) -> Vec<String> {
    resp.kvs().iter().map(|kv| kv.key_str().unwrap().to_string()).collect()
}

#[tokio::test]
async fn put_get_delete_revisions_and_history() {
    let cluster = Cluster::start(3).await;
    let mut c = cluster.client(cluster.follower().await).await;

    let base = c.get("any", None).await.unwrap().header().unwrap().revision();
    let r1 = c.put("k", "v1", None).await.unwrap().header().unwrap().revision();
    assert_eq!(r1, base + 1, "one revision per write");
    let r2 = c.put("k", "v2", Some(PutOptions::new().with_prev_key())).await.unwrap();
    assert_eq!(r2.prev_key().unwrap().value(), b"v1");
    let r2 = r2.header().unwrap().revision();

    let got = c.get("k", None).await.unwrap();
    let kv = &got.kvs()[0];
    assert_eq!((kv.create_revision(), kv.mod_revision(), kv.version()), (r1, r2, 2));
    assert_eq!(got.count(), 1);
    assert_eq!(got.header().unwrap().revision(), r2);

    // Reads at a past revision see history.
    let old = c.get("k", Some(GetOptions::new().with_revision(r1))).await.unwrap();
    assert_eq!(old.kvs()[0].value(), b"v1");
    // A future revision is an error.
    let (code, msg) = grpc_error(c.get("k", Some(GetOptions::new().with_revision(r2 + 100))).await.unwrap_err());
    assert_eq!((code, msg.as_str()), (Code::OutOfRange, "etcdserver: mvcc: required revision is a future revision"));

    let del = c.delete("k", Some(DeleteOptions::new().with_prev_key())).await.unwrap();
    assert_eq!(del.deleted(), 1);
    assert_eq!(del.prev_kvs()[0].value(), b"v2");
    let r3 = del.header().unwrap().revision();
    assert_eq!(r3, r2 + 1);
    // Deleting nothing does not bump the revision.
    let del = c.delete("k", None).await.unwrap();
    assert_eq!((del.deleted(), del.header().unwrap().revision()), (0, r3));
    assert!(c.get("k", None).await.unwrap().kvs().is_empty());
    // A new generation starts at version 1.
    let r4 = c.put("k", "v3", None).await.unwrap().header().unwrap().revision();
    let kv = c.get("k", None).await.unwrap().kvs()[0].clone();
    assert_eq!((kv.create_revision(), kv.version()), (r4, 1));

    // ignore_value keeps the value, and needs an existing key.
    c.put("k", "", Some(PutOptions::new().with_ignore_value())).await.unwrap();
    assert_eq!(c.get("k", None).await.unwrap().kvs()[0].value(), b"v3");
    let (code, msg) = grpc_error(c.put("missing", "", Some(PutOptions::new().with_ignore_value())).await.unwrap_err());
    assert_eq!((code, msg.as_str()), (Code::InvalidArgument, "etcdserver: key not found"));
    let (code, msg) = grpc_error(c.put("k", "x", Some(PutOptions::new().with_ignore_value())).await.unwrap_err());
    assert_eq!((code, msg.as_str()), (Code::InvalidArgument, "etcdserver: value is provided"));
    // Until leases exist every lease is unknown.
    let (code, msg) = grpc_error(c.put("k", "x", Some(PutOptions::new().with_lease(42))).await.unwrap_err());
    assert_eq!((code, msg.as_str()), (Code::NotFound, "etcdserver: requested lease not found"));

    // Compaction.
    let cur = c.put("k", "v4", None).await.unwrap().header().unwrap().revision();
    c.compact(cur - 1, None).await.unwrap();
    let (code, msg) = grpc_error(c.get("k", Some(GetOptions::new().with_revision(r1))).await.unwrap_err());
    assert_eq!((code, msg.as_str()), (Code::OutOfRange, "etcdserver: mvcc: required revision has been compacted"));
    let (code, _) = grpc_error(c.compact(cur - 1, None).await.unwrap_err());
    assert_eq!(code, Code::OutOfRange);
    assert_eq!(c.get("k", Some(GetOptions::new().with_revision(cur - 1))).await.unwrap().kvs()[0].value(), b"v3");
}

#[tokio::test]
async fn ranges_prefixes_limits_sorting_and_filters() {
    let cluster = Cluster::start(3).await;
    let mut c = cluster.client(0).await;
    for (k, v) in [("r/b", "2"), ("r/a", "3"), ("r/d", "0"), ("r/c", "1"), ("s/x", "9")] {
        c.put(k, v, None).await.unwrap();
    }
    let prefix = c.get("r/", Some(GetOptions::new().with_prefix())).await.unwrap();
    assert_eq!(keys(&prefix), ["r/a", "r/b", "r/c", "r/d"]);
    let range = c.get("r/b", Some(GetOptions::new().with_range("r/d"))).await.unwrap();
    assert_eq!(keys(&range), ["r/b", "r/c"]);
    let from = c.get("r/c", Some(GetOptions::new().with_from_key())).await.unwrap();
    assert_eq!(keys(&from), ["r/c", "r/d", "s/x"]);
    let all = c.get("", Some(GetOptions::new().with_all_keys())).await.unwrap();
    assert_eq!(all.count(), 5);

    let limited = c.get("r/", Some(GetOptions::new().with_prefix().with_limit(2))).await.unwrap();
    assert_eq!((keys(&limited), limited.more(), limited.count()), (vec!["r/a".into(), "r/b".into()], true, 4));
    let exact = c.get("r/", Some(GetOptions::new().with_prefix().with_limit(4))).await.unwrap();
    assert!(!exact.more());

    let by_value = c
        .get("r/", Some(GetOptions::new().with_prefix().with_sort(SortTarget::Value, SortOrder::Descend)))
        .await
        .unwrap();
    assert_eq!(keys(&by_value), ["r/a", "r/b", "r/c", "r/d"]);
    let by_key_desc = c
        .get("r/", Some(GetOptions::new().with_prefix().with_sort(SortTarget::Key, SortOrder::Descend).with_limit(1)))
        .await
        .unwrap();
    assert_eq!((keys(&by_key_desc), by_key_desc.more()), (vec!["r/d".into()], true));
    let by_create = c
        .get("r/", Some(GetOptions::new().with_prefix().with_sort(SortTarget::Create, SortOrder::Ascend)))
        .await
        .unwrap();
    assert_eq!(keys(&by_create), ["r/b", "r/a", "r/d", "r/c"]);

    let keys_only = c.get("r/", Some(GetOptions::new().with_prefix().with_keys_only())).await.unwrap();
    assert!(keys_only.kvs().iter().all(|kv| kv.value().is_empty()));
    let count_only = c.get("r/", Some(GetOptions::new().with_prefix().with_count_only())).await.unwrap();
    assert_eq!((count_only.kvs().len(), count_only.count()), (0, 4));

    let a_rev = prefix.kvs()[0].mod_revision();
    let filtered = c
        .get("r/", Some(GetOptions::new().with_prefix().with_min_mod_revision(a_rev).with_max_mod_revision(a_rev + 1)))
        .await
        .unwrap();
    assert_eq!(keys(&filtered), ["r/a", "r/d"]);
    let filtered = c.get("r/", Some(GetOptions::new().with_prefix().with_max_create_revision(a_rev))).await.unwrap();
    assert_eq!(keys(&filtered), ["r/a", "r/b"]);

    // Serializable reads are served locally on every member.
    for i in 0..3 {
        let mut ci = cluster.client(i).await;
        let mut tries = 0;
        loop {
            let r = ci.get("s/x", Some(GetOptions::new().with_serializable())).await.unwrap();
            if r.kvs().len() == 1 || tries > 100 {
                assert_eq!(r.kvs()[0].value(), b"9");
                break;
            }
            tries += 1;
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
}

#[tokio::test]
async fn transactions() {
    let cluster = Cluster::start(3).await;
    let mut c = cluster.client(cluster.follower().await).await;
    let r1 = c.put("t/a", "1", None).await.unwrap().header().unwrap().revision();

    // Success branch: two writes share one revision, a read sees them.
    let txn = Txn::new()
        .when([
            Compare::value("t/a", CompareOp::Equal, "1"),
            Compare::version("t/a", CompareOp::Equal, 1),
            Compare::create_revision("t/a", CompareOp::Equal, r1),
            Compare::mod_revision("t/a", CompareOp::Less, r1 + 1),
            Compare::lease("t/a", CompareOp::Equal, 0),
            Compare::version("t/missing", CompareOp::Equal, 0),
        ])
        .and_then([TxnOp::put("t/b", "2", None), TxnOp::put("t/c", "3", None), TxnOp::get("t/b", None)])
        .or_else([TxnOp::put("t/failed", "x", None)]);
    let resp = c.txn(txn).await.unwrap();
    assert!(resp.succeeded());
    let rev = resp.header().unwrap().revision();
    assert_eq!(rev, r1 + 1);
    match &resp.op_responses()[2] {
        TxnOpResponse::Get(g) => assert_eq!(g.kvs()[0].mod_revision(), rev),
        other => panic!("{other:?}"),
    }

    // Failure branch, and compares on a range.
    let txn = Txn::new()
        .when([Compare::value("t/", CompareOp::Greater, "0").with_prefix()])
        .and_then([TxnOp::delete("t/", Some(DeleteOptions::new().with_prefix()))])
        .or_else([TxnOp::get("t/", Some(GetOptions::new().with_prefix().with_count_only()))]);
    let resp = c.txn(txn).await.unwrap();
    assert!(resp.succeeded(), "every value under t/ is > \"0\"");
    match &resp.op_responses()[0] {
        TxnOpResponse::Delete(d) => assert_eq!(d.deleted(), 3),
        other => panic!("{other:?}"),
    }
    let resp = c
        .txn(
            Txn::new()
                .when([Compare::value("t/a", CompareOp::Equal, "")])
                .and_then([TxnOp::put("t/x", "never", None)])
                .or_else([TxnOp::put("t/y", "else", None)]),
        )
        .await
        .unwrap();
    assert!(!resp.succeeded(), "a value compare on a missing key fails");
    assert_eq!(c.get("t/y", None).await.unwrap().kvs()[0].value(), b"else");

    // Nested txns.
    let inner = Txn::new()
        .when([Compare::version("t/y", CompareOp::Greater, 0)])
        .and_then([TxnOp::put("t/nested", "yes", None)]);
    let resp = c.txn(Txn::new().and_then([TxnOp::txn(inner), TxnOp::put("t/outer", "o", None)])).await.unwrap();
    assert!(resp.succeeded());
    assert_eq!(c.get("t/nested", None).await.unwrap().kvs()[0].value(), b"yes");

    // A read-only txn does not bump the revision.
    let before = c.get("t/y", None).await.unwrap().header().unwrap().revision();
    let resp = c.txn(Txn::new().and_then([TxnOp::get("t/y", None)])).await.unwrap();
    assert_eq!(resp.header().unwrap().revision(), before);

    // Validation: duplicate keys, put inside a deleted range, too many ops.
    let dup = Txn::new().and_then([TxnOp::put("d", "1", None), TxnOp::put("d", "2", None)]);
    let (code, msg) = grpc_error(c.txn(dup).await.unwrap_err());
    assert_eq!((code, msg.as_str()), (Code::InvalidArgument, "etcdserver: duplicate key given in txn request"));
    let overlap = Txn::new()
        .and_then([TxnOp::delete("a", Some(DeleteOptions::new().with_range("z"))), TxnOp::put("m", "1", None)]);
    assert_eq!(grpc_error(c.txn(overlap).await.unwrap_err()).1, "etcdserver: duplicate key given in txn request");
    let many: Vec<TxnOp> = (0..129).map(|i| TxnOp::put(format!("many/{i}"), "v", None)).collect();
    let (code, msg) = grpc_error(c.txn(Txn::new().and_then(many)).await.unwrap_err());
    assert_eq!((code, msg.as_str()), (Code::InvalidArgument, "etcdserver: too many operations in txn request"));
    let ok: Vec<TxnOp> = (0..128).map(|i| TxnOp::put(format!("many/{i}"), "v", None)).collect();
    c.txn(Txn::new().and_then(ok)).await.unwrap();
    // A txn that fails a check changes nothing.
    let bad = Txn::new()
        .and_then([TxnOp::put("t/z", "1", None), TxnOp::put("t/w", "1", Some(PutOptions::new().with_lease(7)))]);
    let rev_before = c.get("t/z", None).await.unwrap().header().unwrap().revision();
    assert_eq!(grpc_error(c.txn(bad).await.unwrap_err()).0, Code::NotFound);
    let after = c.get("t/z", None).await.unwrap();
    assert!(after.kvs().is_empty());
    assert_eq!(after.header().unwrap().revision(), rev_before);
}

#[tokio::test]
async fn bad_input_is_refused_and_the_node_keeps_serving() {
    let cluster = Cluster::start(3).await;
    let mut c = cluster.client(0).await;
    let empty = [
        grpc_error(c.put("", "v", None).await.unwrap_err()),
        grpc_error(c.get("", None).await.unwrap_err()),
        grpc_error(c.delete("", None).await.unwrap_err()),
    ];
    for (code, msg) in empty {
        assert_eq!((code, msg.as_str()), (Code::InvalidArgument, "etcdserver: key is not provided"));
    }
    // 1.5 MiB is the limit for a request.
    let big = vec![b'x'; 3 * 512 * 1024];
    let (code, msg) = grpc_error(c.put("big", big, None).await.unwrap_err());
    assert_eq!((code, msg.as_str()), (Code::InvalidArgument, "etcdserver: request is too large"));
    let fits = vec![b'x'; 1024 * 1024];
    c.put("big", fits, None).await.unwrap();
    assert_eq!(c.get("big", None).await.unwrap().kvs()[0].value().len(), 1024 * 1024);
    // And the cluster still serves through every member.
    for i in 0..3 {
        let mut ci = cluster.client(i).await;
        ci.put(format!("after/{i}"), "ok", None).await.unwrap();
    }
}

#[tokio::test]
async fn every_member_serves_writes_with_etcd_headers() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.leader().await;
    let mut seen_members = std::collections::BTreeSet::new();
    let mut cluster_ids = std::collections::BTreeSet::new();
    let mut last = 0;
    for i in 0..3 {
        let mut c = cluster.client(i).await;
        let resp = c.put(format!("w/{i}"), "v", None).await.unwrap();
        let h = resp.header().unwrap();
        assert!(h.revision() > last, "revisions increase across members");
        last = h.revision();
        assert!(h.raft_term() >= 1);
        seen_members.insert(h.member_id());
        cluster_ids.insert(h.cluster_id());
        // Linearizable: a read on any member right after the write sees it.
        for j in 0..3 {
            let mut cj = cluster.client(j).await;
            let got = cj.get(format!("w/{i}"), None).await.unwrap();
            assert_eq!(got.kvs().len(), 1, "member {j} must see the write made through {i} (leader {leader})");
        }
    }
    assert_eq!(seen_members.len(), 3, "each member answers with its own ID");
    assert_eq!(cluster_ids.len(), 1, "one cluster ID");

    let mut c = cluster.client(0).await;
    let members = c.member_list().await.unwrap();
    assert_eq!(members.members().len(), 3);
    let mut names: Vec<_> = members.members().iter().map(|m| m.name().to_string()).collect();
    names.sort();
    assert_eq!(names, ["m0", "m1", "m2"]);
    for m in members.members() {
        assert_eq!(m.peer_urls().len(), 1);
        assert!(seen_members.contains(&m.id()));
        assert!(!m.is_learner());
    }
    // Client URLs are published through the log; wait for all three.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let members = c.member_list().await.unwrap();
        if members.members().iter().all(|m| m.client_urls().len() == 1) {
            let mut urls: Vec<_> = members.members().iter().map(|m| m.client_urls()[0].clone()).collect();
            urls.sort();
            let mut want = cluster.endpoints();
            want.sort();
            assert_eq!(urls, want);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "client URLs not published");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // The leader now (an election may have happened since the start).
    let leader = cluster.leader().await;
    let status = c.status().await.unwrap();
    assert_eq!(status.leader(), cluster_leader_id(&cluster, leader).await);
    assert!(status.raft_index() > 0);
}

/// A follower answers a write it forwarded from its own apply, so a
/// serializable read on that member right after the answer sees the write
/// (with the leader's answer relayed instead, the follower could still be
/// an entry behind when its client read).
#[tokio::test]
async fn a_follower_has_applied_the_writes_it_answers() {
    let cluster = Cluster::start(3).await;
    let follower = cluster.follower().await;
    let mut c = cluster.client(follower).await;
    let serializable = || Some(GetOptions::new().with_serializable());
    for i in 0..300 {
        let put = c.put("ryw/k", i.to_string(), None).await.unwrap();
        let written = put.header().unwrap().revision();
        let got = c.get("ryw/k", serializable()).await.unwrap();
        assert!(
            got.header().unwrap().revision() >= written,
            "write {i} answered at revision {written}, read there at {}",
            got.header().unwrap().revision()
        );
        assert_eq!(got.kvs()[0].value(), i.to_string().as_bytes(), "write {i}");
    }
}

async fn cluster_leader_id(cluster: &Cluster, leader: usize) -> u64 {
    let mut c = cluster.client(leader).await;
    c.status().await.unwrap().header().unwrap().member_id()
}
