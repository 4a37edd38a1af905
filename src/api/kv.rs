//! etcd's KV service: Range, Put, DeleteRange, Txn, Compact.
//!
//! Validation follows etcd's order and errors exactly (empty key, sort options,
//! `ignore_*` with a value, txn op counts, then txn key overlaps), so a client
//! sees the same error for the same bad request. Reads are linearizable unless
//! `serializable` is set; writes go through Raft.

use std::collections::HashSet;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::{auth, check_request_size, error, header, MAX_TXN_OPS};
use crate::base::limits::RANGE_STEP_KEYS;
use crate::model::auth::PermKind;
use crate::model::mvcc::{self, KeyRange};
use crate::node::Node;
use crate::proto::etcdserverpb as pb;
use crate::proto::etcdserverpb::kv_server::{Kv, KvServer};
use crate::proto::mvccpb;

pub struct KvService {
    node: Arc<Node>,
}

impl KvService {
    pub fn server(node: Arc<Node>) -> super::served::Served<KvServer<KvService>> {
        super::served::Served(
            KvServer::new(KvService { node }).max_decoding_message_size(crate::base::limits::MAX_GRPC_MESSAGE_BYTES),
        )
    }
}

#[tonic::async_trait]
impl Kv for KvService {
    async fn range(&self, req: Request<pb::RangeRequest>) -> Result<Response<pb::RangeResponse>, Status> {
        let credentials = auth::Credentials::of(&req);
        let req = req.into_inner();
        let range = range_request(&req)?;
        if !req.serializable {
            self.node.read_barrier().await.map_err(error::server)?;
        }
        // Who the caller is, as of the barrier: a token forgotten by a change
        // committed before this read (a password change) no longer counts.
        let caller = credentials.caller(&self.node).await?;
        auth::check(&self.node, &caller, &req.key, &req.range_end, PermKind::Read)?;
        let result = range_in_steps(self.node.state(), range).await.map_err(error::mvcc)?;
        crate::base::metrics::metrics().ranges.inc();
        Ok(Response::new(range_response(&self.node, result)))
    }

    async fn put(&self, req: Request<pb::PutRequest>) -> Result<Response<pb::PutResponse>, Status> {
        let caller = auth::caller(&self.node, &req).await?;
        let req = req.into_inner();
        check_request_size(&req)?;
        let put = put_request(req)?;
        let result = self.node.put(put, Some(&caller)).await.map_err(error::write)?;
        Ok(Response::new(put_response(&self.node, result)))
    }

    async fn delete_range(
        &self,
        req: Request<pb::DeleteRangeRequest>,
    ) -> Result<Response<pb::DeleteRangeResponse>, Status> {
        let caller = auth::caller(&self.node, &req).await?;
        let req = req.into_inner();
        check_request_size(&req)?;
        let del = delete_request(req)?;
        let result = self.node.delete_range(del, Some(&caller)).await.map_err(error::write)?;
        Ok(Response::new(delete_response(&self.node, result)))
    }

    async fn txn(&self, req: Request<pb::TxnRequest>) -> Result<Response<pb::TxnResponse>, Status> {
        let credentials = auth::Credentials::of(&req);
        let req = req.into_inner();
        check_request_size(&req)?;
        check_txn(&req, MAX_TXN_OPS)?;
        check_intervals(&req.success)?;
        check_intervals(&req.failure)?;
        let txn = txn_request(req)?;
        let result = if txn.is_read_only() {
            // etcd serves a txn of reads without Raft; so does raftlock, with the
            // same linearizable barrier as a Range.
            self.node.read_barrier().await.map_err(error::server)?;
            let caller = credentials.caller(&self.node).await?;
            let state = self.node.state();
            let (leases, auth) = (state.leases(), state.auth());
            crate::model::auth::checks::check_txn(&auth, &caller, &txn, &leases).map_err(error::auth)?;
            drop((leases, auth));
            self.node.state().mvcc().read_txn(&txn).map_err(error::mvcc)?
        } else {
            let caller = credentials.caller(&self.node).await?;
            self.node.txn(txn, Some(&caller)).await.map_err(error::write)?
        };
        let mut resp = txn_response(result, true);
        resp.header = header(&self.node, resp.header.map_or(0, |h| h.revision));
        Ok(Response::new(resp))
    }

