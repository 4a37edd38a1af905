//! Linearizability of one key, modelled as a register holding `Option<u64>`
//! (`None`: the key is absent), by the Wing–Gong search with Lowe's
//! memoization.
//!
//! Keys are independent registers, so a history is linearizable iff each key's
//! sub-history is (P-compositionality): the caller splits the history by key
//! and calls [`check_register`] once per key. Every written value must be
//! unique within a run; a read then names the write it saw.
//!
//! How outcomes count:
//! - `Failed` operations did not happen and are dropped.
//! - An `Unknown` read has no effect and tells nothing; it is dropped.
//! - An `Unknown` write or compare-and-swap may take effect at any time after
//!   its invocation, or never. An unknown compare-and-swap that fails changes
//!   nothing, which is the same as never taking effect, so the search only
//!   ever tries it as a success (when the register holds `expect`).
//! - The search succeeds once every operation with a known outcome is
//!   linearized; unknown ones may stay pending forever.
//!
//! Time: each operation occupies `[invoke, complete]`. Intervals that touch
//! (one completes at the very nanosecond the other is invoked) are treated as
//! concurrent — the conservative choice, since a shared clock read at equal
//! values cannot order the two server-side effects. Concretely, among events
//! at equal times invocations sort before completions.
//!
//! The search: invocations and completions form a doubly linked list in time
//! order. An operation may be linearized next iff its invocation comes before
//! the first completion left in the list; linearizing it unlinks its entries
//! and pushes it on a stack, and reaching a completion whose operation is not
//! linearized means the current order is a dead end, so the last operation is
//! popped and relinked and the next candidate after it is tried. Lowe's cache
//! remembers every (set of linearized operations, register value) reached, so
//! no configuration is explored twice.
//!
//! Caveat: the search is exponential in the worst case. `budget` bounds the
//! number of search steps; running out gives [`Verdict::Undecided`], which the
//! caller must report as undecided, never as an anomaly. One step is one visit
//! of a list entry. So that unknown writes which never took effect do not
//! multiply the search, an unknown write whose value nobody observed is only
//! tried where it can matter (the docs of `Search` say why that is sound).

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::format_time;
use crate::history::{Anomaly, Op, Outcome, Time, NEVER};

const CHECKER: &str = "linearizable";
const SERIALIZABLE_CHECKER: &str = "serializable-reads";

/// How many of the prefix's last operations an anomaly lists.
const PREFIX_TAIL_SHOWN: usize = 8;

/// A request on one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RegisterInput {
    Read,
    Write(u64),
    /// Write `new` iff the key holds `expect` (`None`: the key is absent).
    Cas {
        expect: Option<u64>,
        new: u64,
    },
}

/// The answer to a [`RegisterInput`] of the same kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RegisterOutput {
    Read(Option<u64>),
    Write,
    /// Whether the swap happened.
    Cas(bool),
}

/// What the search concluded about one key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    Linearizable,
    NotLinearizable(Anomaly),
    /// The budget ran out after `explored` steps; nothing is known.
    Undecided {
        explored: usize,
    },
}

type State = Option<u64>;

/// What an operation does to the register, as far as the search is concerned.
#[derive(Clone, Copy, Debug)]
enum Effect {
    /// A read that returned this value.
    Read(State),
    Write(u64),
    /// A compare-and-swap that succeeded (or, with an unknown outcome, may have).
    Swap {
        expect: State,
        new: u64,
    },
    /// A compare-and-swap known to have failed: the register did not hold `expect`.
    Refused {
        expect: State,
    },
}

impl Effect {
    /// The register after this operation, or `None` if it cannot take place in `state`.
    fn apply(self, state: State) -> Option<State> {
        match self {
            Effect::Read(seen) => (seen == state).then_some(state),
            Effect::Write(value) => Some(Some(value)),
            Effect::Swap { expect, new } => (state == expect).then_some(Some(new)),
            Effect::Refused { expect } => (state != expect).then_some(state),
        }
    }
}

/// An operation the search must place (known outcome) or may place (unknown).
struct Candidate<'a> {
    op: &'a Op<RegisterInput, RegisterOutput>,
    effect: Effect,
    /// `None` for an unknown outcome: the operation never completes.
    complete: Option<Time>,
}

/// Checks that one key's history is linearizable, starting from `initial`,
/// within `budget` search steps in all.
///
/// When it is not, the anomaly names the first answer no linearization can
/// explain: the earliest completion time T such that the operations answered
/// by T (with those still in flight at T taken as unknown) are not
/// linearizable, found by bisection with what is left of the budget. A
/// violation shows at the completion of the operation that exposes it, and
/// truncating the history at T keeps every linearization of a longer
/// truncation valid, so the bisection is sound.
pub fn check_register(
    key: &str,
    initial: Option<u64>,
    history: &[Op<RegisterInput, RegisterOutput>],
    budget: usize,
) -> Verdict {
    let candidates = match candidates(key, history) {
        Ok(candidates) => candidates,
        Err(malformed) => return Verdict::NotLinearizable(malformed),
    };
    let known = candidates.iter().filter(|candidate| candidate.complete.is_some()).count();
    let (explored, dead_end) = match Search::new(candidates, initial).run(initial, budget) {
        Finding::Linearizable { .. } => return Verdict::Linearizable,
        Finding::Undecided { explored } => return Verdict::Undecided { explored },
        Finding::DeadEnd { explored, detail } => (explored, detail),
    };
    let what = match first_unexplained(history, initial, budget - explored) {
        Some((exposed_at, detail)) => {
            let exposing: Vec<String> = history
                .iter()
                .filter(|op| matches!(op.outcome, Outcome::Ok(_)) && op.complete == exposed_at)
                .map(describe)
                .collect();
            format!(
                "not linearizable ({known} operation(s) with a known outcome): the answers received before {} \
                 are linearizable, but not with the answer of {}. The search's deepest dead end in the history up to \
                 then: {detail}",
                format_time(exposed_at),
                exposing.join(" and ")
            )
        }
        None => format!(
            "not linearizable ({known} operation(s) with a known outcome; the budget left no room to find the \
             first answer that exposes it): {dead_end}"
        ),
    };
    Verdict::NotLinearizable(Anomaly::new(CHECKER, key, what))
}

