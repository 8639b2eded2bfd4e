//! Who may use the console and how: the address it listens on, the credentials a request must
//! carry, and the checks that make every action a request of the console's own page (the
//! listener has already refused other hosts and other sites: crate::listener).

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;

use crate::listener::Request;
use base64::Engine;

/// The header the console's script sends with every action: a cross-site form cannot set it,
/// and a cross-site script cannot read the token (no CORS header is ever sent).
pub const TOKEN_HEADER: &str = "x-outbox-console";

#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error("cannot read {path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("{0} is empty")]
    Empty(String),
    #[error("{0} must hold user:password on one line")]
    NotUserPassword(String),
    #[error("give the console one way to authenticate: --token-file, OUTBOX_CONSOLE_TOKEN or --basic-auth-file")]
    TwoWays,
    #[error("cannot listen on {0}: not an address (write 127.0.0.1:8080)")]
    Address(String),
    #[error(
        "the console listens on {0}, which is not a loopback address, and has no authentication: give --token-file, \
         OUTBOX_CONSOLE_TOKEN or --basic-auth-file (or listen on 127.0.0.1)"
    )]
    Unprotected(String),
}

/// What a request must carry in its `Authorization` header.
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    /// Loopback only.
    None,
    /// `Bearer <token>`: for a proxy in front that adds it.
    Bearer(String),
    /// `Basic <user:password in base64>`: the browser asks for it.
    Basic(String),
}

/// Which kind, never the value: it is what a client must send.
impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Credentials::None => "Credentials::None",
            Credentials::Bearer(_) => "Credentials::Bearer(…)",
            Credentials::Basic(_) => "Credentials::Basic(…)",
        })
    }
}

impl Credentials {
    pub fn load(token_file: Option<&Path>, token: Option<String>, basic_file: Option<&Path>) -> Result<Credentials, GuardError> {
        let token = match (token_file, token) {
            (Some(_), Some(_)) => return Err(GuardError::TwoWays),
            (Some(path), None) => Some((read_secret(path)?, path.display().to_string())),
            (None, Some(token)) => Some((token.trim().to_string(), "OUTBOX_CONSOLE_TOKEN".to_string())),
            (None, None) => None,
        };
        match (token, basic_file) {
            (Some(_), Some(_)) => Err(GuardError::TwoWays),
            (Some((token, _)), None) if !token.is_empty() => Ok(Credentials::Bearer(format!("Bearer {token}"))),
            (Some((_, source)), None) => Err(GuardError::Empty(source)),
            (None, Some(path)) => {
                let pair = read_secret(path)?;
                if !pair.contains(':') || pair.contains('\n') {
                    return Err(GuardError::NotUserPassword(path.display().to_string()));
                }
                Ok(Credentials::Basic(format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair))))
            }
            (None, None) => Ok(Credentials::None),
        }
    }

    /// Whether `request` carries these credentials; compared in constant time.
    pub fn admit(&self, request: &Request) -> bool {
        let expected = match self {
            Credentials::None => return true,
            Credentials::Bearer(value) | Credentials::Basic(value) => value,
        };
        request.header("authorization").is_some_and(|given| same_bytes(given.as_bytes(), expected.as_bytes()))
    }

    /// The challenge a browser answers with a login prompt, for basic authentication.
    pub fn challenge(&self) -> Option<&'static str> {
        matches!(self, Credentials::Basic(_)).then_some("Basic realm=\"outbox console\", charset=\"UTF-8\"")
    }
}

fn read_secret(path: &Path) -> Result<String, GuardError> {
    let text = std::fs::read_to_string(path).map_err(|error| GuardError::Read { path: path.display().to_string(), error })?;
    let text = text.trim_end_matches(['\n', '\r']).to_string();
    if text.is_empty() {
        return Err(GuardError::Empty(path.display().to_string()));
    }
    Ok(text)
}

fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |difference, (x, y)| difference | (x ^ y)) == 0
}