    async fn compact(&self, req: Request<pb::CompactionRequest>) -> Result<Response<pb::CompactionResponse>, Status> {
        let caller = auth::caller(&self.node, &req).await?;
        let req = req.into_inner();
        let revision = self.node.compact(req.revision, Some(&caller)).await.map_err(error::write)?;
        if req.physical {
            self.node.compaction_swept(Some(req.revision)).await;
        }
        Ok(Response::new(pb::CompactionResponse { header: header(&self.node, revision) }))
    }
}

// ---------------------------------------------------------------------------
// Validation (etcd's order and errors)
// ---------------------------------------------------------------------------

fn check_range(r: &pb::RangeRequest) -> Result<(), Status> {
    if r.key.is_empty() {
        return Err(error::empty_key());
    }
    if pb::range_request::SortOrder::try_from(r.sort_order).is_err()
        || pb::range_request::SortTarget::try_from(r.sort_target).is_err()
    {
        return Err(error::invalid_sort_option());
    }
    Ok(())
}

fn check_put(r: &pb::PutRequest) -> Result<(), Status> {
    if r.key.is_empty() {
        return Err(error::empty_key());
    }
    if r.ignore_value && !r.value.is_empty() {
        return Err(error::value_provided());
    }
    if r.ignore_lease && r.lease != 0 {
        return Err(error::lease_provided());
    }
    Ok(())
}

fn check_delete(r: &pb::DeleteRangeRequest) -> Result<(), Status> {
    if r.key.is_empty() {
        return Err(error::empty_key());
    }
    Ok(())
}

/// Read `req` from the applied state [`RANGE_STEP_KEYS`] keys at a time,
/// letting go of the store between steps (`mvcc::RangeScan`): a range over
/// millions of keys, or over history read back from disk, holds up apply
/// for one step at a time, not for its whole length.
pub(super) async fn range_in_steps(
    state: &crate::model::applied::AppliedState,
    req: crate::model::mvcc::RangeRequest,
) -> Result<crate::model::mvcc::RangeResult, crate::model::mvcc::MvccError> {
    let mut scan = crate::model::mvcc::RangeScan::new(&state.mvcc(), req)?;
    loop {
        state.mvcc().range_step(&mut scan, RANGE_STEP_KEYS)?;
        if scan.finished() {
            return scan.finish();
        }
        tokio::task::yield_now().await;
    }
}

/// etcd's checkTxnRequest: op counts (nested txns get what the parent left),
/// compare keys, then each op.
fn check_txn(r: &pb::TxnRequest, max_ops: usize) -> Result<(), Status> {
    let ops = r.compare.len().max(r.success.len()).max(r.failure.len());
    if ops > max_ops {
        return Err(error::too_many_ops());
    }
    if r.compare.iter().any(|c| c.key.is_empty()) {
        return Err(error::empty_key());
    }
    for op in r.success.iter().chain(&r.failure) {
        match &op.request {
            Some(pb::request_op::Request::RequestRange(r)) => check_range(r)?,
            Some(pb::request_op::Request::RequestPut(r)) => check_put(r)?,
            Some(pb::request_op::Request::RequestDeleteRange(r)) => check_delete(r)?,
            Some(pb::request_op::Request::RequestTxn(t)) => check_txn(t, max_ops - ops)?,
            None => {}
        }
    }
    Ok(())
}

/// A delete's interval as etcd's overlap check sees it: `range_end` is taken
/// literally (so `"\0"` does not mean "to the end" here, as in etcd).
fn delete_interval(d: &pb::DeleteRangeRequest) -> KeyRange {
    if d.range_end.is_empty() {
        KeyRange::Single(d.key.clone())
    } else {
        KeyRange::Interval(d.key.clone(), d.range_end.clone())
    }
}

