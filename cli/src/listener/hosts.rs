//! Whom a listener answers. A browser sends, as `Host`, the name of the page's URL: a page on
//! `evil.example` whose name its owner made resolve to 127.0.0.1 (DNS rebinding) reaches a
//! loopback listener with `Host: evil.example`. So a request must name, as its `Host`, the IP
//! address the listener serves (any IP address when it listens on all of them), `localhost` when
//! it listens on loopback, or a name given by `--allowed-host`. An IP address cannot be rebound,
//! nor can a port: the port is not compared (tunnels and published container ports change it).
//!
//! And a request must not come from another site's page, reads included: `Sec-Fetch-Site`, where
//! the browser sends it, must be `same-origin` or `none` (typed in the address bar), and an
//! `Origin`, on any request that carries one, must be the request's own `Host` or a name given by
//! `--allowed-host` (a proxy in front may rewrite `Host` to the listener's address).

use std::net::IpAddr;

use super::http::Request;

/// A host in a `Host` header, an origin or `--allowed-host`: an IP address, or a name in lower case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostName {
    Ip(IpAddr),
    Name(String),
}

/// `--allowed-host`: a host name or IP address, with no port.
pub fn allowed_host(text: &str) -> Result<HostName, String> {
    let text = text.trim();
    let unbracketed = text.strip_prefix('[').and_then(|rest| rest.strip_suffix(']')).unwrap_or(text);
    if let Ok(ip) = unbracketed.parse::<IpAddr>() {
        return Ok(HostName::Ip(ip));
    }
    name(text).ok_or_else(|| format!("{text:?} is not a host name or IP address: write console.example.com or 10.0.0.5, with no port"))
}

/// The host of a `Host` header's value or an origin's authority (`name`, `name:port`,
/// `1.2.3.4:port`, `[::1]:port`); `None` if it is none of these.
fn host_of(authority: &str) -> Option<HostName> {
    let port_ok = |port: &str| !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit());
    if let Some(rest) = authority.strip_prefix('[') {
        let (ip, after) = rest.split_once(']')?;
        if !after.is_empty() && !after.strip_prefix(':').is_some_and(port_ok) {
            return None;
        }
        return ip.parse::<std::net::Ipv6Addr>().ok().map(|ip| HostName::Ip(ip.into()));
    }
    let host = match authority.rsplit_once(':') {
        Some((host, port)) if port_ok(port) => host,
        Some(_) => return None,
        None => authority,
    };
    match host.parse::<std::net::Ipv4Addr>() {
        Ok(ip) => Some(HostName::Ip(ip.into())),
        Err(_) => name(host),
    }
}

/// A DNS name (letters, digits, `-`, `_` and dots), in lower case.
fn name(text: &str) -> Option<HostName> {
    let valid = !text.is_empty() && text.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    valid.then(|| HostName::Name(text.to_ascii_lowercase()))
}

/// The hosts a listener answers to.
#[derive(Debug)]
pub struct Hosts {
    /// The address it listens on.
    listen: IpAddr,
    /// `--allowed-host`.
    allowed: Vec<HostName>,
}

impl Hosts {
    pub fn new(listen: IpAddr, allowed: &[HostName]) -> Hosts {
        Hosts { listen, allowed: allowed.to_vec() }
    }

    /// Why `request` is not answered, with the status that says so, if it is not: a `Host` this
    /// listener does not serve, or a request from another site's page.
    pub fn refusal(&self, request: &Request) -> Option<(u16, &'static str)> {
        let Some(host) = request.header("host") else {
            return Some((400, "a request must name its Host"));
        };
        if !host_of(host).is_some_and(|name| self.serves(&name)) {
            return Some((421, "this listener does not answer to that Host: use its address, or name the host with --allowed-host"));
        }
        if request.header("sec-fetch-site").is_some_and(|site| site != "same-origin" && site != "none") {
            return Some((403, "a request from another site is refused, reads as well as actions"));
        }
        if let Some(origin) = request.header("origin") {
            let authority = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://"));
            let own = authority.is_some_and(|authority| authority.eq_ignore_ascii_case(host));
            if !own && !authority.and_then(host_of).is_some_and(|name| self.allowed.contains(&name)) {
                return Some((403, "a request from another origin is refused: name that origin's host with --allowed-host"));
            }
        }
        None
    }

