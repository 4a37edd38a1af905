//! Who the members are and who leads: bootstrapping a new cluster,
//! membership changes (joint consensus, learners, promotion), leader
//! transfer, and the election timer with pre-vote and check-quorum that
//! replaces openraft's own elections.

pub mod bootstrap;
pub mod membership;
pub mod prevote;
pub mod transfer;