/// The addresses `listen` names; all of them loopback unless the console asks for credentials.
pub fn listen_addresses(listen: &str, credentials: &Credentials) -> Result<Vec<SocketAddr>, GuardError> {
    let addresses: Vec<SocketAddr> = listen.to_socket_addrs().map_err(|_| GuardError::Address(listen.to_string()))?.collect();
    if addresses.is_empty() {
        return Err(GuardError::Address(listen.to_string()));
    }
    if *credentials == Credentials::None && addresses.iter().any(|a| !a.ip().is_loopback()) {
        return Err(GuardError::Unprotected(listen.to_string()));
    }
    Ok(addresses)
}

/// Why an action request is refused as not coming from the console's own page, if it is: it
/// must be JSON, carry the page's token, and say (where the browser says) that it comes from
/// the same origin: a fetch of the page's script, never a navigation.
pub fn not_from_the_page(request: &Request, token: &str) -> Option<&'static str> {
    let json = request.header("content-type").is_some_and(|value| value.split(';').next().unwrap_or("").trim() == "application/json");
    if !json {
        return Some("an action is a JSON request (content-type: application/json)");
    }
    if !request.header(TOKEN_HEADER).is_some_and(|given| same_bytes(given.as_bytes(), token.as_bytes())) {
        return Some("an action must come from the console's page: its token is missing or stale (reload the page)");
    }
    if request.header("sec-fetch-site").is_some_and(|site| site != "same-origin") {
        return Some("a cross-site request cannot act");
    }
    None
}

/// A token no one can guess: 32 bytes from the kernel's generator, in hex.
pub fn random_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_never_print_their_value() {
        for credentials in [Credentials::Bearer("Bearer s3cret".into()), Credentials::Basic("Basic b3BzOnBhOnNz".into())] {
            let printed = format!("{credentials:?}");
            assert!(!printed.contains("s3cret") && !printed.contains("b3BzOnBhOnNz"), "{printed}");
        }
    }

    #[test]
    fn loopback_needs_nothing_and_any_other_address_needs_credentials() {
        assert!(listen_addresses("127.0.0.1:0", &Credentials::None).is_ok());
        assert!(listen_addresses("[::1]:0", &Credentials::None).is_ok());
        assert!(matches!(listen_addresses("0.0.0.0:8080", &Credentials::None), Err(GuardError::Unprotected(_))));
        assert!(listen_addresses("0.0.0.0:0", &Credentials::Bearer("Bearer x".into())).is_ok());
        assert!(matches!(listen_addresses("nowhere", &Credentials::None), Err(GuardError::Address(_))));
    }

    #[test]
    fn credentials_come_from_one_place_and_are_never_empty() {
        let dir = std::env::temp_dir().join(format!("outbox-guard-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (token, basic, empty) = (dir.join("token"), dir.join("basic"), dir.join("empty"));
        std::fs::write(&token, "s3cret\n").unwrap();
        std::fs::write(&basic, "ops:pa:ss\n").unwrap();
        std::fs::write(&empty, "\n").unwrap();
        assert_eq!(Credentials::load(Some(&token), None, None).unwrap(), Credentials::Bearer("Bearer s3cret".into()));
        assert_eq!(Credentials::load(None, Some("t".into()), None).unwrap(), Credentials::Bearer("Bearer t".into()));
        assert_eq!(Credentials::load(None, None, Some(&basic)).unwrap(), Credentials::Basic("Basic b3BzOnBhOnNz".into()));
        assert!(matches!(Credentials::load(Some(&empty), None, None), Err(GuardError::Empty(_))));
        assert!(matches!(Credentials::load(None, Some(" ".into()), None), Err(GuardError::Empty(_))));
        assert!(matches!(Credentials::load(None, None, Some(&token)), Err(GuardError::NotUserPassword(_))));
        assert!(matches!(Credentials::load(Some(&token), None, Some(&basic)), Err(GuardError::TwoWays)));
        assert_eq!(Credentials::load(None, None, None).unwrap(), Credentials::None);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn tokens_differ_and_compare_only_when_equal() {
        let (a, b) = (random_token().unwrap(), random_token().unwrap());
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
        assert!(same_bytes(a.as_bytes(), a.as_bytes()));
        assert!(!same_bytes(a.as_bytes(), b.as_bytes()));
        assert!(!same_bytes(b"ab", b"abc"));
    }
}