    fn serves(&self, host: &HostName) -> bool {
        let everywhere = self.listen.is_unspecified();
        self.allowed.contains(host)
            || match host {
                HostName::Ip(ip) => everywhere || *ip == self.listen,
                HostName::Name(name) => name == "localhost" && (everywhere || self.listen.is_loopback()),
            }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(headers: &[(&str, &str)]) -> Request {
        let head: String = headers.iter().map(|(name, value)| format!("\r\n{name}: {value}")).collect();
        super::super::http::parse_head(format!("GET / HTTP/1.1{head}").as_bytes()).unwrap()
    }

    fn refused(hosts: &Hosts, headers: &[(&str, &str)]) -> Option<u16> {
        hosts.refusal(&request(headers)).map(|(status, _)| status)
    }

    #[test]
    fn a_loopback_listener_answers_to_its_address_and_localhost_on_any_port() {
        let hosts = Hosts::new("127.0.0.1".parse().unwrap(), &[]);
        for host in ["127.0.0.1:8080", "127.0.0.1:9000", "127.0.0.1", "localhost:8080", "LocalHost"] {
            assert_eq!(refused(&hosts, &[("host", host)]), None, "{host}");
        }
        for host in ["evil.example:8080", "127.0.0.2:8080", "[::1]:8080", "127.0.0.1:x", "127.0.0.1:", "a b", "", "localhost.evil.example"]
        {
            assert_eq!(refused(&hosts, &[("host", host)]), Some(421), "{host}");
        }
        assert_eq!(refused(&hosts, &[]), Some(400), "no Host");
    }

    #[test]
    fn a_listener_on_every_address_answers_to_ip_addresses_and_allowed_names_only() {
        let hosts = Hosts::new("::".parse().unwrap(), &[allowed_host("Console.Example").unwrap()]);
        for host in ["10.0.0.5:8080", "[fd00::1]:8080", "localhost:8080", "console.example", "console.example:443"] {
            assert_eq!(refused(&hosts, &[("host", host)]), None, "{host}");
        }
        for host in ["evil.example", "console.example.evil.example"] {
            assert_eq!(refused(&hosts, &[("host", host)]), Some(421), "{host}");
        }
    }

    #[test]
    fn another_site_is_refused_by_its_fetch_site_or_its_origin() {
        let hosts = Hosts::new("127.0.0.1".parse().unwrap(), &[allowed_host("console.example").unwrap()]);
        let host = ("host", "127.0.0.1:8080");
        for site in ["same-origin", "none"] {
            assert_eq!(refused(&hosts, &[host, ("sec-fetch-site", site)]), None, "{site}");
        }
        for site in ["cross-site", "same-site", "other"] {
            assert_eq!(refused(&hosts, &[host, ("sec-fetch-site", site)]), Some(403), "{site}");
        }
        for origin in ["http://127.0.0.1:8080", "https://console.example", "https://console.example:8443"] {
            assert_eq!(refused(&hosts, &[host, ("origin", origin)]), None, "{origin}");
        }
        for origin in ["http://evil.example", "http://127.0.0.1:3000", "null", "http://127.0.0.1:8080/", "ftp://127.0.0.1:8080"] {
            assert_eq!(refused(&hosts, &[host, ("origin", origin)]), Some(403), "{origin}");
        }
    }

    #[test]
    fn an_allowed_host_is_a_name_or_an_address_without_a_port() {
        assert_eq!(allowed_host("Console.Example"), Ok(HostName::Name("console.example".into())));
        assert_eq!(allowed_host("10.0.0.5"), Ok(HostName::Ip("10.0.0.5".parse().unwrap())));
        assert_eq!(allowed_host("[::1]"), Ok(HostName::Ip("::1".parse().unwrap())));
        for bad in ["console.example:8080", "http://console.example", "*", "", "a/b"] {
            assert!(allowed_host(bad).is_err(), "{bad}");
        }
    }
}
