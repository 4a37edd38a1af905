//! Names on the wire: member and cluster IDs (derived from the flags every
//! member shares, so that each computes the same ones), peer and client URLs,
//! and Go-style durations as etcd's flags write them.
//!
//! Invariant: `member_id` and `cluster_id` are pure functions of their
//! inputs, never 0, and must not change between releases (they are stored in
//! every member's log and in clients' headers).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;

/// A Go-style duration: `300s`, `5m`, `1h30m`, `1500ms`.
pub fn go_duration(s: &str) -> anyhow::Result<Duration> {
    let mut total = Duration::ZERO;
    let mut rest = s;
    if rest.is_empty() {
        anyhow::bail!("empty duration");
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let n: u64 = rest[..digits].parse()?;
        rest = &rest[digits..];
        let unit = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        total += match &rest[..unit] {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n * 60),
            "h" => Duration::from_secs(n * 3600),
            u => anyhow::bail!("unknown unit '{u}'"),
        };
        rest = &rest[unit..];
    }
    Ok(total)
}

/// Whether a URL asks for TLS.
pub fn is_https(url: &str) -> bool {
    url.starts_with("https://")
}

/// The host of an `http(s)://host:port` URL, as written.
pub fn url_host(url: &str) -> anyhow::Result<&str> {
    let rest = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"));
    let hostport = rest.with_context(|| format!("`{url}`: only http:// and https:// URLs are supported"))?;
    let hostport = hostport.trim_end_matches('/');
    let host = hostport.rsplit_once(':').map_or(hostport, |(host, _)| host);
    Ok(host.trim_start_matches('[').trim_end_matches(']'))
}

/// The `host:port` of an `http(s)://host:port` URL, checked: a host (a
/// name or an address) and a port, no path. Peer URLs may name hosts
/// (resolved when dialed, `base::resolve`); listen URLs need addresses
/// ([`url_addr`]).
pub fn url_hostport(url: &str) -> anyhow::Result<&str> {
    let rest = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"));
    let rest = rest.with_context(|| format!("`{url}`: only http:// and https:// URLs are supported"))?;
    let hostport = rest.strip_suffix('/').unwrap_or(rest);
    let valid = match hostport.rsplit_once(':') {
        Some((host, port)) => {
            !host.is_empty()
                && !hostport.contains('/')
                && !host.contains(char::is_whitespace)
                && port.parse::<u16>().is_ok()
        }
        None => false,
    };
    anyhow::ensure!(valid, "`{url}` is not http(s)://host:port");
    Ok(hostport)
}

/// The socket address of an `http(s)://host:port` URL.
pub fn url_addr(url: &str) -> anyhow::Result<SocketAddr> {
    let rest = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"));
    let rest = rest.with_context(|| format!("`{url}`: only http:// and https:// URLs are supported"))?;
    let hostport = rest.trim_end_matches('/');
    let hostport = if hostport.starts_with("localhost:") {
        hostport.replacen("localhost", "127.0.0.1", 1)
    } else {
        hostport.to_string()
    };
    hostport.parse().with_context(|| format!("`{url}` is not http(s)://ip:port"))
}

/// FNV-1a, 64 bit: a stable hash that every member computes identically.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in part.iter().chain(std::iter::once(&0u8)) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// A member's ID from its peer URLs and the cluster token (never 0).
pub fn member_id(peer_urls: &[String], token: &str) -> u64 {
    let mut urls: Vec<&str> = peer_urls.iter().map(String::as_str).collect();
    urls.sort_unstable();
    let mut parts: Vec<&[u8]> = urls.iter().map(|u| u.as_bytes()).collect();
    parts.push(token.as_bytes());
    fnv1a(&parts).max(1)
}

/// The cluster's ID, from its token (never 0). Not from the initial members,
/// as etcd derives it: a member that joins later with
/// `--initial-cluster-state existing` must compute the same ID from its own
/// flags, and the token is what every member of a cluster shares.
pub fn cluster_id(token: &str) -> u64 {
    fnv1a(&[b"cluster".as_slice(), token.as_bytes()]).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_urls_may_name_hosts_listen_urls_need_addresses() {
        assert_eq!(url_hostport("http://raftlock-0.raftlock:2380").unwrap(), "raftlock-0.raftlock:2380");
        assert_eq!(url_hostport("https://10.0.0.1:2380/").unwrap(), "10.0.0.1:2380");
        assert_eq!(url_hostport("http://[::1]:2380").unwrap(), "[::1]:2380");
        for bad in ["raftlock-0:2380", "http://raftlock-0", "http://:2380", "http://a:2380/path", "http://a:99999"] {
            assert!(url_hostport(bad).is_err(), "{bad}");
        }
        assert!(url_addr("http://raftlock-0.raftlock:2380").is_err());
        assert_eq!(url_addr("http://localhost:2380").unwrap(), "127.0.0.1:2380".parse().unwrap());
    }
}