/// etcd's checkIntervals: within one branch, no key may be put twice, nor put
/// and deleted; nested txns contribute the puts and deletes of both their
/// branches (a key put in both branches of one nested txn is fine).
fn check_intervals(ops: &[pb::RequestOp]) -> Result<(HashSet<Vec<u8>>, Vec<KeyRange>), Status> {
    use pb::request_op::Request;
    let mut dels: Vec<KeyRange> = ops
        .iter()
        .filter_map(|op| match &op.request {
            Some(Request::RequestDeleteRange(d)) => Some(delete_interval(d)),
            _ => None,
        })
        .collect();
    let hits = |dels: &[KeyRange], k: &[u8]| dels.iter().any(|d| d.contains(k));
    let mut puts: HashSet<Vec<u8>> = HashSet::new();
    for op in ops {
        let Some(Request::RequestTxn(t)) = &op.request else {
            continue;
        };
        let (puts_then, dels_then) = check_intervals(&t.success)?;
        let (puts_else, dels_else) = check_intervals(&t.failure)?;
        for k in &puts_then {
            if puts.contains(k) || hits(&dels, k) {
                return Err(error::duplicate_key());
            }
            puts.insert(k.clone());
        }
        for k in &puts_else {
            if (puts.contains(k) && !puts_then.contains(k)) || hits(&dels, k) {
                return Err(error::duplicate_key());
            }
            puts.insert(k.clone());
        }
        dels.extend(dels_then);
        dels.extend(dels_else);
    }
    for op in ops {
        let Some(Request::RequestPut(p)) = &op.request else {
            continue;
        };
        if puts.contains(&p.key) || hits(&dels, &p.key) {
            return Err(error::duplicate_key());
        }
        puts.insert(p.key.clone());
    }
    Ok((puts, dels))
}

// ---------------------------------------------------------------------------
// Conversions: protobuf -> mvcc
// ---------------------------------------------------------------------------

fn range_request(r: &pb::RangeRequest) -> Result<mvcc::RangeRequest, Status> {
    check_range(r)?;
    use pb::range_request::{SortOrder, SortTarget};
    let sort_order = match SortOrder::try_from(r.sort_order).map_err(|_| error::invalid_sort_option())? {
        SortOrder::None => mvcc::SortOrder::None,
        SortOrder::Ascend => mvcc::SortOrder::Ascend,
        SortOrder::Descend => mvcc::SortOrder::Descend,
    };
    let sort_target = match SortTarget::try_from(r.sort_target).map_err(|_| error::invalid_sort_option())? {
        SortTarget::Key => mvcc::SortTarget::Key,
        SortTarget::Version => mvcc::SortTarget::Version,
        SortTarget::Create => mvcc::SortTarget::Create,
        SortTarget::Mod => mvcc::SortTarget::Mod,
        SortTarget::Value => mvcc::SortTarget::Value,
    };
    Ok(mvcc::RangeRequest {
        key: r.key.clone(),
        range_end: r.range_end.clone(),
        limit: r.limit,
        revision: r.revision,
        sort_order,
        sort_target,
        keys_only: r.keys_only,
        count_only: r.count_only,
        min_mod_revision: r.min_mod_revision,
        max_mod_revision: r.max_mod_revision,
        min_create_revision: r.min_create_revision,
        max_create_revision: r.max_create_revision,
    })
}

fn put_request(r: pb::PutRequest) -> Result<mvcc::PutRequest, Status> {
    check_put(&r)?;
    Ok(mvcc::PutRequest {
        key: r.key,
        value: r.value,
        lease: r.lease,
        prev_kv: r.prev_kv,
        ignore_value: r.ignore_value,
        ignore_lease: r.ignore_lease,
    })
}

fn delete_request(r: pb::DeleteRangeRequest) -> Result<mvcc::DeleteRangeRequest, Status> {
    check_delete(&r)?;
    Ok(mvcc::DeleteRangeRequest { key: r.key, range_end: r.range_end, prev_kv: r.prev_kv })
}

fn compare(c: pb::Compare) -> Result<mvcc::Compare, Status> {
    use pb::compare::{CompareResult as R, CompareTarget as T, TargetUnion as U};
    let result = match R::try_from(c.result).map_err(|_| error::invalid_compare())? {
        R::Equal => mvcc::CompareResult::Equal,
        R::Greater => mvcc::CompareResult::Greater,
        R::Less => mvcc::CompareResult::Less,
        R::NotEqual => mvcc::CompareResult::NotEqual,
    };
    let target = T::try_from(c.target).map_err(|_| error::invalid_compare())?;
    // As in etcd, an operand of another kind than the target reads as zero.
    let (number, value) = match (target, c.target_union) {
        (T::Version, Some(U::Version(v))) => (v, Vec::new()),
        (T::Create, Some(U::CreateRevision(v))) => (v, Vec::new()),
        (T::Mod, Some(U::ModRevision(v))) => (v, Vec::new()),
        (T::Lease, Some(U::Lease(v))) => (v, Vec::new()),
        (T::Value, Some(U::Value(v))) => (0, v),
        _ => (0, Vec::new()),
    };
    let target = match target {
        T::Version => mvcc::CompareTarget::Version,
        T::Create => mvcc::CompareTarget::Create,
        T::Mod => mvcc::CompareTarget::Mod,
        T::Value => mvcc::CompareTarget::Value,
        T::Lease => mvcc::CompareTarget::Lease,
    };
    Ok(mvcc::Compare { result, target, key: c.key, range_end: c.range_end, number, value })
}