/// The earliest completion time by which the answers are no longer
/// linearizable, and the search's account of that truncated history; `None`
/// if `budget` runs out first. Called only on a history known not to be
/// linearizable.
fn first_unexplained(
    history: &[Op<RegisterInput, RegisterOutput>],
    initial: State,
    mut budget: usize,
) -> Option<(Time, String)> {
    let mut completions: Vec<Time> =
        history.iter().filter(|op| matches!(op.outcome, Outcome::Ok(_))).map(|op| op.complete).collect();
    completions.sort_unstable();
    completions.dedup();
    let mut probe = |time: Time| -> Option<Option<String>> {
        let truncated = truncate(history, time);
        let candidates = candidates("", &truncated).ok()?;
        let (explored, finding) = match Search::new(candidates, initial).run(initial, budget) {
            Finding::Linearizable { explored } => (explored, None),
            Finding::Undecided { .. } => return None,
            Finding::DeadEnd { explored, detail } => (explored, Some(detail)),
        };
        budget -= explored;
        Some(finding)
    };
    // The first failing truncation lies in `low..=high`; the one at `high`
    // fails (the last holds as much as the whole history), and `found` is its
    // account once a probe has produced one.
    let (mut low, mut high) = (0, completions.len().checked_sub(1)?);
    let mut found = None;
    while low < high {
        let middle = low + (high - low) / 2;
        match probe(completions[middle])? {
            None => low = middle + 1,
            Some(detail) => (high, found) = (middle, Some(detail)),
        }
    }
    let detail = match found {
        Some(detail) => detail,
        None => probe(completions[high])??,
    };
    Some((completions[high], detail))
}

/// The history as it stood at `time`: operations invoked later are left out,
/// and those answered later become unknown.
fn truncate(history: &[Op<RegisterInput, RegisterOutput>], time: Time) -> Vec<Op<RegisterInput, RegisterOutput>> {
    history
        .iter()
        .filter(|op| op.invoke <= time)
        .map(|op| match op.outcome {
            Outcome::Ok(_) if op.complete > time => Op {
                complete: NEVER,
                outcome: Outcome::Unknown(format!("not answered by {}", format_time(time))),
                ..op.clone()
            },
            _ => op.clone(),
        })
        .collect()
}

/// The operations that may have taken effect, with what they do. A history
/// the recorder could not have produced (an answer of the wrong kind, a
/// completion before the invocation) is reported as such: it is a harness bug
/// that would otherwise pass for a server bug.
fn candidates<'a>(key: &str, history: &'a [Op<RegisterInput, RegisterOutput>]) -> Result<Vec<Candidate<'a>>, Anomaly> {
    let mut candidates = Vec::with_capacity(history.len());
    for op in history {
        let (effect, complete) = match (&op.outcome, op.input) {
            (Outcome::Failed(_), _) | (Outcome::Unknown(_), RegisterInput::Read) => continue,
            (Outcome::Unknown(_), RegisterInput::Write(value)) => (Effect::Write(value), None),
            (Outcome::Unknown(_), RegisterInput::Cas { expect, new }) => (Effect::Swap { expect, new }, None),
            (Outcome::Ok(output), input) => {
                if op.complete < op.invoke {
                    let what = format!("malformed history (harness bug): completed before invoked: {}", describe(op));
                    return Err(Anomaly::new(CHECKER, key, what));
                }
                let effect = match (input, *output) {
                    (RegisterInput::Read, RegisterOutput::Read(seen)) => Effect::Read(seen),
                    (RegisterInput::Write(value), RegisterOutput::Write) => Effect::Write(value),
                    (RegisterInput::Cas { expect, new }, RegisterOutput::Cas(true)) => Effect::Swap { expect, new },
                    (RegisterInput::Cas { expect, .. }, RegisterOutput::Cas(false)) => Effect::Refused { expect },
                    _ => {
                        let what = format!(
                            "malformed history (harness bug): the answer is not of the request's kind: {}",
                            describe(op)
                        );
                        return Err(Anomaly::new(CHECKER, key, what));
                    }
                };
                (effect, Some(op.complete))
            }
        };
        candidates.push(Candidate { op, effect, complete });
    }
    Ok(candidates)
}

/// A set of candidate indices, the linearized part of Lowe's cache key.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Bitset(Vec<u64>);

impl Bitset {
    fn new(len: usize) -> Bitset {
        Bitset(vec![0; len.div_ceil(64)])
    }

    fn contains(&self, index: usize) -> bool {
        self.0[index / 64] & (1 << (index % 64)) != 0
    }

    fn insert(&mut self, index: usize) {
        self.0[index / 64] |= 1 << (index % 64);
    }

    fn remove(&mut self, index: usize) {
        self.0[index / 64] &= !(1 << (index % 64));
    }
}

/// Marks the end of the linked list.
const NIL: usize = usize::MAX;

#[derive(Clone, Copy)]
enum Entry {
    Call(usize),
    Return(usize),
}

/// One step of the current linearization.
struct Frame {
    /// The operation placed.
    index: usize,
    /// A silent operation placed just before it, if any.
    helper: Option<usize>,
    /// Which of the operation's ways to be placed this is (see [`Search::run`]).
    alternative: usize,
    /// The register before this step.
    before: State,
}

/// What one search found.
enum Finding {
    Linearizable {
        explored: usize,
    },
    Undecided {
        explored: usize,
    },
    /// Not linearizable; `detail` describes the deepest dead end.
    DeadEnd {
        explored: usize,
        detail: String,
    },
}

/// Where the deepest dead end of a failed search stood.
struct DeadEnd {
    /// The linearization found so far, in order (indices of candidates).
    prefix: Vec<usize>,
    /// The register after `prefix`.
    state: State,
    /// The operation that completed with no place left for it.
    blocked: usize,
}

