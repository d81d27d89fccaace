use std::borrow::Cow;
use std::fmt;
use std::io::Write as _;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use http::header::HeaderName;
use http::request::Parts;

use super::KeyExtractor;

/// The client's IP address.
///
/// The address comes from the connection: axum's `ConnectInfo<SocketAddr>` (with the `axum`
/// feature; serve with `into_make_service_with_connect_info::<SocketAddr>()`), tonic's
/// `TcpConnectInfo` (with the `tonic` feature; `tonic::transport::Server` inserts it), or a plain
/// `SocketAddr` request extension that hyper users insert themselves.
///
/// **Forwarding headers are not trusted by default**: anyone can send `X-Forwarded-For`. Name the
/// proxies in front of you with [`PeerIp::trust_proxies`]; then, when the peer is one of them,
/// the header is read from the right and the first address that is not a trusted proxy is the
/// client ("rightmost untrusted"). An entry that is not an address (garbage, stray bytes) stops
/// the walk there: the client is the one the last trusted proxy reported.
///
/// IPv6 clients are grouped by /64 (configurable): one host usually owns a whole /64 and could
/// rotate through it.
///
/// ```
/// use redlimit::key::{KeyExtractor, PeerIp};
/// use std::net::SocketAddr;
///
/// let extractor = PeerIp::new().trust_proxies(["10.0.0.0/8".parse()?]);
/// let mut request = http::Request::builder()
///     .header("x-forwarded-for", "203.0.113.7, 10.1.2.3")
///     .body(())
///     .unwrap();
/// request.extensions_mut().insert("10.0.0.1:4000".parse::<SocketAddr>().unwrap());
/// let (parts, _) = request.into_parts();
/// assert_eq!(extractor.extract(&parts).as_deref(), Some("ip:203.0.113.7"));
/// # Ok::<(), redlimit::key::InvalidCidr>(())
/// ```
#[derive(Debug, Clone)]
pub struct PeerIp {
    trusted: Vec<Cidr>,
    forwarded_header: HeaderName,
    ipv6_prefix: u8,
}

impl Default for PeerIp {
    fn default() -> Self {
        Self::new()
    }
}

impl PeerIp {
    /// The peer address; no proxy trusted; IPv6 grouped by /64.
    pub fn new() -> Self {
        PeerIp {
            trusted: Vec::new(),
            forwarded_header: HeaderName::from_static("x-forwarded-for"),
            ipv6_prefix: 64,
        }
    }

    /// Trusts these proxies' forwarding headers.
    pub fn trust_proxies(mut self, proxies: impl IntoIterator<Item = Cidr>) -> Self {
        self.trusted.extend(proxies);
        self
    }

    /// The forwarding header read from trusted proxies (`x-forwarded-for` by default), a
    /// comma-separated list of addresses, the nearest hop last.
    ///
    /// ```
    /// use redlimit::key::{KeyExtractor, PeerIp};
    /// use http::HeaderName;
    /// use std::net::SocketAddr;
    ///
    /// let extractor = PeerIp::new()
    ///     .trust_proxies(["192.0.2.10".parse()?])
    ///     .forwarded_header(HeaderName::from_static("x-real-ip"));
    /// let mut request = http::Request::builder()
    ///     .header("x-real-ip", "203.0.113.7")
    ///     .body(())
    ///     .unwrap();
    /// request.extensions_mut().insert("192.0.2.10:4000".parse::<SocketAddr>().unwrap());
    /// let (parts, _) = request.into_parts();
    /// assert_eq!(extractor.extract(&parts).as_deref(), Some("ip:203.0.113.7"));
    /// # Ok::<(), redlimit::key::InvalidCidr>(())
    /// ```
    pub fn forwarded_header(mut self, name: HeaderName) -> Self {
        self.forwarded_header = name;
        self
    }

