//! Where the relay may connect: `outbox.allowed_destinations`, checked on the address a
//! connection would go to, after the URL's host was parsed or resolved. So no spelling of an
//! address (decimal, hex, shortened, IPv4-mapped IPv6) and no DNS answer gets around it, and
//! nothing is sent, not even a SYN, to an address outside it.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::client::legacy::connect::dns::Name;
use ipnet::IpNet;

/// What `last_error` says of every refused destination, whatever its port or whether anything
/// listens there: the relay must not tell a role which internal ports are open.
pub const REFUSED: &str = "destination not allowed by outbox.allowed_destinations";

/// The blocks of `outbox.allowed_destinations`, each with an optional port; or of several
/// such lists, every one of which must allow an address (`within`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destinations {
    lists: Vec<Vec<Rule>>,
}

/// Nothing is allowed.
impl Default for Destinations {
    fn default() -> Destinations {
        Destinations { lists: vec![Vec::new()] }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    block: IpNet,
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an address block (a CIDR like 10.0.0.0/8 or [fd00::]/8, optionally with :port)")]
pub struct DestinationsError(String);

/// The error a resolver returns for a name none of whose addresses is allowed; found again in
/// the request's error chain by its type.
#[derive(Debug, thiserror::Error)]
#[error("{REFUSED}")]
pub struct DestinationRefused;

impl Destinations {
    /// Parses a comma-separated list: `127.0.0.1`, `10.0.0.0/8`, `10.0.0.0/8:443`, `::1`,
    /// `[fd00::]/8`, `[fd00::]/8:443`. An empty list allows nothing.
    pub fn parse(text: &str) -> Result<Destinations, DestinationsError> {
        let rules = text.split(',').map(str::trim).filter(|entry| !entry.is_empty()).map(parse_rule).collect::<Result<_, _>>()?;
        Ok(Destinations { lists: vec![rules] })
    }

    /// What both `self` and `other` allow: where two settings say where the relay may
    /// connect (an `outbox relay` flag and the server's setting), the stricter holds.
    pub fn within(mut self, other: Destinations) -> Destinations {
        self.lists.extend(other.lists);
        self
    }

    /// Whether a block names `port` (otherwise every port is treated alike, as port 0 is).
    pub fn names_port(&self, port: u16) -> bool {
        self.lists.iter().flatten().any(|rule| rule.port == Some(port))
    }

    /// Whether the relay may connect to `address`. Where cloud metadata services live
    /// (link-local addresses, and the few others `protected` names) only when a block within
    /// that place is listed on its own, never through a wider one such as 0.0.0.0/0.
    pub fn allows(&self, address: SocketAddr) -> bool {
        let ip = address.ip().to_canonical();
        let protected = protected(ip);
        self.lists.iter().all(|rules| {
            rules.iter().any(|rule| {
                rule.block.contains(&ip)
                    && rule.port.is_none_or(|port| port == address.port())
                    && protected.is_none_or(|place| place.contains(&rule.block))
            })
        })
    }
}

fn parse_rule(entry: &str) -> Result<Rule, DestinationsError> {
    let invalid = || DestinationsError(entry.to_string());
    let (block, port) = split_port(entry).ok_or_else(invalid)?;
    let block = match block.parse::<IpNet>() {
        Ok(block) => block.trunc(),
        Err(_) => IpNet::from(block.parse::<IpAddr>().map_err(|_| invalid())?),
    };
    let port = port.map(|port| port.parse::<u16>().ok().filter(|&p| p > 0).ok_or_else(invalid)).transpose()?;
    Ok(Rule { block, port })
}

/// An entry's block and port: `10.0.0.0/8:443`, `[fd00::]/8:443` or `[fd00::/8]:443`; an IPv6
/// block without brackets has no port. `None` when the brackets do not close, or are followed
/// by something else than a prefix or a port.
fn split_port(entry: &str) -> Option<(String, Option<&str>)> {
    if let Some(bracketed) = entry.strip_prefix('[') {
        let (address, rest) = bracketed.split_once(']')?;
        let (prefix, port) = match rest.split_once(':') {
            Some((prefix, port)) => (prefix, Some(port)),
            None => (rest, None),
        };
        if !prefix.is_empty() && !prefix.starts_with('/') {
            return None;
        }
        return Some((format!("{address}{prefix}"), port));
    }
    if entry.matches(':').count() > 1 {
        return Some((entry.to_string(), None));
    }
    Some(match entry.split_once(':') {
        Some((block, port)) => (block.to_string(), Some(port)),
        None => (entry.to_string(), None),
    })
}

/// The blocks where cloud metadata services answer: link-local addresses (AWS, GCP, Azure,
/// OpenStack at 169.254.169.254), AWS's IPv6 endpoint and Alibaba's. The default list does not
/// reach them.
const PROTECTED: [&str; 4] = ["169.254.0.0/16", "fe80::/10", "fd00:ec2::254/128", "100.100.100.200/32"];

/// The protected place `ip` is in, if any. An IPv6 address that embeds an IPv4 one for NAT64
/// (64:ff9b::/96) is protected when that address is: then only it, on its own, may be listed.
fn protected(ip: IpAddr) -> Option<IpNet> {
    let place = PROTECTED.iter().filter_map(|block| block.parse::<IpNet>().ok()).find(|block| block.contains(&ip));
    place.or_else(|| match ip {
        IpAddr::V6(v6) if v6.segments()[..6] == [0x64, 0xff9b, 0, 0, 0, 0] => {
            let [.., a, b, c, d] = v6.octets();
            protected(IpAddr::from([a, b, c, d])).map(|_| IpNet::from(ip))
        }
        _ => None,
    })
}

/// Resolves host names for one port (0: any port no block names) and keeps only the addresses
/// the relay may connect to; a name with none of them fails with `DestinationRefused`. (A URL
/// whose host is an address never reaches a resolver: the sender checks it itself.)
#[derive(Clone)]
pub struct AllowedResolver {
    pub destinations: Arc<Destinations>,
    pub port: u16,
}

type Resolving = Pin<Box<dyn Future<Output = Result<std::vec::IntoIter<SocketAddr>, Box<dyn std::error::Error + Send + Sync>>> + Send>>;

impl tower_service::Service<Name> for AllowedResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = Resolving;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Resolving {
        let (destinations, port) = (self.destinations.clone(), self.port);
        Box::pin(async move {
            let found = tokio::net::lookup_host((name.as_str(), port)).await?;
            let allowed: Vec<SocketAddr> = found.filter(|address| destinations.allows(*address)).collect();
            if allowed.is_empty() {
                return Err(Box::new(DestinationRefused) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(allowed.into_iter())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allows(list: &str, address: &str) -> bool {
        Destinations::parse(list).unwrap().allows(address.parse().unwrap())
    }

    const DEFAULT: &str = "0.0.0.0/0, ::/0";

    #[test]
    fn the_default_allows_every_address_but_those_of_metadata_services() {
        for address in ["93.184.215.14:443", "127.0.0.1:5432", "10.0.0.1:80", "[2606:2800::1]:443", "[::1]:80"] {
            assert!(allows(DEFAULT, address), "{address}");
        }
        for address in [
            "169.254.169.254:80",
            "169.254.0.1:443",
            "[fe80::1]:80",
            "[febf::1]:80",
            "[::ffff:169.254.169.254]:80",
            "[fd00:ec2::254]:80",
            "100.100.100.200:80",
            "[64:ff9b::a9fe:a9fe]:80",
        ] {
            assert!(!allows(DEFAULT, address), "{address}");
        }
        assert!(allows(DEFAULT, "[64:ff9b::5db8:d70e]:443"), "NAT64 to an ordinary address");
        assert!(allows(DEFAULT, "[fd00:ec2::253]:80"), "beside AWS's endpoint");
    }

    #[test]
    fn a_link_local_address_is_allowed_only_by_a_block_within_link_local() {
        assert!(allows("169.254.169.254/32", "169.254.169.254:80"));
        assert!(allows("0.0.0.0/0, 169.254.0.0/16", "169.254.1.1:80"));
        assert!(!allows("169.0.0.0/8", "169.254.1.1:80"));
        assert!(allows("[fe80::]/10", "[fe80::1]:80"));
        assert!(allows("100.100.100.200", "100.100.100.200:80"));
        assert!(!allows("100.64.0.0/10", "100.100.100.200:80"));
        assert!(allows("[64:ff9b::a9fe:a9fe]", "[64:ff9b::a9fe:a9fe]:80"));
        assert!(!allows("[64:ff9b::]/96", "[64:ff9b::a9fe:a9fe]:80"));
    }

    #[test]
    fn ipv4_mapped_ipv6_addresses_are_checked_as_the_ipv4_address_they_are() {
        assert!(allows("127.0.0.1", "[::ffff:127.0.0.1]:80"));
        assert!(!allows("127.0.0.1", "[::ffff:127.0.0.2]:80"));
        assert!(!allows("::/0", "[::ffff:127.0.0.1]:80"), "an IPv6 block does not admit IPv4 through its mapped form");
    }

    #[test]
    fn blocks_and_ports() {
        let list = "127.0.0.1/32, 10.0.0.0/8:443, [fd00::]/8:8443, ::1, 192.168.1.7:80";
        assert!(allows(list, "127.0.0.1:1"));
        assert!(!allows(list, "127.0.0.2:1"));
        assert!(allows(list, "10.9.8.7:443"));
        assert!(!allows(list, "10.9.8.7:80"), "a block with a port allows that port only");
        assert!(allows(list, "[fd12::1]:8443"));
        assert!(!allows(list, "[fd12::1]:443"));
        assert!(allows(list, "[::1]:9"));
        assert!(allows(list, "192.168.1.7:80"));
        assert!(!allows(list, "192.168.1.7:81"));
        assert!(allows("10.1.2.3/8", "10.200.0.1:80"), "host bits of a block are ignored");
    }

    #[test]
    fn within_another_list_only_what_both_allow_is_allowed() {
        let both = |a: &str, b: &str, address: &str| {
            Destinations::parse(a).unwrap().within(Destinations::parse(b).unwrap()).allows(address.parse().unwrap())
        };
        assert!(both("0.0.0.0/0", "10.0.0.0/8", "10.1.2.3:443"));
        assert!(!both("0.0.0.0/0", "10.0.0.0/8", "192.168.1.1:443"), "the stricter list holds");
        assert!(!both("10.0.0.0/8", "0.0.0.0/0", "192.168.1.1:443"), "whichever side it is on");
        assert!(!both("10.0.0.0/8:443", "10.0.0.0/8", "10.1.2.3:80"));
        assert!(!both("0.0.0.0/0", "", "10.1.2.3:443"), "an empty list allows nothing, within another too");
    }

    #[test]
    fn an_empty_list_allows_nothing() {
        assert!(!allows("", "127.0.0.1:80"));
        assert!(!allows(" , ", "[::1]:80"));
    }

    #[test]
    fn anything_else_is_refused_with_the_entry_named() {
        for bad in ["localhost", "10.0.0.0/33", "10.0.0.1:0", "10.0.0.1:65536", "[::1", "[::1]443", "*", "0x7f000001", "127.1"] {
            let error = Destinations::parse(&format!("127.0.0.1, {bad}")).expect_err(bad);
            assert!(error.to_string().contains(bad), "{error}");
        }
    }
}