/// The linked list of entries, the stack and the cache of one search.
///
/// Silent operations — unknown writes and swaps whose value no read returned
/// and no compare-and-swap expected — get no entries. In a linearization
/// where one takes effect, the operations that can follow it before the next
/// write are only refused compare-and-swaps (nothing else accepts a value
/// nobody saw), so it can be moved to just before the first of those that
/// needed the key to differ from what it held, or dropped if none did. The
/// search therefore places a silent operation only together with a refused
/// compare-and-swap that could not otherwise be placed. Any two silent writes
/// already invoked are interchangeable from then on, so only the earliest
/// unused one is tried; each applicable silent swap is tried too. Without
/// this, every unknown write that never took effect could hide at every point
/// of the history and multiply the search.
///
/// A second cut relies on written values being unique: the register never
/// comes back to a value that only one source gives it, so an order that
/// moves the register off such a value while an unplaced operation with a
/// known outcome still has to see it is a dead end. It is cut at once instead
/// of when that operation's completion is reached, which may be much later.
/// Values with several sources (a value written twice, or the initial value
/// written again) are exempt, so a run that breaks uniqueness is slower to
/// check, never misjudged.
struct Search<'a> {
    candidates: Vec<Candidate<'a>>,
    /// The list's nodes; the head sentinel is the last node of `next`/`prev`.
    entries: Vec<Entry>,
    next: Vec<usize>,
    prev: Vec<usize>,
    call_entry: Vec<usize>,
    return_entry: Vec<Option<usize>>,
    /// Silent writes and swaps, by invocation time.
    silent_writes: Vec<usize>,
    silent_swaps: Vec<usize>,
    /// Per candidate with a known outcome, the value it needs the register to
    /// hold: what a read returned, what a successful swap expected.
    needs: Vec<Option<State>>,
    /// Values more than one source could give the register (the initial value
    /// counts as a source); the register may come back to them.
    repeatable: HashSet<State>,
}

