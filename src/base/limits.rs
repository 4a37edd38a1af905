//! Every size, batch and queue budget of raftlock in one place: what a
//! client may send and be sent, how writes are batched and queued, how much
//! replication keeps in flight, and how large the log and its copies grow.
//!
//! Invariants: a budget that bounds memory is in bytes or items, never
//! both left open; where etcd has the same limit raftlock uses etcd's
//! value (noted); budgets that two members must agree on (the peer message
//! size, the txn depth a decoder accepts) change only with a new peer
//! protocol version.
//!
//! Caveat: some values depend on each other (the gRPC message limit sits
//! above the request limit so that the request check answers first; a
//! peer message carries at most a batch of the largest requests); the
//! tests beside their users check those relations.

// ---- Client requests (etcd's limits where etcd has one) ----

/// The largest request accepted, as etcd's `--max-request-bytes` default.
pub const MAX_CLIENT_REQUEST_BYTES: usize = 3 * 512 * 1024;

/// What the gRPC layer decodes at most: the request limit plus etcd's overhead.
pub const MAX_GRPC_MESSAGE_BYTES: usize = MAX_CLIENT_REQUEST_BYTES + 512 * 1024;

/// The most operations in one branch of a txn.
pub const MAX_TXN_OPS: usize = 128;

/// The deepest txn nesting that decodes. The API's op budget (etcd's: every
/// level spends at least one of the 128 operations a txn may hold) keeps
/// what clients send at most 129 deep; anything deeper came from somewhere
/// else (a rogue peer, a damaged file) and is refused when it is decoded,
/// before the recursion could exhaust the stack.
pub const MAX_TXN_DEPTH: usize = 160;

/// The most key-value bytes one range returns (its keys, values and 64
/// bytes each): a larger one fails with [`MvccError::ResponseTooLarge`]
/// rather than copy that much of the store into one message. 256 MiB is far
/// more than a lock service's ranges need, and well inside what a gRPC
/// message may hold.
pub const MAX_RANGE_RESPONSE_BYTES: usize = 256 << 20;

/// Keys a range reads per step while it holds the store's lock.
pub const RANGE_STEP_KEYS: usize = 1024;

/// The largest JSON body accepted: a request at the gRPC limit, in base64,
/// with room to spare; the gRPC service refuses what is over its own limit.
pub const MAX_GATEWAY_BODY_BYTES: usize = 4 * 1024 * 1024;

/// The most permits a lock may have.
pub const MAX_PERMITS: u32 = 1024;

/// The most locks one multi-lock may take: its places are queued in one txn
/// that reads every queue whole, three operations per lock.
pub const MAX_LOCKS_PER_ACQUIRE: usize = 64;

/// The most bytes a multi-lock's names may have together: its grants, which
/// a client hands back whole to release them, repeat each name twice (the
/// name and the owner key), and must still fit a request.
pub const MAX_MULTI_LOCK_NAME_BYTES: usize = 512 * 1024;

/// Snapshot stream chunk size (etcd's).
pub const SNAPSHOT_CHUNK_BYTES: usize = 32 * 1024;

// ---- Watches ----

/// Watchers one stream may hold at once. Each holds its range, and every
/// batch routed to the stream is matched against each watcher of a range
/// (of single keys, by lookup): a client that wants more opens another
/// stream.
pub const MAX_WATCHERS_PER_STREAM: usize = 10_000;

/// Responses queued for a client that is not reading, per stream.
pub const WATCH_OUTBOX: usize = 64;

/// A catch-up reads history in scans of about this many bytes of events
/// (`mvcc::HistoryScan`), then sends them before reading on.
pub const WATCH_CATCH_UP_BYTES: usize = 4 << 20;

/// Keys a catch-up scan looks at per hold of the store's lock.
pub const WATCH_CATCH_UP_KEYS: usize = 4096;

/// Batches one session's inbox holds before it is told it lagged.
pub const WATCH_INBOX_BATCHES: usize = 1024;

/// Bytes of changes (keys, values and previous values) one session's inbox
/// holds before it is told it lagged.
pub const WATCH_INBOX_BYTES: usize = 64 << 20;