    /// How many leading bits of an IPv6 address form the key (64 by default, at most 128).
    ///
    /// ```
    /// use redlimit::key::{KeyExtractor, PeerIp};
    /// use std::net::SocketAddr;
    ///
    /// let key = |extractor: &PeerIp, peer: &str| {
    ///     let mut request = http::Request::new(());
    ///     request.extensions_mut().insert(peer.parse::<SocketAddr>().unwrap());
    ///     extractor.extract(&request.into_parts().0).unwrap().into_owned()
    /// };
    /// let by_64 = PeerIp::new();
    /// assert_eq!(key(&by_64, "[2001:db8:1:2::7]:443"), "ip:2001:db8:1:2::/64");
    /// // A /48 puts a whole site under one key.
    /// let by_48 = PeerIp::new().ipv6_prefix(48);
    /// assert_eq!(key(&by_48, "[2001:db8:1:2::7]:443"), key(&by_48, "[2001:db8:1:ffff::1]:443"));
    /// ```
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits.min(128);
        self
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|cidr| cidr.contains(ip))
    }

    /// Walks the forwarding header from the right past trusted proxies.
    fn client_behind(&self, peer: IpAddr, parts: &Parts) -> IpAddr {
        let mut client = peer;
        // Split the raw bytes: a line is often written partly by the client and partly by a
        // trusted proxy (`$proxy_add_x_forwarded_for`), so a bad byte in the client's part must
        // not discard the proxy's hop on the same line.
        let hops = parts
            .headers
            .get_all(&self.forwarded_header)
            .iter()
            .flat_map(|value| value.as_bytes().split(|&byte| byte == b','));
        for hop in hops.rev() {
            if !self.is_trusted(client) {
                break;
            }
            match std::str::from_utf8(hop).ok().and_then(parse_hop) {
                Some(ip) => client = ip,
                // Garbage from a client (not an address, not even UTF-8): the last trusted hop
                // is the best we know.
                None => break,
            }
        }
        client
    }

    /// Writes the key of `ip` into `buf` (64 bytes hold the longest: `ip:` and an IPv6 address
    /// with its prefix length) and returns it.
    fn write_key<'b>(&self, ip: IpAddr, buf: &'b mut [u8; KEY_BUF]) -> &'b str {
        let mut out = &mut buf[..];
        let written = match canonical(ip) {
            IpAddr::V4(v4) => write!(out, "ip:{v4}"),
            IpAddr::V6(v6) => {
                let bits = u128::from(v6);
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.ipv6_prefix))
                    .unwrap_or(0);
                write!(
                    out,
                    "ip:{}/{}",
                    Ipv6Addr::from(bits & mask),
                    self.ipv6_prefix
                )
            }
        };
        written.expect("an IP key fits in 64 bytes");
        let len = KEY_BUF - out.len();
        std::str::from_utf8(&buf[..len]).expect("an IP key is ASCII")
    }

    /// The client's address: the peer's, or the one its trusted proxies name.
    fn client(&self, parts: &Parts) -> Option<IpAddr> {
        let peer = peer_addr(parts)?.ip();
        Some(if self.trusted.is_empty() {
            peer
        } else {
            self.client_behind(peer, parts)
        })
    }
}

/// The longest IP key: `ip:` (3), an IPv6 address (at most 39 in its compressed form), `/128`.
const KEY_BUF: usize = 64;

impl KeyExtractor for PeerIp {
    fn extract<'a>(&'a self, parts: &'a Parts) -> Option<Cow<'a, str>> {
        let client = self.client(parts)?;
        Some(Cow::Owned(
            self.write_key(client, &mut [0; KEY_BUF]).to_owned(),
        ))
    }

    fn with_key<R>(&self, parts: &Parts, f: impl FnOnce(Option<&str>) -> R) -> R {
        // The layer only reads the key while it builds the storage key: on the stack, the
        // request path allocates nothing for it.
        match self.client(parts) {
            Some(client) => f(Some(self.write_key(client, &mut [0; KEY_BUF]))),
            None => f(None),
        }
    }

    fn missing_key_hint(&self) -> &'static str {
        "PeerIp sees no peer address: serve axum with \
         `into_make_service_with_connect_info::<SocketAddr>()`, insert the `SocketAddr` as a \
         request extension (hyper), or key tonic servers some other way"
    }
}

/// The connection's address from the request extensions.
fn peer_addr(parts: &Parts) -> Option<SocketAddr> {
    #[cfg(feature = "axum")]
    if let Some(info) = parts
        .extensions
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(info.0);
    }
    #[cfg(feature = "tonic")]
    if let Some(addr) = tonic_peer_addr(parts) {
        return Some(addr);
    }
    parts.extensions.get::<SocketAddr>().copied()
}

/// The peer address tonic's server (`tonic::transport::Server`) puts into every request.
#[cfg(feature = "tonic")]
fn tonic_peer_addr(parts: &Parts) -> Option<SocketAddr> {
    parts
        .extensions
        .get::<tonic::transport::server::TcpConnectInfo>()?
        .remote_addr()
}

/// One `X-Forwarded-For` entry: an address, possibly with a port (`1.2.3.4:80`, `[::1]:80`).
fn parse_hop(hop: &str) -> Option<IpAddr> {
    let hop = hop.trim();
    hop.parse::<IpAddr>()
        .ok()
        .or_else(|| hop.parse::<SocketAddr>().ok().map(|s| s.ip()))
}