fn request_ops(ops: Vec<pb::RequestOp>) -> Result<Vec<mvcc::RequestOp>, Status> {
    use pb::request_op::Request;
    ops.into_iter()
        .filter_map(|op| op.request)
        .map(|r| {
            Ok(match r {
                Request::RequestRange(r) => mvcc::RequestOp::Range(range_request(&r)?),
                Request::RequestPut(r) => mvcc::RequestOp::Put(put_request(r)?),
                Request::RequestDeleteRange(r) => mvcc::RequestOp::DeleteRange(delete_request(r)?),
                Request::RequestTxn(t) => mvcc::RequestOp::Txn(txn_request(t)?),
            })
        })
        .collect()
}

fn txn_request(r: pb::TxnRequest) -> Result<mvcc::TxnRequest, Status> {
    Ok(mvcc::TxnRequest {
        compare: r.compare.into_iter().map(compare).collect::<Result<_, _>>()?,
        success: request_ops(r.success)?,
        failure: request_ops(r.failure)?,
    })
}

// ---------------------------------------------------------------------------
// Conversions: mvcc -> protobuf
// ---------------------------------------------------------------------------

pub fn key_value(kv: mvcc::KeyValue) -> mvccpb::KeyValue {
    mvccpb::KeyValue {
        key: kv.key,
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        value: kv.value,
        lease: kv.lease,
    }
}

/// A header carrying only a revision: what etcd puts on the responses inside a txn.
fn bare_header(revision: i64) -> Option<pb::ResponseHeader> {
    Some(pb::ResponseHeader { revision, ..Default::default() })
}

fn range_body(r: mvcc::RangeResult) -> pb::RangeResponse {
    pb::RangeResponse {
        header: bare_header(r.revision),
        kvs: r.kvs.into_iter().map(key_value).collect(),
        more: r.more,
        count: r.count,
    }
}

fn put_body(r: mvcc::PutResult) -> pb::PutResponse {
    pb::PutResponse { header: bare_header(r.revision), prev_kv: r.prev_kv.map(key_value) }
}

fn delete_body(r: mvcc::DeleteRangeResult) -> pb::DeleteRangeResponse {
    pb::DeleteRangeResponse {
        header: bare_header(r.revision),
        deleted: r.deleted,
        prev_kvs: r.prev_kvs.into_iter().map(key_value).collect(),
    }
}

fn range_response(node: &Node, r: mvcc::RangeResult) -> pb::RangeResponse {
    let revision = r.revision;
    pb::RangeResponse { header: header(node, revision), ..range_body(r) }
}

fn put_response(node: &Node, r: mvcc::PutResult) -> pb::PutResponse {
    let revision = r.revision;
    pb::PutResponse { header: header(node, revision), ..put_body(r) }
}

fn delete_response(node: &Node, r: mvcc::DeleteRangeResult) -> pb::DeleteRangeResponse {
    let revision = r.revision;
    pb::DeleteRangeResponse { header: header(node, revision), ..delete_body(r) }
}

/// A txn's response; nested ones carry the headers etcd gives them (a bare
/// revision on reads and writes, an empty header on a nested txn).
fn txn_response(r: mvcc::TxnResult, outer: bool) -> pb::TxnResponse {
    use pb::response_op::Response as R;
    let responses = r
        .responses
        .into_iter()
        .map(|op| pb::ResponseOp {
            response: Some(match op {
                mvcc::ResponseOp::Range(r) => R::ResponseRange(range_body(r)),
                mvcc::ResponseOp::Put(r) => R::ResponsePut(put_body(r)),
                mvcc::ResponseOp::DeleteRange(r) => R::ResponseDeleteRange(delete_body(r)),
                mvcc::ResponseOp::Txn(t) => R::ResponseTxn(txn_response(t, false)),
            }),
        })
        .collect();
    let header = if outer { bare_header(r.revision) } else { Some(pb::ResponseHeader::default()) };
    pb::TxnResponse { header, succeeded: r.succeeded, responses }
}