/// The most distinct ranges that are neither a single key nor a prefix a
/// member routes at once. Apply finds a changed key among them in an
/// interval index (logarithmic in their number), so the cap bounds what the
/// routing table holds for ranges no two watchers share, not apply's cost.
/// A watch over one more is refused (`Inbox::watch`); watchers of a range
/// already routed, prefixes and single keys are never refused.
pub const MAX_WATCHED_RANGES: usize = 65_536;

// ---- The write path: proposal batches and forwarding ----

/// The most commands in one log entry.
pub const MAX_BATCH_COMMANDS: usize = 512;

/// Batches proposed and not yet answered, at most. More than one lets the next
/// batches be appended while earlier ones are replicated and applied (the
/// measurements: docs/performance-notes.md).
pub const BATCHES_IN_FLIGHT: usize = 4;

/// The most encoded command bytes in one log entry (etcd sends at most
/// 1 MiB of entries per message; one request may be 1.5 MiB).
pub const MAX_BATCH_BYTES: u64 = 2 << 20;

/// Commands waiting for a batch, at most.
pub const MAX_QUEUED_COMMANDS: usize = 16 * 1024;

/// Encoded bytes of the commands waiting for a batch, at most.
pub const MAX_QUEUED_BYTES: u64 = 128 << 20;

/// Forwarded batches on their way at once, at most.
pub const FORWARD_IN_FLIGHT: usize = 2;

// ---- Replication to followers ----

/// Requests sent on a pipe and not yet answered, at most.
pub const APPENDS_IN_FLIGHT: usize = 8;

/// The most log entries in one request (each entry is a proposal batch).
pub const MAX_APPEND_ENTRIES: usize = 64;

/// The most encoded entry bytes in one request, but for its first entry (which
/// is at most `raft::proposer::MAX_BATCH_BYTES` plus one command): with
/// [`MAX_IN_FLIGHT`] requests on a pipe, what a slow follower can have
/// queued towards it stays bounded.
pub const MAX_APPEND_BYTES: u64 = 4 << 20;

/// The largest peer message accepted or sent: far above any AppendEntries
/// batch or snapshot chunk a member sends, and a bound on what a peer can
/// make this member buffer.
pub const MAX_PEER_MESSAGE_BYTES: usize = 16 << 20;

// ---- The log, snapshots and checkpoints ----

/// The bytes of encoded entries kept decoded in memory, at most (but the
/// last entry, which always is): far more than a follower or apply that
/// keeps up is behind (a proposal batch is at most 2 MiB, so four batches).
pub const HOT_LOG_BYTES: u64 = 8 << 20;

/// Log bytes applied since the last snapshot that make the next one due
/// (or the state's weight, if larger: see [`bound_log`]).
pub const SNAPSHOT_LOG_BYTES: u64 = 64 << 20;

/// Log bytes kept behind a snapshot for members a little behind.
pub const CATCHUP_LOG_BYTES: u64 = 64 << 20;

/// The fewest journal bytes between two checkpoints (see the module doc).
pub const CHECKPOINT_MIN_BYTES: u64 = 64 << 20;

/// The default segment size. Large enough that rotation is rare, small enough
/// that purged segments give memory and disk back soon.
pub const WAL_SEGMENT_BYTES: u64 = 64 << 20;

// ---- The space quota ----

/// The space quota when `--quota-backend-bytes` is 0 (etcd's).
pub const DEFAULT_QUOTA_BYTES: u64 = 2 << 30;

// ---- Leases ----

/// The most leases proposed for expiry in a second, by default
/// (`--lease-expiry-rate`). etcd's rate is 1,000: a storm of 100,000 leases
/// then takes 100 s to clear, and every lock under them is released that
/// late. At 20,000, 100,000 leases were gone 5.4 s after their deadline,
/// with 16 clients' puts at p99 32 ms meanwhile (docs/performance-notes.md,
/// "A lease-expiry storm of 100,000").
pub const EXPIRIES_PER_SECOND: usize = 20_000;

// ---- Auth ----

/// The most names and addresses whose failures are counted.
pub const MAX_TRACKED_LOGIN_FAILURES: usize = 16_384;
