//! Host names to addresses, for the peer URLs members dial: a DNS stub
//! resolver in the process (hickory), reading `/etc/resolv.conf` and
//! `/etc/hosts` itself, so that the statically linked binary resolves names
//! wherever it runs — in an empty container image too, where the C
//! library's resolver has no modules to load — as Docker and Kubernetes
//! name members (`raftlock-0.raftlock.default.svc`).
//!
//! An IP address is used as it is, and `localhost` is 127.0.0.1 (as the
//! listen URLs read it), without a lookup. Names are looked up each time a
//! connection is made, and answers are kept [`MAX_CACHED`] at most whatever
//! their TTL (Docker's DNS gives 600 s), so a member that comes back at
//! another address (a rescheduled pod, a reconnected container) is found
//! there within seconds.
//!
//! Caveat: without a readable `/etc/resolv.conf` the system's resolver
//! (getaddrinfo) is used instead, with a warning once.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::OnceLock;
use std::time::Duration;

use hickory_resolver::TokioResolver;

/// The longest an answer is kept.
pub const MAX_CACHED: Duration = Duration::from_secs(2);

/// The process's resolver, made on first use (None: the system's instead).
fn resolver() -> Option<&'static TokioResolver> {
    static RESOLVER: OnceLock<Option<TokioResolver>> = OnceLock::new();
    RESOLVER
        .get_or_init(|| match TokioResolver::builder_tokio() {
            Ok(mut builder) => {
                let options = builder.options_mut();
                options.positive_max_ttl = Some(MAX_CACHED);
                options.negative_max_ttl = Some(MAX_CACHED);
                Some(builder.build())
            }
            Err(e) => {
                tracing::warn!(error = %e, "no DNS configuration to read; names are resolved by the system's resolver");
                None
            }
        })
        .as_ref()
}

/// The addresses of `host:port` (`[v6]:port` too), in the order to try.
pub async fn resolve(hostport: &str) -> io::Result<Vec<SocketAddr>> {
    if let Ok(addr) = hostport.parse::<SocketAddr>() {
        return Ok(vec![addr]);
    }
    let invalid = || io::Error::new(io::ErrorKind::InvalidInput, format!("`{hostport}` is not host:port"));
    let (host, port) = hostport.rsplit_once(':').ok_or_else(invalid)?;
    let port: u16 = port.parse().map_err(|_| invalid())?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(invalid());
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    if host == "localhost" {
        return Ok(vec![SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)]);
    }
    let addrs: Vec<SocketAddr> = match resolver() {
        Some(resolver) => resolver
            .lookup_ip(host)
            .await
            .map_err(|e| io::Error::new(io::ErrorKind::NotFound, format!("{host}: {e}")))?
            .iter()
            .map(|ip| SocketAddr::new(ip, port))
            .collect(),
        None => tokio::net::lookup_host(hostport).await?.collect(),
    };
    if addrs.is_empty() {
        return Err(io::Error::new(io::ErrorKind::NotFound, format!("{host}: no address")));
    }
    Ok(addrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn addresses_and_localhost_need_no_lookup() {
        assert_eq!(resolve("10.1.2.3:2380").await.unwrap(), vec!["10.1.2.3:2380".parse().unwrap()]);
        assert_eq!(resolve("[::1]:2380").await.unwrap(), vec!["[::1]:2380".parse().unwrap()]);
        assert_eq!(resolve("localhost:2380").await.unwrap(), vec!["127.0.0.1:2380".parse().unwrap()]);
        assert!(resolve("no-port").await.is_err());
        assert!(resolve(":2380").await.is_err());
    }

    #[tokio::test]
    async fn names_are_looked_up_in_the_hosts_file() {
        // A name /etc/hosts gives an IPv4 address (other than localhost)
        // resolves to that address.
        let hosts = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
        let named = hosts.lines().filter_map(|line| {
            let mut words = line.split('#').next()?.split_whitespace();
            let ip: Ipv4Addr = words.next()?.parse().ok()?;
            words.find(|name| *name != "localhost" && !name.contains(':')).map(|name| (ip, name.to_string()))
        });
        let Some((ip, name)) = named.into_iter().next() else { return };
        let addrs = resolve(&format!("{name}:2380")).await.expect("a name in /etc/hosts resolves");
        assert!(addrs.contains(&SocketAddr::new(IpAddr::V4(ip), 2380)), "{name}: {addrs:?}");
        assert!(resolve("no-such-member.invalid:2380").await.is_err());
    }
}
