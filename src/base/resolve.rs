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
//! [`srv_cluster`] is etcd's DNS discovery (`--discovery-srv`): the initial
//! members from the SRV records `_etcd-server-ssl._tcp.DOMAIN` (https) and
//! `_etcd-server._tcp.DOMAIN` (http), with `-NAME` after the service for
//! `--discovery-srv-name`; [`srv_cluster_of_size`] waits until the records
//! name the whole initial cluster (`--initial-cluster-size`).
//!
//! Caveat: without a readable `/etc/resolv.conf` the system's resolver
//! (getaddrinfo) is used instead, with a warning once; SRV records need it.

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

/// The SRV records of `name`: each target host (without its final dot) and
/// port, in the order the server gave them. None when there are none.
pub async fn srv(name: &str) -> anyhow::Result<Vec<(String, u16)>> {
    let resolver =
        resolver().ok_or_else(|| anyhow::anyhow!("no DNS configuration (/etc/resolv.conf) to look {name} up with"))?;
    match resolver.srv_lookup(name).await {
        Ok(records) => Ok(records
            .iter()
            .map(|srv| (srv.target().to_utf8().trim_end_matches('.').to_string(), srv.port()))
            .collect()),
        Err(e) if e.is_no_records_found() || e.is_nx_domain() => Ok(Vec::new()),
        Err(e) => Err(anyhow::anyhow!("looking up SRV records {name}: {e}")),
    }
}

/// The SRV name of etcd's service `base` in `domain`, with `-suffix` after
/// the service when one is given (`--discovery-srv-name`).
fn srv_service(base: &str, domain: &str, suffix: Option<&str>) -> String {
    let domain = domain.trim_end_matches('.');
    match suffix.filter(|s| !s.is_empty()) {
        Some(suffix) => format!("_{base}-{suffix}._tcp.{domain}."),
        None => format!("_{base}._tcp.{domain}."),
    }
}

/// `--initial-cluster` from the SRV records of `domain` (see the module
/// doc). This member (`name`, reached at `advertise`) is the record whose
/// target resolves to one of its advertised addresses (or names its
/// advertised host and port); the others are named by their host's first
/// label (`raftlock-1` of `raftlock-1.raftlock.default.svc`), or by the
/// whole host when two share a first label, until they publish their own
/// names, as etcd's temporary names are.
pub async fn srv_cluster(
    domain: &str,
    suffix: Option<&str>,
    name: &str,
    advertise: &[String],
) -> anyhow::Result<String> {
    let service = |base: &str| srv_service(base, domain, suffix);
    let mut own = Vec::new();
    for url in advertise {
        let hostport = super::ids::url_hostport(url)?;
        own.push(hostport.to_string());
        own.extend(resolve(hostport).await.unwrap_or_default().iter().map(|a| a.to_string()));
    }
    let mut found: Vec<(String, String)> = Vec::new(); // (host, url)
    let mut own_url = None;
    for (base, scheme) in [("etcd-server-ssl", "https"), ("etcd-server", "http")] {
        for (host, port) in srv(&service(base)).await? {
            let hostport = format!("{host}:{port}");
            let url = format!("{scheme}://{hostport}");
            let addrs = resolve(&hostport).await?;
            if own.contains(&hostport) || addrs.iter().any(|a| own.contains(&a.to_string())) {
                if let Some(mine) = advertise.iter().find(|u| !u.starts_with(&format!("{scheme}://"))) {
                    anyhow::bail!("--discovery-srv: {url} is this member's, but it advertises {mine}");
                }
                own_url = Some(url.clone());
            }
            found.push((host, url));
        }
    }
    if found.is_empty() {
        anyhow::bail!("--discovery-srv: no SRV records {} or {}", service("etcd-server-ssl"), service("etcd-server"));
    }
    if own_url.is_none() {
        anyhow::bail!(
            "--discovery-srv: cannot find this member ({name}, {}) in the SRV records of {domain}",
            advertise.join(",")
        );
    }
    let label = |host: &str| host.split('.').next().unwrap_or(host).to_string();
    let parts: Vec<String> = found
        .iter()
        .map(|(host, url)| {
            let member = if Some(url) == own_url.as_ref() {
                name.to_string()
            } else if found.iter().filter(|(other, _)| label(other) == label(host)).count() > 1 || label(host) == name {
                host.clone()
            } else {
                label(host)
            };
            format!("{member}={url}")
        })
        .collect();
    Ok(parts.join(","))
}

