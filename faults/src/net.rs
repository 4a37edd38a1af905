//! Network faults between members, with nftables.
//!
//! Members live on their own loopback addresses (see `cluster`), so a link
//! is cut by dropping, in the output hook, packets from one member's address
//! to another's: one rule per direction, so one-way loss is one rule and a
//! partition two. Clients (from 127.0.0.1) are never cut. Every rule lives in
//! one table of the suite's own, which is created on start, flushed to heal,
//! and deleted when the [`Partition`] is dropped.

use std::process::Command;

const TABLE: &str = "raftlock_faults";

pub struct Partition {
    /// The links cut now, as (from, to) addresses.
    cut: Vec<(String, String)>,
}

fn nft(args: &str) -> anyhow::Result<()> {
    let out = Command::new("nft").args(args.split_whitespace()).output()?;
    if !out.status.success() {
        anyhow::bail!("nft {args}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

impl Partition {
    /// Create the suite's table (replacing one a crashed run left behind).
    pub fn new() -> anyhow::Result<Partition> {
        let _ = nft(&format!("delete table inet {TABLE}"));
        nft(&format!("add table inet {TABLE}"))?;
        nft(&format!("add chain inet {TABLE} output {{ type filter hook output priority 0 ; policy accept ; }}"))?;
        Ok(Partition { cut: Vec::new() })
    }

    /// Drop every packet from `from` to `to` (one way).
    pub fn cut_one_way(&mut self, from: &str, to: &str) -> anyhow::Result<()> {
        nft(&format!("add rule inet {TABLE} output ip saddr {from} ip daddr {to} drop"))?;
        self.cut.push((from.to_string(), to.to_string()));
        Ok(())
    }

    /// Cut the link between `a` and `b` both ways.
    pub fn cut(&mut self, a: &str, b: &str) -> anyhow::Result<()> {
        self.cut_one_way(a, b)?;
        self.cut_one_way(b, a)
    }

    /// Cut every link between the two sides.
    pub fn split(&mut self, left: &[&str], right: &[&str]) -> anyhow::Result<()> {
        for a in left {
            for b in right {
                self.cut(a, b)?;
            }
        }
        Ok(())
    }

    pub fn is_cut(&self) -> bool {
        !self.cut.is_empty()
    }

    /// Restore every link.
    pub fn heal(&mut self) -> anyhow::Result<()> {
        if self.is_cut() {
            nft(&format!("flush chain inet {TABLE} output"))?;
            self.cut.clear();
        }
        Ok(())
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        let _ = nft(&format!("delete table inet {TABLE}"));
    }
}