impl<'a> Search<'a> {
    fn new(candidates: Vec<Candidate<'a>>, initial: State) -> Search<'a> {
        let mut observed = HashSet::new();
        for candidate in &candidates {
            if let Effect::Read(Some(value))
            | Effect::Swap { expect: Some(value), .. }
            | Effect::Refused { expect: Some(value) } = candidate.effect
            {
                observed.insert(value);
            }
        }
        let mut silent_writes = Vec::new();
        let mut silent_swaps = Vec::new();
        let mut events: Vec<(Time, bool, usize)> = Vec::with_capacity(2 * candidates.len());
        for (index, candidate) in candidates.iter().enumerate() {
            match (candidate.complete, candidate.effect) {
                (None, Effect::Write(value)) if !observed.contains(&value) => silent_writes.push(index),
                (None, Effect::Swap { new, .. }) if !observed.contains(&new) => silent_swaps.push(index),
                (complete, _) => {
                    events.push((candidate.op.invoke, false, index));
                    if let Some(complete) = complete {
                        events.push((complete, true, index));
                    }
                }
            }
        }
        let needs = candidates
            .iter()
            .map(|candidate| match (candidate.complete, candidate.effect) {
                (Some(_), Effect::Read(seen)) => Some(seen),
                (Some(_), Effect::Swap { expect, .. }) => Some(expect),
                _ => None,
            })
            .collect();
        let mut sources: HashMap<State, usize> = HashMap::from([(initial, 1)]);
        for candidate in &candidates {
            if let Effect::Write(value) | Effect::Swap { new: value, .. } = candidate.effect {
                *sources.entry(Some(value)).or_default() += 1;
            }
        }
        let repeatable = sources.into_iter().filter(|&(_, count)| count > 1).map(|(value, _)| value).collect();
        silent_writes.sort_by_key(|&index| candidates[index].op.invoke);
        silent_swaps.sort_by_key(|&index| candidates[index].op.invoke);
        // `false < true`: at equal times invocations come first, so touching
        // intervals overlap.
        events.sort_by_key(|&(time, is_return, _)| (time, is_return));

        let count = events.len();
        let head = count;
        let mut next: Vec<usize> = (1..=count).collect();
        if let Some(last) = next.last_mut() {
            *last = NIL;
        }
        next.push(if count == 0 { NIL } else { 0 });
        let mut prev: Vec<usize> = (0..count).map(|node| if node == 0 { head } else { node - 1 }).collect();
        prev.push(NIL);
        let mut search = Search {
            entries: Vec::with_capacity(count),
            next,
            prev,
            call_entry: vec![NIL; candidates.len()],
            return_entry: vec![None; candidates.len()],
            candidates,
            silent_writes,
            silent_swaps,
            needs,
            repeatable,
        };
        for (node, &(_, is_return, index)) in events.iter().enumerate() {
            if is_return {
                search.entries.push(Entry::Return(index));
                search.return_entry[index] = Some(node);
            } else {
                search.entries.push(Entry::Call(index));
                search.call_entry[index] = node;
            }
        }
        search
    }

    fn head(&self) -> usize {
        self.entries.len()
    }

    fn unlink(&mut self, node: usize) {
        let (prev, next) = (self.prev[node], self.next[node]);
        self.next[prev] = next;
        if next != NIL {
            self.prev[next] = prev;
        }
    }

    /// Undoes `unlink(node)`; unlinks must be undone in reverse order.
    fn relink(&mut self, node: usize) {
        let (prev, next) = (self.prev[node], self.next[node]);
        self.next[prev] = node;
        if next != NIL {
            self.prev[next] = node;
        }
    }

    fn lift(&mut self, index: usize) {
        self.unlink(self.call_entry[index]);
        if let Some(node) = self.return_entry[index] {
            self.unlink(node);
        }
    }

    fn unlift(&mut self, index: usize) {
        if let Some(node) = self.return_entry[index] {
            self.relink(node);
        }
        self.relink(self.call_entry[index]);
    }

    /// The silent operations that may take effect just before the refused
    /// compare-and-swap at `node`, in `state`: each applicable unused silent
    /// swap, then the earliest unused silent write. Each must have been
    /// invoked by the first completion still in the list.
    fn helpers(&self, node: usize, state: State, linearized: &Bitset) -> Vec<usize> {
        let mut frontier = Time::MAX;
        let mut scan = node;
        while let Some(&entry) = self.entries.get(scan) {
            if let Entry::Return(index) = entry {
                frontier = self.candidates[index].op.complete;
                break;
            }
            scan = self.next[scan];
        }
        let eligible = |index: usize| !linearized.contains(index) && self.candidates[index].op.invoke <= frontier;
        let mut helpers: Vec<usize> = self
            .silent_swaps
            .iter()
            .copied()
            .filter(|&index| eligible(index) && self.candidates[index].effect.apply(state).is_some())
            .collect();
        let unused_write = self.silent_writes.iter().copied().find(|&index| !linearized.contains(index));
        helpers.extend(unused_write.filter(|&index| eligible(index)));
        helpers
    }

    /// The search. Each operation at a call entry has numbered ways to be
    /// placed: way 0 alone, ways 1.. after one of its [`Search::helpers`]
    /// (only for a refused compare-and-swap that cannot be placed alone).
    /// Backtracking resumes at the way after the one popped.
    fn run(mut self, initial: State, budget: usize) -> Finding {
        let mut unplaced_known = self.candidates.iter().filter(|candidate| candidate.complete.is_some()).count();
        let mut state = initial;
        let mut linearized = Bitset::new(self.candidates.len());
        let mut stack: Vec<Frame> = Vec::new();
        let mut seen: HashSet<(Bitset, State)> = HashSet::new();
        // Per value, how many unplaced operations with a known outcome still
        // need the register to hold it.
        let mut waiting: HashMap<State, usize> = HashMap::new();
        for needed in self.needs.iter().flatten() {
            *waiting.entry(*needed).or_default() += 1;
        }
        let mut deepest: Option<DeadEnd> = None;
        let mut explored = 0;
        let mut node = self.next[self.head()];
        let mut first_way: usize = 0;
        while unplaced_known > 0 {
            if explored >= budget {
                return Finding::Undecided { explored };
            }
            explored += 1;
            // The scan never passes a completion, so running off the end means
            // none is left: every known operation is placed.
            let Some(&entry) = self.entries.get(node) else { break };
            match entry {
                Entry::Call(index) => {
                    let effect = self.candidates[index].effect;
                    let mut ways: Vec<(usize, Option<usize>, State)> = Vec::new();
                    if first_way == 0 {
                        ways.extend(effect.apply(state).map(|after| (0, None, after)));
                    }
                    if matches!(effect, Effect::Refused { expect } if expect == state) {
                        let helpers = self.helpers(node, state, &linearized);
                        for (way, helper) in helpers.into_iter().enumerate().skip(first_way.saturating_sub(1)) {
                            let after = self.candidates[helper].effect.apply(state).and_then(|mid| effect.apply(mid));
                            ways.extend(after.map(|after| (way + 1, Some(helper), after)));
                        }
                    }
                    first_way = 0;
                    let mut placed = false;
                    let needs = self.needs[index];
                    let still_waiting = waiting.get(&state).copied().unwrap_or(0) - usize::from(needs == Some(state));
                    for (alternative, helper, after) in ways {
                        if after != state && still_waiting > 0 && !self.repeatable.contains(&state) {
                            // The register would leave a value it can never
                            // hold again while someone still has to see it.
                            continue;
                        }
                        linearized.insert(index);
                        if let Some(helper) = helper {
                            linearized.insert(helper);
                        }
                        if seen.insert((linearized.clone(), after)) {
                            stack.push(Frame { index, helper, alternative, before: state });
                            state = after;
                            self.lift(index);
                            if self.candidates[index].complete.is_some() {
                                unplaced_known -= 1;
                            }
                            if let Some(needed) = needs {
                                *waiting.entry(needed).or_default() -= 1;
                            }
                            placed = true;
                            break;
                        }
                        linearized.remove(index);
                        if let Some(helper) = helper {
                            linearized.remove(helper);
                        }
                    }
                    node = if placed { self.next[self.head()] } else { self.next[node] };
                }
                Entry::Return(blocked) => {
                    if deepest.as_ref().is_none_or(|dead_end| stack.len() > dead_end.prefix.len()) {
                        let prefix =
                            stack.iter().flat_map(|frame| frame.helper.into_iter().chain([frame.index])).collect();
                        deepest = Some(DeadEnd { prefix, state, blocked });
                    }
                    let Some(frame) = stack.pop() else {
                        let dead_end = deepest.unwrap_or(DeadEnd { prefix: Vec::new(), state, blocked });
                        return Finding::DeadEnd { explored, detail: self.describe_dead_end(&dead_end) };
                    };
                    state = frame.before;
                    linearized.remove(frame.index);
                    if let Some(helper) = frame.helper {
                        linearized.remove(helper);
                    }
                    self.unlift(frame.index);
                    if self.candidates[frame.index].complete.is_some() {
                        unplaced_known += 1;
                    }
                    if let Some(needed) = self.needs[frame.index] {
                        *waiting.entry(needed).or_default() += 1;
                    }
                    node = self.call_entry[frame.index];
                    first_way = frame.alternative + 1;
                }
            }
        }
        Finding::Linearizable { explored }
    }

    fn describe_dead_end(&self, dead_end: &DeadEnd) -> String {
        let state = describe_state(dead_end.state);
        let prefix = if dead_end.prefix.is_empty() {
            format!("No operation can be linearized before it; the key starts {state}.")
        } else {
            let tail_start = dead_end.prefix.len().saturating_sub(PREFIX_TAIL_SHOWN);
            let tail: Vec<String> =
                dead_end.prefix[tail_start..].iter().map(|&index| describe(self.candidates[index].op)).collect();
            format!(
                "The longest linearizable prefix found orders {} operation(s) and leaves the key {state}; \
                 it ends with: {}.",
                dead_end.prefix.len(),
                tail.join("; ")
            )
        };
        format!(
            "{} cannot be linearized, because {}. {prefix}",
            describe(self.candidates[dead_end.blocked].op),
            self.why_blocked(dead_end)
        )
    }

    /// Why the blocked operation could not follow the dead end's prefix.
    fn why_blocked(&self, dead_end: &DeadEnd) -> String {
        let state = dead_end.state;
        let Some(after) = self.candidates[dead_end.blocked].effect.apply(state) else {
            return format!("it cannot take effect on the key {}", describe_state(state));
        };
        let placed: HashSet<usize> = dead_end.prefix.iter().copied().collect();
        let waiting: Vec<String> = (0..self.candidates.len())
            .filter(|index| !placed.contains(index) && self.needs[*index] == Some(state))
            .map(|index| describe(self.candidates[index].op))
            .collect();
        if after != state && !waiting.is_empty() && !self.repeatable.contains(&state) {
            let shown = waiting.len().min(PREFIX_TAIL_SHOWN);
            format!(
                "placing it would change the key from {} for good, yet {} operation(s) must still see the key {0}: {}",
                describe_state(state),
                waiting.len(),
                waiting[..shown].join("; ")
            )
        } else {
            "every order that places it there was already explored and failed".to_string()
        }
    }
}

/// One operation as a person reads it in an anomaly.
fn describe(op: &Op<RegisterInput, RegisterOutput>) -> String {
    let answer = match &op.outcome {
        Outcome::Ok(output) => format!("{output:?}"),
        Outcome::Failed(why) => format!("failed ({why})"),
        Outcome::Unknown(why) => format!("unknown ({why})"),
    };
    format!(
        "client {} {:?} -> {answer} (invoked {}, completed {})",
        op.client,
        op.input,
        format_time(op.invoke),
        format_time(op.complete)
    )
}

fn describe_state(state: State) -> String {
    match state {
        Some(value) => format!("holding {value}"),
        None => "absent".to_string(),
    }
}

/// Checks serializable (possibly stale) reads of one key: each must return
/// `initial` or a value written by a write or a successful-or-unknown
/// compare-and-swap invoked no later than the read completed. `reads` are
/// `(client, invoke, complete, value read)`; reads among `writes` are ignored.
pub fn check_serializable_reads(
    key: &str,
    initial: Option<u64>,
    writes: &[Op<RegisterInput, RegisterOutput>],
    reads: &[(usize, Time, Time, Option<u64>)],
) -> Vec<Anomaly> {
    // Per value: the earliest-invoked operation that may have written it, and
    // one that certainly did not (to say so when a read returns its value).
    let mut may_have_written: HashMap<u64, &Op<RegisterInput, RegisterOutput>> = HashMap::new();
    let mut did_not_write: HashMap<u64, &Op<RegisterInput, RegisterOutput>> = HashMap::new();
    for op in writes {
        let value = match op.input {
            RegisterInput::Write(value) | RegisterInput::Cas { new: value, .. } => value,
            RegisterInput::Read => continue,
        };
        let possible = !matches!(op.outcome, Outcome::Failed(_) | Outcome::Ok(RegisterOutput::Cas(false)));
        let slot = if possible { may_have_written.entry(value) } else { did_not_write.entry(value) };
        slot.and_modify(|earliest| {
            if op.invoke < earliest.invoke {
                *earliest = op;
            }
        })
        .or_insert(op);
    }

    let mut anomalies = Vec::new();
    for &(client, invoke, complete, value) in reads {
        if value == initial {
            continue;
        }
        let read = format!(
            "client {client}'s serializable read (invoked {}, completed {}) returned {}",
            format_time(invoke),
            format_time(complete),
            describe_state(value)
        );
        let Some(seen) = value else {
            let what = format!("{read}, but the key started {} and nothing deletes it", describe_state(initial));
            anomalies.push(Anomaly::new(SERIALIZABLE_CHECKER, key, what));
            continue;
        };
        let what = match (may_have_written.get(&seen), did_not_write.get(&seen)) {
            (Some(writer), _) if writer.invoke <= complete => continue,
            (Some(writer), _) => format!("{read}, a value written only later: {}", describe(writer)),
            (None, Some(writer)) => {
                format!("{read}, a value only a write that did not take effect tried to write: {}", describe(writer))
            }
            (None, None) => format!("{read}, a value never written"),
        };
        anomalies.push(Anomaly::new(SERIALIZABLE_CHECKER, key, what));
    }
    anomalies
}

#[cfg(test)]
mod tests {
    use super::*;