/// [`srv_cluster`], and with a `size` (`--initial-cluster-size`) asked
/// again every second until the records name exactly `size` members, this
/// one among them. The members of a Kubernetes StatefulSet appear in DNS
/// one by one as their pods get addresses: bootstrapping from the first few
/// would make a smaller cluster than the one meant, which the late members
/// could never join. More records than `size` is an error (a set scaled up without
/// `member add` and `--initial-cluster-state existing`).
pub async fn srv_cluster_of_size(
    domain: &str,
    suffix: Option<&str>,
    name: &str,
    advertise: &[String],
    size: Option<usize>,
) -> anyhow::Result<String> {
    let Some(size) = size else { return srv_cluster(domain, suffix, name, advertise).await };
    let mut logged = String::new();
    loop {
        let waiting = match srv_cluster(domain, suffix, name, advertise).await {
            Ok(cluster) => match cluster.split(',').count() {
                found if found == size => return Ok(cluster),
                found if found > size => anyhow::bail!(
                    "--discovery-srv: the SRV records of {domain} name {found} members ({cluster}), more than \
                     --initial-cluster-size {size}: to add a member, run `member add` and start it with \
                     --initial-cluster-state existing"
                ),
                found => format!("{found} of {size} members in DNS: {cluster}"),
            },
            Err(e) => e.to_string(),
        };
        if waiting != logged {
            tracing::info!(%domain, "waiting for the initial members' SRV records ({waiting})");
            logged = waiting;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// `url` with its host name resolved (clients' endpoints: a statically
/// linked raftlockctl in an empty container image has no other resolver):
/// one URL per address, each with the name an `https://` server's
/// certificate must carry. A URL that names an address, or whose name does
/// not resolve, is kept as it is (connecting to it then fails as it would
/// have). Names are resolved once, here.
pub async fn url_addresses(url: &str) -> Vec<(String, Option<String>)> {
    let as_is = vec![(url.to_string(), None)];
    let (Ok(hostport), Ok(host)) = (super::ids::url_hostport(url), super::ids::url_host(url)) else {
        return as_is;
    };
    if host.parse::<std::net::IpAddr>().is_ok() {
        return as_is;
    }
    let https = url.starts_with("https://");
    match resolve(hostport).await {
        Ok(addrs) if !addrs.is_empty() => addrs
            .iter()
            .map(|addr| {
                let scheme = if https { "https" } else { "http" };
                (format!("{scheme}://{addr}"), https.then(|| host.to_string()))
            })
            .collect(),
        _ => as_is,
    }
}

/// etcdctl's `--discovery-srv`: the client URLs of `domain`'s SRV records
/// `_etcd-client-ssl._tcp` (https) and `_etcd-client._tcp` (http), with
/// `-NAME` after the service for `suffix`. An http target is given as its
/// addresses (resolved here, so that a client without a resolver of its own
/// reaches it); an https one keeps its name, which its certificate carries.
pub async fn srv_endpoints(domain: &str, suffix: Option<&str>) -> anyhow::Result<Vec<String>> {
    let service = |base: &str| srv_service(base, domain, suffix);
    let mut endpoints = Vec::new();
    for (host, port) in srv(&service("etcd-client-ssl")).await? {
        endpoints.push(format!("https://{host}:{port}"));
    }
    for (host, port) in srv(&service("etcd-client")).await? {
        for addr in resolve(&format!("{host}:{port}")).await? {
            endpoints.push(format!("http://{addr}"));
        }
    }
    if endpoints.is_empty() {
        anyhow::bail!("--discovery-srv: no SRV records {} or {}", service("etcd-client-ssl"), service("etcd-client"));
    }
    Ok(endpoints)
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