/// IPv4-mapped IPv6 addresses count as the IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// A network in CIDR notation (`10.0.0.0/8`, `2001:db8::/32`) or a single address.
///
/// Parse it with [`str::parse`]; see [`PeerIp::trust_proxies`].
///
/// ```
/// use redlimit::key::Cidr;
/// use std::net::IpAddr;
///
/// let private: Cidr = "10.0.0.0/8".parse()?;
/// assert!(private.contains("10.20.30.40".parse::<IpAddr>().unwrap()));
/// assert!(!private.contains("11.0.0.1".parse::<IpAddr>().unwrap()));
///
/// let single: Cidr = "2001:db8::1".parse()?; // an address alone is a /128 (IPv4: /32)
/// assert_eq!(single.to_string(), "2001:db8::1/128");
/// # Ok::<(), redlimit::key::InvalidCidr>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

/// A string that is not a CIDR network or an IP address.
///
/// ```
/// use redlimit::key::Cidr;
///
/// let error = "10.0.0.0/33".parse::<Cidr>().unwrap_err();
/// assert!(error.to_string().contains("e.g. 10.0.0.0/8"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid network {0:?}: expected an address or address/prefix, e.g. 10.0.0.0/8")]
pub struct InvalidCidr(String);

impl Cidr {
    /// Whether `ip` is inside this network. An IPv4-mapped IPv6 address counts as the IPv4
    /// address.
    ///
    /// ```
    /// use redlimit::key::Cidr;
    /// use std::net::IpAddr;
    ///
    /// let proxies: Cidr = "192.0.2.0/24".parse()?;
    /// assert!(proxies.contains("192.0.2.9".parse::<IpAddr>().unwrap()));
    /// assert!(proxies.contains("::ffff:192.0.2.9".parse::<IpAddr>().unwrap()));
    /// assert!(!proxies.contains("2001:db8::1".parse::<IpAddr>().unwrap()));
    /// # Ok::<(), redlimit::key::InvalidCidr>(())
    /// ```
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.network, canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = InvalidCidr;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || InvalidCidr(s.to_owned());
        let (addr, prefix) = match s.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (s, None),
        };
        let network = canonical(addr.trim().parse::<IpAddr>().map_err(|_| invalid())?);
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(invalid)?,
            None => max,
        };
        Ok(Cidr { network, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(peer: &str, forwarded: &[&str]) -> Parts {
        let mut builder = http::Request::builder();
        for value in forwarded {
            builder = builder.header("x-forwarded-for", *value);
        }
        let mut request = builder.body(()).unwrap();
        request
            .extensions_mut()
            .insert(peer.parse::<SocketAddr>().unwrap());
        request.into_parts().0
    }

    #[test]
    fn forwarded_header_ignored_unless_peer_is_trusted() {
        let p = parts("198.51.100.9:1000", &["203.0.113.7"]);
        assert_eq!(
            PeerIp::new().extract(&p).as_deref(),
            Some("ip:198.51.100.9")
        );
        let trusting = PeerIp::new().trust_proxies(["10.0.0.0/8".parse().unwrap()]);
        assert_eq!(trusting.extract(&p).as_deref(), Some("ip:198.51.100.9"));
    }

    #[test]
    fn rightmost_untrusted_hop_is_the_client() {
        let extractor = PeerIp::new().trust_proxies(["10.0.0.0/8".parse().unwrap()]);
        // A client forging the leftmost entry cannot choose its key.
        let p = parts("10.0.0.1:1", &["1.1.1.1, 203.0.113.7", "10.2.2.2"]);
        assert_eq!(extractor.extract(&p).as_deref(), Some("ip:203.0.113.7"));
        let garbage = parts("10.0.0.1:1", &["not-an-ip"]);
        assert_eq!(extractor.extract(&garbage).as_deref(), Some("ip:10.0.0.1"));
    }

    /// A trusted proxy appends the client to the line the client sent: bytes that are not
    /// visible ASCII in the client's part are a garbage hop, not a reason to drop the line with
    /// the proxy's hop (which would key the client by the proxy's address).
    #[test]
    fn non_ascii_bytes_left_of_a_trusted_hop_do_not_discard_it() {
        let extractor = PeerIp::new().trust_proxies(["10.0.0.0/8".parse().unwrap()]);
        let key = |lines: &[&[u8]]| {
            let mut request = http::Request::new(());
            for line in lines {
                request.headers_mut().append(
                    "x-forwarded-for",
                    http::HeaderValue::from_bytes(line).unwrap(),
                );
            }
            request
                .extensions_mut()
                .insert("10.0.0.1:4000".parse::<SocketAddr>().unwrap());
            extractor
                .extract(&request.into_parts().0)
                .unwrap()
                .into_owned()
        };
        assert_eq!(key(&[b"\xff, 203.0.113.7"]), "ip:203.0.113.7");
        assert_eq!(key(&[b"1.1.1.1\xff, 203.0.113.7"]), "ip:203.0.113.7");
        assert_eq!(key(&[b"\xc3\xa9, 10.2.2.2, 203.0.113.7"]), "ip:203.0.113.7");
        // Through two trusted proxies, on two lines: the walk passes the second proxy's hop.
        assert_eq!(key(&[b"\xff, 10.2.2.2", b"10.3.3.3"]), "ip:10.2.2.2");
        // The bad bytes are a garbage hop: the walk stops there, it does not skip them.
        assert_eq!(key(&[b"198.51.100.1, \xff, 10.2.2.2"]), "ip:10.2.2.2");
        // A bad byte inside the trusted proxy's own hop: that hop is garbage, the peer stays.
        assert_eq!(key(&[b"203.0.113.7\xff"]), "ip:10.0.0.1");
    }

    /// The layer's `with_key` (on the stack) gives exactly `extract`'s key, the longest too.
    #[test]
    fn with_key_gives_the_extracted_key() {
        let longest = "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe]:1";
        let trusting = PeerIp::new().trust_proxies(["10.0.0.0/8".parse().unwrap()]);
        for (extractor, peer, forwarded) in [
            (PeerIp::new(), "198.51.100.9:1000", &[][..]),
            (PeerIp::new().ipv6_prefix(128), longest, &[]),
            (PeerIp::new(), "[::ffff:192.0.2.1]:1", &[]),
            (trusting, "10.0.0.1:1", &["203.0.113.7"]),
        ] {
            let p = parts(peer, forwarded);
            let extracted = extractor.extract(&p);
            assert!(extracted.is_some(), "{peer}");
            extractor.with_key(&p, |key| assert_eq!(key, extracted.as_deref()));
        }
        let p = parts(longest, &[]);
        let full = PeerIp::new().ipv6_prefix(128);
        let key = full.extract(&p).unwrap();
        assert_eq!(key, "ip:ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe/128");
        let none = http::Request::new(()).into_parts().0;
        PeerIp::new().with_key(&none, |key| assert_eq!(key, None));
    }

    #[test]
    fn ipv6_grouped_by_prefix_and_mapped_v4_unwrapped() {
        let p = parts("[2001:db8:1:2:aaaa::1]:1", &[]);
        assert_eq!(
            PeerIp::new().extract(&p).as_deref(),
            Some("ip:2001:db8:1:2::/64")
        );
        let full = PeerIp::new().ipv6_prefix(128);
        assert_eq!(
            full.extract(&p).as_deref(),
            Some("ip:2001:db8:1:2:aaaa::1/128")
        );
        let mapped = parts("[::ffff:192.0.2.1]:1", &[]);
        assert_eq!(
            PeerIp::new().extract(&mapped).as_deref(),
            Some("ip:192.0.2.1")
        );
    }

    #[cfg(feature = "tonic")]
    #[test]
    fn tonic_connect_info_is_the_peer() {
        let mut request = http::Request::new(());
        request
            .extensions_mut()
            .insert(tonic::transport::server::TcpConnectInfo {
                local_addr: "127.0.0.1:50051".parse().ok(),
                remote_addr: "198.51.100.9:40000".parse().ok(),
            });
        let (p, _) = request.into_parts();
        assert_eq!(peer_addr(&p), "198.51.100.9:40000".parse().ok());
    }

    #[test]
    fn no_peer_address_means_no_key() {
        let (p, _) = http::Request::new(()).into_parts();
        assert_eq!(PeerIp::new().extract(&p), None);
    }

    #[test]
    fn cidr_parsing() {
        assert!("10.0.0.0/8"
            .parse::<Cidr>()
            .unwrap()
            .contains("10.9.9.9".parse().unwrap()));
        assert!(!"10.0.0.0/8"
            .parse::<Cidr>()
            .unwrap()
            .contains("11.0.0.1".parse().unwrap()));
        assert!("::/0"
            .parse::<Cidr>()
            .unwrap()
            .contains("2001:db8::1".parse().unwrap()));
        assert!("0.0.0.0/0"
            .parse::<Cidr>()
            .unwrap()
            .contains("8.8.8.8".parse().unwrap()));
        for bad in ["10.0.0.0/33", "x", "1.2.3.4/", ""] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }
}