    type RegisterOp = Op<RegisterInput, RegisterOutput>;

    const BUDGET: usize = 1_000_000;

    fn ok(client: usize, invoke: Time, complete: Time, input: RegisterInput, output: RegisterOutput) -> RegisterOp {
        Op { client, invoke, complete, input, outcome: Outcome::Ok(output) }
    }

    fn write(client: usize, invoke: Time, complete: Time, value: u64) -> RegisterOp {
        ok(client, invoke, complete, RegisterInput::Write(value), RegisterOutput::Write)
    }

    fn read(client: usize, invoke: Time, complete: Time, seen: Option<u64>) -> RegisterOp {
        ok(client, invoke, complete, RegisterInput::Read, RegisterOutput::Read(seen))
    }

    fn cas(client: usize, invoke: Time, complete: Time, expect: Option<u64>, new: u64, swapped: bool) -> RegisterOp {
        ok(client, invoke, complete, RegisterInput::Cas { expect, new }, RegisterOutput::Cas(swapped))
    }

    fn unknown(client: usize, invoke: Time, input: RegisterInput) -> RegisterOp {
        Op { client, invoke, complete: NEVER, input, outcome: Outcome::Unknown("timeout".into()) }
    }

    fn failed(client: usize, invoke: Time, complete: Time, input: RegisterInput) -> RegisterOp {
        Op { client, invoke, complete, input, outcome: Outcome::Failed("not leader".into()) }
    }

    fn verdict(history: &[RegisterOp]) -> Verdict {
        check_register("k", None, history, BUDGET)
    }

    fn assert_linearizable(history: &[RegisterOp]) {
        assert_eq!(verdict(history), Verdict::Linearizable, "history: {history:#?}");
    }

    fn assert_not_linearizable(history: &[RegisterOp]) -> Anomaly {
        match verdict(history) {
            Verdict::NotLinearizable(anomaly) => {
                assert_eq!(anomaly.checker, "linearizable");
                assert_eq!(anomaly.subject, "k");
                anomaly
            }
            other => panic!("expected an anomaly, got {other:?} for {history:#?}"),
        }
    }

    #[test]
    fn empty_history_is_linearizable() {
        assert_linearizable(&[]);
        assert_eq!(check_register("k", Some(4), &[], 0), Verdict::Linearizable);
    }

    #[test]
    fn sequential_history_is_linearizable() {
        assert_linearizable(&[
            read(0, 0, 10, None),
            write(0, 20, 30, 1),
            read(1, 40, 50, Some(1)),
            write(1, 60, 70, 2),
            read(0, 80, 90, Some(2)),
            cas(2, 100, 110, Some(2), 3, true),
            cas(0, 120, 130, Some(2), 4, false),
            read(1, 140, 150, Some(3)),
        ]);
    }

    #[test]
    fn initial_value_counts() {
        assert_eq!(check_register("k", Some(7), &[read(0, 0, 10, Some(7))], BUDGET), Verdict::Linearizable);
        assert!(matches!(check_register("k", Some(7), &[read(0, 0, 10, None)], BUDGET), Verdict::NotLinearizable(_)));
    }

    #[test]
    fn overlapping_operations_may_take_effect_in_either_order() {
        assert_linearizable(&[
            write(0, 0, 100, 1),
            read(1, 10, 20, None),
            read(2, 30, 40, Some(1)),
            write(3, 50, 60, 2),
            read(1, 70, 80, Some(2)),
        ]);
        // Two concurrent writes seen in the order opposite to their invocations.
        assert_linearizable(&[
            write(0, 0, 50, 1),
            write(1, 10, 40, 2),
            read(2, 60, 70, Some(1)),
            read(3, 80, 90, Some(1)),
        ]);
    }

    #[test]
    fn touching_intervals_are_concurrent() {
        // The read completes at the very nanosecond the write is invoked.
        assert_linearizable(&[read(0, 0, 10, Some(1)), write(1, 10, 20, 1)]);
        // The write completes when the read is invoked: the read may precede it.
        assert_linearizable(&[write(0, 0, 10, 1), read(1, 10, 20, None)]);
    }

    #[test]
    fn unknown_write_that_took_effect() {
        assert_linearizable(&[
            unknown(0, 0, RegisterInput::Write(1)),
            read(1, 10, 20, None),
            read(1, 30, 40, Some(1)),
            read(2, 50, 60, Some(1)),
        ]);
    }

    #[test]
    fn unknown_write_that_did_not_take_effect() {
        assert_linearizable(&[unknown(0, 0, RegisterInput::Write(1)), read(1, 10, 20, None), read(1, 30, 40, None)]);
    }

    #[test]
    fn unknown_write_may_take_effect_long_after_its_client_moved_on() {
        assert_linearizable(&[
            write(0, 0, 10, 1),
            unknown(1, 20, RegisterInput::Write(2)),
            write(1, 30, 40, 3),
            read(2, 50, 60, Some(3)),
            read(2, 1_000, 1_010, Some(2)),
        ]);
    }

    #[test]
    fn unknown_write_cannot_take_effect_before_its_invocation() {
        let anomaly = assert_not_linearizable(&[read(0, 0, 10, Some(1)), unknown(1, 20, RegisterInput::Write(1))]);
        assert!(anomaly.what.contains("client 0 Read -> Read(Some(1))"), "{anomaly}");
    }

    #[test]
    fn unobserved_unknown_write_still_explains_a_refused_cas() {
        // Only the unknown write, whose value nobody read, can make the key
        // present when the compare-and-swap on "absent" is refused.
        assert_linearizable(&[unknown(0, 0, RegisterInput::Write(1)), cas(1, 10, 20, None, 2, false)]);
        assert_not_linearizable(&[cas(1, 10, 20, None, 2, false), unknown(0, 30, RegisterInput::Write(1))]);
    }

    #[test]
    fn unknown_reads_and_failed_operations_are_dropped() {
        assert_linearizable(&[
            unknown(0, 0, RegisterInput::Read),
            failed(1, 10, 20, RegisterInput::Write(9)),
            read(2, 30, 40, None),
            failed(1, 50, 60, RegisterInput::Cas { expect: None, new: 10 }),
            read(2, 70, 80, None),
        ]);
    }

    #[test]
    fn unknown_cas_may_succeed_or_fail() {
        // Took effect: its value is read later.
        assert_linearizable(&[
            write(0, 0, 10, 1),
            unknown(1, 20, RegisterInput::Cas { expect: Some(1), new: 2 }),
            read(2, 30, 40, Some(1)),
            read(2, 50, 60, Some(2)),
        ]);
        // Did not: the register keeps its value.
        assert_linearizable(&[
            write(0, 0, 10, 1),
            unknown(1, 20, RegisterInput::Cas { expect: Some(1), new: 2 }),
            read(2, 50, 60, Some(1)),
        ]);
        // Could not have succeeded: the register never held what it expected.
        assert_not_linearizable(&[
            write(0, 0, 10, 1),
            unknown(1, 20, RegisterInput::Cas { expect: Some(5), new: 2 }),
            read(2, 50, 60, Some(2)),
        ]);
    }

    #[test]
    fn cas_chain_across_clients() {
        assert_linearizable(&[
            cas(0, 0, 30, None, 1, true),
            cas(1, 5, 40, Some(1), 2, true),
            cas(2, 10, 50, Some(2), 3, true),
            cas(3, 15, 45, Some(3), 4, true),
            cas(4, 20, 60, None, 5, false),
            read(0, 70, 80, Some(4)),
        ]);
    }

    #[test]
    fn stale_read_after_completed_write() {
        let anomaly = assert_not_linearizable(&[write(0, 0, 10, 1), read(1, 20, 30, None)]);
        let exposed = "the answers received before 0.000000030s are linearizable, but not with the answer of \
                       client 1 Read -> Read(None) (invoked 0.000000020s, completed 0.000000030s)";
        assert!(anomaly.what.contains(exposed), "{anomaly}");
        assert!(anomaly.what.contains("client 0 Write(1)"), "{anomaly}");
        assert!(anomaly.what.contains("change the key from absent for good"), "{anomaly}");
    }

    #[test]
    fn read_of_a_value_never_written() {
        let anomaly = assert_not_linearizable(&[write(0, 0, 10, 1), read(1, 20, 30, Some(99))]);
        assert!(anomaly.what.contains("Read(Some(99))"), "{anomaly}");
    }

    #[test]
    fn new_old_inversion_across_clients() {
        assert_not_linearizable(&[write(0, 0, 100, 1), read(1, 10, 20, Some(1)), read(2, 30, 40, None)]);
    }

    #[test]
    fn cas_that_could_not_have_succeeded() {
        assert_not_linearizable(&[write(0, 0, 10, 1), write(0, 20, 30, 2), cas(1, 40, 50, Some(1), 3, true)]);
        assert_not_linearizable(&[write(0, 0, 10, 1), cas(1, 20, 30, Some(1), 3, false)]);
    }

    #[test]
    fn lost_write() {
        assert_not_linearizable(&[
            write(0, 0, 10, 1),
            write(1, 20, 30, 2),
            read(2, 40, 50, Some(1)),
            read(3, 60, 70, Some(2)),
        ]);
    }

    #[test]
    fn read_of_a_failed_write() {
        assert_not_linearizable(&[failed(0, 0, 10, RegisterInput::Write(5)), read(1, 20, 30, Some(5))]);
    }

    #[test]
    fn anomaly_names_the_longest_prefix() {
        let anomaly = assert_not_linearizable(&[
            write(0, 0, 10, 1),
            read(1, 20, 30, Some(1)),
            write(2, 40, 50, 2),
            read(3, 60, 70, Some(1)),
        ]);
        assert!(anomaly.what.contains("client 2 Write(2) -> Write (invoked 0.000000040s"), "{anomaly}");
        assert!(anomaly.what.contains("must still see the key holding 1: client 3 Read -> Read(Some(1))"), "{anomaly}");
        assert!(anomaly.what.contains("orders 2 operation(s) and leaves the key holding 1"), "{anomaly}");
        assert!(anomaly.what.contains("4 operation(s) with a known outcome"), "{anomaly}");
    }

    #[test]
    fn malformed_records_are_reported_as_harness_bugs() {
        let wrong_kind = ok(0, 0, 10, RegisterInput::Read, RegisterOutput::Cas(true));
        let anomaly = assert_not_linearizable(&[wrong_kind]);
        assert!(anomaly.what.contains("harness bug"), "{anomaly}");
        let backwards = read(0, 10, 5, None);
        let anomaly = assert_not_linearizable(&[backwards]);
        assert!(anomaly.what.contains("completed before invoked"), "{anomaly}");
    }

    /// A small deterministic generator (splitmix64), so tests need no crate.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        fn below(&mut self, bound: u64) -> u64 {
            self.next() % bound
        }
    }

    /// A history of a real register: `clients` clients each run `per_client`
    /// operations back to back, each taking effect at a random instant of its
    /// interval. About one write in ten ends unknown (half of those took
    /// effect), one in twenty failed; some reads end unknown.
    fn simulated_history(seed: u64, clients: usize, per_client: usize) -> Vec<RegisterOp> {
        #[derive(Clone, Copy)]
        enum Kind {
            Read,
            Write,
            Cas,
        }
        #[derive(Clone, Copy, PartialEq)]
        enum Fate {
            Ok,
            Failed,
            UnknownApplied,
            UnknownLost,
        }
        let mut rng = Rng(seed);
        let mut planned = Vec::new();
        for client in 0..clients {
            let mut now = rng.below(100);
            for _ in 0..per_client {
                let duration = 1 + rng.below(300);
                let at = now + rng.below(duration + 1);
                let kind = match rng.below(3) {
                    0 => Kind::Read,
                    1 => Kind::Write,
                    _ => Kind::Cas,
                };
                let fate = match rng.below(20) {
                    0 | 1 => Fate::UnknownApplied,
                    2 => Fate::UnknownLost,
                    3 => Fate::Failed,
                    _ => Fate::Ok,
                };
                planned.push((client, now, now + duration, at, kind, fate));
                now += duration + rng.below(50);
            }
        }
        planned.sort_by_key(|&(client, _, _, at, _, _)| (at, client));

        let mut state: Option<u64> = None;
        let mut next_value = 0;
        let mut history = Vec::new();
        for (client, invoke, complete, _, kind, fate) in planned {
            let applies = matches!(fate, Fate::Ok | Fate::UnknownApplied);
            let (input, output) = match kind {
                Kind::Read => (RegisterInput::Read, RegisterOutput::Read(state)),
                Kind::Write => {
                    next_value += 1;
                    if applies {
                        state = Some(next_value);
                    }
                    (RegisterInput::Write(next_value), RegisterOutput::Write)
                }
                Kind::Cas => {
                    next_value += 1;
                    let expect =
                        if rng.below(2) == 0 || next_value == 1 { state } else { Some(1 + rng.below(next_value - 1)) };
                    let swapped = state == expect;
                    if applies && swapped {
                        state = Some(next_value);
                    }
                    (RegisterInput::Cas { expect, new: next_value }, RegisterOutput::Cas(swapped))
                }
            };
            let (complete, outcome) = match fate {
                Fate::Ok => (complete, Outcome::Ok(output)),
                Fate::Failed => (complete, Outcome::Failed("not leader".into())),
                Fate::UnknownApplied | Fate::UnknownLost => (NEVER, Outcome::Unknown("timeout".into())),
            };
            if fate == Fate::Failed && matches!(kind, Kind::Read) {
                continue;
            }
            history.push(Op { client, invoke, complete, input, outcome });
        }
        history.sort_by_key(|op| (op.client, op.invoke));
        history
    }

    #[test]
    fn hundreds_of_operations_are_decided_well_within_budget() {
        for seed in 0..5 {
            let history = simulated_history(seed, 5, 60);
            assert!(history.len() >= 250, "{}", history.len());
            assert!(history.iter().filter(|op| matches!(op.outcome, Outcome::Unknown(_))).count() >= 10);
            // Such histories take a few thousand steps at most.
            assert_eq!(check_register("k", None, &history, BUDGET / 100), Verdict::Linearizable, "seed {seed}");
        }
    }

    #[test]
    fn a_stale_read_among_hundreds_of_operations_is_found_within_budget() {
        for seed in 0..5 {
            let mut history = simulated_history(seed, 5, 60);
            // A write overwritten by a write that followed it in real time can
            // never be read by a read that follows both.
            let known_writes: Vec<(Time, Time, u64)> = history
                .iter()
                .filter(|op| op.outcome == Outcome::Ok(RegisterOutput::Write))
                .filter_map(|op| match op.input {
                    RegisterInput::Write(value) => Some((op.invoke, op.complete, value)),
                    _ => None,
                })
                .collect();
            let (overwritten_by, old_value) = known_writes
                .iter()
                .find_map(|&(_, first_done, value)| {
                    known_writes.iter().find(|&&(invoke, _, _)| invoke > first_done).map(|&(_, done, _)| (done, value))
                })
                .expect("two writes in sequence");
            let stale = history
                .iter_mut()
                .filter(|op| op.invoke > overwritten_by && op.input == RegisterInput::Read)
                .filter(|op| matches!(op.outcome, Outcome::Ok(_)))
                .nth(10)
                .expect("late reads exist");
            stale.outcome = Outcome::Ok(RegisterOutput::Read(Some(old_value)));
            let stale_read = describe(stale);
            match check_register("k", None, &history, BUDGET / 10) {
                Verdict::NotLinearizable(anomaly) => assert!(anomaly.what.contains(&stale_read), "{anomaly}"),
                other => panic!("seed {seed}: expected an anomaly, got {other:?}"),
            }
        }
    }

    /// Linearizability straight from its definition, by trying every order:
    /// the next operation may be any one not preceded in real time by an
    /// unplaced known operation; unknown ones may also never happen.
    fn brute_force(initial: Option<u64>, history: &[RegisterOp]) -> bool {
        struct Pending {
            invoke: Time,
            complete: Option<Time>,
            effect: Effect,
        }
        fn place(pending: &[Pending], placed: &mut Vec<bool>, state: State) -> bool {
            let unplaced_known: Vec<usize> =
                (0..pending.len()).filter(|&index| !placed[index] && pending[index].complete.is_some()).collect();
            if unplaced_known.is_empty() {
                return true;
            }
            for index in 0..pending.len() {
                let blocked_by_earlier =
                    unplaced_known.iter().any(|&other| pending[other].complete < Some(pending[index].invoke));
                if placed[index] || blocked_by_earlier {
                    continue;
                }
                if let Some(after) = pending[index].effect.apply(state) {
                    placed[index] = true;
                    let found = place(pending, placed, after);
                    placed[index] = false;
                    if found {
                        return true;
                    }
                }
            }
            false
        }
        let pending: Vec<Pending> = history
            .iter()
            .filter_map(|op| {
                let (effect, complete) = match (&op.outcome, op.input) {
                    (Outcome::Failed(_), _) | (Outcome::Unknown(_), RegisterInput::Read) => return None,
                    (Outcome::Unknown(_), RegisterInput::Write(value)) => (Effect::Write(value), None),
                    (Outcome::Unknown(_), RegisterInput::Cas { expect, new }) => (Effect::Swap { expect, new }, None),
                    (Outcome::Ok(RegisterOutput::Read(seen)), _) => (Effect::Read(*seen), Some(op.complete)),
                    (Outcome::Ok(_), RegisterInput::Write(value)) => (Effect::Write(value), Some(op.complete)),
                    (Outcome::Ok(RegisterOutput::Cas(true)), RegisterInput::Cas { expect, new }) => {
                        (Effect::Swap { expect, new }, Some(op.complete))
                    }
                    (Outcome::Ok(_), RegisterInput::Cas { expect, .. }) => {
                        (Effect::Refused { expect }, Some(op.complete))
                    }
                    (Outcome::Ok(_), RegisterInput::Read) => unreachable!("the generator answers reads with reads"),
                };
                Some(Pending { invoke: op.invoke, complete, effect })
            })
            .collect();
        place(&pending, &mut vec![false; pending.len()], initial)
    }

    #[test]
    fn agrees_with_brute_force_on_small_histories() {
        let mut verdicts = [0usize; 2];
        for seed in 0..4_000 {
            let mut rng = Rng(seed ^ 0x5eed);
            let mut history = simulated_history(seed, 2 + rng.below(2) as usize, 1 + rng.below(3) as usize);
            // Corrupt one answer half of the time, so both verdicts occur.
            if rng.below(2) == 0 && !history.is_empty() {
                let index = rng.below(history.len() as u64) as usize;
                let op = &mut history[index];
                let values = 1 + rng.below(8);
                op.outcome = match (op.input, &op.outcome) {
                    (RegisterInput::Read, _) => {
                        let seen = rng.below(values);
                        Outcome::Ok(RegisterOutput::Read((seen > 0).then_some(seen)))
                    }
                    (RegisterInput::Cas { .. }, Outcome::Ok(RegisterOutput::Cas(swapped))) => {
                        Outcome::Ok(RegisterOutput::Cas(!swapped))
                    }
                    (_, Outcome::Ok(_)) => Outcome::Failed("injected".into()),
                    (RegisterInput::Write(_), _) => {
                        op.complete = op.invoke + rng.below(100);
                        Outcome::Ok(RegisterOutput::Write)
                    }
                    (RegisterInput::Cas { .. }, _) => {
                        op.complete = op.invoke + rng.below(100);
                        Outcome::Ok(RegisterOutput::Cas(rng.below(2) == 0))
                    }
                };
            }
            // Now and then break the uniqueness of values, or start from a
            // value that is written again, which the search must survive.
            if rng.below(4) == 0 {
                if let Some(op) = history.iter_mut().find(|op| matches!(op.input, RegisterInput::Write(_))) {
                    op.input = RegisterInput::Write(1 + rng.below(3));
                }
            }
            let initial = (rng.below(4) == 0).then_some(1);
            let expected = brute_force(initial, &history);
            let verdict = check_register("k", initial, &history, BUDGET);
            assert_eq!(verdict == Verdict::Linearizable, expected, "seed {seed}: {verdict:?} for {history:#?}");
            verdicts[usize::from(expected)] += 1;
        }
        assert!(verdicts.iter().all(|&count| count > 500), "{verdicts:?}");
    }

    #[test]
    fn tiny_budget_is_undecided() {
        let history = simulated_history(7, 5, 20);
        assert_eq!(check_register("k", None, &history, 5), Verdict::Undecided { explored: 5 });
    }

    #[test]
    fn serializable_reads_may_be_stale_but_not_invented() {
        let writes = [
            write(0, 100, 110, 1),
            write(0, 200, 210, 2),
            unknown(1, 300, RegisterInput::Write(3)),
            cas(1, 400, 410, Some(2), 4, false),
            failed(2, 500, 510, RegisterInput::Write(5)),
            cas(2, 600, 610, Some(2), 6, true),
            write(3, 700, 710, 7),
            read(3, 720, 730, Some(99)),
        ];
        let fine = [
            (0, 0, 10, None),
            (1, 105, 108, Some(1)),
            (1, 250, 260, Some(1)),
            (2, 290, 300, Some(3)),
            (2, 650, 660, Some(6)),
            (3, 1_000, 1_010, Some(2)),
        ];
        assert!(check_serializable_reads("k", None, &writes, &fine).is_empty());

        let bad = [(4, 0, 50, Some(1)), (4, 1_000, 1_010, Some(4)), (5, 1_000, 1_010, Some(5)), (5, 0, 10, Some(42))];
        let anomalies = check_serializable_reads("k", None, &writes, &bad);
        assert_eq!(anomalies.len(), 4, "{anomalies:#?}");
        assert!(anomalies.iter().all(|anomaly| anomaly.checker == "serializable-reads" && anomaly.subject == "k"));
        assert!(anomalies[0].what.contains("written only later: client 0 Write(1)"), "{}", anomalies[0]);
        assert!(anomalies[1].what.contains("did not take effect"), "{}", anomalies[1]);
        assert!(anomalies[2].what.contains("failed (not leader)"), "{}", anomalies[2]);
        assert!(anomalies[3].what.contains("never written"), "{}", anomalies[3]);
    }

    #[test]
    fn serializable_read_of_absent_key_after_it_started_present() {
        let anomalies = check_serializable_reads("k", Some(1), &[], &[(0, 0, 10, None), (0, 20, 30, Some(1))]);
        assert_eq!(anomalies.len(), 1);
        assert!(anomalies[0].what.contains("started holding 1"), "{}", anomalies[0]);
    }
}
